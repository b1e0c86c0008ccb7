"""The kernels on CUDA with real (compiled) Triton, at sizes the interpreter cannot afford and
in bfloat16, which the interpreter gets wrong. The CPU-sized tests in this folder also run on
CUDA where there is a GPU (see conftest.py)."""

import os

import pytest
import torch
from paged_cases import dense_causal_attention, make_paged_batch

import kernels
import kernels.dispatch as dispatch
import kernels.paged_attention_triton as attention_module
import kernels.paged_decode_split_k_triton as split_k_module

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
        reason="needs a CUDA device and compiled (not interpreted) Triton",
    ),
]

# Long decodes, a long prefill from zero, chunked prefill over a long cached prefix.
SERVING_MIX = [(1999, 1), (700, 1), (0, 1), (0, 300), (1000, 200), (31, 1), (4095, 1)]
ATOL = {torch.float32: 2e-3, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("num_kv_heads", "group", "head_dim"), [(8, 4, 128), (3, 3, 64)])
def test_serving_sized_mixed_batch_matches_dense(impl, dtype, num_kv_heads, group, head_dim):
    batch = make_paged_batch(
        SERVING_MIX, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, block_size=16,
        dtype=dtype, device="cuda",
    )
    out = kernels.paged_attention(*batch.args(), impl=impl)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(
        out.float(), dense_causal_attention(batch), atol=ATOL[dtype], rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_long_decode_of_few_sequences_goes_split_k_and_matches_dense(dtype, monkeypatch):
    chosen = []
    real = split_k_module.paged_decode_split_k_triton

    def spy(*args, **kwargs):
        chosen.append(kwargs["num_splits"])
        return real(*args, **kwargs)

    monkeypatch.setattr(split_k_module, "paged_decode_split_k_triton", spy)
    batch = make_paged_batch(
        [(8191, 1), (5000, 1)], num_kv_heads=8, group=4, head_dim=128, block_size=16,
        dtype=dtype, device="cuda",
    )
    out = kernels.paged_attention(*batch.args())
    assert chosen and chosen[0] > 1
    torch.testing.assert_close(
        out.float(), dense_causal_attention(batch), atol=ATOL[dtype], rtol=0
    )


def test_cuda_tensors_take_triton_by_default(monkeypatch):
    monkeypatch.delenv("QUERN_KERNELS", raising=False)
    reached = []
    real = attention_module.paged_attention_triton
    monkeypatch.setattr(
        attention_module, "paged_attention_triton",
        lambda *a, **k: reached.append("triton") or real(*a, **k),
    )
    monkeypatch.setattr(dispatch, "paged_attention_torch", lambda *a, **k: reached.append("torch"))
    batch = make_paged_batch([(10, 2)], num_kv_heads=1, group=2, head_dim=64, block_size=16,
                             device="cuda")
    kernels.paged_attention(*batch.args())
    assert reached == ["triton"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_store_kv_cache_writes_exactly_the_mapped_slots(dtype):
    k_cache = torch.randn(64, 16, 8, 128, device="cuda").to(dtype)
    v_cache = torch.randn_like(k_cache)
    slots = torch.randperm(64 * 16, device="cuda")[:500]
    slots[::7] = -1
    key = torch.randn(500, 8, 128, device="cuda").to(dtype)
    value = torch.randn_like(key)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    kernels.store_kv_cache(key, value, want_k, want_v, slots, impl="torch")
    kernels.store_kv_cache(key, value, k_cache, v_cache, slots, impl="triton")
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_with_residual_matches_twin(dtype):
    x = torch.randn(300, 2048, device="cuda").to(dtype)
    residual = torch.randn_like(x)
    weight = (1 + 0.1 * torch.randn(2048, device="cuda")).to(dtype)
    out, summed = kernels.rms_norm(x, weight, 1e-5, residual, impl="triton")
    want_out, want_sum = kernels.rms_norm(x, weight, 1e-5, residual, impl="torch")
    # A GPU rounds to nearest even, as torch does, so the sum is exact.
    assert torch.equal(summed, want_sum)
    torch.testing.assert_close(out, want_out, atol=ATOL[dtype], rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rotary_matches_twin(dtype):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cache = kernels.build_cos_sin_cache(128, 32768, 500000.0, rope).cuda()
    positions = torch.randint(0, 32768, (300,), device="cuda")
    q = torch.randn(300, 32, 128, device="cuda").to(dtype)
    k = torch.randn(300, 8, 128, device="cuda").to(dtype)
    got = kernels.rotary_embedding(positions, q, k, cache, impl="triton")
    want = kernels.rotary_embedding(positions, q, k, cache, impl="torch")
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL[dtype], rtol=1e-2)
