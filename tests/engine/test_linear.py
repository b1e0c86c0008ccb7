"""Linear layers packed for oneDNN (engine/layers/linear.py): the same bits as F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers.linear import Linear, can_pack

needs_packing = pytest.mark.skipif(
    not can_pack(torch.empty(1, dtype=torch.bfloat16)),
    reason="this torch has no oneDNN weight packing on the CPU")


@needs_packing
@pytest.mark.parametrize("rows", [1, 4, 63, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_bfloat16_linear_equals_f_linear_bit_for_bit(rows, bias):
    torch.manual_seed(0)
    layer = Linear(576, 960, bias=bias).to(torch.bfloat16)
    weight = layer.weight.detach().clone()
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    expected = F.linear(x, weight, layer.bias)
    assert layer.pack()
    assert layer.weight.device.type == "meta"  # the row-major copy is gone
    with torch.inference_mode():
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_float32_and_other_layers_stay_as_they_are():
    layer = Linear(8, 4)
    assert not layer.pack()
    assert layer.weight.device.type == "cpu" and layer.packed is None
    x = torch.randn(3, 8)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


@needs_packing
@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: q/k/v bias and a tied head
def test_packed_bfloat16_model_gives_the_logits_of_the_unpacked_one(byte_tokenizer, kind,
                                                                  monkeypatch):
    from engine import EngineConfig, LLMEngine
    from engine.models.llama import LlamaForCausalLM
    from tests.conftest import tiny_hf_model
    from tests.engine.test_tiny_models import engine_logits

    model = tiny_hf_model(kind)
    prompt = list(range(3, 30))
    chunks = [20] + [1] * 7

    def run():
        engine = LLMEngine(model.config, model.state_dict(), byte_tokenizer,
                           EngineConfig(num_kv_blocks=16), dtype=torch.bfloat16)
        return engine, engine_logits(engine, prompt, chunks)

    packed_engine, packed = run()
    assert packed_engine.runner.model.layers[0].mlp.down_proj.packed is not None
    monkeypatch.setattr(LlamaForCausalLM, "pack_for_cpu", lambda self, layers=True: 0)
    plain_engine, plain = run()
    assert plain_engine.runner.model.layers[0].mlp.down_proj.packed is None
    torch.testing.assert_close(packed, plain, atol=0, rtol=0)
