"""Plain-torch twin of rms_norm_triton, written to equal HF's LlamaRMSNorm bit for bit."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    # torch's rms_norm without a weight is HF's float32 normalization rounded back to x's
    # dtype, op for op (tests/kernels/test_rms_norm.py holds it to the bit), in one call
    # instead of five; HF then multiplies by the weight in x's dtype, as here.
    out = (weight * F.rms_norm(x, (x.shape[-1],), None, eps)).to(x.dtype)
    return out if residual is None else (out, x)
