"""The dispatch rule: CUDA tensors take Triton, CPU tensors take torch; impl= or QUERN_KERNELS
overrides, read at every call."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kernels
import kernels.dispatch as dispatch
import kernels.rms_norm_triton as rms_norm_triton_module


@pytest.fixture
def spies(monkeypatch):
    """Records which implementation each rms_norm call reached."""
    seen = []
    real_torch, real_triton = dispatch.rms_norm_torch, rms_norm_triton_module.rms_norm_triton

    def torch_spy(*args):
        seen.append("torch")
        return real_torch(*args)

    def triton_spy(*args):
        seen.append("triton")
        return real_triton(*args)

    monkeypatch.setattr(dispatch, "rms_norm_torch", torch_spy)
    monkeypatch.setattr(rms_norm_triton_module, "rms_norm_triton", triton_spy)
    monkeypatch.delenv("QUERN_KERNELS", raising=False)
    return seen


def call(impl=None, device="cpu"):
    x = torch.randn(2, 64, device=device)
    return kernels.rms_norm(x, torch.ones(64, device=device), 1e-6, impl=impl)


def test_cpu_tensors_take_torch_by_default(spies):
    call()
    assert spies == ["torch"]


def test_cuda_tensors_take_triton_by_default(monkeypatch):
    monkeypatch.delenv("QUERN_KERNELS", raising=False)
    assert kernels.use_triton(SimpleNamespace(is_cuda=True))
    assert not kernels.use_triton(SimpleNamespace(is_cuda=False))


def test_impl_argument_overrides_device(spies, device):
    call("triton", device)
    call("torch", device)
    assert spies == ["triton", "torch"]


def test_env_var_overrides_device_and_is_read_at_call_time(spies, monkeypatch, device):
    monkeypatch.setenv("QUERN_KERNELS", "triton")
    call(device=device)
    monkeypatch.setenv("QUERN_KERNELS", "torch")
    call(device=device)
    assert spies == ["triton", "torch"]


def test_impl_argument_beats_env_var(spies, monkeypatch):
    monkeypatch.setenv("QUERN_KERNELS", "triton")
    call("torch")
    assert spies == ["torch"]


def test_unknown_impl_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="cuda-graphs"):
        call("cuda-graphs")
    monkeypatch.setenv("QUERN_KERNELS", "numpy")
    with pytest.raises(ValueError, match="numpy"):
        call()


def test_triton_on_cpu_without_interpreter_says_how_to_fix(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.use_triton(torch.zeros(1), "triton")


def test_every_public_kernel_reaches_both_impls(monkeypatch, device):
    # A wrong import in one branch of the dispatch would otherwise only show on a GPU.
    monkeypatch.delenv("QUERN_KERNELS", raising=False)
    cache = torch.zeros(4, 16, 1, 64, device=device)
    key = torch.randn(3, 1, 64, device=device)
    slots = torch.tensor([0, 17, -1], device=device)
    cos_sin = kernels.build_cos_sin_cache(64, 32, 10000.0).to(device)
    q = torch.randn(3, 2, 64, device=device)
    int32 = {"dtype": torch.int32, "device": device}
    for impl in ("torch", "triton"):
        kernels.store_kv_cache(key, key, cache, cache.clone(), slots, impl=impl)
        kernels.rotary_embedding(torch.tensor([0, 1, 2], device=device), q, key, cos_sin, impl=impl)
        out = kernels.paged_attention(
            q, cache, cache, torch.tensor([[0, 1]], **int32), torch.tensor([20], **int32),
            torch.tensor([0, 3], **int32), 0.125, impl=impl,
        )
        assert out.shape == q.shape


def test_importing_kernels_leaves_triton_kernels_undecorated():
    # triton.jit chooses interpreter or compiler at decoration time, so `import kernels` must
    # not import the Triton modules; tests that set TRITON_INTERPRET later rely on it.
    code = (
        "import sys, kernels; "
        "bad = [m for m in sys.modules if m.startswith('kernels.') and m.endswith('_triton')]; "
        "assert not bad, bad"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=repo, timeout=120)
