"""The inductor-compiled CPU decode kernel (kernels/paged_decode_compiled.py), through the torch
twin's compiled=True: the same answers as a dense float64 reference, with and without the
shared-prefix cascade, one sequence, decode mixed with prefill, NaN in every slot no sequence
owns; and the sizes that change from step to step do not recompile it.

Compiling imports inductor, which breaks the Triton interpreter the other kernel tests run on
for the rest of the process, so the checks run in a child process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def test_compiled_decode_in_a_child_process():
    proc = subprocess.run(
        [sys.executable, "-c", "from tests.kernels.test_paged_decode_compiled import check; "
         "check()"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("compiled decode ok")


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def check() -> None:
    from kernels import paged_attention
    from kernels.paged_attention_torch import COMPILED_CASCADE_MIN_SEQS, _plan_compiled_decode
    from tests.kernels.paged_cases import dense_causal_attention, make_paged_batch
    from tests.kernels.test_shared_prefix_decode import dense, shared_prefix_batch

    def attend(q, kc, vc, bt, sl, qsl, dtype, scale=0.125):
        with torch.inference_mode():  # as in the engine, q is made under inference mode
            q = q.to(dtype).clone()
            return paged_attention(q, kc.to(dtype), vc.to(dtype), bt, sl, qsl, scale,
                                   impl="torch", step_cache={}, compiled=True)

    for dtype, atol in ((torch.float32, 2e-5), (torch.bfloat16, 3e-2)):
        cases = [
            [3, 1, 40],  # too few for a cascade
            [1, 5, 16, 17, 40, 3, 33] * 5,  # 35 sequences: the cascade
            [9],  # one sequence, padded to two inside
            [2] * COMPILED_CASCADE_MIN_SEQS,  # every suffix in one block
            [7, 60, 2, 2, 31],
        ]
        for step, suffix_lens in enumerate(cases):
            if step == 2:
                graphs = _graphs()  # both graphs (with and without a prefix) exist by now
            n = len(suffix_lens)
            q, kc, vc, bt, sl, qsl, keys, values = shared_prefix_batch(n, 3, suffix_lens,
                                                                       seed=step)
            plan = _plan_compiled_decode(list(range(n)), list(range(n)), sl.tolist(), bt, 16,
                                         whole_batch=True)
            assert (plan.prefix_blocks is not None) == (n >= COMPILED_CASCADE_MIN_SEQS)
            out = attend(q, kc, vc, bt, sl, qsl, dtype)
            assert out.dtype == dtype and out.shape == q.shape
            for s in range(n):
                expected = dense(q[s].to(dtype).float(), keys[s].to(dtype).float(),
                                 values[s].to(dtype).float(), 0.125)
                torch.testing.assert_close(out[s].float(), expected, atol=atol, rtol=0)
        assert _graphs() == graphs, "a new batch size or context length recompiled"

        # Decode tokens among prefills: the decode rows come back in their places.
        batch = make_paged_batch([(30, 1), (0, 7), (50, 1), (12, 5), (3, 1)], num_kv_heads=2,
                                 group=4, head_dim=32, block_size=16, padding=-1)
        out = attend(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                     batch.seq_lens, batch.query_start_loc, dtype, batch.scale)
        torch.testing.assert_close(out.float(), dense_causal_attention(batch),
                                   atol=10 * atol, rtol=0)
    print("compiled decode ok")
