"""Triton kernels and their plain-torch twins; the dispatch picks one per call by device.

Modules are named `<kernel>_triton` / `<kernel>_torch` so that no submodule shadows a public
function of the same name on this package.
"""

from kernels.dispatch import (
    paged_attention,
    rms_norm,
    rotary_embedding,
    store_kv_cache,
    use_triton,
)
from kernels.rope_cache import build_cos_sin_cache

__all__ = [
    "build_cos_sin_cache",
    "paged_attention",
    "rms_norm",
    "rotary_embedding",
    "store_kv_cache",
    "use_triton",
]
