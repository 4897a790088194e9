#!/usr/bin/env bash
# Python package tests (called by scripts/run_tests.sh).
#   1. a virtual environment (python/build/test-venv, or SPATTN_TEST_VENV=/existing/venv to reuse
#      one, e.g. one that has torch);
#   2. pip install numpy and the package from this checkout (`pip install ./python`; the build
#      runs CMake on the repository, CPU-only unless SPATTN_CUDA is set);
#   3. python/tests/run.py: NumPy tests always, PyTorch tests when torch is importable (skipped
#      with a printed reason otherwise).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${SPATTN_TEST_VENV:-$PWD/build/test-venv}
export SPATTN_CUDA=${SPATTN_CUDA:-OFF}
export SPATTN_BUILD_JOBS=${SPATTN_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
unset SPATTN_LIBRARY
PIP_FLAGS=(--disable-pip-version-check --no-input -q)

if [ ! -x "$VENV/bin/python" ]; then
  echo "python: creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import numpy" 2>/dev/null; then
  "$VPY" -m pip install "${PIP_FLAGS[@]}" numpy
fi
echo "python: pip install ./python (SPATTN_CUDA=$SPATTN_CUDA)"
t0=$(date +%s)
"$VPY" -m pip install "${PIP_FLAGS[@]}" --no-deps --force-reinstall .
echo "python: installed in $(( $(date +%s) - t0 )) s"
cd tests
"$VPY" run.py
