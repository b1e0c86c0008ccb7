"""Plain-torch twin of paged_attention_triton; the engine's real attention on CPU.

Decode sequences (one new token) are batched: their blocks are gathered into a padded
[n, slots, num_kv_heads, head_dim] tensor and attended with one masked SDPA call per chunk of
sequences. Sequences are sorted by length so a chunk pads little, and a chunk's gathered K/V
is kept small enough to still sit in the CPU cache when SDPA reads it. Sequences with several
new tokens (prefill, chunked prefill) get one SDPA call each, causal with the cached prefix in
front.

What depends only on the step's metadata (the host copies of the lengths, the chunks, their
masks) is planned by the first layer and kept in the caller's step cache for the other layers
(kernels/step_cache.py). A step of a few decode sequences and nothing else, the long tail of a
batch, is one gather and one SDPA call per layer, with no reordering of rows.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.step_cache import derived

# Gathered K+V bytes per decode chunk: well inside a server L3, the size that measured fastest
# (64 seqs x 300 tokens, 3 KV heads of 64, fp32: 7.4 ms against 10.8 ms for one 33 MB gather
# and 10.3 ms for 1 MB chunks).
DECODE_CHUNK_BYTES = 4 << 20
# Gathers up to this size reuse a per-thread buffer: a fresh multi-MB tensor is fresh pages from
# the OS, and faulting them in made the gathers 3.5x slower. Bigger ones are not worth keeping.
SCRATCH_MAX_BYTES = 64 << 20
# Shared-prefix (cascade) decode pays off once several sequences share a few blocks; below
# that the extra merge costs more than the gathers it saves.
CASCADE_MIN_SEQS = 4
CASCADE_MIN_BLOCKS = 2

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
    # A buffer made under inference mode cannot be written outside it (and the engine runs
    # under it while tests may not): one buffer per mode.
    key = (which, cache.dtype, cache.device, torch.is_inference_mode_enabled())
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = buffers[key] = torch.empty(numel, dtype=cache.dtype, device=cache.device)
    out = buffer[:numel].view(shape)
    return torch.index_select(cache, 0, table, out=out)


@dataclass
class _Chunk:
    token_rows: torch.Tensor  # [n] rows of q/out
    table: torch.Tensor  # [n * num_blocks] block ids to gather (padding pointed at block 0)
    hidden_rows: torch.Tensor  # gathered slots past a sequence's end, zeroed before use
    mask: torch.Tensor  # [n, 1, 1, num_slots] additive: 0 visible, -inf past the end
    num_slots: int


@dataclass
class _DecodePlan:
    """Everything about a step's decode sequences that no layer changes: built once per step
    and reused by every layer, which then only gathers and attends."""

    chunks: list[_Chunk]
    prefix_blocks: torch.Tensor | None  # block ids every decode sequence starts with
    prefix_rows: torch.Tensor | None  # rows of q/out of those sequences, in chunk order
    # The step is these decode tokens alone, in order, in one chunk and with no shared
    # prefix: q is the chunk's query as it stands and the attention is the output.
    whole_batch: bool = False


def shared_prefix_blocks(table_rows: torch.Tensor, lens: list[int], block_size: int,
                         min_seqs: int = CASCADE_MIN_SEQS) -> int:
    """How many leading blocks every decode sequence shares (prefix caching hands one system
    prompt's blocks to all of them), to attend once for the whole batch, cascade style: 0 when
    fewer than `min_seqs` sequences or CASCADE_MIN_BLOCKS blocks make it not worth a merge.
    table_rows [n, max_blocks]: the sequences' block tables; lens: their context lengths."""
    if len(lens) < min_seqs:
        return 0
    limit = (min(lens) - 1) // block_size  # each sequence keeps a token past the prefix
    same = (table_rows[:, :limit] == table_rows[:1, :limit]).all(dim=0).tolist()
    shared = next((i for i, ok in enumerate(same) if not ok), limit)
    return shared if shared >= CASCADE_MIN_BLOCKS else 0


def _plan_decode(tokens: list[int], seqs: list[int], lens: list[int],
                 block_tables: torch.Tensor, block_size: int, slot_bytes: int,
                 cascade: bool = True, whole_batch: bool = False) -> _DecodePlan:
    device = block_tables.device
    table_rows = block_tables.index_select(0, torch.tensor(seqs, device=device)).long()
    shared = (shared_prefix_blocks(table_rows, [lens[s] for s in seqs], block_size)
              if cascade else 0)
    offset = shared * block_size
    longest = max(lens[s] for s in seqs) - offset
    whole_batch = (whole_batch and not shared
                   and len(seqs) * longest * slot_bytes <= DECODE_CHUNK_BYTES)
    order = (list(range(len(seqs))) if whole_batch
             else sorted(range(len(seqs)), key=lambda i: lens[seqs[i]]))
    chunks, first = [], 0
    while first < len(order):
        last = len(order) if whole_batch else first + 1
        # Sorted ascending, so the chunk's padded length is its last sequence's length.
        while last < len(order):
            padded_bytes = (last + 1 - first) * (lens[seqs[order[last]]] - offset) * slot_bytes
            if padded_bytes > DECODE_CHUNK_BYTES:
                break
            last += 1
        members = order[first:last]
        suffix = torch.tensor([lens[seqs[i]] - offset for i in members], device=device)[:, None]
        num_blocks = -(-int(suffix.max()) // block_size)
        num_slots = num_blocks * block_size
        table = table_rows[members][:, shared:shared + num_blocks]
        # Padding entries may hold any value (-1, out of range): point them at block 0 instead.
        in_use = torch.arange(0, num_slots, block_size, device=device) < suffix
        visible = torch.arange(num_slots, device=device) < suffix
        mask = torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))
        chunks.append(_Chunk(
            token_rows=torch.tensor([tokens[i] for i in members], device=device),
            table=table.masked_fill(~in_use, 0).flatten(),
            # Slots past seq_len hold whatever the cache holds (stale, NaN included); a -inf
            # score is not enough, since 0 * NaN is NaN in the product with V. Filling those
            # rows by index measured 10x faster than a broadcast masked_fill.
            hidden_rows=(~visible).flatten().nonzero().squeeze(1),
            mask=mask[:, None, None, :], num_slots=num_slots))
        first = last
    prefix_blocks = table_rows[0, :shared] if shared else None
    prefix_rows = torch.cat([c.token_rows for c in chunks]) if shared else None
    return _DecodePlan(chunks, prefix_blocks, prefix_rows, whole_batch)


def _gather_chunk(k_cache: torch.Tensor, v_cache: torch.Tensor,
                  chunk: _Chunk) -> tuple[torch.Tensor, torch.Tensor]:
    """A chunk's K and V as [n, num_slots, num_kv_heads, head_dim], slots past each sequence's
    end zeroed (they may hold NaN, and 0 * NaN is NaN even under a -inf score)."""
    _, _, num_kv_heads, head_dim = k_cache.shape
    n = chunk.token_rows.shape[0]
    shape = (n, chunk.num_slots, num_kv_heads, head_dim)
    k = _gather_blocks(k_cache, chunk.table, 0).view(shape)
    v = _gather_blocks(v_cache, chunk.table, 1).view(shape)
    k.view(n * chunk.num_slots, -1).index_fill_(0, chunk.hidden_rows, 0)
    v.view(n * chunk.num_slots, -1).index_fill_(0, chunk.hidden_rows, 0)
    return k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [n, num_heads, head_dim] (one token each); k, v [n, slots, num_kv_heads, head_dim]
    -> (out [n, num_heads, head_dim], logsumexp [n, num_heads]) in float32.

    Each KV head's query group is laid out as a short query sequence of its own, which spares
    SDPA a GQA expansion; the CPU flash kernel also returns the logsumexp a cascade merges by.
    """
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_heads // num_kv_heads
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.reshape(n, num_kv_heads, group, head_dim), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=mask, scale=scale)
    return out.reshape(n, num_heads, head_dim), lse.reshape(n, num_heads)


def _decode(q: torch.Tensor, out: torch.Tensor, plan: _DecodePlan, k_cache: torch.Tensor,
            v_cache: torch.Tensor, scale: float) -> None:
    """Attends each planned decode token over its whole context and writes its row of out."""
    _, _, num_kv_heads, head_dim = k_cache.shape
    parts = []
    for chunk in plan.chunks:
        k, v = _gather_chunk(k_cache, v_cache, chunk)
        parts.append(_attend(q.index_select(0, chunk.token_rows), k, v, chunk.mask, scale))
    if plan.prefix_blocks is None:
        for chunk, (part, _) in zip(plan.chunks, parts, strict=True):
            out.index_copy_(0, chunk.token_rows, part.to(out.dtype))
        return
    # The shared prefix: every decode query against one copy of its K/V, then a merge of the
    # two partial softmaxes by their logsumexps.
    k = _gather_blocks(k_cache, plan.prefix_blocks, 0).view(1, -1, num_kv_heads, head_dim)
    v = _gather_blocks(v_cache, plan.prefix_blocks, 1).view(1, -1, num_kv_heads, head_dim)
    rows = plan.prefix_rows
    queries = q.index_select(0, rows)
    n, num_heads, _ = queries.shape
    group = num_heads // num_kv_heads
    # [1, kv_heads, n * group, head_dim]: the whole batch as one query sequence per KV head
    folded = queries.view(n, num_kv_heads, group, head_dim).transpose(0, 1).reshape(
        1, num_kv_heads, n * group, head_dim)
    prefix_out, prefix_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        folded, k.transpose(1, 2), v.transpose(1, 2), scale=scale)
    prefix_out = prefix_out.view(num_kv_heads, n, group, head_dim).transpose(0, 1).reshape(
        n, num_heads, head_dim)
    prefix_lse = prefix_lse.view(num_kv_heads, n, group).transpose(0, 1).reshape(n, num_heads)
    suffix_out = torch.cat([o for o, _ in parts])
    suffix_lse = torch.cat([lse for _, lse in parts])
    top = torch.maximum(prefix_lse, suffix_lse)
    w_prefix = (prefix_lse - top).exp_().unsqueeze(-1)
    w_suffix = (suffix_lse - top).exp_().unsqueeze(-1)
    merged = (prefix_out * w_prefix + suffix_out * w_suffix) / (w_prefix + w_suffix)
    out.index_copy_(0, rows, merged.to(out.dtype))


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
    step_cache: dict | None = None,
) -> torch.Tensor:
    """Same contract as kernels.paged_attention: q [num_tokens, num_heads, head_dim];
    caches [num_blocks, block_size, num_kv_heads, head_dim], whose first dim must be
    index_select-able; block_tables [num_seqs, max_blocks]; seq_lens [num_seqs];
    query_start_loc [num_seqs + 1]. Index tensors may be int32 or int64, on q's device.
    Returns a new [num_tokens, num_heads, head_dim] tensor in q's dtype. step_cache: see
    kernels/step_cache.py."""
    flash = q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16)
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    slot_bytes = 2 * num_kv_heads * head_dim * k_cache.element_size()
    # The plan depends only on the metadata (and the cache's geometry): the first layer of a
    # forward builds it, the others reuse it.
    step = derived(step_cache, ("paged_attention", block_size, slot_bytes, flash),
                   lambda: _plan_step(block_tables, seq_lens, query_start_loc, block_size,
                                      slot_bytes, flash))
    decode = step.decode
    if decode is not None and decode.whole_batch:
        # Every token is a decode token, in one chunk, in order: the attention is the output.
        chunk = decode.chunks[0]
        k, v = _gather_chunk(k_cache, v_cache, chunk)
        if flash:
            return _attend(q, k, v, chunk.mask, scale)[0].to(q.dtype)
        return _attend_sdpa(q, k, v, chunk.mask, scale)
    out = torch.empty_like(q)
    if decode is not None:
        if flash:
            _decode(q, out, decode, k_cache, v_cache, scale)
        else:
            for chunk in decode.chunks:
                k, v = _gather_chunk(k_cache, v_cache, chunk)
                out.index_copy_(0, chunk.token_rows,
                                _attend_sdpa(q.index_select(0, chunk.token_rows), k, v,
                                             chunk.mask, scale))
    for start, end, seq_len, s in step.prefills:
        out[start:end] = _prefill(q[start:end], k_cache, v_cache, block_tables[s], seq_len,
                                  scale)
    return out


@dataclass
class _StepPlan:
    decode: _DecodePlan | None
    prefills: list[tuple[int, int, int, int]]  # (first token, end token, seq_len, seq)


def _plan_step(block_tables: torch.Tensor, seq_lens: torch.Tensor,
               query_start_loc: torch.Tensor, block_size: int, slot_bytes: int,
               flash: bool) -> _StepPlan:
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    decode = [s for s in range(len(lens)) if starts[s + 1] - starts[s] == 1]
    prefills = [(starts[s], starts[s + 1], lens[s], s) for s in range(len(lens))
                if starts[s + 1] - starts[s] > 1]
    plan = None
    if decode:
        # The shared-prefix merge needs the flash kernel's logsumexp.
        plan = _plan_decode([starts[s] for s in decode], decode, lens, block_tables,
                            block_size, slot_bytes, cascade=flash,
                            whole_batch=not prefills and starts[-1] == len(decode))
    return _StepPlan(plan, prefills)


def _attend_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """Decode attention for what the CPU flash path is not used for (float16, other devices):
    q [n, num_heads, head_dim]; k, v [n, slots, num_kv_heads, head_dim]."""
    return F.scaled_dot_product_attention(
        q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale,
        enable_gqa=True).squeeze(2)
