"""The engine end to end on the Triton kernels (the interpreter on CPU, compiled on CUDA)
produces the same greedy tokens as on the plain-torch twins."""

from __future__ import annotations

import pytest

from engine import LLM, EngineConfig, LLMEngine, SamplingParams

PROMPTS = ["the quick brown fox", "jumps over the lazy dog, then the quick brown fox runs"]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_tokens_on_triton_equal_torch(kind, device, byte_tokenizer):
    from tests.conftest import tiny_hf_model

    model = tiny_hf_model(kind)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outputs = {}
    for impl in ("torch", "triton"):
        engine = LLMEngine(model.config, model.state_dict(), byte_tokenizer,
                           EngineConfig(num_kv_blocks=16, block_size=16, kernels=impl),
                           device=device)
        # A budget of 8 forces a chunked prefill over cached blocks, then decodes mixed in.
        engine.config.max_num_batched_tokens = 8
        outputs[impl] = [o.token_ids for o in LLM.from_engine(engine).generate(PROMPTS, params)]
    assert outputs["triton"] == outputs["torch"]
    assert all(len(t) == 6 for t in outputs["torch"])
