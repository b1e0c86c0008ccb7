#!/usr/bin/env bash
# The one device check, for a session that is lent a CUDA machine: the CUDA kernel tests, the
# engine on compiled Triton against the torch path, and the kernel bandwidth benchmark.
# It installs nothing: it runs on a machine whose python3 already has torch, triton and
# transformers (as the lent H200 image does), from the repository root.
#   bash bench/gpu_check.sh            # prints everything; exits non-zero on a failed test
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gpu.py \
  tests/kernels/test_engine_triton.py tests/kernels/test_shared_prefix_decode.py 2>&1 \
  | tee "$out/gpu_tests.log"
status=${PIPESTATUS[0]}
python3 bench/kernels.py 2>&1 | tee "$out/gpu_bench.log"
exit "$status"
