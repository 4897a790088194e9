#!/usr/bin/env bash
# The project's test command (README "Tests"; .ci/run runs exactly this).
#   1. Release build + every ctest test.
#   2. The same tests built with AddressSanitizer + UndefinedBehaviorSanitizer.
#   3. Fuzzing (scripts/fuzz.sh): libFuzzer harnesses of tests/fuzz/ under ASan + UBSan, each
#      for SPATTN_FUZZ_SECONDS (default 30; clang is installed from Debian when missing).
#   4. The Python package's tests, when python/ exists (python/run_tests.sh: NumPy, hypothesis
#      and PyTorch 2.11.0 on the CPU, installed from PyPI once per machine).
# Usage: scripts/run_tests.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

echo "== release build =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${1:-}" != "--no-sanitize" ]; then
  echo "== ASan + UBSan build =="
  # CUDA is off here: the sanitizers instrument host code only.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSPATTN_SANITIZE=ON -DSPATTN_CUDA=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    SPATTN_TEST_QUICK=1 ctest --test-dir build-asan --output-on-failure -j"$jobs"
fi

if [ "${1:-}" != "--no-sanitize" ]; then
  echo "== fuzzing =="
  bash scripts/fuzz.sh
fi

if [ -f python/run_tests.sh ]; then
  echo "== python =="
  bash python/run_tests.sh
fi
echo "ALL TESTS PASSED"
