#!/usr/bin/env bash
# Per-kernel durations of one spattn call (ncu, gpu__time_duration at the clocks the GPU runs,
# not ncu's locked base clocks; L2 flushed before each kernel, ncu's default).  Shows where a
# pass's time goes besides its main kernel (preprocess, postprocess, conversions, schedules).
#   bash bench/gpu/kernel_times.sh SUITE CASE_REGEX PASS DET [SPATTN]
#   e.g. bash bench/gpu/kernel_times.sh bsa '^bsa17_' bwd 1 build-dev/tools/spattn
# Prints the kernels of the last timed call in launch order (one repeat, no warm-up: the earlier
# lines are the forward that produces O / LSE and the L2 flushes).
set -uo pipefail
SUITE=$1 CASE=$2 PASS=$3 DET=$4 SP=${5:-build-dev/tools/spattn}
ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  "$SP" bench --backend cuda --suite "$SUITE" --case "$CASE" --pass "$PASS" --deterministic "$DET" \
  --repeats 1 --warmup 0 --quiet 2>/dev/null | grep '^"' | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))[1:]
ks = [(r[4].split("(")[0].replace("void ", "").replace("<unnamed>::", "").replace("(anonymous namespace)::", ""),
       float(r[-1].replace(",", "")) / 1000) for r in rows]
tail = ks[-16:]
for name, us in tail: print("%10.1f us  %s" % (us, name[:90]))
print("%10.1f us  total of the lines above" % sum(us for _, us in tail))
'
