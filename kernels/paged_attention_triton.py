"""Varlen causal attention over the paged KV cache (Triton): prefill, chunked prefill and decode
in one launch.

One program takes one KV head of one sequence and a tile of that sequence's new tokens; its rows
are (token, query head) pairs for all query heads that share the KV head, so every K/V tile
loaded serves the whole GQA group. Keys are gathered one at a time through the block table, so
any block size works and a tile may straddle blocks. Online softmax in float32, in base 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Rows per program when some sequence has several new tokens: a 64-row tile amortizes each K/V
# load over many queries and still leaves registers for a 128-wide head.
PREFILL_BLOCK_M = 64
# Rows per program in an all-decode batch: 16 is the smallest M that tl.dot accepts, and decode
# rows are only the GQA group of one token.
DECODE_BLOCK_M = 16
# Keys per inner-loop tile: enough to keep tensor cores busy, few enough for the registers.
BLOCK_N = 64
LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    qk_scale,
    stride_q_token, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_out_token, stride_out_head,
    stride_table_seq,
    block_size,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile_start = tile * BLOCK_Q
    # The grid is sized for the longest query in the batch; shorter ones have idle tiles.
    if tile_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    token = tile_start + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (token < q_len)
    q_pos = prefix_len + token
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM

    q_offs = (q_start + token)[:, None] * stride_q_token + head[:, None] * stride_q_head
    q = tl.load(q_ptr + q_offs + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    # A finite floor, not -inf: padding rows see no key at all, and -inf - -inf would be NaN.
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Causality bounds the keys this tile needs: up to its last token's position.
    kv_end = prefix_len + tl.minimum(tile_start + BLOCK_Q, q_len)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_table_seq
    for kv_start in range(0, kv_end, BLOCK_N):
        k_pos = kv_start + tl.arange(0, BLOCK_N)
        k_ok = k_pos < kv_end
        block = tl.load(table_row + k_pos // block_size, mask=k_ok, other=0).to(tl.int64)
        slot = k_pos % block_size
        k_offs = block * stride_k_block + slot * stride_k_slot + kv_head * stride_k_head
        k = tl.load(
            k_cache_ptr + k_offs[None, :] + dims[:, None],
            mask=k_ok[None, :] & dim_ok[:, None],
            other=0.0,
        )
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
        s = tl.where((k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_offs = block * stride_v_block + slot * stride_v_slot + kv_head * stride_v_head
        v = tl.load(
            v_cache_ptr + v_offs[:, None] + dims[None, :],
            mask=k_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out_offs = (q_start + token)[:, None] * stride_out_token + head[:, None] * stride_out_head
    tl.store(
        out_ptr + out_offs + dims[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


def check_paged_attention_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> None:
    """Shape, dtype and layout checks shared by the Triton launchers."""
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(
            f"q must be 3-D and k_cache 4-D, got {tuple(q.shape)}, {tuple(k_cache.shape)}"
        )
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    if v_cache.shape != k_cache.shape or k_cache.shape[3] != head_dim:
        raise ValueError(
            f"caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)} do not fit q {tuple(q.shape)}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q is {q.dtype} but the caches are {k_cache.dtype}, {v_cache.dtype}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("q and the caches must be contiguous in head_dim")
    num_seqs = seq_lens.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} must be [{num_seqs}, max_blocks]"
        )
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(f"query_start_loc {tuple(query_start_loc.shape)} must be [{num_seqs + 1}]")
    if block_tables.stride(-1) != 1:
        raise ValueError("block_tables must be contiguous in its last dim")


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    split_k: bool | None = None,
) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim] (any token and head strides);
    k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], q's dtype;
    block_tables [num_seqs, max_blocks] int32 (int64 works too);
    seq_lens [num_seqs] int32, query_start_loc [num_seqs + 1] int32, all on q's device.
    Returns out [num_tokens, num_heads, head_dim], contiguous, q's dtype.

    max_query_len and max_seq_len, when the caller knows them, save a device-to-host sync.
    split_k: None picks the split-K decode path by a heuristic, True forces it (all q_len must
    be 1), False forbids it.
    """
    check_paged_attention_args(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if num_seqs else 0

    if split_k is not False and max_query_len == 1:
        from kernels.paged_decode_split_k_triton import (
            choose_num_splits,
            paged_decode_split_k_triton,
        )

        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len)
        if split_k or num_splits > 1:
            return paged_decode_split_k_triton(
                q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                num_splits=max(num_splits, 2) if split_k else num_splits,
            )
    elif split_k:
        raise ValueError("split_k=True needs an all-decode batch (every q_len == 1)")

    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    min_rows = DECODE_BLOCK_M if max_query_len == 1 else PREFILL_BLOCK_M
    block_m = max(min_rows, triton.next_power_of_2(group))
    block_q = block_m // group
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out,
        block_tables, seq_lens, query_start_loc,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_tables.stride(0),
        k_cache.shape[1],
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out

