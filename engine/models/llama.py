"""The Llama family from one implementation, driven by the HF config.

Llama 2/3 (llama3 rope scaling), Mistral, SmolLM2, Qwen2/2.5 (bias on q, k, v) and Qwen3
(RMSNorm on each head of q and k). q/k/v and gate/up are fused into one matmul each; the
embedding may be tied to the LM head. Logits are computed only at the positions sampled.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.attention import AttentionMetadata, paged_attention_layer
from engine.layers.linear import Linear, can_pack, pack_linears, pack_weight, packed_linear
from kernels import build_cos_sin_cache, rms_norm, rotary_embedding


def rope_settings(config) -> tuple[float, dict | None]:
    """(rope_theta, scaling dict or None) from either generation of HF config."""
    params = getattr(config, "rope_parameters", None)
    if params:
        params = dict(params)
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        return float(theta), params if params.get("rope_type", "default") != "default" else None
    return float(getattr(config, "rope_theta", 10000.0)), getattr(config, "rope_scaling", None)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, kernels: str | None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernels = kernels

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual, impl=self.kernels)


class LlamaAttention(nn.Module):
    def __init__(self, config, kernels: str | None):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        bias = config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)
        self.qk_norm = config.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, kernels)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, kernels)

    def forward(self, positions, hidden, kv_cache, meta: AttentionMetadata, cos_sin_cache):
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view_as(q)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view_as(k)
        q, k = rotary_embedding(positions, q, k, cos_sin_cache, impl=meta.kernels,
                                step_cache=meta.step_cache)
        out = paged_attention_layer(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(-1, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.intermediate = config.intermediate_size
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.intermediate, bias=bias)
        self.down_proj = Linear(self.intermediate, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, kernels: str | None):
        super().__init__()
        self.self_attn = LlamaAttention(config, kernels)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)

    def forward(self, positions, hidden, residual, kv_cache, meta, cos_sin_cache):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta, cos_sin_cache)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, max_position: int, kernels: str | None = None):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, kernels) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)
        self.tied_head_packed: torch.Tensor | None = None
        self.init_rope(max_position)

    def init_rope(self, max_position: int) -> None:
        """Build the rotary cos/sin table [max_position, head_dim] on the model's device."""
        theta, scaling = rope_settings(self.config)
        head_dim = self.layers[0].self_attn.head_dim
        device = self.embed_tokens.weight.device
        if device.type == "meta":
            return
        self.cos_sin_cache = build_cos_sin_cache(head_dim, max_position, theta, scaling).to(device)

    def pack_for_cpu(self, layers: bool = True) -> int:
        """Lay the linear weights out for oneDNN once (engine/layers/linear.py); a tied LM
        head gets a packed copy, the embedding keeps its rows. `layers=False` packs only the
        LM head. Returns how many were packed."""
        if layers:
            count = pack_linears(self)
        else:  # the untied head still runs outside any compiled graph
            count = int(not self.tie_word_embeddings and self.lm_head.pack())
        if self.tie_word_embeddings and can_pack(self.embed_tokens.weight):
            self.tied_head_packed = pack_weight(self.embed_tokens.weight)
            count += 1
        return count

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] after the final norm."""
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta,
                                     self.cos_sin_cache)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.tie_word_embeddings:
            return self.lm_head(hidden).float()
        if self.tied_head_packed is not None:
            return packed_linear(hidden, self.tied_head_packed).float()
        return F.linear(hidden, self.embed_tokens.weight).float()

    @torch.no_grad()
    def load_hf_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy weights named as in transformers' Llama/Qwen checkpoints, fusing q/k/v and
        gate/up."""
        own = dict(self.named_parameters())

        def put(name: str, tensor: torch.Tensor) -> None:
            own.pop(name).copy_(tensor)

        put("embed_tokens.weight", state["model.embed_tokens.weight"])
        put("norm.weight", state["model.norm.weight"])
        if not self.tie_word_embeddings:
            put("lm_head.weight", state["lm_head.weight"])
        for i in range(len(self.layers)):
            src, dst = f"model.layers.{i}.", f"layers.{i}."
            attn = src + "self_attn."
            put(dst + "self_attn.qkv_proj.weight", torch.cat(
                [state[attn + p + "_proj.weight"] for p in ("q", "k", "v")]))
            if self.layers[i].self_attn.qkv_proj.bias is not None:
                put(dst + "self_attn.qkv_proj.bias", torch.cat(
                    [state[attn + p + "_proj.bias"] for p in ("q", "k", "v")]))
            put(dst + "self_attn.o_proj.weight", state[attn + "o_proj.weight"])
            if self.layers[i].self_attn.qk_norm:
                put(dst + "self_attn.q_norm.weight", state[attn + "q_norm.weight"])
                put(dst + "self_attn.k_norm.weight", state[attn + "k_norm.weight"])
            mlp = src + "mlp."
            put(dst + "mlp.gate_up_proj.weight", torch.cat(
                [state[mlp + "gate_proj.weight"], state[mlp + "up_proj.weight"]]))
            if self.layers[i].mlp.down_proj.bias is not None:
                put(dst + "mlp.gate_up_proj.bias", torch.cat(
                    [state[mlp + "gate_proj.bias"], state[mlp + "up_proj.bias"]]))
                put(dst + "mlp.down_proj.bias", state[mlp + "down_proj.bias"])
            put(dst + "mlp.down_proj.weight", state[mlp + "down_proj.weight"])
            put(dst + "input_layernorm.weight", state[src + "input_layernorm.weight"])
            put(dst + "post_attention_layernorm.weight",
                state[src + "post_attention_layernorm.weight"])
        if own:
            raise ValueError(f"weights missing from the checkpoint: {sorted(own)[:5]}")


SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
