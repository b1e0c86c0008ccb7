"""The torch twin's cascade decode: sequences whose block tables start with the same blocks
(a prompt prefix shared through the prefix cache) attend that prefix once, then merge."""

from __future__ import annotations

import pytest
import torch

from kernels import paged_attention
from kernels.paged_attention_torch import CASCADE_MIN_BLOCKS, _plan_decode


def dense(q, keys, values, scale):
    """q [num_heads, head_dim] of the last position over keys/values [len, kv_heads, dim]."""
    group = q.shape[0] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, len, dim]
    v = values.repeat_interleave(group, dim=1).transpose(0, 1)
    weights = (q[:, None, :] @ k.transpose(1, 2) * scale).softmax(-1)
    return (weights @ v)[:, 0, :]


def shared_prefix_batch(num_seqs, shared_blocks, suffix_lens, block_size=16, kv_heads=3,
                        group=3, head_dim=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 64
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    prefix_ids = [ids.pop() for _ in range(shared_blocks)]
    prefix_len = shared_blocks * block_size
    prefix_k = torch.randn(prefix_len, kv_heads, head_dim, generator=gen)
    prefix_v = torch.randn(prefix_len, kv_heads, head_dim, generator=gen)
    for i, b in enumerate(prefix_ids):
        k_cache[b] = prefix_k[i * block_size:(i + 1) * block_size]
        v_cache[b] = prefix_v[i * block_size:(i + 1) * block_size]
    tables, keys, values = [], [], []
    for s in range(num_seqs):
        n = suffix_lens[s]
        sk = torch.randn(n, kv_heads, head_dim, generator=gen)
        sv = torch.randn(n, kv_heads, head_dim, generator=gen)
        own = [ids.pop() for _ in range(-(-n // block_size))]
        for i, b in enumerate(own):
            part = slice(i * block_size, min(n, (i + 1) * block_size))
            k_cache[b, :part.stop - part.start] = sk[part]
            v_cache[b, :part.stop - part.start] = sv[part]
        tables.append(prefix_ids + own)
        keys.append(torch.cat([prefix_k, sk]))
        values.append(torch.cat([prefix_v, sv]))
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    seq_lens = torch.tensor([prefix_len + n for n in suffix_lens], dtype=torch.int32)
    q = torch.randn(num_seqs, kv_heads * group, head_dim, generator=gen)
    query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32)
    return q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, keys, values


@pytest.mark.parametrize("suffix_lens", [[1, 5, 16, 17, 40, 3], [20] * 8, [1, 1, 1, 1]])
def test_shared_prefix_decode_matches_dense(suffix_lens):
    q, kc, vc, bt, sl, qsl, keys, values = shared_prefix_batch(len(suffix_lens), 5, suffix_lens)
    plan = _plan_decode(list(range(len(suffix_lens))), list(range(len(suffix_lens))),
                        sl.tolist(), bt, 16, 1)
    assert plan.prefix_blocks is not None and len(plan.prefix_blocks) == 5  # cascade taken
    out = paged_attention(q, kc, vc, bt, sl, qsl, 0.125, impl="torch")
    for s in range(len(suffix_lens)):
        torch.testing.assert_close(out[s], dense(q[s], keys[s], values[s], 0.125),
                                   atol=2e-5, rtol=1e-4)


def test_too_short_a_shared_prefix_takes_the_plain_path():
    q, kc, vc, bt, sl, qsl, keys, values = shared_prefix_batch(6, CASCADE_MIN_BLOCKS - 1,
                                                               [3, 9, 20, 1, 7, 30])
    plan = _plan_decode(list(range(6)), list(range(6)), sl.tolist(), bt, 16, 1)
    assert plan.prefix_blocks is None
    out = paged_attention(q, kc, vc, bt, sl, qsl, 0.125, impl="torch")
    for s in range(6):
        torch.testing.assert_close(out[s], dense(q[s], keys[s], values[s], 0.125),
                                   atol=2e-5, rtol=1e-4)


def test_step_cache_plans_once_per_forward_and_a_new_step_plans_again(monkeypatch):
    import kernels.paged_attention_torch as twin

    q, kc, vc, bt, sl, qsl, keys, values = shared_prefix_batch(4, 3, [5, 6, 7, 8])
    builds = []
    real = twin._plan_step
    monkeypatch.setattr(twin, "_plan_step", lambda *a: builds.append(1) or real(*a))
    step: dict = {}
    first = [paged_attention(q, kc, vc, bt, sl, qsl, 0.125, impl="torch", step_cache=step)
             for _ in range(3)]  # three "layers" of one forward
    assert len(builds) == 1
    torch.testing.assert_close(first[0], first[2], atol=0, rtol=0)
    # The next step swaps two sequences' tables; its fresh cache must not serve the old plan.
    bt[[0, 1]] = bt[[1, 0]]
    sl[[0, 1]] = sl[[1, 0]]
    second = paged_attention(q, kc, vc, bt, sl, qsl, 0.125, impl="torch", step_cache={})
    assert len(builds) == 2
    torch.testing.assert_close(second[0], dense(q[0], keys[1], values[1], 0.125),
                               atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2),
                                        (torch.float16, 5e-3)])
@pytest.mark.parametrize("suffix_lens", [[3, 40, 17], [1, 5, 16, 17, 40, 3]])
def test_decode_in_16_bits_matches_dense(dtype, atol, suffix_lens):
    """Three sequences take the whole-batch path (no cascade below CASCADE_MIN_SEQS), six the
    cascade; bfloat16 runs the CPU flash kernel, float16 the masked SDPA."""
    q, kc, vc, bt, sl, qsl, keys, values = shared_prefix_batch(len(suffix_lens), 3,
                                                               suffix_lens)
    out = paged_attention(q.to(dtype), kc.to(dtype), vc.to(dtype), bt, sl, qsl, 0.125,
                          impl="torch")
    assert out.dtype == dtype
    for s in range(len(suffix_lens)):
        expected = dense(q[s].to(dtype).float(), keys[s].to(dtype).float(),
                         values[s].to(dtype).float(), 0.125)
        torch.testing.assert_close(out[s].float(), expected, atol=atol, rtol=0)


def test_twin_works_inside_and_then_outside_inference_mode():
    """The engine calls the twin under inference mode; other callers may not. Reused scratch
    buffers must serve both, in either order."""
    q, kc, vc, bt, sl, qsl, keys, values = shared_prefix_batch(4, 3, [5, 6, 7, 8])
    with torch.inference_mode():
        inside = paged_attention(q, kc, vc, bt, sl, qsl, 0.125, impl="torch")
    outside = paged_attention(q, kc, vc, bt, sl, qsl, 0.125, impl="torch")
    torch.testing.assert_close(inside, outside)
