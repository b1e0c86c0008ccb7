"""Decode attention over the paged cache, written for inductor to compile (the CPU path of an
engine that compiles its model).

The eager twin gathers each decode sequence's blocks and hands them to SDPA's CPU flash kernel,
which spends about 1.7 us on each (sequence, KV head) pair's 3x64 by 64xS product: at 64
sequences that is most of a layer's attention. Written as broadcasts and sums, the same math
compiles into a few parallel loops that look the blocks up through the table as they read
them, score, softmax and weight V without a gathered copy or a per-pair call. A prefix that
every sequence shares (one system prompt's cached blocks) is one matmul per KV head, its scores
joined to the rest in one softmax. Measured against the eager twin on 2 CPUs (SmolLM2's 3 KV
heads of 64, 5 shared blocks, bfloat16): 64 sequences 589 -> 249 us per layer, 16 sequences
361 -> 181 us, 1 sequence even.

Compiling imports inductor, which breaks the Triton interpreter for the rest of the process, so
nothing runs this unless asked (AttentionMetadata.compiled, set by an engine that compiles).
"""

from __future__ import annotations

import torch

_compiled = None


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            table: torch.Tensor, lens: torch.Tensor, scale: float,
            prefix_blocks: torch.Tensor | None) -> torch.Tensor:
    n, num_kv_heads, group, head_dim = q.shape
    block_size = k_cache.shape[1]
    slots = table.shape[1] * block_size
    qf = q.float()
    k = k_cache[table].view(n, slots, num_kv_heads, head_dim).permute(0, 2, 1, 3)
    v = v_cache[table].view(n, slots, num_kv_heads, head_dim).permute(0, 2, 1, 3)
    # Slots past a sequence's end hold anything, NaN included: -inf scores and zero values.
    hidden = torch.arange(slots, device=q.device)[None, :] >= lens[:, None]  # [n, slots]
    scores = (qf[:, :, :, None, :] * k[:, :, None].float()).sum(-1) * scale  # [n, kvh, g, S]
    scores = scores.masked_fill(hidden[:, None, None, :], float("-inf"))
    v = v.masked_fill(hidden[:, None, :, None], 0)
    if prefix_blocks is None:
        top = scores.amax(-1, keepdim=True)
        weights = (scores - top).exp()
        out = (weights[..., None] * v[:, :, None].float()).sum(-2)
        return (out / weights.sum(-1)[..., None]).to(q.dtype)
    # The shared prefix: every sequence's queries of a KV head against one copy of its keys.
    width = prefix_blocks.shape[0] * block_size
    kp = k_cache[prefix_blocks].view(width, num_kv_heads, head_dim).float()
    vp = v_cache[prefix_blocks].view(width, num_kv_heads, head_dim).float()
    queries = qf.permute(1, 0, 2, 3).reshape(num_kv_heads, n * group, head_dim)
    prefix_scores = torch.matmul(queries, kp.permute(1, 2, 0)) * scale  # [kvh, n * g, P]
    prefix_scores = prefix_scores.view(num_kv_heads, n, group, width).permute(1, 0, 2, 3)
    top = torch.maximum(prefix_scores.amax(-1), scores.amax(-1))[..., None]
    prefix_weights = (prefix_scores - top).exp()
    weights = (scores - top).exp()
    total = prefix_weights.sum(-1) + weights.sum(-1)
    prefix_out = torch.matmul(
        prefix_weights.permute(1, 0, 2, 3).reshape(num_kv_heads, n * group, width),
        vp.permute(1, 0, 2)).view(num_kv_heads, n, group, head_dim).permute(1, 0, 2, 3)
    out = prefix_out + (weights[..., None] * v[:, :, None].float()).sum(-2)
    return (out / total[..., None]).to(q.dtype)


def paged_decode_compiled(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          table: torch.Tensor, lens: torch.Tensor, scale: float,
                          prefix_blocks: torch.Tensor | None = None) -> torch.Tensor:
    """One new token per sequence attended over its paged context.

    q [n, num_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads, head_dim];
    prefix_blocks [p] int64 with p >= 2, or None: blocks every sequence's context starts with;
    table [n, max_blocks] int64: each sequence's blocks after that prefix, every entry a valid
    block id (padding may point at any block); lens [n] int64: each context's length after the
    prefix, at least 1. Returns [n, num_heads, head_dim] in q's dtype.

    Sizes that change from step to step are compiled as dynamic; dynamo specializes a size of
    0 or 1, so one sequence and one block are padded to two here (two graphs in all: with and
    without a prefix).
    """
    global _compiled
    if _compiled is None:
        # Not fullgraph: past dynamo's recompile limit (many models in one process) this
        # runs eagerly, slower but right, rather than failing.
        _compiled = torch.compile(_decode, dynamic=False)
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if prefix_blocks is not None and prefix_blocks.shape[0] < 2:
        raise ValueError("a shared prefix of one block would compile a graph of its own: "
                         "leave it in the table")
    if table.shape[1] < 2:
        table = torch.cat([table, table[:, :1]], dim=1)  # the copy lies past every length
    if n < 2:
        q, table, lens = q.repeat(2, 1, 1), table.repeat(2, 1), lens.repeat(2)
    # Contiguous, so that q's layout (a view, or rows picked out) is one graph's guard.
    queries = q.contiguous().view(-1, num_kv_heads, num_heads // num_kv_heads, head_dim)
    # Views, so that marking their sizes dynamic leaves the caches themselves unmarked (a
    # compiled forward that takes them would see the mark and recompile).
    k_cache, v_cache = k_cache.view(k_cache.shape), v_cache.view(v_cache.shape)
    for tensor, dims in ((queries, (0,)), (k_cache, (0,)), (v_cache, (0,)), (table, (0, 1)),
                         (lens, (0,)), (prefix_blocks, (0,))):
        if tensor is not None:
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
    out = _compiled(queries, k_cache, v_cache, table, lens, scale, prefix_blocks)
    return out.reshape(-1, num_heads, head_dim)[:n]

