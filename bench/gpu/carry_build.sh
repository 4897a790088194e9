#!/usr/bin/env bash
# Build the CUDA binaries on the development machine (nvcc, no GPU needed) and pack what the
# device runs, so that no device time goes into compiling (a full CUDA build is ~4 min on 2 cores,
# minutes of a fresh device machine too).
#   bash bench/gpu/carry_build.sh            build build-dev (Release, CUDA, tests), strip spattn
#                                            and the *_cuda_check programs into build-carry/ and
#                                            pack them into build-x/bc.tar.xz (~10 MB; build*/ is
#                                            ignored by git, so pass carry: ["build-x"] to the
#                                            device call)
#   bash bench/gpu/carry_build.sh unpack     on the device: build-x/bc.tar.xz -> build-carry/
# Then on the device, e.g.: SPATTN_BUILD=build-carry bash bench/gpu/device_bench.sh checks
# (its probe finds the binaries and skips building).  The tarball is 64 MiB-carry-safe; the
# unpacked binaries are not (~64 MB stripped).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-pack}" = unpack ]; then
  tar xJf build-x/bc.tar.xz
  ls build-carry build-carry/tools
  exit 0
fi
BUILD=${SPATTN_BUILD:-build-dev}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSPATTN_CUDA=ON -DSPATTN_TESTS=ON > /dev/null
cmake --build "$BUILD" -j"$(nproc)" --target spattn spattn_cli_main \
  bsa_cuda_check bsa_varlen_cuda_check sfa_cuda_check sfa_varlen_cuda_check robust_cuda_check
rm -rf build-carry && mkdir -p build-carry/tools build-x
cp "$BUILD"/tools/spattn build-carry/tools/
cp "$BUILD"/*_cuda_check build-carry/
# the shared library too, for python/device_check.sh (SPATTN_LIBRARY=$PWD/build-carry/libspattn.so)
cp "$BUILD"/libspattn.so.0.1.0 build-carry/libspattn.so
strip build-carry/tools/spattn build-carry/*_cuda_check build-carry/libspattn.so
tar cJf build-x/bc.tar.xz build-carry
ls -la build-x/bc.tar.xz
