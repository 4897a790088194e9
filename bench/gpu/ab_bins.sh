#!/usr/bin/env bash
# On the device: A/B of two packed builds (bench/gpu/carry_build.sh pack NAME), interleaved rounds, both
# modes of the backward (or the forward), then per-case time ratios NEW / BASE (< 1: NEW faster).
#   bash bench/gpu/ab_bins.sh BASE NEW
# env: SUITE (bsa), PASS (bwd), CASE (a --case regex), ROUNDS (2), DETS ("1 0"), CHECK (1: run
# NEW's checks first: CHECKS, ';'-separated, default "bsa_cuda_check;bsa_varlen_cuda_check quick"),
# OUT (/tmp/ab; write under the device call's $OUT to get the files back).
set -uo pipefail
cd "$(dirname "$0")/../.."
A=$1 B=$2 OUT=${OUT:-/tmp/ab}
mkdir -p "$OUT"
for v in "$A" "$B"; do [ -x "build-$v/tools/spattn" ] || tar xJf "build-x/$v.tar.xz"; done
S=$OUT/summary.txt; : > "$S"
if [ "${CHECK:-1}" = 1 ]; then
  IFS=';' read -ra checks <<< "${CHECKS:-bsa_cuda_check;bsa_varlen_cuda_check quick}"
  for c in "${checks[@]}"; do
    read -ra cmd <<< "$c"
    timeout ${CHECK_TIMEOUT:-300} "build-$B/${cmd[0]}" "${cmd[@]:1}" > "$OUT/${cmd[0]}.log" 2>&1
    echo "$c: rc=$? $(tail -1 "$OUT/${cmd[0]}.log")" >> "$S"
  done
fi
sel=(); [ -n "${CASE:-}" ] && sel=(--case "$CASE")
for r in $(seq 1 "${ROUNDS:-2}"); do for v in "$A" "$B"; do for d in ${DETS:-1 0}; do
  timeout ${BENCH_TIMEOUT:-200} "build-$v/tools/spattn" bench --backend cuda --suite "${SUITE:-bsa}" --pass "${PASS:-bwd}" "${sel[@]}" \
    --deterministic "$d" --quiet --json "$OUT/${v}_r${r}_d${d}.json" > /dev/null 2>&1 || echo "bench $v round $r det $d failed" >> "$S"
done; done; done
python3 bench/gpu/ab_ratios.py "$OUT" "$A" "$B" >> "$S"
cat "$S"
