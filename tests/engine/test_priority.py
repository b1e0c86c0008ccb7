"""Priorities: interactive requests are admitted before, and preempt, batch requests."""

from __future__ import annotations

import torch

from engine import BATCH, INTERACTIVE, SamplingParams


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def drain(engine, tokens: dict[str, list[int]], finish_order: list[str]) -> None:
    while engine.has_unfinished_requests():
        for inc in engine.step():
            tokens.setdefault(inc.request_id, []).extend(inc.token_ids)
            if inc.finished:
                finish_order.append(inc.request_id)


def solo(engine, prompt, sampling) -> list[int]:
    tokens: dict[str, list[int]] = {}
    engine.add_request("solo", prompt, sampling)
    drain(engine, tokens, [])
    return tokens["solo"]


def test_interactive_request_behind_a_full_batch_finishes_first(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16, max_num_seqs=2)
    batch_prompts = [random_ids(20, seed=1), random_ids(25, seed=2)]
    expected = [solo(engine, p, params(30)) for p in batch_prompts]

    tokens: dict[str, list[int]] = {}
    order: list[str] = []
    for i, prompt in enumerate(batch_prompts):
        engine.add_request(f"batch{i}", prompt, params(30), priority=BATCH)
    for _ in range(3):
        for inc in engine.step():
            tokens.setdefault(inc.request_id, []).extend(inc.token_ids)
    assert len(engine.scheduler.running) == 2  # max_num_seqs is full
    engine.add_request("chat", random_ids(12, seed=3), params(5), priority=INTERACTIVE)
    drain(engine, tokens, order)

    assert order[0] == "chat"
    assert engine.stats()["num_preemptions"] == 1
    # The preempted batch request (the later one) resumed and still produced its own output.
    assert [tokens["batch0"], tokens["batch1"]] == expected


def test_waiting_interactive_request_is_admitted_before_earlier_batch_ones(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16, max_num_seqs=1)
    engine.add_request("batch", random_ids(10, seed=4), params(4), priority=BATCH)
    engine.add_request("chat", random_ids(10, seed=5), params(4), priority=INTERACTIVE)
    order: list[str] = []
    drain(engine, {}, order)
    assert order == ["chat", "batch"]
    assert engine.stats()["num_preemptions"] == 0


def test_preempting_for_priority_refunds_the_victims_token_budget(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16, max_num_seqs=2,
                            max_num_batched_tokens=16)
    for i in range(2):
        engine.add_request(f"batch{i}", random_ids(8, seed=6 + i), params(30), priority=BATCH)
    engine.step()
    engine.step()  # both decode now
    engine.add_request("chat", random_ids(40, seed=8), params(2), priority=INTERACTIVE)
    out = engine.scheduler.schedule()
    chunks = {req.request_id: n for req, n in out.scheduled}
    # One batch request decodes (1 token); the preempted one gives its token back.
    assert chunks == {"batch0": 1, "chat": 15}
