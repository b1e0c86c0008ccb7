"""Scatter new keys and values into the paged KV cache (Triton).

One program per new token copies all of its KV heads, K and V, to the slot the scheduler gave it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_key_token, stride_key_head,
    stride_value_token, stride_value_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    block_size,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    # int64: block * stride overflows int32 once the cache passes 2 G elements.
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // block_size
    offset = slot % block_size
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    ok = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)

    k = tl.load(key_ptr + token * stride_key_token + heads * stride_key_head + dims, mask=ok)
    k_dst = k_cache_ptr + block * stride_k_block + offset * stride_k_slot + heads * stride_k_head
    tl.store(k_dst + dims, k, mask=ok)
    v = tl.load(value_ptr + token * stride_value_token + heads * stride_value_head + dims, mask=ok)
    v_dst = v_cache_ptr + block * stride_v_block + offset * stride_v_slot + heads * stride_v_head
    tl.store(v_dst + dims, v, mask=ok)


def store_kv_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key, value [num_tokens, num_kv_heads, head_dim] (any token and head strides);
    k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], same dtype as key;
    slot_mapping [num_tokens] int32 or int64 on the same device, slot = block * block_size +
    offset, -1 skips the token. Writes the caches in place; other slots are untouched."""
    if key.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(
            f"key must be 3-D and k_cache 4-D, got {tuple(key.shape)}, {tuple(k_cache.shape)}"
        )
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"value {tuple(value.shape)} / v_cache {tuple(v_cache.shape)} differ from key / k_cache"
        )
    if k_cache.shape[2:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"cache {tuple(k_cache.shape)} does not hold [{num_kv_heads}, {head_dim}] per slot"
        )
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} must be [{num_tokens}]")
    if key.dtype != k_cache.dtype or value.dtype != v_cache.dtype:
        raise ValueError(
            f"key/value {key.dtype}, {value.dtype} differ from the caches' {k_cache.dtype}"
        )
    if any(t.stride(-1) != 1 for t in (key, value, k_cache, v_cache)):
        raise ValueError("key, value and the caches must be contiguous in head_dim")
    if num_tokens == 0:
        return
    _store_kv_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1),
        value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k_cache.shape[1],
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
