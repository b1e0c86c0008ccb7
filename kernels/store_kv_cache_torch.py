"""Plain-torch twin of store_kv_cache_triton: scatter new K/V into the paged cache."""

from __future__ import annotations

import torch


def store_kv_cache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key, value [num_tokens, num_kv_heads, head_dim]; k_cache, v_cache
    [num_blocks, block_size, num_kv_heads, head_dim], whose first two dims must be mergeable
    into one slot dim; slot_mapping [num_tokens] int32 or int64, -1 skips the token. In place."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    # .view, not .reshape: a copy would silently drop the writes.
    k_slots = k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    v_slots = v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    slots = slot_mapping.long()
    valid = slots >= 0
    if not bool(valid.all()):
        key, value, slots = key[valid], value[valid], slots[valid]
    k_slots.index_copy_(0, slots, key.to(k_cache.dtype))
    v_slots.index_copy_(0, slots, value.to(v_cache.dtype))
