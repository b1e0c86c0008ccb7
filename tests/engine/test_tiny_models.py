"""Logits of the engine's Llama-family model against the HF model, on tiny random weights."""

from __future__ import annotations

import pytest
import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams
from engine.sequence import Request


def engine_logits(engine, prompt: list[int], chunks: list[int]) -> torch.Tensor:
    """Run ``prompt`` through the engine's runner in consecutive chunks (a chunked prefill over
    the paged cache) and return the logits of every position."""
    bm, runner = engine.block_manager, engine.runner
    req = Request("r", prompt, SamplingParams(), IncrementalDetokenizer(engine.tokenizer, [],
                  False), None, 1)
    rows = []
    for n in chunks:
        assert bm.allocate(req, n)
        with torch.inference_mode():  # as ModelRunner.execute
            ids, positions, meta, _, _ = runner.prepare([(req, n)])
            hidden = runner.forward(ids, positions, runner.kv_caches, meta)
            rows.append(runner.model.compute_logits(hidden))
        req.num_computed_tokens += n
    bm.free(req)
    return torch.cat(rows)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("length", [15, 16, 17, 40])
def test_logits_match_hf_model(tiny_engine, kind, length):
    engine, hf_model = tiny_engine(kind, num_kv_blocks=64, block_size=16)
    prompt = torch.randint(0, 320, (length,), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        expected = hf_model(prompt[None]).logits[0].float()
    prompt = prompt.tolist()
    whole = engine_logits(engine, prompt, [length])
    torch.testing.assert_close(whole, expected, atol=1e-4, rtol=0)
    # A chunked prefill then token-by-token decode reads earlier blocks through the table.
    split = length // 2
    pieces = engine_logits(engine, prompt, [split] + [1] * (length - split))
    torch.testing.assert_close(pieces, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kv_cache_dtype,expected", [("auto", torch.bfloat16),
                                                      ("float32", torch.float32)])
def test_bfloat16_model_on_cpu_gives_close_logits(byte_tokenizer, kv_cache_dtype, expected):
    from engine import EngineConfig, LLMEngine
    from tests.conftest import tiny_hf_model

    model = tiny_hf_model("llama")
    prompt = list(range(3, 40))
    chunks = [20, 10] + [1] * 7  # prefill, chunked prefill, then decode over the cache
    reference = engine_logits(
        LLMEngine(model.config, model.state_dict(), byte_tokenizer,
                  EngineConfig(num_kv_blocks=16), dtype=torch.float32), prompt, chunks)
    engine = LLMEngine(model.config, model.state_dict(), byte_tokenizer,
                       EngineConfig(num_kv_blocks=16, kv_cache_dtype=kv_cache_dtype),
                       dtype=torch.bfloat16)
    assert engine.runner.kv_caches[0][0].dtype == expected
    error = (engine_logits(engine, prompt, chunks) - reference).abs().max()
    assert error / reference.abs().max() < 0.05  # bfloat16 keeps about 3 significant digits
