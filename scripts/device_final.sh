#!/usr/bin/env bash
# One call on the H200 that checks the whole product on the GPU: `spattn verify --backend cuda`
# on both public suites, `spattn bench --backend cuda` on both (ours by CUDA events around the
# whole call, L2 flushed, median of 10) compared with the peers' JSON recorded on the same kind
# of machine (bench/results/), and the Python package's torch tests on CUDA tensors.
# Binaries built on the workstation (CUDA ON) travel in .final_bin/ (carry); else it builds here.
#   usage (repo root, on the device): bash scripts/device_final.sh      logs/JSON: $OUT
set -uo pipefail
OUT=${OUT:-/tmp/final}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
BIN=.final_bin
if ! "$BIN/spattn" version >/dev/null 2>&1; then
  echo "== building on the device"; BIN=build-dev
  cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DSPATTN_TESTS=OFF >"$OUT/build.log" 2>&1 &&
    cmake --build build-dev -j16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  cp build-dev/tools/spattn build-dev/libspattn.so.0.1.0 "$BIN"/ 2>/dev/null || true
  BIN=build-dev; ln -sf tools/spattn build-dev/spattn
fi
LIB=$(ls "$PWD/$BIN"/libspattn.so.0.1.0 2>/dev/null || echo "$PWD/$BIN/libspattn.so")
el; echo "== spattn verify --backend cuda (both suites, full size)"
timeout ${VERIFY_TIMEOUT:-200} "$BIN/spattn" verify --backend cuda --cases-dir cases --quiet \
  --json "$OUT/verify_cuda.json" > "$OUT/verify_cuda.log" 2>&1
echo "exit $?"; grep -E "passed|FAIL|error" "$OUT/verify_cuda.log" | tail -8
el; echo "== spattn bench --backend cuda"
for s in bsa sfa; do
  cmp=()
  for f in bench/results/${s}_flex_h200.json bench/results/${s}_cudnn_h200.json bench/results/${s}_torch_gather_h200.json; do
    [ -f "$f" ] && cmp+=(--compare "$f"); done
  timeout ${BENCH_TIMEOUT:-150} "$BIN/spattn" bench --backend cuda --cases-dir cases --suite $s --quiet \
    --repeats 10 --json "$OUT/bench_${s}_cuda.json" --svg "$OUT/bench_${s}_cuda.svg" "${cmp[@]}" \
    > "$OUT/bench_${s}.log" 2>&1
  echo "$s bench exit $?"
done
el; echo "== python torch tests on CUDA tensors"
SPATTN_LIBRARY="$LIB" timeout ${PY_TIMEOUT:-200} bash python/device_check.sh > "$OUT/python.log" 2>&1
echo "python exit $?"; sed -n '/== python test summary ==/,$p' "$OUT/python.log" | head -30
el; echo "== tables"
cat "$OUT/bench_bsa.log" "$OUT/bench_sfa.log" | grep -vE "^\s*$" | tail -70
el
