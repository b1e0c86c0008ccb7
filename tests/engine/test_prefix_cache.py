"""Prefix caching: shared prompt heads reuse KV blocks, per tenant, without changing outputs."""

from __future__ import annotations

import torch

from engine import LLM, SamplingParams
from engine.block_manager import BlockManager
from engine.detokenizer import IncrementalDetokenizer
from engine.sequence import Request

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def generate_one(engine, request_id, prompt, params=GREEDY, cache_salt=None):
    """Run one request to completion; returns (token ids, num_cached_tokens)."""
    engine.add_request(request_id, prompt, params, cache_salt=cache_salt)
    tokens, cached = [], None
    while engine.has_unfinished_requests():
        for inc in engine.step():
            tokens += inc.token_ids
            cached = inc.num_cached_tokens
    return tokens, cached


def test_prefix_cache_hit_gives_the_same_greedy_output_as_a_cold_run(tiny_engine):
    system = random_ids(70, seed=1)
    prompt_a, prompt_b = system + random_ids(9, seed=2), system + random_ids(13, seed=3)
    cold, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    expected, cold_cached = generate_one(cold, "a", prompt_a)
    assert cold_cached == 0

    warm, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    generate_one(warm, "b", prompt_b)
    got, warm_cached = generate_one(warm, "a", prompt_a)
    assert warm_cached == 64  # four full blocks of the shared 70 tokens
    assert got == expected


def test_shared_system_prompt_reports_block_aligned_cached_tokens(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    system = random_ids(100, seed=4)
    _, first = generate_one(engine, "first", system + random_ids(20, seed=5))
    _, second = generate_one(engine, "second", system + random_ids(20, seed=6))
    assert (first, second) == (0, 96)  # 6 full blocks lie inside the shared 100 tokens
    assert engine.stats()["prefix_cache_hit_rate"] == 96 / 240


def test_identical_prompt_leaves_its_last_token_to_compute(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    prompt = random_ids(112, seed=7)  # exactly 7 blocks
    expected, _ = generate_one(engine, "first", prompt)
    got, cached = generate_one(engine, "again", prompt)
    assert cached == 96  # the 7th block holds the last prompt token, whose logits are needed
    assert got == expected


def test_cache_salt_keeps_tenants_from_sharing_blocks(tiny_engine):
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    prompt = random_ids(60, seed=8)
    generate_one(engine, "a1", prompt, cache_salt="tenant-a")
    _, other_tenant = generate_one(engine, "b1", prompt, cache_salt="tenant-b")
    _, no_salt = generate_one(engine, "n1", prompt)
    _, same_tenant = generate_one(engine, "a2", prompt, cache_salt="tenant-a")
    assert (other_tenant, no_salt, same_tenant) == (0, 0, 48)


def test_eviction_under_memory_pressure_keeps_outputs_correct(tiny_engine):
    # Eight prompts of 3-4 blocks each share two heads; a 12-block pool holds few of them, so
    # cached blocks are evicted (least recently freed first) and reused while others hit.
    heads = [random_ids(32, seed=10), random_ids(32, seed=11)]
    prompts = [heads[i % 2] + random_ids(10 + 3 * i, seed=20 + i) for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    roomy, _ = tiny_engine("llama", num_kv_blocks=256, block_size=16)
    expected = [o.token_ids for o in LLM.from_engine(roomy).generate(prompts, params)]

    tight, _ = tiny_engine("llama", num_kv_blocks=12, block_size=16, max_num_seqs=2)
    outs = LLM.from_engine(tight).generate(prompts + prompts[:4], params)
    assert [o.token_ids for o in outs] == expected + expected[:4]
    # The reruns hit their often used head, but prompt 3's own third block (which a roomy
    # pool would still hold) was evicted.
    assert [o.num_cached_tokens for o in outs[8:]] == [32, 32, 32, 32]
    _, roomy_cached = generate_one(roomy, "rerun", prompts[3], params)
    assert roomy_cached == 48


def make_request(token_ids: list[int], request_id: str = "r") -> Request:
    return Request(request_id, token_ids, SamplingParams(),
                   IncrementalDetokenizer(None, [], False), None, 1)


def run_prompt(bm: BlockManager, req: Request) -> list[int]:
    """Allocate ``req`` (taking its cached prefix), mark it computed, register and free it;
    returns the block ids it got."""
    cached = bm.find_cached_blocks(req)
    assert bm.allocate(req, req.num_tokens - len(cached) * bm.block_size, cached)
    table = list(req.block_table)
    req.num_computed_tokens = req.num_tokens
    bm.cache_full_blocks(req)
    bm.free(req)
    return table


def test_block_manager_evicts_least_recently_freed_blocks_first():
    bm = BlockManager(num_blocks=6, block_size=4)
    prompt_a, prompt_b, prompt_c = random_ids(9, 30), random_ids(9, 31), random_ids(9, 32)
    assert run_prompt(bm, make_request(prompt_a)) == [0, 1, 2]
    assert run_prompt(bm, make_request(prompt_b)) == [3, 4, 5]
    # A runs again: its two full blocks hit, and its use makes them the most recent.
    assert bm.find_cached_blocks(make_request(prompt_a)) == [0, 1]
    assert run_prompt(bm, make_request(prompt_a)) == [0, 1, 2]
    # A new prompt takes B's blocks, tail first (B's partial block was never cached).
    assert run_prompt(bm, make_request(prompt_c)) == [5, 4, 3]
    assert bm.find_cached_blocks(make_request(prompt_b)) == []
    assert bm.find_cached_blocks(make_request(prompt_a)) == [0, 1]
    # Within a freed request, the tail goes before the head: two fresh blocks take A's
    # (uncached) partial block and then its second block, leaving A's head and all of C.
    assert run_prompt(bm, make_request(random_ids(8, 33))) == [2, 1]
    assert bm.find_cached_blocks(make_request(prompt_a)) == [0]
    assert bm.find_cached_blocks(make_request(prompt_c)) == [5, 4]


def test_hash_collision_with_other_tokens_is_a_miss(monkeypatch):
    monkeypatch.setattr("engine.block_manager.hash_block", lambda parent, tokens, extra: 7)
    bm = BlockManager(num_blocks=8, block_size=4)
    run_prompt(bm, make_request(random_ids(9, 40)))
    assert bm.find_cached_blocks(make_request(random_ids(9, 41))) == []


def test_hash_collision_under_another_prefix_is_a_miss(tiny_engine, monkeypatch):
    # A hash that forgets the parent: block "y" after "x" collides with block "y" after "z".
    monkeypatch.setattr("engine.block_manager.hash_block",
                        lambda parent, tokens, extra: hash((tuple(tokens), extra)))
    x, y, z = random_ids(16, 50), random_ids(16, 51), random_ids(16, 52)
    prompt = z + y + random_ids(5, 53)
    cold, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    expected, _ = generate_one(cold, "cold", prompt)

    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    generate_one(engine, "z", z + random_ids(5, 54))
    generate_one(engine, "xy", x + y + random_ids(5, 55))
    got, cached = generate_one(engine, "zy", prompt)
    assert got == expected
    assert cached == 16  # z hits; y computed after x is not y computed after z


def test_hash_collision_across_cache_salts_is_a_miss(tiny_engine, monkeypatch):
    import engine.block_manager as block_manager

    unsalted = block_manager.hash_block
    monkeypatch.setattr("engine.block_manager.hash_block",
                        lambda parent, tokens, extra: unsalted(parent, tokens, b""))
    engine, _ = tiny_engine("llama", num_kv_blocks=64, block_size=16)
    prompt = random_ids(40, 56)
    generate_one(engine, "a", prompt, cache_salt="tenant-a")
    _, cached = generate_one(engine, "b", prompt, cache_salt="tenant-b")
    assert cached == 0
