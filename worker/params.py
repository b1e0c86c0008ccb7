"""From a request body (store's GenerationBody) to what the engine takes."""

from __future__ import annotations

from typing import Any

from engine import SamplingParams, TokenLogprob
from store.openai_batch import GenerationBody


def sampling_params_from_body(body: GenerationBody) -> SamplingParams:
    """Raises ValueError, naming the field, for values the engine rejects."""
    return SamplingParams(
        n=body.n,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        seed=body.seed,
        max_tokens=body.max_output_tokens,
        min_tokens=body.min_tokens,
        stop=list(body.stop or []),
        stop_token_ids=list(body.stop_token_ids or []),
        ignore_eos=body.ignore_eos,
        include_stop_str_in_output=body.include_stop_str_in_output,
        logprobs=body.num_logprobs,
    )


def logprobs_entries(entries: list[TokenLogprob] | None) -> list[dict[str, Any]] | None:
    """Engine logprobs as OpenAI's chat `logprobs.content` entries."""
    if entries is None:
        return None
    return [{"token": e.token, "logprob": e.logprob,
             "bytes": list(e.token.encode()),
             "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                              for _, t, lp in e.top_logprobs]}
            for e in entries]
