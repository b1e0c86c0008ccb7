"""Plain-torch twin of paged_attention_triton; the engine's real attention on CPU.

Decode sequences (one new token) are batched: their blocks are gathered into a padded
[n, slots, num_kv_heads, head_dim] tensor and attended with one masked SDPA call per chunk of
sequences. Sequences are sorted by length so a chunk pads little, and a chunk's gathered K/V
is kept small enough to still sit in the CPU cache when SDPA reads it. Sequences with several
new tokens (prefill, chunked prefill) get one SDPA call each, causal with the cached prefix in
front.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F

# Gathered K+V bytes per decode chunk: well inside a server L3, the size that measured fastest
# (64 seqs x 300 tokens, 3 KV heads of 64, fp32: 7.4 ms against 10.8 ms for one 33 MB gather
# and 10.3 ms for 1 MB chunks).
DECODE_CHUNK_BYTES = 4 << 20
# Gathers up to this size reuse a per-thread buffer: a fresh multi-MB tensor is fresh pages from
# the OS, and faulting them in made the gathers 3.5x slower. Bigger ones are not worth keeping.
SCRATCH_MAX_BYTES = 64 << 20

_scratch = threading.local()


def _gather_blocks(cache: torch.Tensor, table: torch.Tensor, which: int) -> torch.Tensor:
    """cache [num_blocks, block_size, heads, head_dim] rows `table` [n] ->
    [n, block_size, heads, head_dim], in scratch buffer `which` (valid until the next gather
    into it on this thread)."""
    shape = (table.shape[0], *cache.shape[1:])
    numel = math.prod(shape)
    if numel * cache.element_size() > SCRATCH_MAX_BYTES:
        return cache.index_select(0, table)
    buffers = _scratch.__dict__.setdefault("buffers", {})
    key = (which, cache.dtype, cache.device)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = buffers[key] = torch.empty(numel, dtype=cache.dtype, device=cache.device)
    out = buffer[:numel].view(shape)
    return torch.index_select(cache, 0, table, out=out)


def _decode_chunk(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
) -> torch.Tensor:
    """q [n, num_heads, head_dim], one token per sequence; block_tables [n, max_blocks];
    seq_lens [n] -> out [n, num_heads, head_dim]."""
    n = q.shape[0]
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    num_blocks = -(-max_len // block_size)
    num_slots = num_blocks * block_size
    lens = seq_lens.long()[:, None]
    table = block_tables[:, :num_blocks].long()
    # Padding entries may hold any value (-1, out of range): point them at block 0 instead.
    in_use = torch.arange(0, num_slots, block_size, device=q.device) < lens
    table = table.masked_fill(~in_use, 0).flatten()
    visible = torch.arange(num_slots, device=q.device) < lens
    # Slots past seq_len hold whatever the cache holds (stale or uninitialized, NaN included);
    # masking the scores is not enough, since 0 * NaN is NaN in the product with V. Filling
    # those rows by index measured 10x faster than a broadcast masked_fill.
    hidden_rows = (~visible).flatten().nonzero().squeeze(1)
    shape = (n, num_slots, num_kv_heads, head_dim)
    k = _gather_blocks(k_cache, table, 0).view(shape)
    v = _gather_blocks(v_cache, table, 1).view(shape)
    k.view(n * num_slots, -1).index_fill_(0, hidden_rows, 0)
    v.view(n * num_slots, -1).index_fill_(0, hidden_rows, 0)
    return F.scaled_dot_product_attention(
        q.unsqueeze(2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=visible[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    ).squeeze(2)


def _decode(
    q: torch.Tensor,
    out: torch.Tensor,
    tokens: list[int],
    seqs: list[int],
    lens: list[int],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> None:
    """Attends q[tokens[i]] for sequence seqs[i] and writes out[tokens[i]]."""
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    slot_bytes = 2 * num_kv_heads * head_dim * k_cache.element_size()
    order = sorted(range(len(seqs)), key=lambda i: lens[seqs[i]])
    first = 0
    while first < len(order):
        last = first + 1
        # Sorted ascending, so the chunk's padded length is its last sequence's length.
        while last < len(order):
            padded_bytes = (last + 1 - first) * lens[seqs[order[last]]] * slot_bytes
            if padded_bytes > DECODE_CHUNK_BYTES:
                break
            last += 1
        chunk = order[first:last]
        rows = torch.tensor([seqs[i] for i in chunk], device=q.device)
        token_rows = torch.tensor([tokens[i] for i in chunk], device=q.device)
        out.index_copy_(
            0,
            token_rows,
            _decode_chunk(
                q.index_select(0, token_rows), k_cache, v_cache,
                block_tables.index_select(0, rows), seq_lens.index_select(0, rows),
                lens[seqs[chunk[-1]]], scale,
            ),
        )
        first = last


def _prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    """q [q_len, num_heads, head_dim], one sequence's new tokens -> out of the same shape."""
    q_len = q.shape[0]
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    table = block_table[: -(-seq_len // block_size)].long()
    k = _gather_blocks(k_cache, table, 0).view(-1, num_kv_heads, head_dim)[:seq_len]
    v = _gather_blocks(v_cache, table, 1).view(-1, num_kv_heads, head_dim)[:seq_len]
    prefix = seq_len - q_len
    mask = None
    if prefix:
        # Causal, aligned bottom-right: new token i sits at position prefix + i.
        positions = torch.arange(seq_len, device=q.device)
        mask = positions[None, :] <= positions[prefix:, None]
    # 4-D with a batch of one: 3-D inputs miss SDPA's fused CPU kernel (measured 3x slower).
    return F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=not prefix,
        scale=scale,
        enable_gqa=True,
    )[0].transpose(0, 1)


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as kernels.paged_attention: q [num_tokens, num_heads, head_dim];
    caches [num_blocks, block_size, num_kv_heads, head_dim], whose first dim must be
    index_select-able; block_tables [num_seqs, max_blocks]; seq_lens [num_seqs];
    query_start_loc [num_seqs + 1]. Index tensors may be int32 or int64, on q's device.
    Returns a new [num_tokens, num_heads, head_dim] tensor in q's dtype."""
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    out = torch.empty_like(q)
    decode = [s for s in range(len(lens)) if starts[s + 1] - starts[s] == 1]
    if decode:
        tokens = [starts[s] for s in decode]
        _decode(q, out, tokens, decode, lens, k_cache, v_cache, block_tables, seq_lens, scale)
    for s in range(len(lens)):
        start, end = starts[s], starts[s + 1]
        if end - start > 1:
            out[start:end] = _prefill(
                q[start:end], k_cache, v_cache, block_tables[s], lens[s], scale
            )
    return out
