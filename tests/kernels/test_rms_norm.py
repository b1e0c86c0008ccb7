"""rms_norm, both impls, against transformers' own LlamaRMSNorm."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import kernels

EPS = 1e-5
# Per dtype: how far Triton may differ from HF. Its sum and rsqrt round differently, and the
# interpreter truncates to bfloat16 where torch rounds, at each of up to three roundings.
TRITON_TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (4e-3, 1e-2),
    torch.bfloat16: (3e-2, 3e-2),
}


def hf_norm(hidden: int, dtype: torch.dtype, seed: int = 0) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(hidden, eps=EPS).to(dtype)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        norm.weight.copy_(1 + 0.5 * torch.randn(hidden, generator=gen))
    return norm


def check(out: torch.Tensor, ref: torch.Tensor, impl: str) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if impl == "torch":
        # The twin runs HF's exact operations, so it must match to the bit.
        assert torch.equal(out, ref)
    else:
        atol, rtol = TRITON_TOL[ref.dtype]
        torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("hidden", [576, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_hf_llama_rms_norm(impl, dtype, hidden, device):
    norm = hf_norm(hidden, dtype)
    x = (3 * torch.randn(7, hidden)).to(dtype)
    weight = norm.weight.detach().to(device)
    out = kernels.rms_norm(x.to(device), weight, EPS, impl=impl)
    check(out.cpu(), norm(x).detach(), impl)


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_residual_add_matches_add_then_hf_norm(impl, dtype, device):
    norm = hf_norm(576, dtype, seed=1)
    x = torch.randn(5, 576).to(dtype)
    residual = (4 * torch.randn(5, 576)).to(dtype)
    x_dev, residual_dev = x.to(device), residual.to(device)
    weight = norm.weight.detach().to(device)
    out, new_residual = kernels.rms_norm(x_dev, weight, EPS, residual_dev, impl=impl)
    out, new_residual = out.cpu(), new_residual.cpu()
    if impl == "triton" and dtype == torch.bfloat16:
        # The interpreter truncates float32 -> bfloat16 where a GPU rounds to nearest even,
        # so here the sum may be one bfloat16 ulp off (test_gpu.py asserts it exactly).
        torch.testing.assert_close(new_residual, x + residual, atol=0, rtol=2**-7)
    else:
        assert torch.equal(new_residual, x + residual)
    check(out, norm(x + residual).detach(), impl)
    assert torch.equal(x_dev.cpu(), x) and torch.equal(residual_dev.cpu(), residual)


def test_triton_reads_rows_of_a_strided_view(device):
    norm = hf_norm(64, torch.float32)
    wide = torch.randn(6, 96)
    x = wide[:, 16:80]
    weight = norm.weight.detach().to(device)
    out = kernels.rms_norm(wide.to(device)[:, 16:80], weight, EPS, impl="triton")
    torch.testing.assert_close(out.cpu(), norm(x).detach(), atol=1e-5, rtol=1e-5)
