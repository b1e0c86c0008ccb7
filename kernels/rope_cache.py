"""The cos/sin table that rotary_embedding reads, with the inverse frequencies computed as
transformers' modeling_rope_utils does (default, linear and llama3 rope types)."""

from __future__ import annotations

import math

import torch


def _inv_freq(head_dim: int, base: float, rope_scaling: dict | None) -> torch.Tensor:
    # Same expression and dtypes as transformers, so the table matches it to the last bit.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim
    inv_freq = 1.0 / (base**exponents)
    rope_type = "default"
    if rope_scaling:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / rope_scaling["factor"]
    if rope_type == "llama3":
        factor = rope_scaling["factor"]
        low_freq_factor = rope_scaling["low_freq_factor"]
        high_freq_factor = rope_scaling["high_freq_factor"]
        old_context_len = rope_scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context_len / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(f"unsupported rope_type {rope_type!r}; expected default, linear or llama3")


def build_cos_sin_cache(
    head_dim: int,
    max_position: int,
    base: float,
    rope_scaling: dict | None = None,
) -> torch.Tensor:
    """Returns [max_position, head_dim] float32 on the CPU: cos(pos * inv_freq) in the first
    half, sin in the second. rope_scaling is the HF config's dict (keys "rope_type" or "type",
    "factor", and for llama3 "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"); None means the default rope. Move it to the model's
    device once, not per call."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    inv_freq = _inv_freq(head_dim, base, rope_scaling)
    positions = torch.arange(max_position, dtype=torch.int64).to(torch.float)
    freqs = torch.outer(positions, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
