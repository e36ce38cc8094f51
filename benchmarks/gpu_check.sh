#!/usr/bin/env bash
# The GPU check (docs/gpu.md): the CUDA tests, then benchmarks.gpu_check; logs and figures under $OUT.
#
#   bash benchmarks/gpu_check.sh            # from anywhere in the tree; OUT defaults to runs/gpu_check
#
# Needs one NVIDIA GPU and a python3 with PyTorch (CUDA), numba, pyarrow, safetensors, tqdm and
# matplotlib; nothing is installed. A pure-Python package that python lacks (tomli-w) may lie as a
# wheel in .whl/: wheels there are imported as they are. About 4 minutes on an H200 host; the two timeouts keep it under 8.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for w in .whl/*.whl; do
    [ -e "$w" ] && PYTHONPATH="$PYTHONPATH:$PWD/$w"
done
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-default}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, tomli_w; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name())" || exit 2

start=$(date +%s)
timeout 270 $PY -m pytest -m cuda tests/cuda -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_cuda.log"
tests=${PIPESTATUS[0]}
echo "cuda tests: exit $tests in $(( $(date +%s) - start )) s"

start=$(date +%s)
timeout 200 $PY -m benchmarks.gpu_check --out "$OUT/gpu_check.json" ${GPU_CHECK_ARGS:-} 2>&1 | tee "$OUT/gpu_check.log"
bench=${PIPESTATUS[0]}
echo "benchmarks.gpu_check: exit $bench in $(( $(date +%s) - start )) s"
exit $(( tests != 0 ? tests : bench ))
