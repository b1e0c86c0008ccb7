"""Output tokens/s of the engine against transformers, on one seeded workload, in one run.

The workload: N chat requests sharing a system prompt, each with its own seeded output length
(log-uniform, so most answers are short and a few are long, as in real traffic), greedy,
ignore_eos so every system generates exactly the tokens asked for. Each system runs in its own
subprocess (so its peak RSS is its own) on the same prompts:

- engine: quern's engine, one `LLM.generate` call over the whole workload;
- hf-static: transformers' `generate` on static, left-padded batches (each batch runs to its
  longest request), at several batch sizes; the best is the baseline;
- hf-cb: transformers' own continuous batching (`continuous_batching_context_manager`, paged
  KV cache, per-request max_new_tokens), at its default settings.

Throughput counts only the tokens the workload asked for. Usage:
    python bench/throughput.py [--requests 64] [--dtype bfloat16]
        [--baseline-dtypes float32,bfloat16] [--static-batch-sizes 32,64] [--repeat 1]
        [--compile]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

# Run as `python bench/throughput.py`, this folder comes first on sys.path, and its kernels.py
# would shadow the kernels package: put the repository root there instead.
REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)

SYSTEM_PROMPT = (
    "You are a helpful assistant for a library's reference desk. Answer questions about books, "
    "authors, history and science accurately and concisely. When you are unsure, say so and "
    "suggest where the reader could look it up. Prefer plain language, avoid jargon, and give "
    "one concrete example when it helps. Keep a friendly, professional tone."
)
TOPICS = ["the French Revolution", "photosynthesis", "black holes", "the printing press",
          "Jane Austen", "plate tectonics", "the Roman Empire", "vaccines", "jazz music",
          "the water cycle", "Ada Lovelace", "volcanoes", "the Silk Road", "honey bees",
          "the Moon landing", "climate zones"]
ASKS = ["Give me a short overview of {}.", "What is one surprising fact about {}?",
        "Which book would you recommend to learn about {}?", "Explain {} to a ten-year-old."]
MIN_OUT, MAX_OUT = 16, 256
DTYPES = ["float32", "bfloat16"]


def workload(n: int, seed: int) -> list[tuple[list[dict], int]]:
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        question = rng.choice(ASKS).format(rng.choice(TOPICS))
        length = round(math.exp(rng.uniform(math.log(MIN_OUT), math.log(MAX_OUT))))
        items.append(([{"role": "system", "content": SYSTEM_PROMPT},
                       {"role": "user", "content": question}], length))
    return items


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_engine(items, dtype: str, compile_model: bool = False) -> dict:
    from engine import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM("smollm2", dtype=dtype, max_num_seqs=len(items), compile_model=compile_model)
    startup = time.perf_counter() - started
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in items]
    start = time.perf_counter()
    outs = llm.generate([m for m, _ in items], params)
    elapsed = time.perf_counter() - start
    stats = llm.engine.stats()
    return {"tokens": sum(len(o.token_ids) for o in outs), "seconds": elapsed,
            "prompt_tokens": stats["prompt_tokens_total"],
            "prefill_tokens_computed": stats["prompt_tokens_computed"],
            "prefix_cache_hit_rate": stats["prefix_cache_hit_rate"], "startup_s": startup}


def load_hf(dtype: str, attn: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.loader import resolve_model

    src = resolve_model("smollm2")
    tok = AutoTokenizer.from_pretrained(src.directory, gguf_file=src.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(src.directory, gguf_file=src.gguf_file,
                                                 dtype=getattr(torch, dtype),
                                                 attn_implementation=attn)
    return tok, model.eval()


def chat_ids(tok, messages) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def run_hf_static(items, dtype: str, batch_size: int) -> dict:
    import torch

    tok, model = load_hf(dtype, "sdpa")
    prompts = [chat_ids(tok, m) for m, _ in items]
    start = time.perf_counter()
    produced = 0
    for b in range(0, len(items), batch_size):
        ids = prompts[b:b + batch_size]
        lengths = [n for _, n in items[b:b + batch_size]]
        width = max(len(p) for p in ids)
        input_ids = torch.tensor([[tok.eos_token_id] * (width - len(p)) + p for p in ids])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
        with torch.inference_mode():
            out = model.generate(input_ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=max(lengths), min_new_tokens=max(lengths),
                                 pad_token_id=tok.eos_token_id)
        produced += sum(min(n, out.shape[1] - width) for n in lengths)
    return {"tokens": produced, "seconds": time.perf_counter() - start,
            "batch_size": batch_size}


def run_hf_cb(items, dtype: str) -> dict:
    from transformers import GenerationConfig

    tok, model = load_hf(dtype, "sdpa")
    prompts = [chat_ids(tok, m) for m, _ in items]
    config = GenerationConfig(do_sample=False, max_new_tokens=MAX_OUT, eos_token_id=-1,
                              pad_token_id=tok.eos_token_id)
    start = time.perf_counter()
    results = {}
    with model.continuous_batching_context_manager(generation_config=config, block=True,
                                                   timeout=30) as manager:
        ids = [manager.add_request(p, max_new_tokens=n, eos_token_id=-1)
               for p, (_, n) in zip(prompts, items, strict=True)]
        while len(results) < len(ids):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                results[result.request_id] = result
    return {"tokens": sum(len(r.generated_tokens) for r in results.values()),
            "seconds": time.perf_counter() - start}


def child(args) -> None:
    items = workload(args.requests, args.seed)
    if args.system == "engine":
        result = run_engine(items, args.dtype, args.compile)
    elif args.system == "hf-static":
        result = run_hf_static(items, args.dtype, args.batch_size)
    else:
        result = run_hf_cb(items, args.dtype)
    result["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(result))


def spawn(args, system: str, dtype: str, batch_size: int = 0) -> dict:
    """Run one system once, in a fresh subprocess."""
    cmd = [sys.executable, __file__, "--child", system, "--requests", str(args.requests),
           "--seed", str(args.seed), "--dtype", dtype, "--batch-size", str(batch_size)]
    if args.compile and system == "engine":
        cmd.append("--compile")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{system} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(line[7:])
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    result["dtype"] = dtype
    return result


def run_all(args, systems: list[tuple[str, str, str, int]]) -> list[dict]:
    """Each (label, system, dtype, batch size) --repeat times, keeping its fastest run. The
    repeats go round-robin over the systems, so a slow stretch of a noisy machine lands on
    every system alike rather than on whichever ran then."""
    runs: list[list[dict]] = [[] for _ in systems]
    for _ in range(args.repeat):
        for i, (_, system, dtype, batch_size) in enumerate(systems):
            runs[i].append(spawn(args, system, dtype, batch_size))
    best = []
    for tries in runs:
        fastest = max(tries, key=lambda r: r["tokens_per_s"])
        fastest["all_tokens_per_s"] = [round(r["tokens_per_s"], 1) for r in tries]
        best.append(fastest)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES,
                        help="the engine's dtype")
    parser.add_argument("--baseline-dtypes", default="float32,bfloat16",
                        help="transformers runs in each; its best is the baseline")
    parser.add_argument("--static-batch-sizes", default="32,64")
    parser.add_argument("--skip-cb", action="store_true", help="skip transformers' CB")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per system, the fastest kept (the same for every system)")
    parser.add_argument("--compile", action="store_true",
                        help="the engine with compile_model=True (compiled before timing)")
    parser.add_argument("--child", choices=["engine", "hf-static", "hf-cb"])
    parser.add_argument("--batch-size", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        args.system = args.child
        child(args)
        return

    items = workload(args.requests, args.seed)
    print(f"workload: {len(items)} chat requests, one shared system prompt, output lengths "
          f"{min(n for _, n in items)}-{max(n for _, n in items)} (sum "
          f"{sum(n for _, n in items)}), greedy, ignore_eos; {os.cpu_count()} CPUs, "
          f"torch threads {torch_threads()}", flush=True)
    systems = [("quern engine", "engine", args.dtype, 0)]
    for dtype in args.baseline_dtypes.split(","):
        for b in args.static_batch_sizes.split(","):
            systems.append((f"transformers generate, static batch {b}", "hf-static", dtype,
                            int(b)))
        if not args.skip_cb:
            systems.append(("transformers continuous batching (paged, sdpa)", "hf-cb", dtype, 0))
    results = run_all(args, systems)
    rows = [(label, r) for (label, *_), r in zip(systems, results, strict=True)]
    engine = results[0]
    kinds = [system for _, system, _, _ in systems]
    static = [r for kind, r in zip(kinds, results, strict=True) if kind == "hf-static"]
    cbs = [r for kind, r in zip(kinds, results, strict=True) if kind == "hf-cb"]
    for name, r in rows:
        tries = f"  (runs: {r['all_tokens_per_s']})" if args.repeat > 1 else ""
        print(f"{name:48s} {r['dtype']:>9s} {r['tokens']:6d} tok {r['seconds']:7.1f} s "
              f"{r['tokens_per_s']:7.1f} tok/s  peak RSS {r['peak_rss_mb']:6.0f} MB{tries}")
    print(f"engine start-up (load{', compile' if args.compile else ''}): "
          f"{engine['startup_s']:.0f} s, not timed")
    print(f"engine prefill: {engine['prefill_tokens_computed']} prompt tokens computed of "
          f"{engine['prompt_tokens']} ({engine['prefix_cache_hit_rate']:.0%} prefix-cache hits)")
    best = max(static, key=lambda r: r["tokens_per_s"])
    print(f"engine / best transformers static (batch {best['batch_size']}, {best['dtype']}): "
          f"{engine['tokens_per_s'] / best['tokens_per_s']:.2f}x")
    if cbs:
        best_cb = max(cbs, key=lambda r: r["tokens_per_s"])
        print(f"engine / best transformers continuous batching ({best_cb['dtype']}): "
              f"{engine['tokens_per_s'] / best_cb['tokens_per_s']:.2f}x")


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()
