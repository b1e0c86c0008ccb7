"""Split-K (flash-decoding) paged attention for all-decode batches (Triton).

With few sequences and long contexts, one program per (sequence, KV head) leaves most of the GPU
idle, so each context is cut into num_splits contiguous chunks attended in parallel: the split
kernel writes each chunk's normalized partial output and its log-sum-exp, and the reduce kernel
merges them, weighting each chunk by exp(lse - max lse).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.paged_attention_triton import BLOCK_N, LOG2E, check_paged_attention_args

# Programs worth having in flight: about two waves on a 132-SM GPU.
TARGET_PROGRAMS = 256
# A split shorter than this spends more on its partial write and the reduce than it saves.
MIN_KEYS_PER_SPLIT = 256
# Upper bound on splits, and so on the reduce kernel's tile height.
MAX_SPLITS = 32
# Rows per split program: 16 is tl.dot's smallest M; the rows are one token's GQA group.
SPLIT_BLOCK_M = 16


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int) -> int:
    """1 (no split) unless the batch is too small to fill the GPU and the context is long."""
    programs = num_seqs * num_kv_heads
    if programs >= TARGET_PROGRAMS:
        return 1
    wanted = triton.cdiv(TARGET_PROGRAMS, max(programs, 1))
    return max(1, min(wanted, max_seq_len // MIN_KEYS_PER_SPLIT, MAX_SPLITS))


@triton.jit
def _split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, part_out_ptr, part_lse_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    qk_scale,
    stride_q_token, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_po_token, stride_po_head, stride_po_split,
    stride_pl_token, stride_pl_head,
    stride_table_seq,
    block_size,
    num_splits,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    token = tl.load(query_start_loc_ptr + seq)
    seq_len = tl.load(seq_lens_ptr + seq)
    # Whole key tiles per split, so only a context's last tile is ragged.
    split_len = ((seq_len + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    kv_begin = split * split_len
    kv_end = tl.minimum(kv_begin + split_len, seq_len)

    rows = tl.arange(0, BLOCK_M)
    head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    q_offs = token * stride_q_token + head[:, None] * stride_q_head + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_table_seq
    # The one query token is the context's last, so every key before kv_end is visible.
    for kv_start in range(kv_begin, kv_end, BLOCK_N):
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
        s = tl.where(k_ok[None, :], s, float("-inf"))
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

    # An empty split (short context, many splits) leaves l_i == 0: output 0 with weight 0.
    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    po_offs = token * stride_po_token + head[:, None] * stride_po_head + split * stride_po_split
    tl.store(part_out_ptr + po_offs + dims[None, :], acc, mask=row_ok[:, None] & dim_ok[None, :])
    pl_offs = token * stride_pl_token + head * stride_pl_head + split
    tl.store(part_lse_ptr + pl_offs, lse, mask=row_ok)


@triton.jit
def _reduce_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, query_start_loc_ptr,
    stride_po_token, stride_po_head, stride_po_split,
    stride_pl_token, stride_pl_head,
    stride_out_token, stride_out_head,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(query_start_loc_ptr + seq)
    splits = tl.arange(0, BLOCK_S)
    split_ok = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    lse = tl.load(
        part_lse_ptr + token * stride_pl_token + head * stride_pl_head + splits,
        mask=split_ok,
        other=float("-inf"),
    )
    # Split 0 always holds key 0, so the max is finite and empty splits weigh exp2(-inf) = 0.
    weight = tl.exp2(lse - tl.max(lse, 0))
    po_offs = token * stride_po_token + head * stride_po_head + splits[:, None] * stride_po_split
    part = tl.load(
        part_out_ptr + po_offs + dims[None, :],
        mask=split_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    merged = tl.sum(part * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(
        out_ptr + token * stride_out_token + head * stride_out_head + dims,
        merged.to(out_ptr.dtype.element_ty),
        mask=dim_ok,
    )


def paged_decode_split_k_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    num_splits: int,
) -> torch.Tensor:
    """Same tensors as paged_attention_triton, for a batch where every sequence has exactly one
    new token (query_start_loc[i + 1] - query_start_loc[i] == 1; not checked, as that would
    cost a sync). num_splits in [1, MAX_SPLITS]; splits past a short context stay empty.
    Scratch: partial outputs [num_tokens, num_heads, num_splits, head_dim] float32 and their
    log-sum-exps [num_tokens, num_heads, num_splits] float32.
    Returns out [num_tokens, num_heads, head_dim], contiguous, q's dtype."""
    check_paged_attention_args(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if num_tokens != num_seqs:
        raise ValueError(
            f"split-K decode needs one token per sequence: {num_tokens} tokens, {num_seqs} seqs"
        )
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    scratch = {"dtype": torch.float32, "device": q.device}
    part_out = torch.empty((num_tokens, num_heads, num_splits, head_dim), **scratch)
    part_lse = torch.empty((num_tokens, num_heads, num_splits), **scratch)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, part_out, part_lse,
        block_tables, seq_lens, query_start_loc,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        block_tables.stride(0),
        k_cache.shape[1],
        num_splits,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_M=max(SPLIT_BLOCK_M, triton.next_power_of_2(group)),
        BLOCK_N=BLOCK_N,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    _reduce_kernel[(num_seqs, num_heads)](
        part_out, part_lse, out, query_start_loc,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1),
        num_splits,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_S=triton.next_power_of_2(num_splits),
    )
    return out
