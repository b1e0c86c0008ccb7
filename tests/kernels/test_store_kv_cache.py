"""store_kv_cache writes exactly the mapped slots, both impls."""

import pytest
import torch

import kernels

IMPLS = ["triton", "torch"]


def scatter_case(dtype, index_dtype, device):
    num_blocks, block_size, num_kv_heads, head_dim = 9, 16, 3, 64
    gen = torch.Generator().manual_seed(0)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    num_tokens = 40
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[3, 17, 39]] = -1
    # key and value are views into a fused projection, as the engine hands them over.
    kv = torch.randn(num_tokens, 2 * num_kv_heads + 1, head_dim, generator=gen).to(dtype)
    key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads : 2 * num_kv_heads]
    tensors = key, value, k_cache, v_cache, slots.to(index_dtype)
    return tuple(t.to(device) for t in tensors)


def expected_cache(cache, new, slots):
    num_blocks, block_size = cache.shape[:2]
    flat = cache.clone().view(num_blocks * block_size, *cache.shape[2:])
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            flat[slot] = new[token]
    return flat.view(cache.shape)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_writes_mapped_slots_and_nothing_else(impl, dtype, index_dtype, device):
    key, value, k_cache, v_cache, slots = scatter_case(dtype, index_dtype, device)
    want_k = expected_cache(k_cache, key, slots)
    want_v = expected_cache(v_cache, value, slots)
    kernels.store_kv_cache(key, value, k_cache, v_cache, slots, impl=impl)
    assert torch.equal(k_cache, want_k)
    assert torch.equal(v_cache, want_v)


@pytest.mark.parametrize("impl", IMPLS)
def test_all_skipped_tokens_leave_cache_untouched(impl, device):
    key, value, k_cache, v_cache, slots = scatter_case(torch.float32, torch.int64, device)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    kernels.store_kv_cache(key, value, k_cache, v_cache, torch.full_like(slots, -1), impl=impl)
    assert torch.equal(k_cache, before_k)
    assert torch.equal(v_cache, before_v)


def test_triton_launcher_rejects_mismatched_shapes(device):
    key, value, k_cache, v_cache, slots = scatter_case(torch.float32, torch.int64, device)
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.store_kv_cache(key, value, k_cache, v_cache, slots[:-1], impl="triton")
    with pytest.raises(ValueError, match="differ from the caches"):
        kernels.store_kv_cache(key.half(), value.half(), k_cache, v_cache, slots, impl="triton")


@pytest.mark.parametrize("impl", IMPLS)
def test_one_step_cache_serves_every_layer(impl, device):
    """The engine passes one step cache to all layers of a forward: each layer's cache gets
    the same slots written, skipped tokens included."""
    key, value, k_cache, v_cache, slots = scatter_case(torch.float32, torch.int64, device)
    layers = [(k_cache.clone(), v_cache.clone()) for _ in range(3)]
    want_k = expected_cache(k_cache, key, slots)
    step: dict = {}
    for layer_k, layer_v in layers:
        kernels.store_kv_cache(key, value, layer_k, layer_v, slots, impl=impl, step_cache=step)
        assert torch.equal(layer_k, want_k)
