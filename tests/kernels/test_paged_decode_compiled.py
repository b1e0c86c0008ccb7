"""The decode step a compiled forward runs in its graph (kernels/paged_decode_compiled.py): its
plan, and its answers against a dense float64 reference with and without the shared-prefix
cascade, for one sequence and many, with NaN in every slot no sequence owns, eagerly here and
compiled by inductor in a child process, where new batch sizes and lengths must not recompile.

Compiling imports inductor, which breaks the Triton interpreter the other kernel tests run on
for the rest of the process, hence the child.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.paged_decode_compiled import CASCADE_MIN_SEQS, paged_decode, plan_paged_decode
from tests.kernels.test_shared_prefix_decode import dense, shared_prefix_batch

REPO = Path(__file__).resolve().parents[2]
CASES = [
    [3, 1, 40],  # too few sequences for a cascade
    [1, 5, 16, 17, 40, 3, 33] * 5,  # 35 sequences: the cascade
    [9],  # one sequence, one block: the table is padded to two columns
    [2] * CASCADE_MIN_SEQS,  # every suffix within one block
    [7, 60, 2, 2, 31],
]


def run_case(suffix_lens: list[int], dtype: torch.dtype, decode=paged_decode, seed: int = 0):
    """One decode step: the last token of each sequence is new (its K/V not yet in the cache).
    Returns (out, expected, k_cache, slots, new_k)."""
    n = len(suffix_lens)
    q, kc, vc, bt, sl, _, keys, values = shared_prefix_batch(n, 3, suffix_lens, seed=seed)
    kc, vc = kc.to(dtype), vc.to(dtype)
    slots = torch.tensor([bt[s, (int(sl[s]) - 1) // 16] * 16 + (int(sl[s]) - 1) % 16
                          for s in range(n)])
    new_k = torch.stack([k[-1] for k in keys]).to(dtype)
    new_v = torch.stack([v[-1] for v in values]).to(dtype)
    kc.view(-1, 3, 64)[slots] = float("nan")  # the new token's slot is written by the step
    vc.view(-1, 3, 64)[slots] = float("nan")
    batch = plan_paged_decode(bt, sl.tolist(), 16)
    with torch.inference_mode():  # as in the engine
        out = decode(q.to(dtype).clone(), new_k.clone(), new_v.clone(), kc, vc, slots, batch,
                     0.125)
    expected = torch.stack([dense(q[s].to(dtype).float(), keys[s].to(dtype).float(),
                                  values[s].to(dtype).float(), 0.125) for s in range(n)])
    return out, expected, kc, slots, new_k


def test_plan_takes_the_shared_prefix_from_enough_sequences():
    for suffix_lens in CASES:
        n = len(suffix_lens)
        _, _, _, bt, sl, _, _, _ = shared_prefix_batch(n, 3, suffix_lens)
        batch = plan_paged_decode(bt, sl.tolist(), 16)
        assert (batch.prefix_blocks is not None) == (n >= CASCADE_MIN_SEQS)
        shared = 0 if batch.prefix_blocks is None else 3
        assert batch.lens.tolist() == [s + 3 * 16 - shared * 16 for s in suffix_lens]
        assert batch.table.shape[1] >= 2
        for s in range(n):  # a sequence's own blocks, then block 0 for the padding
            used = -(-int(batch.lens[s]) // 16)
            assert batch.table[s, :used].tolist() == bt[s, shared:shared + used].tolist()
            assert (batch.table[s, used:] == 0).all()


@pytest.mark.parametrize("suffix_lens", CASES[:3])
def test_eager_decode_stores_and_matches_dense(suffix_lens):
    out, expected, kc, slots, new_k = run_case(suffix_lens, torch.float32)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=0)
    torch.testing.assert_close(kc.view(-1, 3, 64)[slots], new_k, atol=0, rtol=0)


def test_compiled_decode_in_a_child_process():
    proc = subprocess.run(
        [sys.executable, "-c", "from tests.kernels.test_paged_decode_compiled import check; "
         "check()"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("compiled decode ok")


def check() -> None:
    from torch.fx.experimental import _config as fx_config

    def compiled(q, k, v, k_cache, v_cache, *args):
        for cache in (k_cache, v_cache):  # as the engine does: constants in the graph
            for dim in (1, 2, 3):
                torch._dynamo.mark_static(cache, dim)
        with fx_config.patch(use_duck_shape=False):  # as the engine's compiled forward
            return compiled_decode(q, k, v, k_cache, v_cache, *args)

    compiled_decode = torch.compile(paged_decode, dynamic=True)
    graphs = lambda: torch._dynamo.utils.counters["stats"]["unique_graphs"]  # noqa: E731
    for dtype, atol in ((torch.float32, 2e-5), (torch.bfloat16, 3e-2)):
        for step, suffix_lens in enumerate(CASES):
            if step == 2:
                before = graphs()  # with and without a prefix, both compiled by now
            out, expected, kc, slots, new_k = run_case(suffix_lens, dtype, compiled, seed=step)
            assert out.dtype == dtype
            torch.testing.assert_close(out.float(), expected, atol=atol, rtol=0)
            torch.testing.assert_close(kc.view(-1, 3, 64)[slots], new_k, atol=0, rtol=0)
        # One sequence is a size of 1, which dynamo specializes: at most that one more graph.
        assert graphs() - before <= 1, "new batch sizes or context lengths recompiled"
    print("compiled decode ok")
