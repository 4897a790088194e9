#!/usr/bin/env bash
# On the device: the prepared calls for the open wip patches (pack: bench/gpu/wip_pack.sh on the
# dev machine; carry ["build-v"]).  Each part fits one call; run them back to back, so that the
# machine is still warm (it goes back after ~30 s idle).  Every step's timeout is cut to what is
# left of a 570 s budget (DEADLINE), and a step with under 10 s left is skipped and says so: a
# slow step costs the later ones, never the call's output.
#   bash bench/gpu/wip_call.sh A   the group forward's stpipe A/B (main, pl2, pl2tma, vote2 on the
#                                  NSA-like shapes, forced group form), the racecheck probe's eight
#                                  modes, pl2 / pl2tma quick checks, the stpipe step trace
#   bash bench/gpu/wip_call.sh B   racecheck of the padded (pad) and voted (vote2) forms on the
#                                  quick-set cases that report on main, their quick checks
#   bash bench/gpu/wip_call.sh C   the per-token forward's A/B (main, vote2, pad) on the sfa
#                                  suite's N1 <= 32 cases
# What each result decides: docs/runbooks/sparse_flash_attention.md, "Where issues 12 and 13 stand".
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/wip}; mkdir -p "$OUT"
T0=$(date +%s) DEADLINE=${DEADLINE:-570}
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
tl() {  # tl N: min(N, seconds left); 0 (and a note) when under 10 s are left
  local left=$(( DEADLINE - ($(date +%s) - T0) ))
  if [ "$left" -lt 10 ]; then echo 0; else echo $(( $1 < left ? $1 : left )); fi
}
run() {  # run N CMD...: CMD under timeout min(N, left), or skipped
  local t; t=$(tl "$1"); shift
  if [ "$t" = 0 ]; then echo "SKIPPED (call budget): $*"; return 124; fi
  timeout "$t" "$@"
}
quick() {  # quick BUILD...: each build's sfa_cuda_check quick, its last line
  local v
  for v in "$@"; do
    run 100 build-$v/sfa_cuda_check quick > "$OUT/q_$v.log" 2>&1; echo "$v quick rc=$? $(tail -n 1 "$OUT/q_$v.log")"
  done
}
[ -x build-pad/sfa_cuda_check ] || tar xJf build-v/pk.tar.xz
nvidia-smi --query-gpu=name --format=csv,noheader; el unpacked
case "${1:?usage: wip_call.sh A|B|C}" in
A)
  OUT=$OUT/ab SUITE=cases/sfa_shapes.cases PASS=fwd CASE='sfas0[123478]' DETS=1 CHECK=0 BENCH_TIMEOUT=$(tl 40) \
    SPATTN_SFA_GROUP=1 run 300 bash bench/gpu/ab_bins.sh main pl2 pl2tma vote2 | tail -16; el ab
  for m in 0 1 2 3 4 5 8 9; do
    run 30 compute-sanitizer --tool racecheck build-v/racecheck_barred $m 2>&1 | grep -a 'mode\|SUMMARY\|SKIPPED'
  done; el probe
  quick pl2 pl2tma; el quick
  SPATTN_SFA_GROUP=1 STEP_FILE=/tmp/steps.txt run 60 build-pl2tr/tools/spattn bench --backend cuda \
    --suite cases/sfa_shapes.cases --pass fwd --case '^sfas01' --repeats 1 --warmup 1 --quiet > /dev/null 2>&1
  python3 bench/gpu/step_trace.py /tmp/steps.txt stpipe 2>&1 | tail -40; cp /tmp/steps.txt "$OUT/" 2>/dev/null; el trace ;;
B)
  for b in "pad h16_causal_split" "pad sep_quick_d128r64" "vote2 h16_causal_split" "pad nsa_quick_h8x2"; do
    set -- $b
    RC_TIMEOUT=$(tl 90) OUT=$OUT/rc run 95 bash bench/gpu/racecheck_cases.sh "$1" "$2"
  done; el racecheck
  quick pad vote2; el quick ;;
C)
  OUT=$OUT/abt SUITE=sfa PASS=fwd CASE='sfa0[1235689]|sfa1[01456]|sfa18' DETS=1 CHECK=0 BENCH_TIMEOUT=$(tl 90) \
    run 540 bash bench/gpu/ab_bins.sh main vote2 pad | tail -16; el abt ;;
esac
