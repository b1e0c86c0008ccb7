"""Turns each sampled row of logits into a token, vectorized over the batch.

Order of operations, as in vLLM: penalties and min_tokens masking on the raw logits, then
temperature, top-k, top-p and min-p, then a draw. Greedy rows take the argmax. A draw uses the
exponential race (argmax of probs / Exp(1) noise), so a seeded request's noise comes from its own
generator and its output does not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sequence import Request


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # Per row, when logprobs were asked for: (chosen logprob, [(token id, logprob)] top-N).
    logprobs: list[tuple[float, list[tuple[int, float]]] | None]


def _column(values: list, like: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=like.device).unsqueeze(1)


def _padded(rows: list[list[int]], fill: int, like: torch.Tensor) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.int64,
                        device=like.device)


def apply_penalties(logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
    """Repetition (over prompt and output, HF's rule), frequency and presence (over output)."""
    vocab = logits.shape[1]
    # A scratch column at index `vocab` soaks up the padding.
    output_ids = _padded([r.output_token_ids for r in reqs], vocab, logits)
    counts = torch.zeros(len(reqs), vocab + 1, device=logits.device)
    counts.scatter_add_(1, output_ids, torch.ones_like(output_ids, dtype=counts.dtype))
    counts = counts[:, :vocab]
    rep = _column([r.params.repetition_penalty for r in reqs], logits)
    if (rep != 1.0).any():
        seen = torch.zeros(len(reqs), vocab + 1, dtype=torch.bool, device=logits.device)
        seen.scatter_(1, _padded([r.prompt_token_ids for r in reqs], vocab, logits), True)
        seen = seen[:, :vocab] | (counts > 0)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
    freq = _column([r.params.frequency_penalty for r in reqs], logits)
    pres = _column([r.params.presence_penalty for r in reqs], logits)
    return logits - freq * counts - pres * (counts > 0).float()


def apply_min_tokens(logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
    rows, cols = [], []
    for i, r in enumerate(reqs):
        if r.num_output_tokens < r.params.min_tokens:
            banned = list(r.params.stop_token_ids)
            if r.eos_token_id is not None and not r.params.ignore_eos:
                banned.append(r.eos_token_id)
            rows += [i] * len(banned)
            cols += banned
    if rows:
        logits = logits.clone()
        logits[rows, cols] = float("-inf")
    return logits


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of each row's largest value, the first one on ties, as torch.argmax. Through
    torch.max, which measured 10-40x faster than argmax over a 49152-wide vocabulary on the CPU
    (2.1 ms against 0.06 ms for 4 rows): the greedy step's pick was costing more than a layer."""
    return x.max(dim=1).indices


def apply_top_k_top_p_min_p(logits: torch.Tensor, top_k: list[int], top_p: list[float],
                            min_p: list[float]) -> torch.Tensor:
    vocab = logits.shape[1]
    if any(0 < k < vocab for k in top_k):
        k = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=logits.device)
        kth = logits.sort(dim=1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=1, descending=False)
        cumulative = sorted_logits.softmax(dim=1).cumsum(dim=1)
        # Drop the low tail whose total mass is at most 1 - top_p; the top token always stays.
        drop = cumulative <= 1.0 - _column(top_p, logits)
        drop[:, -1] = False
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    if any(p > 0.0 for p in min_p):
        probs = logits.softmax(dim=1)
        floor = _column(min_p, logits) * probs.max(dim=1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def sample(logits: torch.Tensor, reqs: list[Request]) -> SamplerOutput:
    """logits [num_reqs, vocab] float32, one row per request in ``reqs``."""
    params = [r.params for r in reqs]
    raw = logits
    if any(p.needs_penalties for p in params):
        logits = apply_penalties(logits, reqs)
    if any(r.num_output_tokens < r.params.min_tokens for r in reqs):
        logits = apply_min_tokens(logits, reqs)

    greedy = [p.greedy for p in params]
    if all(greedy):
        tokens = argmax(logits)
    else:
        temps = _column([1.0 if g else p.temperature
                         for g, p in zip(greedy, params, strict=True)], logits)
        scaled = apply_top_k_top_p_min_p(logits / temps, [p.top_k for p in params],
                                         [p.top_p for p in params], [p.min_p for p in params])
        probs = scaled.softmax(dim=1)
        noise = torch.empty_like(probs).exponential_()
        for i, r in enumerate(reqs):
            if r.generator is not None and not greedy[i]:
                # The generator lives on the CPU (a CUDA tensor rejects it): the same draws
                # whatever the device.
                row = torch.empty(probs.shape[1]).exponential_(generator=r.generator)
                noise[i] = row.to(noise.device)
        drawn = argmax(probs / noise)
        tokens = torch.where(torch.tensor(greedy, device=logits.device), argmax(logits),
                             drawn)

    token_list = tokens.tolist()
    wanted = [p.logprobs for p in params]
    logprobs: list = [None] * len(reqs)
    if any(n is not None for n in wanted):
        logp = raw.log_softmax(dim=1)
        chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        top_n = max(n for n in wanted if n is not None)
        top_vals, top_ids = logp.topk(max(top_n, 1), dim=1)
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
        for i, n in enumerate(wanted):
            if n is not None:
                logprobs[i] = (chosen[i], list(zip(top_ids[i][:n], top_vals[i][:n], strict=True)))
    return SamplerOutput(token_list, logprobs)
