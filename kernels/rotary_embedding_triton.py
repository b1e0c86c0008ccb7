"""Neox-style rotary embedding of q and k (Triton), rotary_dim == head_dim.

One program per token rotates all its query and key heads, reading that position's cos/sin row
once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, stride_src_token, stride_src_head, stride_dst_token, stride_dst_head,
    token, cos, sin, half_dims, half_ok,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]
    ok = (heads < NUM_HEADS) & half_ok[None, :]
    src = src_ptr + token * stride_src_token + heads * stride_src_head + half_dims[None, :]
    x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
    dst = dst_ptr + token * stride_dst_token + heads * stride_dst_head + half_dims[None, :]
    out_ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(out_ty), mask=ok)
    tl.store(dst + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(out_ty), mask=ok)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_sin_ptr, q_out_ptr, k_out_ptr,
    stride_q_token, stride_q_head, stride_k_token, stride_k_head,
    stride_qo_token, stride_qo_head, stride_ko_token, stride_ko_head,
    stride_cos_sin,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV_H: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    half_dims = tl.arange(0, BLOCK_HALF)
    half_ok = half_dims < HALF
    row = cos_sin_ptr + position * stride_cos_sin + half_dims
    cos = tl.load(row, mask=half_ok, other=0.0)
    sin = tl.load(row + HALF, mask=half_ok, other=0.0)
    _rotate_heads(
        q_ptr, q_out_ptr, stride_q_token, stride_q_head, stride_qo_token, stride_qo_head,
        token, cos, sin, half_dims, half_ok, NUM_HEADS, HALF, BLOCK_H,
    )
    _rotate_heads(
        k_ptr, k_out_ptr, stride_k_token, stride_k_head, stride_ko_token, stride_ko_head,
        token, cos, sin, half_dims, half_ok, NUM_KV_HEADS, HALF, BLOCK_KV_H,
    )


def rotary_embedding_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [num_tokens] int64 (int32 works); q [num_tokens, num_heads, head_dim] and
    k [num_tokens, num_kv_heads, head_dim] (any token and head strides);
    cos_sin_cache [max_position, head_dim] float32, cos then sin; all on one device.
    Returns new contiguous (q, k) in their input dtypes; q and k are untouched."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must be [num_tokens, heads, head_dim]"
        )
    num_tokens, num_heads, head_dim = q.shape
    if head_dim % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache {tuple(cos_sin_cache.shape)} must be [max_position, {head_dim}]"
        )
    if positions.shape != (num_tokens,):
        raise ValueError(f"positions {tuple(positions.shape)} must be [{num_tokens}]")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos_sin_cache.stride(-1) != 1:
        raise ValueError("q, k and cos_sin_cache must be contiguous in their last dim")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        positions, q, k, cos_sin_cache, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos_sin_cache.stride(0),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=k.shape[1],
        HALF=half,
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_KV_H=triton.next_power_of_2(k.shape[1]),
    )
    return q_out, k_out
