"""Achieved memory bandwidth of the decode attention and store_kv_cache Triton kernels.

    python bench/kernels.py [--peak-gbps N]   # on a CUDA machine
    python bench/kernels.py --cpu-twin [--threads N]   # the torch twin vs dense SDPA, on CPU

Decode attention and the KV-cache scatter are memory-bound, so GB/s is their figure of merit:
bytes of K/V read plus q read and out written (attention), key/value read plus cache slots
written (store), over the median kernel time. Each figure is printed against the device's
peak (from a table by device name, or --peak-gbps) and against a device-to-device copy
measured in the same run. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels  # noqa: E402

# Peak DRAM bandwidth in GB/s by a substring of torch.cuda.get_device_name(); first match wins,
# so the more specific names come first.
PEAK_GBPS = [
    ("H200", 4800),
    ("H100 PCIe", 2000),
    ("H100", 3350),
    ("A100-SXM4-80GB", 2039),
    ("A100 80GB PCIe", 1935),
    ("A100", 1555),
    ("L40S", 864),
    ("L40", 864),
    ("A10G", 600),
    ("L4", 300),
    ("RTX 4090", 1008),
    ("V100", 900),
]


def peak_gbps(name: str) -> float | None:
    return next((gbps for key, gbps in PEAK_GBPS if key in name), None)


def median_ms(fn, reps: int = 50) -> float:
    """Median over CUDA-event-timed runs, after a warmup that also compiles."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def decode_batch(num_seqs, context, num_kv_heads, group, head_dim, block_size, dtype, device):
    gen = torch.Generator(device="cpu").manual_seed(0)
    lens = torch.full((num_seqs,), context, dtype=torch.int32)
    blocks_per_seq = -(-context // block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, generator=gen).view(num_seqs, blocks_per_seq)
    q = torch.randn(num_seqs, num_kv_heads * group, head_dim, dtype=dtype, device=device)
    starts = torch.arange(num_seqs + 1, dtype=torch.int32)
    args = (
        q, k_cache, v_cache, tables.to(torch.int32).to(device), lens.to(device),
        starts.to(device), head_dim**-0.5,
    )
    kv_bytes = 2 * num_seqs * context * num_kv_heads * head_dim * k_cache.element_size()
    q_out_bytes = 2 * q.numel() * q.element_size()
    return args, kv_bytes + q_out_bytes


def bench_gpu(peak: float | None) -> None:
    name = torch.cuda.get_device_name()
    peak = peak or peak_gbps(name)
    print(f"device: {name}; peak {peak or '?'} GB/s" + ("" if peak else " (pass --peak-gbps)"))

    copy_src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    copy_gbps = 2 * copy_src.numel() / median_ms(lambda: copy_dst.copy_(copy_src)) / 1e6

    def report(label: str, nbytes: int, ms: float) -> None:
        gbps = nbytes / ms / 1e6
        vs_peak = f"{gbps / peak:5.1%} of peak" if peak else "peak ?"
        print(f"  {label:<58} {ms * 1e3:9.1f} us {gbps:8.0f} GB/s  {vs_peak}  "
              f"{gbps / copy_gbps:5.1%} of copy")

    print(f"  {'device-to-device copy (baseline, 256 MiB)':<58} {'':>12} {copy_gbps:8.0f} GB/s"
          + (f"  {copy_gbps / peak:5.1%} of peak" if peak else ""))

    print("decode attention (bf16, block 16, one new token per sequence)")
    configs = [  # num_seqs, context, num_kv_heads, group, head_dim
        (64, 1024, 8, 4, 128),
        (256, 512, 8, 4, 128),
        (32, 4096, 8, 4, 128),
        (64, 1024, 3, 3, 64),
        (4, 16384, 8, 4, 128),
        (1, 32768, 8, 4, 128),
    ]
    for num_seqs, context, kv_heads, group, head_dim in configs:
        args, nbytes = decode_batch(
            num_seqs, context, kv_heads, group, head_dim, 16, torch.bfloat16, "cuda"
        )
        label = f"{num_seqs} seqs x {context} ctx, {kv_heads * group}/{kv_heads} heads, d{head_dim}"
        hints = {"max_query_len": 1, "max_seq_len": context, "impl": "triton"}

        def plain(args=args, hints=hints):
            kernels.paged_attention(*args, split_k=False, **hints)

        def chosen(args=args, hints=hints):
            kernels.paged_attention(*args, **hints)

        report(label, nbytes, median_ms(plain))
        report("  same, launcher's choice (split-K where it picks it)", nbytes, median_ms(chosen))

    print("store_kv_cache (bf16, 8 KV heads of 128, block 16)")
    for num_tokens in (64, 2048, 16384):
        k_cache = torch.zeros(4 * num_tokens // 16 + 1, 16, 8, 128, dtype=torch.bfloat16,
                              device="cuda")
        v_cache = torch.zeros_like(k_cache)
        key = torch.randn(num_tokens, 8, 128, dtype=torch.bfloat16, device="cuda")
        value = torch.randn_like(key)
        slots = torch.randperm(k_cache.shape[0] * 16, device="cuda")[:num_tokens]
        nbytes = 4 * key.numel() * key.element_size()  # read key, value; write both slots

        def store(tensors=(key, value, k_cache, v_cache, slots)):
            kernels.store_kv_cache(*tensors, impl="triton")

        report(f"{num_tokens} tokens", nbytes, median_ms(store))


def bench_cpu_twin() -> None:
    """The engine's CPU attention: the torch twin on an all-decode batch against dense SDPA
    over the same K/V already laid out contiguously (what a non-paged cache would cost)."""
    torch.manual_seed(0)
    num_seqs, num_heads, num_kv_heads, head_dim, block_size, layers = 64, 9, 3, 64, 16, 30
    lens = torch.randint(260, 340, (num_seqs,), dtype=torch.int32)
    max_len = int(lens.max())
    blocks = -(-max_len // block_size)
    num_blocks = num_seqs * blocks
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks).view(num_seqs, blocks).to(torch.int32)
    q = torch.randn(num_seqs, num_heads, head_dim)
    starts = torch.arange(num_seqs + 1, dtype=torch.int32)
    dense_k = torch.randn(num_seqs, num_kv_heads, max_len, head_dim)
    dense_v = torch.randn_like(dense_k)
    mask = (torch.arange(max_len) < lens[:, None])[:, None, None, :]

    def best_ms(fn, reps=10, rounds=7):
        fn()
        best = math.inf
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            best = min(best, (time.perf_counter() - start) / reps * 1e3)
        return best

    twin = best_ms(lambda: kernels.paged_attention(
        q, k_cache, v_cache, tables, lens, starts, 0.125, impl="torch"))
    dense = best_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], dense_k, dense_v, attn_mask=mask, scale=0.125, enable_gqa=True))
    print(f"CPU, {torch.get_num_threads()} threads: all-decode batch of {num_seqs} seqs, "
          f"context 260-340, {num_heads}/{num_kv_heads} heads of {head_dim}, fp32")
    for label, ms in (("torch twin (paged)", twin), ("dense SDPA (baseline)", dense)):
        print(f"  {label:<22} {ms:7.2f} ms/call  {ms * layers:7.0f} ms per {layers} layers")
    print(f"  {'twin / dense':<22} {twin / dense:7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak-gbps", type=float, help="the device's peak DRAM bandwidth")
    parser.add_argument("--cpu-twin", action="store_true", help="time the CPU torch twin instead")
    parser.add_argument("--threads", type=int, help="torch CPU threads for --cpu-twin")
    args = parser.parse_args()
    if args.cpu_twin:
        if args.threads:
            torch.set_num_threads(args.threads)
        bench_cpu_twin()
        return
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        print("no CUDA device (or TRITON_INTERPRET=1): the kernel bandwidth benchmark needs a "
              "GPU; nothing measured. `--cpu-twin` times the CPU attention instead.")
        return
    bench_gpu(args.peak_gbps)


if __name__ == "__main__":
    main()
