#!/usr/bin/env bash
# Build the CUDA binaries on the development machine (nvcc, no GPU needed) and pack what the
# device runs, so that no device time goes into compiling (a full CUDA build is ~4 min on 2 cores,
# minutes of a fresh device machine too).
#   bash bench/gpu/carry_build.sh [pack] [NAME]   build build-dev (Release, CUDA, tests), strip spattn,
#                                            the *_cuda_check programs and libspattn.so into
#                                            build-NAME/ (NAME: carry) and pack them into
#                                            build-x/NAME.tar.xz (~13 MB; build*/ is ignored by git,
#                                            so pass carry: ["build-x"] to the device call)
#   SLIM=1 bash bench/gpu/carry_build.sh pack NAME   only tools/spattn (~4.5 MB): an A/B base for
#                                            bench/gpu/ab_bins.sh (the checks run on NEW only), so
#                                            that three or four packs fit the 64 MiB carry
#   bash bench/gpu/carry_build.sh unpack [NAME]   on the device: build-x/NAME.tar.xz -> build-NAME/
# Then on the device, e.g.: SPATTN_BUILD=build-carry bash bench/gpu/device_bench.sh checks
# (its probe finds the binaries and skips building); two packs of different trees (e.g. NAME base
# on main, NAME new with a patch applied) are compared by bench/gpu/ab_bins.sh base new.
# The tarball is 64 MiB-carry-safe; the unpacked binaries are not (~64 MB stripped).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=pack
case "${1:-}" in pack|unpack) MODE=$1; shift ;; esac
NAME=${1:-carry}
if [ "$MODE" = unpack ]; then
  tar xJf "build-x/$NAME.tar.xz"
  ls "build-$NAME" "build-$NAME/tools"
  exit 0
fi
BUILD=${SPATTN_BUILD:-build-dev}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSPATTN_CUDA=ON -DSPATTN_TESTS=ON > /dev/null
cmake --build "$BUILD" -j"$(nproc)" --target spattn spattn_cli_main \
  bsa_cuda_check bsa_varlen_cuda_check sfa_cuda_check sfa_varlen_cuda_check robust_cuda_check
D=build-$NAME
rm -rf "$D" && mkdir -p "$D/tools" build-x
cp "$BUILD"/tools/spattn "$D/tools/"
cp "$BUILD"/*_cuda_check "$D/"
# the shared library too, for python/device_check.sh (SPATTN_LIBRARY=$PWD/build-carry/libspattn.so)
cp "$BUILD"/libspattn.so.0.1.0 "$D/libspattn.so"
strip "$D/tools/spattn" "$D"/*_cuda_check "$D/libspattn.so"
if [ "${SLIM:-0}" = 1 ]; then tar cJf "build-x/$NAME.tar.xz" "$D/tools/spattn"
else tar cJf "build-x/$NAME.tar.xz" "$D"; fi
ls -la "build-x/$NAME.tar.xz"
