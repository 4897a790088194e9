#!/usr/bin/env bash
# On the device: the measurements of the sfa forward's group form prepared in the thirty-fifth
# session (runbook sparse_flash_attention.md, "Where issues 12 and 13 stand (end of the
# thirty-fifth session)"), one step per device call.  Packs (git-ignored, made on the dev machine):
#   build-x/old.tar.xz    build-old/tools/spattn: main's group kernel (form 3)
#   build-x/new4.tar.xz   build-new4/{tools/spattn, sfa_cuda_check, sfa_varlen_cuda_check, wgmma_rate}:
#                         form 4c (d-split) at D 65 .. 128, form 3' with SPATTN_SFA_GROUP_DSPLIT=0
#   build-y/new4b.tar.xz  build-new4b/{tools/spattn, sfa_cuda_check}: 4c, one max exchange a round, 3 stages
#   build-y/new4s.tar.xz  build-new4s/tools/spattn: new4's spattn again (the A/B beside new4b)
#   build-y/new4r.tar.xz  build-new4r/robust_cuda_check (with the group-form non-finite case)
#   bash bench/gpu/group_calls.sh checks   carry ["build-x"], ~6 min: wgmma_rate, sfa_cuda_check, varlen
#   bash bench/gpu/group_calls.sh ab       carry ["build-x"], ~4 min: old / 4c / 3' / per-token, ncu of 4c and 3'
#   bash bench/gpu/group_calls.sh slots    carry ["build-y"], ~6 min: new4b's check, A/B new4s / new4b (ab_bins.sh)
#   bash bench/gpu/group_calls.sh robust   carry ["build-y"], ~5 min: robust_cuda_check
# Everything it writes goes under $OUT (the device call's folder; /tmp/group_calls elsewhere).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/group_calls}
mkdir -p "$OUT"
T0=$(date +%s)
t() { echo "t=$(( $(date +%s) - T0 ))"; }
unpack() { for v in "$@"; do [ -e "build-$v" ] || tar xJf build-*/"$v.tar.xz"; done; }
BENCH=(bench --backend cuda --suite cases/sfa_shapes.cases --pass fwd --quiet)
CASES='sfas0[1234678]'
bench_as() {  # LABEL BINARY [VAR=VALUE ...]: the group form forced, the shapes suite's group cases
  local label=$1 bin=$2
  shift 2
  env SPATTN_SFA_GROUP=1 "$@" timeout 100 "$bin" "${BENCH[@]}" --case "$CASES" 2>&1 | grep -a sfas | sed "s/^/$label /"
}
check() {  # NAME BINARY [ARGS]: a check program, its failures and last line
  local name=$1 bin=$2
  shift 2
  timeout 300 "$bin" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(t)"
  grep -a FAIL "$OUT/$name.log" | head -8
  grep -a 'group form took' "$OUT/$name.log" | head -4
  tail -1 "$OUT/$name.log"
}
case "${1:-}" in
checks)
  unpack new4
  build-new4/wgmma_rate 4000 > "$OUT/wgmma_rate.txt" 2>&1
  tail -18 "$OUT/wgmma_rate.txt"
  check sfa_cuda_check build-new4/sfa_cuda_check
  check sfa_varlen_cuda_check build-new4/sfa_varlen_cuda_check
  ;;
ab)
  unpack old new4
  for r in 1 2; do
    bench_as old build-old/tools/spattn
    bench_as 4c build-new4/tools/spattn SPATTN_SFA_GROUP_DSPLIT=1
    bench_as 3p build-new4/tools/spattn SPATTN_SFA_GROUP_DSPLIT=0
  done
  SPATTN_SFA_GROUP=0 build-new4/tools/spattn "${BENCH[@]}" --case 'sfas0[1234]' 2>&1 | grep -a sfas | sed "s/^/pertoken /"
  t
  for d in 1 0; do  # ncu of the group kernel on sfas01: 4c (d1), 3' (d0)
    SPATTN_SFA_GROUP=1 SPATTN_SFA_GROUP_DSPLIT=$d timeout 120 ncu --set full --import-source no -k regex:sfa_fwd_group \
      --launch-skip 1 --launch-count 1 -o "$OUT/ds$d" build-new4/tools/spattn bench --backend cuda \
      --suite cases/sfa_shapes.cases --case sfas01 --pass fwd --repeats 1 --warmup 1 --quiet > "$OUT/ncu_ds$d.log" 2>&1
    echo "ncu ds$d rc=$?"
    ncu --import "$OUT/ds$d.ncu-rep" --page details > "$OUT/ds${d}_details.txt" 2>&1
    ncu --import "$OUT/ds$d.ncu-rep" --page source --csv --print-source sass > "$OUT/ds${d}_src.csv" 2>&1
    python3 bench/gpu/ncu_stalls.py "$OUT/ds${d}_src.csv" 30 > "$OUT/ds${d}_stalls.txt" 2>&1
    head -8 "$OUT/ds${d}_stalls.txt"
  done
  t
  ;;
slots)  # new4b's check, then the A/B new4s / new4b (bench/gpu/ab_bins.sh: interleaved, ratios)
  SPATTN_SFA_GROUP=1 CHECKS=sfa_cuda_check SUITE=cases/sfa_shapes.cases PASS=fwd CASE="$CASES" DETS=1 \
    BENCH_TIMEOUT=100 OUT="$OUT/slots" bash bench/gpu/ab_bins.sh new4s new4b
  grep -a FAIL "$OUT/slots/new4b_sfa_cuda_check.log" | head -8
  t
  ;;
robust)
  unpack new4r
  timeout 500 build-new4r/robust_cuda_check > "$OUT/robust.log" 2>&1
  echo "robust rc=$? $(t)"
  grep -a FAIL "$OUT/robust.log" | head -10
  grep -a 'N1 32 N2 2' "$OUT/robust.log" | head -12
  tail -1 "$OUT/robust.log"
  ;;
*)
  sed -n 2,15p "$0"
  exit 2
  ;;
esac
