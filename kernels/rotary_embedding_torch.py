"""Plain-torch twin of rotary_embedding_triton (neox style, rotary_dim == head_dim)."""

from __future__ import annotations

import torch

from kernels.step_cache import derived


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor):
    """[num_tokens, 1, head_dim] cos (each half repeated) and sin (first half negated), so a
    whole head rotates as x * cos + roll(x) * sin, the products and sums of HF's
    `q * cos + rotate_half(q) * sin` in the same order (negating is exact)."""
    cos, sin = cos_sin_cache.index_select(0, positions.long()).unsqueeze(1).chunk(2, dim=-1)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rotary_embedding_torch(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    step_cache: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [num_tokens] int; q [num_tokens, num_heads, head_dim];
    k [num_tokens, num_kv_heads, head_dim]; cos_sin_cache [max_position, head_dim] float32.
    Returns new (q, k) in their own dtypes; computed in float32. step_cache: see
    kernels/step_cache.py (the cos/sin rows of `positions` are looked up once per forward)."""
    # Compiled, the lookup is part of one graph for all layers; no host-side cache to keep.
    cache = None if torch.compiler.is_compiling() else step_cache
    cos, sin = derived(cache, "rotary", lambda: _cos_sin(positions, cos_sin_cache))
    half = q.shape[-1] // 2
    if q.dtype != k.dtype:
        return _rotate(q, cos, sin, half), _rotate(k, cos, sin, half)
    # q and k rotate as one tensor: half the calls, and each call costs more than its math.
    both = _rotate(torch.cat((q, k), dim=1), cos, sin, half)
    return both[:, :q.shape[1]], both[:, q.shape[1]:]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    xf = x.float()
    return (xf * cos + xf.roll(half, dims=-1) * sin).to(x.dtype)
