"""Fixtures shared by every test folder: the embedded SmolLM2 (loaded once per session) and
tiny random-weight models built from HF config classes."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return  # spares the API tests a torch import
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; the same logic runs on CPU elsewhere")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2():
    """(HF model, tokenizer, engine LLM) for the embedded default, float32, CPU, loaded once.

    The engine is built from the same state dict the HF model holds, so both read the same
    dequantized GGUF weights.
    """
    import torch

    from engine import LLM, LLMEngine
    from engine.loader import load_hf_weights, load_tokenizer, resolve_model

    source = resolve_model("smollm2")
    hf_config, state = load_hf_weights(source, torch.float32)
    tokenizer = load_tokenizer(source)
    from transformers import AutoModelForCausalLM

    hf_model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    hf_model.load_state_dict(state)
    hf_model.eval()
    engine = LLMEngine(hf_config, state, tokenizer, model_name="smollm2")
    return hf_model, tokenizer, LLM.from_engine(engine)


@pytest.fixture(scope="session")
def byte_tokenizer():
    return make_byte_tokenizer()


def make_byte_tokenizer():
    """A small byte-level BPE tokenizer trained in milliseconds, with an EOS token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the quick brown fox jumps over the lazy dog"] * 20 + ["héllo wörld ✓ 🙂 日本語"] * 5
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


TINY_CONFIGS = {
    "llama": dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 64}),
    "qwen2": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1),
    "qwen3": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16),
}


def tiny_hf_model(kind: str, vocab_size: int = 320, seed: int = 0):
    """A random-weight HF model of the given family with GQA, float32."""
    import torch
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[kind]
    config = cls(vocab_size=vocab_size, intermediate_size=128,
                 num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                 tie_word_embeddings=(kind == "qwen2"), initializer_range=0.2,
                 **TINY_CONFIGS[kind])
    torch.manual_seed(seed)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_engine(byte_tokenizer):
    """Build an LLMEngine over a tiny random model: tiny_engine("llama", num_kv_blocks=...)."""
    from engine import EngineConfig, LLMEngine

    def build(kind: str = "llama", seed: int = 0, **config):
        model = tiny_hf_model(kind, seed=seed)
        engine = LLMEngine(model.config, model.state_dict(), byte_tokenizer,
                           EngineConfig(**config), model_name=f"tiny-{kind}")
        return engine, model

    return build
