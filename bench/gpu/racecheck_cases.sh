#!/usr/bin/env bash
# On the device: compute-sanitizer racecheck of packed builds' sfa_cuda_check, one run per
# (build, case-name filter) of the quick set, the hazard summary of each (the whole quick set
# under racecheck takes minutes; the filters pick the cases whose reports are being chased).
#   bash bench/gpu/racecheck_cases.sh "BUILD..." "FILTER..."   e.g. "main pad" "h16_causal_split sep_quick_d128r64"
# env: RC_TIMEOUT (90) seconds a run; OUT (/tmp/rc): full logs there.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/rc}
mkdir -p "$OUT"
for b in $1; do for f in $2; do
  log="$OUT/rc_${b}_$f.log"
  timeout "${RC_TIMEOUT:-90}" compute-sanitizer --tool racecheck --racecheck-report all \
    "build-$b/sfa_cuda_check" quick "$f" > "$log" 2>&1
  rc=$?
  echo "$b $f: rc=$rc $(grep -a 'RACECHECK SUMMARY' "$log" | tail -1) | $(grep -a 'passed' "$log" | tail -1)"
done; done
