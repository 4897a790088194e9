#!/usr/bin/env python3
"""Reader of `spattn bench --dump DIR` (format: docs/cli.md, "Dump files"), shared by the peer
scripts so that they time the very masks / indices spattn was timed with (regenerating them
with another random generator would give other masks for the random and bigbird patterns).

Per case, DIR/<case>.json is the header (the case's scaled shape, "pairs" and "flops_fwd" /
"flops_bwd" counted by spattn, and "mask" (bsa) or "indices" (sfa): file, dtype, byte_order,
shape) and the data file beside it is raw C-order uint8 [B,N,nbx,nby] or int32 [B,S1,N2,K].
The header is written after the data, so a header means complete data.

Standard library only (NumPy and torch are optional, for the checks and for tensors):
    cases = load_dir(DIR, op="bsa")          # headers, in case-name order
    raw = read_data(case)                    # bytes of the mask / indices
    t = as_torch(case)                       # torch.uint8 / torch.int32 tensor of the shape

Run as a program it checks a dump (sizes, values, pairs recounted from the data equal the
header's) and exits 1 on any problem:  python3 bench/peers/spattn_dump.py DIR [--case REGEX]
"""
import argparse
import json
import os
import re
import sys
from array import array

DTYPES = {"uint8": ("B", 1), "int32": ("i", 4)}


def load_dir(path, op=None, case=None):
    """Headers of every dumped case (dicts, plus "dir"), sorted by name; op / case (a regex)
    filter.  Raises ValueError when the directory holds no header."""
    out = []
    for name in sorted(os.listdir(path)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(path, name)) as f:
            h = json.load(f)
        if "case" not in h or h.get("tool") != "spattn":
            continue  # not a dump header (e.g. a results file put in the same directory)
        if op and h["op"] != op:
            continue
        if case and not re.search(case, h["case"]):
            continue
        h["dir"] = path
        out.append(h)
    if not out:
        raise ValueError(f"{path}: no spattn dump header (run `spattn bench --dump {path}` first)")
    return out


def data_info(h):
    """The data member of a header: {"file", "dtype", "byte_order", "shape"}."""
    return h["mask"] if h["op"] == "bsa" else h["indices"]


def read_data(h):
    """The raw bytes of the case's mask / indices, size-checked against the header."""
    d = data_info(h)
    code, size = DTYPES[d["dtype"]]
    n = 1
    for s in d["shape"]:
        n *= s
    with open(os.path.join(h["dir"], d["file"]), "rb") as f:
        raw = f.read()
    if len(raw) != n * size:
        raise ValueError(f"{d['file']}: {len(raw)} bytes, the header's shape {d['shape']} needs {n * size}")
    return raw


def as_array(h):
    """array.array of the values in C order (byte order fixed up to the host's)."""
    d = data_info(h)
    a = array(DTYPES[d["dtype"]][0])
    a.frombytes(read_data(h))
    if a.itemsize > 1 and d["byte_order"] != sys.byteorder:
        a.byteswap()
    return a


def as_torch(h, device="cpu"):
    """torch tensor of the header's shape: uint8 mask or int32 indices."""
    import torch

    d = data_info(h)
    t = torch.frombuffer(bytearray(as_array(h).tobytes()),
                         dtype=torch.uint8 if d["dtype"] == "uint8" else torch.int32)
    return t.reshape(d["shape"]).to(device)


def count_pairs(h, a=None):
    """Attended (query, key) pairs recounted from the data as cases/README.md counts them."""
    s = h["shape"]
    a = as_array(h) if a is None else a
    if h["op"] == "bsa":
        B, N, nbx, nby = data_info(h)["shape"]
        rows = [min(s["bx"], s["Sq"] - i * s["bx"]) for i in range(nbx)]
        cols = [min(s["by"], s["Skv"] - j * s["by"]) for j in range(nby)]
        pairs = 0
        for bn in range(B * N):
            for i in range(nbx):
                base = (bn * nbx + i) * nby
                pairs += rows[i] * sum(cols[j] for j in range(nby) if a[base + j])
        return pairs
    B, S1, N2, K = data_info(h)["shape"]
    S2, sbs, heads = s["S2"], s["sbs"], s["N1"] // s["N2"]
    pairs = 0
    for b in range(B):
        for i in range(S1):
            lim = S2 - S1 + i if s["mode"] == 3 else S2 - 1
            for n in range(N2):
                base = ((b * S1 + i) * N2 + n) * K
                for t in range(K):
                    x = a[base + t]
                    if x < 0:
                        continue
                    lo, hi = x * sbs, min(x * sbs + sbs - 1, S2 - 1, lim)
                    if hi >= lo:
                        pairs += (hi - lo + 1) * heads
    return pairs


def check(h):
    """Problems found in one case's dump (empty list: fine)."""
    errs = []
    try:
        a = as_array(h)
    except (OSError, ValueError) as e:
        return [str(e)]
    s = h["shape"]
    if h["op"] == "bsa":
        want = [s["B"], s["N"], -(-s["Sq"] // s["bx"]), -(-s["Skv"] // s["by"])]
        if data_info(h)["shape"] != want:
            errs.append(f"mask shape {data_info(h)['shape']}, the case needs {want}")
        if any(v > 1 for v in a):
            errs.append("mask values other than 0 and 1")
    else:
        want = [s["B"], s["S1"], s["N2"], s["K"]]
        if data_info(h)["shape"] != want:
            errs.append(f"indices shape {data_info(h)['shape']}, the case needs {want}")
        nblk = -(-s["S2"] // s["sbs"])
        if any(v < -1 or v >= nblk for v in a):
            errs.append(f"indices outside [-1, {nblk})")
    if errs:
        return errs
    p = count_pairs(h, a)
    if p != h["pairs"]:
        errs.append(f"pairs recounted {p}, header says {h['pairs']}")
    return errs


def main():
    ap = argparse.ArgumentParser(description="check a `spattn bench --dump` directory")
    ap.add_argument("dir")
    ap.add_argument("--case", default=None, help="regex on case names")
    a = ap.parse_args()
    bad = 0
    for h in load_dir(a.dir, case=a.case):
        errs = check(h)
        d = data_info(h)
        print(f"{h['case']:28s} {h['op']} {d['dtype']:5s} {str(d['shape']):24s} pairs {h['pairs']:.0f} "
              + ("ok" if not errs else "FAIL: " + "; ".join(errs)))
        bad += bool(errs)
    print(f"spattn_dump: {bad} bad case(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
