"""rotary_embedding and build_cos_sin_cache against transformers' LlamaRotaryEmbedding and
apply_rotary_pos_emb, for the default, linear and llama3 rope types."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import kernels

MAX_POSITION = 16384
ROPE_TYPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def hf_rotary(head_dim: int, base: float, rope_scaling: dict | None) -> LlamaRotaryEmbedding:
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=MAX_POSITION,
        rope_theta=base,
        rope_scaling=rope_scaling,
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("rope_type", list(ROPE_TYPES))
def test_cos_sin_cache_equals_hf_cos_sin(rope_type, head_dim):
    base = 500000.0
    rotary = hf_rotary(head_dim, base, ROPE_TYPES[rope_type])
    positions = torch.tensor([0, 1, 77, 4095, 8191, 12000, MAX_POSITION - 1])
    cos, sin = rotary(torch.zeros(1, 1, head_dim), positions[None])
    cache = kernels.build_cos_sin_cache(head_dim, MAX_POSITION, base, ROPE_TYPES[rope_type])
    assert cache.shape == (MAX_POSITION, head_dim) and cache.dtype == torch.float32
    half = head_dim // 2
    assert torch.equal(cache[positions, :half], cos[0, :, :half])
    assert torch.equal(cache[positions, half:], sin[0, :, :half])


def test_llama3_scaling_changes_only_low_frequencies():
    plain = kernels.build_cos_sin_cache(128, 9000, 500000.0, None)
    scaled = kernels.build_cos_sin_cache(128, 9000, 500000.0, ROPE_TYPES["llama3"])
    # The fastest frequency (column 0) is left alone; the slowest ones are divided by 8.
    assert torch.equal(plain[:, 0], scaled[:, 0])
    assert not torch.allclose(plain[:, 63], scaled[:, 63])


def test_unknown_rope_type_is_refused():
    with pytest.raises(ValueError, match="yarn"):
        kernels.build_cos_sin_cache(64, 100, 10000.0, {"rope_type": "yarn", "factor": 2.0})


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize(
    ("dtype", "atol", "rtol"),
    # A last-bit difference is allowed: Triton fuses multiply-adds, and the interpreter
    # truncates to bfloat16 where torch rounds.
    [(torch.float32, 1e-5, 1e-5), (torch.float16, 2e-3, 2**-10), (torch.bfloat16, 2e-2, 2**-7)],
)
@pytest.mark.parametrize(("rope_type", "head_dim"), [("default", 64), ("llama3", 128)])
def test_matches_hf_apply_rotary_pos_emb(impl, rope_type, head_dim, dtype, atol, rtol, device):
    base = 10000.0 if rope_type == "default" else 500000.0
    rope_scaling = ROPE_TYPES[rope_type]
    gen = torch.Generator().manual_seed(head_dim)
    num_tokens, num_heads, num_kv_heads = 9, 6, 2
    positions = torch.randint(0, MAX_POSITION, (num_tokens,), generator=gen)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    q_dev, k_dev = q.to(device), k.to(device)

    cache = kernels.build_cos_sin_cache(head_dim, MAX_POSITION, base, rope_scaling).to(device)
    q_out, k_out = kernels.rotary_embedding(positions.to(device), q_dev, k_dev, cache, impl=impl)
    q_out, k_out = q_out.cpu(), k_out.cpu()

    # HF wants [batch, heads, tokens, head_dim]; its cos/sin are computed in float32 here and
    # the rotation in float32, then rounded, as the kernels do.
    rotary = hf_rotary(head_dim, base, rope_scaling)
    cos, sin = rotary(torch.zeros(1, 1, head_dim), positions[None])
    q_ref, k_ref = apply_rotary_pos_emb(
        q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None], cos, sin
    )
    q_ref, k_ref = q_ref[0].transpose(0, 1).to(dtype), k_ref[0].transpose(0, 1).to(dtype)
    assert q_out.dtype == dtype and k_out.dtype == dtype
    torch.testing.assert_close(q_out, q_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(k_out, k_ref, atol=atol, rtol=rtol)
    assert torch.equal(q_dev.cpu(), q) and torch.equal(k_dev.cpu(), k)


def test_triton_rotary_reads_strided_views(device):
    cache = kernels.build_cos_sin_cache(64, 512, 10000.0, None).to(device)
    qkv = torch.randn(5, 6 + 2 + 2, 64, device=device)
    q, k = qkv[:, :6], qkv[:, 6:8]
    positions = torch.tensor([0, 3, 100, 511, 7], device=device)
    want_q, want_k = kernels.rotary_embedding(positions, q, k, cache, impl="torch")
    got_q, got_k = kernels.rotary_embedding(positions, q, k, cache, impl="triton")
    torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=0)


def test_torch_twin_equals_hf_bit_for_bit_and_reuses_its_step_cache():
    head_dim, base = 64, 10000.0
    gen = torch.Generator().manual_seed(1)
    positions = torch.randint(0, MAX_POSITION, (7,), generator=gen)
    cache = kernels.build_cos_sin_cache(head_dim, MAX_POSITION, base, None)
    cos, sin = hf_rotary(head_dim, base, None)(torch.zeros(1, 1, head_dim), positions[None])
    step: dict = {}
    for _layer in range(3):  # one step cache for every layer of a forward
        q = torch.randn(7, 6, head_dim, generator=gen)
        k = torch.randn(7, 2, head_dim, generator=gen)
        q_out, k_out = kernels.rotary_embedding(positions, q, k, cache, impl="torch",
                                                step_cache=step)
        q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                            cos, sin)
        assert torch.equal(q_out, q_ref[0].transpose(0, 1))
        assert torch.equal(k_out, k_ref[0].transpose(0, 1))
    assert list(step) == ["rotary"]
