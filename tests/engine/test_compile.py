"""EngineConfig(compile_model=True): the forward under torch.compile (decode steps' attention
in the graph, other steps' behind the opaque quern::attention op) gives the eager engine's
logits and tokens, for one sequence and for a batch that shares a prefix, and decoding does
not recompile.

torch.compile changes process-wide state (dynamo's caches; inductor imports Triton in a way
that breaks the interpreter the kernel tests run on), so the checks run in a child process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def test_compiled_engine_matches_eager_in_a_child_process():
    proc = subprocess.run(
        [sys.executable, "-c", "from tests.engine.test_compile import check; check()"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("compiled forward ok")


def check() -> None:
    from engine import EngineConfig, LLMEngine
    from tests.conftest import make_byte_tokenizer, tiny_hf_model
    from tests.engine.test_tiny_models import engine_logits

    tokenizer = make_byte_tokenizer()
    model = tiny_hf_model("llama")
    prompt = list(range(3, 40))
    chunks = [20, 10] + [1] * 7  # prefill, chunked prefill, then decode over the cache
    for dtype, atol in ((torch.float32, 1e-4), (torch.bfloat16, 0.05)):

        def build(compile_model: bool, dtype=dtype):
            return LLMEngine(model.config, model.state_dict(), tokenizer,
                             EngineConfig(num_kv_blocks=16, compile_model=compile_model),
                             dtype=dtype)

        eager = engine_logits(build(False), prompt, chunks)
        torch._dynamo.reset()
        compiled_engine = build(True)  # compiles at start-up, for one token and for many
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        compiled = engine_logits(compiled_engine, prompt, chunks)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, "recompiled"
        torch.testing.assert_close(compiled, eager, atol=atol * eager.abs().max().item(),
                                   rtol=0)
    check_batch(model, tokenizer)
    q = torch.zeros(1, 2, 4)
    try:
        torch.ops.quern.attention(q, q[:, :1], q[:, :1], torch.zeros(1, 16, 1, 4),
                                  torch.zeros(1, 16, 1, 4), 0.5)
    except RuntimeError as e:
        assert "forward_context" in str(e)
    else:
        raise AssertionError("quern::attention ran without a forward context")
    print("compiled forward ok")


def check_batch(model, tokenizer) -> None:
    """40 requests sharing a 48-token prompt prefix, prefilled together then decoding with the
    shared prefix attended once (the cascade graph), and without it once fewer than 32
    remain: every step's logits and every token as the eager engine's, in float32."""
    from engine import EngineConfig, LLMEngine, SamplingParams

    prefix = list(range(3, 51))
    prompts = [prefix + [60 + i, 100 + i % 7] for i in range(40)]

    def run(compile_model: bool):
        engine = LLMEngine(model.config, model.state_dict(), tokenizer,
                           EngineConfig(num_kv_blocks=256, compile_model=compile_model),
                           dtype=torch.float32)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        steps, real = [], engine.runner.execute

        def execute(scheduled):
            logits, sampled = real(scheduled)
            steps.append(logits.clone())
            return logits, sampled

        engine.runner.execute = execute
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, SamplingParams(
                temperature=0, max_tokens=3 + i % 11, ignore_eos=True))
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for inc in engine.step():
                tokens.setdefault(inc.request_id, []).extend(inc.token_ids)
        if compile_model:
            assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, \
                "recompiled"
        return steps, tokens

    eager_steps, eager_tokens = run(False)
    torch._dynamo.reset()
    compiled_steps, compiled_tokens = run(True)
    assert compiled_tokens == eager_tokens
    assert len(compiled_steps) == len(eager_steps)
    for compiled, eager in zip(compiled_steps, eager_steps, strict=True):
        torch.testing.assert_close(compiled, eager, atol=1e-4 * eager.abs().max().item(),
                                   rtol=0)
