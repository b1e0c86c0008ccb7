"""Kernel tests run every Triton kernel on CPU through the Triton interpreter.

TRITON_INTERPRET must be set before `triton.jit` decorates the kernels, which happens when the
kernels' Triton modules are first imported; kernels.dispatch imports them lazily, so setting it
here, at conftest import, is early enough even when other test packages imported `kernels`.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
