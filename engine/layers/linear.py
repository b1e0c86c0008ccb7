"""Linear layers whose bfloat16 weights are laid out once for oneDNN on the CPU.

A plain bfloat16 `F.linear` on the CPU hands oneDNN a row-major weight, which it reorders into
its blocked layout on every call: for a small decode batch that is a second full pass over the
weight, and the matmul is bound by reading weights. Reordering once at load time, with the
same oneDNN kernel at call time, gives the same bits (checked in tests/engine/test_linear.py)
and measured 1.3-1.4x faster over SmolLM2's 30 layers (1 to 300 rows). float32 gains nothing
from it and its rounding would change, so it is left alone, as are other devices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The batch size oneDNN is told to lay the weight out for; any row count works at call time.
PACK_ROWS_HINT = 64


def can_pack(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class Linear(nn.Linear):
    """nn.Linear that, once `pack()`ed, multiplies by the oneDNN-laid-out copy of its weight.

    Packing drops the row-major weight (it would only double the memory) by moving it to the
    meta device: a packed layer is for inference, and code that reads `.weight` afterwards
    fails loudly instead of reading stale numbers."""

    packed: torch.Tensor | None = None

    def pack(self) -> bool:
        if not can_pack(self.weight):
            return False
        self.packed = pack_weight(self.weight)
        self.weight = nn.Parameter(self.weight.detach().to("meta"), requires_grad=False)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_linear(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)


def pack_linears(model: nn.Module) -> int:
    """Pack every `Linear` of the model that can be; returns how many were."""
    return sum(m.pack() for m in model.modules() if isinstance(m, Linear))
