#!/usr/bin/env bash
# Fuzzing stage of the test command (scripts/run_tests.sh runs it; tests/fuzz/ has the harnesses).
#   1. clang with libFuzzer and OpenMP: installed from Debian (apt-get) when missing;
#   2. build-fuzz/: the whole library and the CLI's parsers instrumented for libFuzzer, with
#      ASan + UBSan (CMake option SPATTN_FUZZ=ON);
#   3. ctest -R ^fuzz_: each harness replays its seed corpus (tests/fuzz/corpus/, regression
#      inputs included), then fuzzes for SPATTN_FUZZ_SECONDS (default 30) from it.  A crash,
#      a sanitizer report, a leak, a timeout (20 s per input) or a failed oracle fails the run;
#      the input is left in build-fuzz/tests/fuzz/crash_<harness>_*.
# Usage: scripts/fuzz.sh   (SPATTN_FUZZ_SECONDS=0 skips the stage; SPATTN_FUZZ_SEED: libFuzzer
#        seed, default 1, 0 = random; neither makes a run's inputs reproducible: see
#        tests/fuzz/CMakeLists.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${SPATTN_FUZZ_SECONDS:-30}
jobs=$(nproc 2>/dev/null || echo 2)
if [ "$secs" = 0 ]; then
  echo "fuzz: skipped (SPATTN_FUZZ_SECONDS=0)"
  exit 0
fi

probe() { # clang can build and link a libFuzzer target with ASan, UBSan and OpenMP
  local dir
  dir=$(mktemp -d)
  printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' '#include <omp.h>' \
    'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; return (int)n * 0 + 0 * omp_get_max_threads(); }' \
    > "$dir/p.c"
  clang -fsanitize=fuzzer,address,undefined -fopenmp "$dir/p.c" -o "$dir/p" >/dev/null 2>&1
  local rc=$?
  rm -rf "$dir"
  return $rc
}

if ! command -v clang >/dev/null 2>&1 || ! probe; then
  echo "fuzz: installing clang, libFuzzer and OpenMP from Debian (clang libclang-rt-dev libomp-dev)"
  sudo=
  [ "$(id -u)" = 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends clang libclang-rt-dev libomp-dev >/dev/null
  probe || { echo "fuzz: clang cannot build libFuzzer targets with OpenMP"; exit 1; }
fi

echo "fuzz: $(clang --version | head -1); ${secs} s per harness"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DSPATTN_CUDA=OFF -DSPATTN_FUZZ=ON \
  -DSPATTN_FUZZ_SECONDS="$secs" -DSPATTN_FUZZ_SEED="${SPATTN_FUZZ_SEED:-1}" >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_api fuzz_api_more fuzz_cases fuzz_json
ctest --test-dir build-fuzz -R '^fuzz_' --output-on-failure -j"$jobs"
