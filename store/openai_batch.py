"""The OpenAI Batch line format, shared by the API (uploaded files, output files) and the
offline runner (`quern run`).

An input line is ``{"custom_id", "method": "POST", "url", "body"}``; ``body`` is a
``/v1/chat/completions`` or ``/v1/completions`` request. An output line is
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``.
Nothing here touches a database, the network or the engine: it parses and it formats.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
SUPPORTED_URLS = (CHAT_URL, COMPLETIONS_URL)
MAX_STOP_SEQUENCES = 4  # OpenAI's own limit on `stop`


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]]

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, content: str | list[dict[str, Any]]) -> str:
        if isinstance(content, str):
            return content
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)


class GenerationBody(BaseModel):
    """A chat or text completion request body, with every sampling knob the engine accepts.

    Field names and defaults follow OpenAI (temperature 1.0); vLLM's extras are accepted too.
    Unknown fields are rejected so that a typo never silently changes an output.
    """

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    messages: list[ChatMessage] | None = None
    prompt: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    n: int = Field(default=1, ge=1, le=16)
    logprobs: bool | int | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, stream: bool) -> bool:
        if stream:
            raise ValueError("streaming is not available in batch requests")
        return stream

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerationBody:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of `messages` or `prompt`")
        if self.messages is not None and not self.messages:
            raise ValueError("`messages` must not be empty")
        return self

    @property
    def max_output_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """Top-N logprobs per generated token, or None when none were asked for."""
        if self.logprobs is None or self.logprobs is False:
            return None
        if self.messages is not None:  # chat: logprobs is a bool, top_logprobs the count
            return self.top_logprobs or 0
        return 0 if self.logprobs is True else int(self.logprobs)

    def prompt_input(self) -> str | list[dict[str, str]]:
        """What the engine takes as a prompt: a string, or chat messages."""
        if self.messages is not None:
            return [{"role": m.role, "content": m.content} for m in self.messages]
        return self.prompt or ""


@dataclass(frozen=True)
class BatchLine:
    line_no: int  # 1-based, as editors count
    custom_id: str
    url: str
    body: GenerationBody


class BatchLineError(ValueError):
    """A line that cannot run. ``code`` is stable; ``param`` names the field at fault."""

    def __init__(self, line_no: int, code: str, message: str, param: str | None = None,
                 custom_id: str | None = None):
        super().__init__(f"line {line_no}: {message}")
        self.line_no = line_no
        self.code = code
        self.message = message
        self.param = param
        self.custom_id = custom_id

    def as_error(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param,
                "line": self.line_no}


def parse_batch_line(raw: bytes | str, line_no: int, *,
                     url_for_all: str | None = None) -> BatchLine:
    """Parse and validate one input line; raise BatchLineError naming what is wrong.

    ``url_for_all``, when given, is the batch's endpoint: every line must use it.
    """
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BatchLineError(line_no, "invalid_json", f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BatchLineError(line_no, "invalid_json", "a line must be a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise BatchLineError(line_no, "missing_custom_id",
                             "`custom_id` is required and must be a non-empty string",
                             "custom_id")
    method = obj.get("method", "POST")
    if method != "POST":
        raise BatchLineError(line_no, "invalid_method", f"method must be POST, got {method!r}",
                             "method", custom_id)
    url = obj.get("url")
    if url not in SUPPORTED_URLS:
        raise BatchLineError(line_no, "invalid_url",
                             f"url must be one of {', '.join(SUPPORTED_URLS)}, got {url!r}",
                             "url", custom_id)
    if url_for_all is not None and url != url_for_all:
        raise BatchLineError(line_no, "mismatched_url",
                             f"url {url!r} differs from the batch endpoint {url_for_all!r}",
                             "url", custom_id)
    body = obj.get("body")
    if not isinstance(body, dict):
        raise BatchLineError(line_no, "invalid_body", "`body` must be a JSON object", "body",
                             custom_id)
    if url == CHAT_URL and "messages" not in body:
        raise BatchLineError(line_no, "invalid_body", "chat completions need `messages`",
                             "body.messages", custom_id)
    if url == COMPLETIONS_URL and "prompt" not in body:
        raise BatchLineError(line_no, "invalid_body", "completions need `prompt`",
                             "body.prompt", custom_id)
    try:
        parsed = GenerationBody.model_validate(body)
    except ValidationError as exc:
        raise body_error(line_no, exc, custom_id) from None
    return BatchLine(line_no=line_no, custom_id=custom_id, url=url, body=parsed)


def body_error(line_no: int, exc: ValidationError, custom_id: str | None) -> BatchLineError:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"])
    param = f"body.{field}" if field else "body"
    message = first["msg"].removeprefix("Value error, ")
    return BatchLineError(line_no, "invalid_request", f"{param}: {message}", param, custom_id)


def completion_body(url: str, *, request_id: str, model: str, created: int,
                    choices: list[dict[str, Any]], prompt_tokens: int, cached_tokens: int
                    ) -> dict[str, Any]:
    """The OpenAI response body for one request.

    ``choices`` holds, per output: ``text``, ``finish_reason`` and optionally ``logprobs``
    (a list of ``{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}``).
    """
    completion_tokens = sum(c.get("num_tokens", 0) for c in choices)
    is_chat = url == CHAT_URL
    out_choices = []
    for index, c in enumerate(choices):
        if is_chat:
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": c["text"]},
                "finish_reason": c["finish_reason"],
                "logprobs": ({"content": c["logprobs"]} if c.get("logprobs") is not None
                             else None),
            }
        else:
            choice = {"index": index, "text": c["text"], "finish_reason": c["finish_reason"],
                      "logprobs": _completion_logprobs(c.get("logprobs"))}
        out_choices.append(choice)
    return {
        "id": ("chatcmpl-" if is_chat else "cmpl-") + request_id,
        "object": "chat.completion" if is_chat else "text_completion",
        "created": created,
        "model": model,
        "choices": out_choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        },
    }


def _completion_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    if entries is None:
        return None
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
    }


def output_line(custom_id: str, *, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "batch_req_" + uuid.uuid4().hex, "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": request_id, "body": body},
            "error": None}


def error_line(custom_id: str | None, code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"id": "batch_req_" + uuid.uuid4().hex, "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message, **extra}}


def now() -> int:
    return int(time.time())
