#!/usr/bin/env bash
# On the device: the prepared calls for the open wip patches (pack: bench/gpu/wip_pack.sh on the
# dev machine; carry ["build-v"]).  Each part fits one call (~8-9 min); run B right after A so
# that the machine is still warm (it goes back after ~30 s idle).
#   bash bench/gpu/wip_call.sh A   the group forward's stpipe A/B (main, pl2, pl2tma, vote2 on the
#                                  NSA-like shapes, forced group form), the racecheck probe's eight
#                                  modes, pl2 / pl2tma quick checks, the stpipe step trace
#   bash bench/gpu/wip_call.sh B   racecheck of the padded (pad) and voted (vote2) forms on the
#                                  quick-set cases that report on main, their quick checks, the
#                                  per-token forward A/B (main, vote2, pad) on the N1 <= 32 cases
# What each result decides: docs/runbooks/sparse_flash_attention.md, "Where issues 12 and 13 stand".
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/wip}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
[ -x build-pad/sfa_cuda_check ] || tar xJf build-v/pk.tar.xz
nvidia-smi --query-gpu=name --format=csv,noheader; el unpacked
case "${1:?usage: wip_call.sh A|B}" in
A)
  OUT=$OUT/ab SUITE=cases/sfa_shapes.cases PASS=fwd CASE='sfas0[123478]' DETS=1 CHECK=0 BENCH_TIMEOUT=60 \
    SPATTN_SFA_GROUP=1 bash bench/gpu/ab_bins.sh main pl2 pl2tma vote2 | tail -16; el ab
  for m in 0 1 2 3 4 5 8 9; do
    timeout 30 compute-sanitizer --tool racecheck build-v/racecheck_barred $m 2>&1 | grep -a 'mode\|SUMMARY'
  done; el probe
  for v in pl2 pl2tma; do
    timeout 100 build-$v/sfa_cuda_check quick > "$OUT/q_$v.log" 2>&1; echo "$v quick rc=$? $(tail -n 1 "$OUT/q_$v.log")"
  done; el quick
  SPATTN_SFA_GROUP=1 STEP_FILE=/tmp/steps.txt timeout 60 build-pl2tr/tools/spattn bench --backend cuda \
    --suite cases/sfa_shapes.cases --pass fwd --case '^sfas01' --repeats 1 --warmup 1 --quiet > /dev/null 2>&1
  python3 bench/gpu/step_trace.py /tmp/steps.txt stpipe 2>&1 | tail -40; cp /tmp/steps.txt "$OUT/" 2>/dev/null; el trace ;;
B)
  RC_TIMEOUT=80 OUT=$OUT/rc bash bench/gpu/racecheck_cases.sh "pad" "h16_causal_split sep_quick_d128r64 nsa_quick_h8x2"; el rc_pad
  RC_TIMEOUT=80 OUT=$OUT/rc bash bench/gpu/racecheck_cases.sh "vote2" "h16_causal_split"; el rc_vote
  for v in pad vote2; do
    timeout 100 build-$v/sfa_cuda_check quick > "$OUT/q_$v.log" 2>&1; echo "$v quick rc=$? $(tail -n 1 "$OUT/q_$v.log")"
  done; el quick
  OUT=$OUT/abt SUITE=sfa PASS=fwd CASE='sfa0[1235689]|sfa1[01456]|sfa18' DETS=1 CHECK=0 BENCH_TIMEOUT=90 \
    bash bench/gpu/ab_bins.sh main vote2 pad | tail -16; el abt ;;
esac
