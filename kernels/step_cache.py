"""Host-side facts derived from a step's metadata tensors, computed by the first layer that
asks and reused by the other layers of the same forward.

Every layer of one forward passes the very same metadata tensors (positions, slot mapping,
block tables...). A torch twin that needs something derived from them on the host (a list of
lengths, an attention plan, the cos/sin rows of the positions) would otherwise derive it again
in each of 30 layers; on a small decode batch that Python was a third of the step.

The caller owns the cache: a dict it passes to every kernel call of one forward (the engine
keeps one in its AttentionMetadata, made fresh each step), promising that the metadata tensors
do not change while it passes the same dict. Without one (None), everything is derived anew on
each call. Version counters cannot stand in for that promise: tensors made under
torch.inference_mode, as the engine's are, have none.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


def derived(cache: dict | None, name: Hashable, build: Callable[[], Any]) -> Any:
    """`build()`'s result, from `cache` when an earlier call of this forward made it."""
    if cache is None:
        return build()
    if name not in cache:
        cache[name] = build()
    return cache[name]
