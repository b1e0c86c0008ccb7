"""Plain-torch twin of rms_norm_triton, written to equal HF's LlamaRMSNorm bit for bit."""

from __future__ import annotations

import torch


def rms_norm_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [num_tokens, hidden], weight [hidden], residual [num_tokens, hidden] or None.
    Returns rms_norm(x) * weight, or (rms_norm(x + residual) * weight, x + residual), new
    tensors in x's dtype."""
    if residual is not None:
        # The sum is rounded to x's dtype before the norm, as in HF's decoder layer, where the
        # residual stream is kept in the model dtype.
        x = x + residual
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    out = (weight * hidden.to(x.dtype)).to(x.dtype)
    return out if residual is None else (out, x)
