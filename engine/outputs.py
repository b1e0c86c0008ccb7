from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top_logprobs: list[tuple[int, str, float]]  # (token id, token text, logprob)


@dataclass
class Increment:
    """What one step added to one output of one request (the streaming interface)."""

    request_id: str
    index: int  # which of the request's n outputs
    text: str  # new text only; never ends in a broken UTF-8 character
    token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" once finished
    stop_reason: str | int | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    logprobs: list[TokenLogprob] | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    finished: bool = False

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    def add(self, inc: Increment) -> None:
        out = self.outputs[inc.index]
        out.text += inc.text
        out.token_ids.extend(inc.token_ids)
        if inc.logprobs is not None:
            out.logprobs = (out.logprobs or []) + inc.logprobs
        if inc.finished:
            out.finish_reason = inc.finish_reason
            out.stop_reason = inc.stop_reason
        self.num_cached_tokens = inc.num_cached_tokens
        self.finished = all(o.finish_reason is not None for o in self.outputs)
