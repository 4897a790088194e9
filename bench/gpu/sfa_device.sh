#!/usr/bin/env bash
# One device call for the sfa CUDA backend (issue 6): build (or use a carried build), small-shape
# correctness check, compute-sanitizer memcheck on the quick set, the 18-case suite (verified
# against the CUDA reference kernels, then timed), and the PyTorch gather peer.  Logs and JSON
# under $OUT; a short table last.
#   usage (on the device machine, repo root): bash bench/gpu/sfa_device.sh [steps]
#   steps: any of check,sanitize,bench,peer,cli (default: check,sanitize,bench,peer)
#   env: SFA_BIN (carried binary), CASES_FILE (suite subset), REPEATS, NOVERIFY=1, *_TIMEOUT
set -uo pipefail
OUT=${OUT:-/tmp/sfa_out}
mkdir -p "$OUT"
STEPS=${1:-check,sanitize,bench,peer}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/gpu.txt"
git log -1 --format='commit %H %s' 2>/dev/null | tee -a "$OUT/gpu.txt"
BIN=${SFA_BIN:-build-sfa/sfa_cuda_check}   # a build carried from the dev machine, if any
if ! [ -x "$BIN" ] || ! "$BIN" quick >/dev/null 2>&1; then
  echo "== building on the device =="
  t0=$(date +%s)
  cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1
  cmake --build build-dev -j16 --target sfa_cuda_check spattn_cli >>"$OUT/build.log" 2>&1 || \
    cmake --build build-dev -j16 --target sfa_cuda_check >>"$OUT/build.log" 2>&1
  BIN=build-dev/sfa_cuda_check
  echo "build: $(( $(date +%s) - t0 )) s"; grep -E "error|spill" "$OUT/build.log" | head
fi
if has check; then
  echo "== small-shape check =="
  timeout 120 "$BIN" 2>&1 | tee "$OUT/check.log" | grep -vE "^  .*ok$" | tail -40
fi
if has sanitize; then
  echo "== compute-sanitizer memcheck (quick) =="
  timeout 150 compute-sanitizer --tool memcheck --print-limit 5 "$BIN" quick >"$OUT/sanitize.log" 2>&1
  tail -4 "$OUT/sanitize.log"
fi
if has bench; then
  echo "== suite: verify + time =="
  timeout ${BENCH_TIMEOUT:-200} "$BIN" bench ${CASES_FILE:-cases/sfa.cases} "$OUT/sfa_cuda.json" ${REPEATS:-10} ${NOVERIFY:+noverify} 2>&1 | tee "$OUT/bench.log" | grep -v "^sfa" | tail -25
fi
if has peer; then
  echo "== peer: PyTorch gather =="
  PYTHONUNBUFFERED=1 timeout ${PEER_TIMEOUT:-200} python3 bench/peers/sfa_torch_gather.py --json "$OUT/sfa_torch_gather.json" --repeats 3 >"$OUT/peer.log" 2>&1
  tail -3 "$OUT/peer.log"
fi
if has cli && [ -x build-dev/spattn ]; then
  build-dev/spattn verify --backend cuda --suite sfa 2>&1 | tail -25 | tee "$OUT/cli_verify.log"
fi
# short table: ours vs peer
python3 - "$OUT/sfa_cuda.json" "$OUT/sfa_torch_gather.json" <<'PY'
import json, math, sys
def load(p):
    try: return {(r["case"], r["pass"]): r for r in json.load(open(p))["results"]}
    except Exception: return {}
a, b = load(sys.argv[1]), load(sys.argv[2])
print(f"{'case':26s} {'fwdTF':>7s} {'peer':>6s} {'x':>6s} {'bwdTF':>7s} {'peer':>6s} {'x':>6s}")
ratios = []
for (c, p) in sorted(a):
    if p != "fwd": continue
    row = f"{c:26s}"
    for pas in ("fwd", "bwd"):
        o = a.get((c, pas), {}); q = b.get((c, pas), {})
        t, pt = o.get("tflops"), q.get("tflops")
        x = (q["median_ms"] / o["median_ms"]) if (q.get("median_ms") and o.get("median_ms")) else None
        if x: ratios.append(x)
        row += f" {t or float('nan'):7.1f} {pt or float('nan'):6.2f} {x or float('nan'):6.1f}"
    print(row)
if ratios: print("geomean speedup vs peer: %.1fx over %d passes" % (math.exp(sum(map(math.log, ratios)) / len(ratios)), len(ratios)))
PY
