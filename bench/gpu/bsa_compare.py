#!/usr/bin/env python3
"""Prints ours vs a peer per case (fwd/bwd TFLOP/s, ratio of times) and the geometric means.
Usage: bsa_compare.py ours.json peer.json [more peers...]"""
import json
import math
import sys


def load(p):
    try:
        d = json.load(open(p))
    except Exception as e:  # noqa: BLE001
        print(f"cannot read {p}: {e}")
        return None
    return d.get("name", p), {(r["case"], r["pass"]): r for r in d["results"]}


def main():
    ours = load(sys.argv[1])
    if not ours:
        return 1
    for pp in sys.argv[2:]:
        peer = load(pp)
        if not peer:
            continue
        name, pr = peer
        print(f"\nours vs {name}: TFLOP/s and speedup (peer time / our time)")
        print(f"{'case':28s} {'fwd ours':>8s} {'peer':>7s} {'x':>6s}   {'bwd ours':>8s} {'peer':>7s} {'x':>6s}")
        logs = {"fwd": [], "bwd": []}
        for (case, ps), r in ours[1].items():
            if ps != "fwd":
                continue
            row = f"{case:28s}"
            for pas in ("fwd", "bwd"):
                o, p = ours[1].get((case, pas)), pr.get((case, pas))
                if o and p and o["median_ms"] > 0:
                    x = p["median_ms"] / o["median_ms"]
                    logs[pas].append(math.log(x))
                    row += f" {o['tflops']:8.1f} {p['tflops']:7.1f} {x:6.2f}  "
                else:
                    row += f" {o['tflops'] if o else float('nan'):8.1f} {'-':>7s} {'-':>6s}  "
            print(row)
        for pas in ("fwd", "bwd"):
            if logs[pas]:
                print(f"geomean speedup {pas}: {math.exp(sum(logs[pas]) / len(logs[pas])):.3f} over {len(logs[pas])} cases, "
                      f"min {math.exp(min(logs[pas])):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
