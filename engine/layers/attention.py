from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from kernels import paged_attention, store_kv_cache
from kernels.paged_decode_compiled import DecodeBatch, paged_decode


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
    # A step of decode tokens only, planned for the CPU decode kernel that a compiled forward
    # runs in its graph (kernels/paged_decode_compiled.py); None otherwise.
    decode: DecodeBatch | None = None
    # What the kernels derive from this metadata once per forward (kernels/step_cache.py);
    # valid while these tensors are unchanged, so each step makes new metadata.
    step_cache: dict = field(default_factory=dict)


def paged_attention_layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor,
                          meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Write this step's K/V into the cache, then attend over each sequence's whole context.

    q [num_tokens, num_heads, head_dim]; k, v [num_tokens, num_kv_heads, head_dim].

    Under torch.compile, a decode-only step planned for it (meta.decode) runs the CPU decode
    kernel in the graph itself; any other step goes through the opaque op `quern::attention`,
    which finds the step's metadata in the forward context (see `forward_context`): the
    compiled graph holds the dense layers, and attention, whose plan is host-side Python,
    stays eager.
    """
    if torch.compiler.is_compiling():
        if meta.decode is not None:
            return paged_decode(q, k, v, k_cache, v_cache, meta.slot_mapping, meta.decode,
                                scale)
        return torch.ops.quern.attention(q, k, v, k_cache, v_cache, scale)
    return _paged_attention(q, k, v, k_cache, v_cache, meta, scale)


def _paged_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata,
                     scale: float) -> torch.Tensor:
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


_context = threading.local()


@contextmanager
def forward_context(meta: AttentionMetadata) -> Iterator[None]:
    """Make `meta` the metadata that `quern::attention` reads during one compiled forward."""
    _context.meta = meta
    try:
        yield
    finally:
        _context.meta = None


def _attention_op(q, k, v, k_cache, v_cache, scale: float) -> torch.Tensor:
    meta = getattr(_context, "meta", None)
    if meta is None:
        raise RuntimeError("quern::attention runs only inside engine.layers.attention."
                           "forward_context(meta)")
    return _paged_attention(q, k, v, k_cache, v_cache, meta, scale)


_library = torch.library.Library("quern", "DEF")
_library.define("attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, "
                "Tensor(b!) v_cache, float scale) -> Tensor")
for _key in ("CPU", "CUDA"):
    _library.impl("attention", _attention_op, _key)


@torch.library.register_fake("quern::attention")
def _attention_fake(q, k, v, k_cache, v_cache, scale):
    return torch.empty_like(q)
