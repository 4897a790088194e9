#!/usr/bin/env bash
# Python package tests (called by scripts/run_tests.sh).
#   1. PyTorch 2.11.0 (CPU use of PyPI's wheel), NumPy and hypothesis, pinned in
#      tests/requirements-torch.txt, installed once per machine into a shared folder
#      ($SPATTN_TORCH_DIR, default ~/.cache/spattn/torch-<hash of that list>): created with
#      `pip install --no-deps --target` into a temporary folder and renamed into place, so
#      concurrent runs never see half an install; reused while `import torch` works there.
#      A fresh machine downloads ~2.3 GB from PyPI (about 2.5 min); later runs take seconds.
#      SPATTN_TEST_TORCH=0 skips it (the torch tests are then skipped with a printed reason).
#   2. a virtual environment (python/build/test-venv, or SPATTN_TEST_VENV=/existing/venv) that
#      sees the shared folder through a .pth file;
#   3. pip install of the package from this checkout (`pip install ./python`; the build runs
#      CMake on the repository, CPU-only unless SPATTN_CUDA is set);
#   4. python/tests/run.py: NumPy, hypothesis and PyTorch tests; with torch installed here a
#      torch test skipped for lack of torch fails the run.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${SPATTN_TEST_VENV:-$PWD/build/test-venv}
export SPATTN_CUDA=${SPATTN_CUDA:-OFF}
export SPATTN_BUILD_JOBS=${SPATTN_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
unset SPATTN_LIBRARY
PIP_FLAGS=(--disable-pip-version-check --no-input -q)
REQ=$PWD/tests/requirements-torch.txt

torch_ok() { # $1: folder; imports torch there and runs a CPU op with autograd
  PYTHONPATH="$1" PYTHONNOUSERSITE=1 "$PY" -c "
import torch, numpy, hypothesis
x = torch.ones(2, 3, requires_grad=True); (x * x).sum().backward(); assert x.grad.sum() == 12
" >/dev/null 2>&1
}

if [ "${SPATTN_TEST_TORCH:-1}" != 0 ]; then
  tag=$("$PY" -c "import sys; print('cp%d%d' % sys.version_info[:2])")-$(sha256sum "$REQ" | cut -c1-12)
  TORCH_DIR=${SPATTN_TORCH_DIR:-$HOME/.cache/spattn/torch-$tag}
  if ! torch_ok "$TORCH_DIR"; then
    echo "python: installing tests/requirements-torch.txt into $TORCH_DIR (once per machine)"
    t0=$(date +%s)
    mkdir -p "$(dirname "$TORCH_DIR")"
    tmp=$(mktemp -d "$TORCH_DIR.tmp.XXXXXX")
    chmod 755 "$tmp"
    "$PY" -m pip install "${PIP_FLAGS[@]}" --no-deps --no-warn-script-location --target "$tmp" -r "$REQ"
    torch_ok "$tmp" || { echo "python: torch installed but not importable"; exit 1; }
    rm -rf "$TORCH_DIR.old.$$"
    [ -e "$TORCH_DIR" ] && mv -T "$TORCH_DIR" "$TORCH_DIR.old.$$"
    mv -T "$tmp" "$TORCH_DIR" 2>/dev/null || rm -rf "$tmp"   # a concurrent run may have won
    rm -rf "$TORCH_DIR.old.$$"
    torch_ok "$TORCH_DIR" || { echo "python: $TORCH_DIR: torch not importable"; exit 1; }
    echo "python: torch installed in $(( $(date +%s) - t0 )) s ($(du -sh "$TORCH_DIR" | cut -f1))"
  fi
  export SPATTN_REQUIRE_TORCH=1
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "python: creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
SITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ -n "${TORCH_DIR:-}" ]; then
  echo "$TORCH_DIR" > "$SITE/spattn-test-torch.pth"
else
  rm -f "$SITE/spattn-test-torch.pth"
fi
if ! "$VPY" -c "import numpy" 2>/dev/null; then
  "$VPY" -m pip install "${PIP_FLAGS[@]}" numpy
fi
echo "python: pip install ./python (SPATTN_CUDA=$SPATTN_CUDA)"
t0=$(date +%s)
"$VPY" -m pip install "${PIP_FLAGS[@]}" --no-deps --force-reinstall .
echo "python: installed in $(( $(date +%s) - t0 )) s"
cd tests
"$VPY" run.py
