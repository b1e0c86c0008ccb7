"""Memory pressure and long prompts: preemption by recompute and chunked prefill keep outputs."""

from __future__ import annotations

import torch

from engine import LLM, SamplingParams


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPTS = [random_ids(18 + 5 * i, seed=i) for i in range(4)]


def generate(engine, prompts, params) -> list[list[int]]:
    return [o.token_ids for o in LLM.from_engine(engine).generate(prompts, params)]


def test_small_kv_pool_preempts_and_greedy_outputs_match_unconstrained(tiny_engine):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    roomy, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    expected = generate(roomy, PROMPTS, params)
    assert roomy.stats()["num_preemptions"] == 0

    # Each request needs 4 blocks at its end; 10 blocks cannot hold the four of them.
    tight, _ = tiny_engine("llama", num_kv_blocks=10, block_size=16)
    assert generate(tight, PROMPTS, params) == expected
    assert tight.stats()["num_preemptions"] > 0
    assert tight.stats()["kv_blocks_free"] == 10


def test_small_kv_pool_preempts_and_seeded_outputs_match_unconstrained(tiny_engine):
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=40, ignore_eos=True)
              for i in range(4)]
    roomy, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    expected = generate(roomy, PROMPTS, params)
    tight, _ = tiny_engine("llama", num_kv_blocks=10, block_size=16)
    assert generate(tight, PROMPTS, params) == expected
    assert tight.stats()["num_preemptions"] > 0


def test_preemption_takes_the_latest_arrival_and_requeues_it_first(tiny_engine):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    engine, _ = tiny_engine("llama", num_kv_blocks=10, block_size=16)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    while engine.stats()["num_preemptions"] == 0:
        engine.step()
    preempted = [r for _, r in engine.scheduler.waiting if r.num_preemptions]
    assert [r.request_id for r in preempted] == ["3"]
    assert engine.scheduler.waiting[0][1] is preempted[0]


def test_prompt_longer_than_the_token_budget_is_prefilled_in_chunks(tiny_engine):
    prompt = random_ids(75, seed=9)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    whole, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    expected = generate(whole, [prompt], params)

    chunked, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16, max_num_batched_tokens=16)
    chunks = []
    schedule = chunked.scheduler.schedule

    def recording_schedule():
        out = schedule()
        chunks.extend(n for _, n in out.scheduled)
        return out

    chunked.scheduler.schedule = recording_schedule
    assert generate(chunked, [prompt], params) == expected
    assert chunks == [16, 16, 16, 16, 11] + [1] * 9
