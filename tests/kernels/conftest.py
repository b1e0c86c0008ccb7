"""Kernel tests run every Triton kernel: on CPU through the Triton interpreter, or with real
Triton on CUDA where there is a GPU.

TRITON_INTERPRET must be set before `triton.jit` decorates the kernels, which happens when the
kernels' Triton modules are first imported. kernels.dispatch imports them lazily, so setting it
here, at conftest import, is early enough even if another test package imported `kernels`.
It is not set on a GPU machine: an interpreted kernel on CUDA tensors would not test Triton.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def kernel_device() -> str:
    """CUDA when real Triton can run there, else CPU (the interpreter's home)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return "cuda" if torch.cuda.is_available() and not interpreted else "cpu"


@pytest.fixture
def device() -> str:
    return kernel_device()


@pytest.fixture(autouse=True)
def seeded():
    """Same random inputs on every run, so a tolerance that passes once passes always."""
    torch.manual_seed(0)
