#!/bin/bash
# One device call for the bsa CUDA backend: build, check, sanitize, benchmark ours and the peers,
# print the comparison.  Run from the repository root on the GPU machine:
#   bash bench/gpu/bsa_device.sh            (everything)
#   BSA_STEPS="check bench" bash bench/gpu/bsa_device.sh
# Prebuilt binaries in .bsa_bin/ (built on the workstation, carried) are used when they run;
# otherwise the library is built here (cmake Release, -j16) and the programs linked with nvcc.
# Logs and JSON go to $OUT (default /tmp/bsa_out).
set -u
OUT=${OUT:-/tmp/bsa_out}
mkdir -p "$OUT"
STEPS=${BSA_STEPS:-"check sanitize bench peers"}
PEER_LIMIT=${BSA_PEER_LIMIT:-150}
exec > >(tee -a "$OUT/bsa_device.log") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
git log --oneline -1 2>/dev/null
T0=$(date +%s)
BIN=${BSA_BIN:-.bsa_bin}
if ! ( [ -x $BIN/bsa_cuda_check ] && $BIN/bsa_cuda_check --probe >/dev/null 2>&1 ); then
  echo "== building on the device"
  BIN=build-dev/bin; mkdir -p $BIN
  cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DSPATTN_TESTS=OFF > "$OUT/build.log" 2>&1 &&
  cmake --build build-dev -j16 --target spattn_static >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  for p in tests/cuda/bsa_cuda_check.cu bench/gpu/bsa_bench.cu; do
    n=$(basename $p .cu)
    nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -std=c++17 -Iinclude -Isrc $p build-dev/libspattn.a -lgomp -lm -o $BIN/$n \
      >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  done
fi
echo "== binaries: $BIN ($(( $(date +%s) - T0 )) s)"
for s in $STEPS; do
  case $s in
  check)
    echo "== check (random shapes vs fp64)"; timeout 120 $BIN/bsa_cuda_check > "$OUT/check.log" 2>&1; echo "rc $?"
    grep -E "FAIL" "$OUT/check.log" | head -20; tail -3 "$OUT/check.log" ;;
  sanitize)
    if command -v compute-sanitizer >/dev/null; then
      echo "== compute-sanitizer memcheck"; timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 $BIN/bsa_cuda_check quick 2>&1 | tail -6
      echo "== compute-sanitizer racecheck"; timeout 90 compute-sanitizer --tool racecheck --error-exitcode 3 $BIN/bsa_cuda_check quick 2>&1 | tail -6
      echo "== compute-sanitizer synccheck"; timeout 90 compute-sanitizer --tool synccheck --error-exitcode 3 $BIN/bsa_cuda_check quick 2>&1 | tail -4
    else echo "no compute-sanitizer"; fi ;;
  bench)
    echo "== bench (ours, 17 cases, verify vs CUDA reference kernels)"
    mkdir -p /tmp/bsa_masks
    timeout 180 $BIN/bsa_bench cases/bsa.cases --json "$OUT/bsa_ours.json" --masks /tmp/bsa_masks --reps ${BSA_REPS:-15} ${BSA_PASS:+--pass $BSA_PASS} ;;
  peers)
    echo "== peers (FlexAttention, cuDNN SDPA), limit ${PEER_LIMIT} s"
    PYTHONUNBUFFERED=1 timeout $PEER_LIMIT python3 bench/peers/bsa_flex.py --masks /tmp/bsa_masks \
      --out-flex "$OUT/bsa_flex.json" --out-cudnn "$OUT/bsa_cudnn.json" --reps 10 2>&1 | grep -v Warning | tail -25 ;;
  esac
  echo "-- after $s: $(( $(date +%s) - T0 )) s"
done
echo "== comparison"
python3 bench/gpu/bsa_compare.py "$OUT/bsa_ours.json" "$OUT/bsa_flex.json" "$OUT/bsa_cudnn.json" 2>&1
