from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels import paged_attention, store_kv_cache


@dataclass
class AttentionMetadata:
    """The flattened batch, as every attention layer of one forward sees it.

    slot_mapping [num_tokens]: where each new token's K/V goes in the paged cache.
    block_tables [num_seqs, max_blocks], seq_lens [num_seqs], query_start_loc [num_seqs + 1].
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    kernels: str | None = None
    # What the kernels derive from this metadata once per forward (kernels/step_cache.py);
    # valid while these tensors are unchanged, so each step makes new metadata.
    step_cache: dict = field(default_factory=dict)


def paged_attention_layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor,
                          meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Write this step's K/V into the cache, then attend over each sequence's whole context.

    q [num_tokens, num_heads, head_dim]; k, v [num_tokens, num_kv_heads, head_dim].
    """
    dtype = q.dtype
    if k_cache.dtype != dtype:  # e.g. a float32 cache under a bfloat16 model on the CPU
        q, k, v = q.to(k_cache.dtype), k.to(k_cache.dtype), v.to(k_cache.dtype)
    store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping, impl=meta.kernels,
                   step_cache=meta.step_cache)
    out = paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                          meta.query_start_loc, scale, impl=meta.kernels,
                          max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
                          step_cache=meta.step_cache)
    return out.to(dtype)
