from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """How big the engine's batches and KV cache may get.

    The KV cache is sized from ``kv_cache_memory_gb`` on the CPU, and from a fraction of free
    memory after a profiled forward on a GPU; ``num_kv_blocks`` overrides both (tests use it
    to force memory pressure).
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int | None = None  # None: the model's own limit, capped at 8192
    block_size: int = 16
    kv_cache_memory_gb: float = 1.0
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0  # >0: cap one request's prefill chunk per step
    kernels: str | None = None  # "triton" | "torch"; None picks by device
    # "auto": the model's dtype. A float32 cache under a 16-bit model is allowed (attention
    # then runs in float32) but on the CPU bfloat16 reads half the bytes and is faster.
    kv_cache_dtype: str = "auto"
    # torch.compile the model's forward, compiled at start-up for each kind of step (one token,
    # a prefill, decode batches with and without a shared prefix). On the CPU a decode-only
    # step's attention runs in the graph (kernels/paged_decode_compiled.py); other steps' goes
    # through an opaque op to the eager twin. Measured 1.3-1.5x the eager engine's throughput
    # on a 2-core CPU, for about six minutes of compiling there.
    compile_model: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.kernels not in (None, "triton", "torch"):
            raise ValueError("kernels must be 'triton', 'torch' or None")
        if self.kv_cache_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError("kv_cache_dtype must be auto, float32, bfloat16 or float16")
