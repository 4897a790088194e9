#!/usr/bin/env bash
# Python package on the GPU machine (no network there; torch with CUDA preinstalled):
#   1. pip install --no-build-isolation --no-deps with SPATTN_CUDA=ON into python/build/device-site
#      (falls back to a plain CMake build + SPATTN_LIBRARY when pip cannot build);
#      SPATTN_LIBRARY=/path/libspattn.so reuses an already built CUDA library instead;
#   2. the PyTorch tests (CPU + CUDA tensors: autograd vs dense fp64, CUDA streams, torch.compile,
#      suite-sized shapes in bf16/fp16), the torch_npu wrapper tests, the NumPy tests and the
#      caller-workspace tests (every op kind on CUDA tensors, forward and backward);
#   3. a short summary: tests passed/failed/skipped and max errors per tensor.
# Usage (repo root): bash python/device_check.sh      Log: ${OUT:-/tmp}/python_device_check.log
set -uo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
LOG=${OUT:-/tmp}/python_device_check.log
SITE=$PWD/build/device-site
t0=$(date +%s)

main() {

echo "== environment =="
"$PY" - <<'PYEOF'
import importlib.util, torch
print("torch", torch.__version__, "| cuda", torch.version.cuda, "| available", torch.cuda.is_available(),
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("numpy", "present" if importlib.util.find_spec("numpy") else "ABSENT (NumPy tests skipped)")
PYEOF
command -v nvcc >/dev/null && nvcc --version | tail -1

export SPATTN_CUDA=${SPATTN_CUDA:-ON}
echo "== install (SPATTN_CUDA=$SPATTN_CUDA) =="
export SPATTN_BUILD_JOBS=${SPATTN_BUILD_JOBS:-$(nproc)}
rm -rf "$SITE"
# Reuse ../build/libspattn.so when it has the CUDA backend and no C source is newer than it.
built=$(ls ../build/libspattn.so.*.*.* 2>/dev/null | head -1)
if [ -z "${SPATTN_LIBRARY:-}" ] && [ -n "$built" ] && [ "$SPATTN_CUDA" = ON ] &&
   [ -z "$(find ../src ../include ../CMakeLists.txt -newer "$built" -type f 2>/dev/null | head -1)" ] &&
   "$PY" -c "import ctypes,sys; sys.exit(0 if ctypes.CDLL('$built').spattn_cuda_available() else 1)" 2>/dev/null; then
  export SPATTN_LIBRARY=$(cd "$(dirname "$built")" && pwd)/$(basename "$built")
  echo "reusing $SPATTN_LIBRARY (CUDA backend, newer than every C source)"
fi
if "$PY" -m pip install --no-build-isolation --no-deps --no-input --disable-pip-version-check -q \
     --target "$SITE" . ; then
  export PYTHONPATH=$SITE
  unset SPATTN_LIBRARY
else
  echo "pip install failed; using the package from source + SPATTN_LIBRARY"
  if [ -z "${SPATTN_LIBRARY:-}" ]; then
    cmake -S .. -B build/device-cmake -DCMAKE_BUILD_TYPE=Release -DSPATTN_TESTS=OFF -DSPATTN_CUDA="$SPATTN_CUDA" \
      >/dev/null && cmake --build build/device-cmake --target spattn -j "$SPATTN_BUILD_JOBS" ||
      { echo "BUILD FAILED"; return 1; }
    export SPATTN_LIBRARY=$PWD/build/device-cmake/libspattn.so
  fi
  export PYTHONPATH=$PWD
fi
echo "install: $(( $(date +%s) - t0 )) s"
(cd tests && "$PY" -c "import spattn; print('spattn', spattn.version(), '| lib', spattn.library_path(), '| cuda_available', spattn.cuda_available(), '| cpu', spattn.cpu_isa())")

echo "== tests =="
cd tests
"$PY" run.py test_torch test_npu test_numpy test_block_mask test_workspace > ../build/device_run.log 2>&1
rc=$?
grep -E "^(FAIL|ERROR):|Error:|error:" ../build/device_run.log | head -40
sed -n '/== python test summary ==/,$p' ../build/device_run.log
cp ../build/device_run.log "${LOG%.log}_full.log" 2>/dev/null || true
echo "total: $(( $(date +%s) - t0 )) s, exit $rc"
return $rc
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
