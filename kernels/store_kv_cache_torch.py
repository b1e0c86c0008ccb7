"""Plain-torch twin of store_kv_cache_triton: scatter new K/V into the paged cache."""

from __future__ import annotations

import torch

from kernels.step_cache import derived


def store_kv_cache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    step_cache: dict | None = None,
) -> None:
    """key, value [num_tokens, num_kv_heads, head_dim]; k_cache, v_cache
    [num_blocks, block_size, num_kv_heads, head_dim], whose first two dims must be mergeable
    into one slot dim; slot_mapping [num_tokens] int32 or int64, -1 skips the token. In place.
    step_cache: see kernels/step_cache.py (the skipped tokens are found once per forward)."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    # .view, not .reshape: a copy would silently drop the writes.
    k_slots = k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    v_slots = v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    slots, valid = derived(step_cache, "store_kv_cache", lambda: _valid_slots(slot_mapping))
    if valid is not None:
        key, value = key[valid], value[valid]
    k_slots.index_copy_(0, slots, key.to(k_cache.dtype))
    v_slots.index_copy_(0, slots, value.to(v_cache.dtype))


def _valid_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the slots written, as int64; the mask of tokens written, or None for all of them)."""
    slots = slot_mapping.long()
    valid = slots >= 0
    if bool(valid.all()):
        return slots, None
    return slots[valid], valid
