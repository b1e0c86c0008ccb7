"""Pick the Triton kernel or its plain-torch twin for each call.

CUDA tensors take Triton, CPU tensors take torch. `impl="triton"|"torch"` or the environment
variable QUERN_KERNELS overrides that; the tests use it to run Triton on CPU through the
interpreter (TRITON_INTERPRET=1, set before triton is imported).

The Triton modules are imported on first use, not here: `triton.jit` decides at decoration time
whether to interpret, so importing them early (say, when the engine imports this package before
a test sets TRITON_INTERPRET) would fix that choice too soon. It also keeps `import kernels`
cheap on CPU.
"""

from __future__ import annotations

import os

import torch

from kernels.paged_attention_torch import paged_attention_torch
from kernels.rms_norm_torch import rms_norm_torch
from kernels.rotary_embedding_torch import rotary_embedding_torch
from kernels.store_kv_cache_torch import store_kv_cache_torch

IMPLS = ("triton", "torch")


def use_triton(x: torch.Tensor, impl: str | None = None) -> bool:
    """True when the call on tensor `x` should run the Triton kernel."""
    choice = impl or os.environ.get("QUERN_KERNELS") or None
    if choice is None:
        return x.is_cuda
    if choice == "triton":
        if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "Triton kernels on CPU tensors need TRITON_INTERPRET=1, set before triton is "
                "imported; use impl='torch' (or QUERN_KERNELS=torch) instead"
            )
        return True
    if choice == "torch":
        return False
    raise ValueError(f"unknown kernel impl {choice!r}; expected one of {IMPLS}")


def store_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    impl: str | None = None,
    step_cache: dict | None = None,
) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_dim] into the paged caches
    [num_blocks, block_size, num_kv_heads, head_dim] at slot_mapping [num_tokens] (int32 or
    int64; slot = block * block_size + offset; -1 skips the token). In place."""
    if use_triton(key, impl):
        from kernels.store_kv_cache_triton import store_kv_cache_triton

        store_kv_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_cache_torch(key, value, k_cache, v_cache, slot_mapping, step_cache)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    impl: str | None = None,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    split_k: bool | None = None,
    step_cache: dict | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole paged context.

    q [num_tokens, num_heads, head_dim]: every sequence's new tokens back to back.
    k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim], already holding the new
    tokens' K/V (store_kv_cache runs first).
    block_tables [num_seqs, max_blocks] int32; entries past a sequence's last block are never read.
    seq_lens [num_seqs] int32: total length of each sequence, new tokens included.
    query_start_loc [num_seqs + 1] int32: offsets of each sequence's tokens in q.
    Returns out [num_tokens, num_heads, head_dim], q's dtype.

    max_query_len / max_seq_len are optional host-side hints that spare the Triton launcher a
    device-to-host sync; split_k forces (True) or forbids (False) the split-K decode path.
    step_cache: a dict the caller passes to every call of one forward, whose metadata does not
    change meanwhile; the torch twin keeps its per-step plan there (kernels/step_cache.py).
    """
    if use_triton(q, impl):
        from kernels.paged_attention_triton import paged_attention_triton

        return paged_attention_triton(
            q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
            max_query_len=max_query_len, max_seq_len=max_seq_len, split_k=split_k,
        )
    return paged_attention_torch(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, step_cache
    )


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    impl: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [num_tokens, hidden] times weight [hidden], as HF's LlamaRMSNorm.

    With residual [num_tokens, hidden]: r = x + residual, returns (rms_norm(r) * weight, r).
    Returns new tensors in x's dtype; inputs are left untouched.
    """
    if use_triton(x, impl):
        from kernels.rms_norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_torch(x, weight, eps, residual)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    impl: str | None = None,
    step_cache: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding (HF Llama's rotate_half) over the whole head_dim.

    positions [num_tokens] int64; q [num_tokens, num_heads, head_dim];
    k [num_tokens, num_kv_heads, head_dim]; cos_sin_cache [max_position, head_dim] float32 with
    cos in the first half and sin in the second (see build_cos_sin_cache).
    Returns new tensors (q, k) in their input dtypes; q and k are left untouched.
    """
    if use_triton(q, impl):
        from kernels.rotary_embedding_triton import rotary_embedding_triton

        return rotary_embedding_triton(positions, q, k, cos_sin_cache)
    return rotary_embedding_torch(positions, q, k, cos_sin_cache, step_cache)
