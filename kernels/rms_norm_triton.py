"""RMSNorm with an optional fused residual add (Triton), matching HF's LlamaRMSNorm.

One program per token holds the whole hidden row, so the mean of squares and the scaling happen
in one pass over registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Widest row one program keeps in registers; Llama-family hidden sizes stay well under it.
MAX_HIDDEN = 65536


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_residual, stride_out, stride_residual_out,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=ok, other=0.0)
        # Rounded to x's dtype before the norm, as HF keeps its residual stream.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    # HF rounds the normalized row to the input dtype before the weight multiply; so do we.
    normed = (xf * inv_rms).to(x.dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (normed * weight).to(x.dtype), mask=ok)


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [num_tokens, hidden] (any row stride), weight [hidden] (any float dtype),
    residual [num_tokens, hidden] in x's dtype or None.
    Returns out [num_tokens, hidden] in x's dtype, or (out, x + residual) with residual given;
    new contiguous tensors, inputs untouched."""
    if x.dim() != 2:
        raise ValueError(f"x must be [num_tokens, hidden], got {tuple(x.shape)}")
    num_tokens, hidden = x.shape
    if weight.shape != (hidden,):
        raise ValueError(f"weight {tuple(weight.shape)} must be [{hidden}]")
    if hidden > MAX_HIDDEN:
        raise ValueError(f"hidden {hidden} exceeds {MAX_HIDDEN}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} must match x")
    rows = [x, weight] if residual is None else [x, weight, residual]
    if any(t.stride(-1) != 1 for t in rows):
        raise ValueError("x, weight and residual must be contiguous in their last dim")
    out = torch.empty((num_tokens, hidden), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(out) if residual is not None else out
    if num_tokens:
        _rms_norm_kernel[(num_tokens,)](
            x, residual if residual is not None else x, weight, out, residual_out,
            x.stride(0),
            residual.stride(0) if residual is not None else 0,
            out.stride(0),
            residual_out.stride(0),
            hidden,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=triton.next_power_of_2(hidden),
        )
    return out if residual is None else (out, residual_out)
