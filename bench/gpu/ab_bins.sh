#!/usr/bin/env bash
# On the device: A/B of packed builds (bench/gpu/carry_build.sh pack NAME; the base may be a
# SLIM=1 pack), interleaved rounds, both modes of the backward (or the forward), then per-case
# time ratios NEW / BASE for each NEW (< 1: NEW faster).
#   bash bench/gpu/ab_bins.sh BASE NEW [NEW2 ...]
# env: SUITE (bsa), PASS (bwd), CASE (a --case regex), ROUNDS (2), DETS ("1 0"), CHECK (1: run
# each NEW's checks first: CHECKS, ';'-separated, default "bsa_cuda_check;bsa_varlen_cuda_check
# quick"), CHECK_TIMEOUT (300) and BENCH_TIMEOUT (200) seconds each (a hang costs no more), OUT
# (/tmp/ab; write under the device call's $OUT to get the files back).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${2:?usage: ab_bins.sh BASE NEW [NEW2 ...]}"
A=$1 OUT=${OUT:-/tmp/ab}
shift
NEWS=("$@")
mkdir -p "$OUT"
for v in "$A" "${NEWS[@]}"; do  # the pack from whichever carried folder holds it (build-x, build-y, ...)
  [ -x "build-$v/tools/spattn" ] || tar xJf "$(ls build-*/"$v.tar.xz" | head -1)"
done
S=$OUT/summary.txt; : > "$S"
if [ "${CHECK:-1}" = 1 ]; then
  IFS=';' read -ra checks <<< "${CHECKS:-bsa_cuda_check;bsa_varlen_cuda_check quick}"
  for v in "${NEWS[@]}"; do for c in "${checks[@]}"; do
    read -ra cmd <<< "$c"
    timeout ${CHECK_TIMEOUT:-300} "build-$v/${cmd[0]}" "${cmd[@]:1}" > "$OUT/${v}_${cmd[0]}.log" 2>&1
    echo "$v $c: rc=$? $(tail -1 "$OUT/${v}_${cmd[0]}.log")" >> "$S"
  done; done
fi
sel=(); [ -n "${CASE:-}" ] && sel=(--case "$CASE")
for r in $(seq 1 "${ROUNDS:-2}"); do for v in "$A" "${NEWS[@]}"; do for d in ${DETS:-1 0}; do
  timeout ${BENCH_TIMEOUT:-200} "build-$v/tools/spattn" bench --backend cuda --suite "${SUITE:-bsa}" --pass "${PASS:-bwd}" "${sel[@]}" \
    --deterministic "$d" --quiet --json "$OUT/${v}_r${r}_d${d}.json" > /dev/null 2>&1 || echo "bench $v round $r det $d failed" >> "$S"
done; done; done
python3 bench/gpu/ab_ratios.py "$OUT" "$A" "${NEWS[@]}" >> "$S"
cat "$S"
