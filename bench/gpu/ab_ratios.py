#!/usr/bin/env python3
"""Per-case time ratios of bench JSONs DIR/{NEW}_r{round}_d{det}.json over DIR/{BASE}_r..._d....json
(bench/gpu/ab_bins.sh): geomean and every case, then the medians in ms.
  python3 bench/gpu/ab_ratios.py DIR BASE NEW [NEW2 ...]"""
import glob
import json
import math
import re
import sys


def load(f):
    return {(r["case"], r.get("pass", "")): r["median_ms"] for r in json.load(open(f))["results"] if r.get("median_ms")}


d, base = sys.argv[1], sys.argv[2]
for v in sys.argv[3:]:
    for f in sorted(glob.glob(f"{d}/{v}_r*_d*.json")):
        m = re.search(r"_r(\d+)_d(\d)\.json$", f)
        try:
            a, b = load(f"{d}/{base}_r{m.group(1)}_d{m.group(2)}.json"), load(f)
        except (OSError, ValueError, KeyError) as e:
            print(f, e)
            continue
        rat = {k: b[k] / a[k] for k in b if k in a}
        if not rat:
            continue
        g = math.exp(sum(math.log(x) for x in rat.values()) / len(rat))
        print(f"{v} round {m.group(1)} det {m.group(2)}: geomean {g:.4f}  " +
              " ".join(f"{k[0].split('_')[0]}:{x:.3f}" for k, x in sorted(rat.items())))
        print("   ms base/new: " + " ".join(f"{k[0].split('_')[0]}:{a[k]:.3f}/{b[k]:.3f}" for k in sorted(rat)))
