"""Request limits shared by POST /v1/jobs and batch lines, so both refuse the same things
with the same codes."""

from __future__ import annotations

from store.errors import InvalidRequest
from store.openai_batch import GenerationBody
from store.settings import Settings


def prompt_chars(body: GenerationBody) -> int:
    if body.messages is not None:
        return sum(len(m.content) for m in body.messages)  # validated to str already
    return len(body.prompt or "")


def check_generation(body: GenerationBody, settings: Settings, *, param_prefix: str = "") -> None:
    """Raise InvalidRequest when ``body`` names no served model or exceeds a limit."""
    if not body.model:
        raise InvalidRequest("missing_model", "`model` is required", param_prefix + "model")
    if body.model not in settings.models:
        raise InvalidRequest("model_not_found",
                             f"model {body.model!r} is not served here; available: "
                             f"{', '.join(settings.models)}", param_prefix + "model")
    chars = prompt_chars(body)
    if chars > settings.max_prompt_chars:
        field = "messages" if body.messages is not None else "prompt"
        raise InvalidRequest("prompt_too_long",
                             f"the prompt has {chars} characters; the limit is "
                             f"{settings.max_prompt_chars}", param_prefix + field)
    max_tokens = body.max_output_tokens
    if max_tokens is not None and max_tokens > settings.max_tokens_cap:
        field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        raise InvalidRequest("max_tokens_too_large",
                             f"{field} is {max_tokens}; the limit is {settings.max_tokens_cap}",
                             param_prefix + field)
