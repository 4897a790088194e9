#!/usr/bin/env python3
"""Peer for the sfa suite: a plain PyTorch gather implementation of top-k sparse attention.

Forward: gather the selected key rows (index_select on the flattened key tensor), scores by
einsum over D+Dr, mask padding / causal, fp32 softmax, P V with V = the first D columns of the
gathered keys (shared key/value).  Backward: autograd through the same graph.  Tokens are
processed in chunks so the gathered [chunk, K, D+Dr] tensor fits in memory.

Timing: kernel device time (sum of the CUDA kernels' self device time reported by
torch.profiler) per pass, median over the repeats; inputs per cases/README.md (standard normal,
indices: the newest allowed key plus distinct random allowed keys, -1 padding).  TFLOP/s as in
cases/README.md.  Output: JSON {"name", "backend", "device", "results": [{"case", "pass",
"median_ms", "tflops"}]} (docs/cli.md schema, readable by `spattn bench --compare`).

usage: sfa_torch_gather.py [--cases cases/sfa.cases] [--json OUT] [--repeats 3] [--case REGEX]
"""
import argparse
import json
import math
import re
import sys

import torch


def parse_cases(path):
    cases = []
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        c = {"name": parts[0]}
        for kv in parts[1:]:
            k, v = kv.split("=")
            c[k] = v if k == "dtype" else int(v)
        cases.append(c)
    return cases


def gen_indices(c, gen, dev):
    """[B, S1, N2, K] int32 per cases/README.md (sbs = 1 in the suite; blocks otherwise)."""
    B, S1, S2, N2, K, sbs, mode = c["B"], c["S1"], c["S2"], c["N2"], c["K"], c["sbs"], c["mode"]
    nblk = (S2 + sbs - 1) // sbs
    out = torch.empty(B, S1, N2, K, dtype=torch.int32, device=dev)
    i = torch.arange(S1, device=dev)
    lim = (S2 - S1 + i) if mode == 3 else torch.full_like(i, S2 - 1)
    limb = torch.div(lim, sbs, rounding_mode="floor")  # newest allowed block (may be < 0)
    cols = torch.arange(nblk, device=dev)
    for b in range(B):
        for n in range(N2):
            for s0 in range(0, S1, 1024):
                s1 = min(S1, s0 + 1024)
                r = torch.rand(s1 - s0, nblk, generator=gen, device=dev)
                allowed = cols[None, :] <= limb[s0:s1, None]
                r = torch.where(allowed, r, torch.full_like(r, -1.0))
                r[torch.arange(s1 - s0, device=dev), limb[s0:s1].clamp(min=0)] = torch.where(
                    limb[s0:s1] >= 0, 2.0, -1.0)
                kk = min(K, nblk)
                vals, idx = torch.topk(r, kk, dim=1)
                idx = torch.where(vals >= 0, idx, torch.full_like(idx, -1))
                # random order among the selected entries (padding stays at the end)
                perm = torch.argsort(torch.rand(idx.shape, generator=gen, device=dev) + (idx < 0) * 2.0, dim=1)
                idx = torch.gather(idx, 1, perm)
                row = torch.full((s1 - s0, K), -1, dtype=torch.int64, device=dev)
                row[:, :kk] = idx
                out[b, s0:s1, n] = row.to(torch.int32)
    return out


def sfa_chunk(q, kv, idx_c, s1_0, c, scale):
    """q: [C, H, D+Dr] (one b, n2), kv: [S2, D+Dr], idx_c: [C, K] int64 -> o [C, H, D]."""
    D, S1, S2, sbs, mode = c["D"], c["S1"], c["S2"], c["sbs"], c["mode"]
    C, K = idx_c.shape
    if sbs > 1:
        off = torch.arange(sbs, device=idx_c.device)
        keys = (idx_c[:, :, None] * sbs + off).reshape(C, K * sbs)
        pad = (idx_c < 0)[:, :, None].expand(C, K, sbs).reshape(C, K * sbs)
    else:
        keys, pad = idx_c, idx_c < 0
    i = torch.arange(s1_0, s1_0 + C, device=idx_c.device)
    lim = (S2 - S1 + i) if mode == 3 else torch.full_like(i, S2 - 1)
    valid = (~pad) & (keys < S2) & (keys <= lim[:, None])
    keys = torch.where(valid, keys, torch.zeros_like(keys))
    kg = kv.index_select(0, keys.reshape(-1)).reshape(C, keys.shape[1], kv.shape[-1])
    s = torch.einsum("chd,ckd->chk", q, kg).float() * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num(p, nan=0.0)  # rows with no key
    o = torch.einsum("chk,ckd->chd", p.to(q.dtype), kg[..., :D])
    return o, int(valid.sum().item())


def device_ms(fn):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    total_us = 0.0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0.0)
        total_us += t
    return total_us / 1000.0


def run_case(c, repeats, dev):
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[c["dtype"]]
    B, S1, S2, N1, N2, D, Dr, K = (c[x] for x in ("B", "S1", "S2", "N1", "N2", "D", "Dr", "K"))
    H = N1 // N2
    gen = torch.Generator(device=dev)
    gen.manual_seed(c.get("seed", 0))
    q = torch.randn(B, S1, N1, D + Dr, generator=gen, device=dev).to(dt)
    kv = torch.randn(B, S2, N2, D + Dr, generator=gen, device=dev).to(dt)
    dout = torch.randn(B, S1, N1, D, generator=gen, device=dev).to(dt)
    idx = gen_indices(c, gen, dev)
    scale = 1.0 / math.sqrt(D + Dr)
    chunk = max(1, min(S1, int(1.5e9 // (K * c["sbs"] * (D + Dr) * 2 + K * c["sbs"] * H * 16))))
    pairs = [0]

    def fwd(grad):
        pairs[0] = 0
        outs = []
        for b in range(B):
            for n in range(N2):
                kvb = kv[b, :, n]
                for s0 in range(0, S1, chunk):
                    s1 = min(S1, s0 + chunk)
                    qc = q[b, s0:s1, n * H:(n + 1) * H]
                    if grad:
                        qc = qc.detach().requires_grad_(True)
                        kvc = kvb.detach().requires_grad_(True)
                    else:
                        kvc = kvb
                    o, npair = sfa_chunk(qc, kvc, idx[b, s0:s1, n].long(), s0, c, scale)
                    pairs[0] += npair * H
                    if grad:
                        outs.append((o, qc, kvc, dout[b, s0:s1, n * H:(n + 1) * H]))
        return outs

    with torch.no_grad():
        fwd(False)  # warm-up and pair count
    npairs = pairs[0]
    ff = 2.0 * (D + Dr + D) * npairs
    fb = 2.0 * (3.0 * (D + Dr) + 2.0 * D) * npairs
    tf, tb = [], []
    for _ in range(repeats):
        with torch.no_grad():
            tf.append(device_ms(lambda: fwd(False)))
        # backward: one profiled pass of forward + backward per chunk, minus the forward time
        def fwd_bwd():
            for b in range(B):
                for n in range(N2):
                    kvb = kv[b, :, n]
                    for s0 in range(0, S1, chunk):
                        s1 = min(S1, s0 + chunk)
                        qc = q[b, s0:s1, n * H:(n + 1) * H].detach().requires_grad_(True)
                        kvc = kvb.detach().requires_grad_(True)
                        o, _ = sfa_chunk(qc, kvc, idx[b, s0:s1, n].long(), s0, c, scale)
                        o.backward(dout[b, s0:s1, n * H:(n + 1) * H])
                        del o, qc, kvc
        tot = device_ms(fwd_bwd) - tf[-1]
        tb.append(tot)
    tf.sort()
    tb.sort()
    mf, mb = tf[len(tf) // 2], tb[len(tb) // 2]
    return [
        {"case": c["name"], "pass": "fwd", "median_ms": mf, "tflops": ff / (mf * 1e-3) / 1e12},
        {"case": c["name"], "pass": "bwd", "median_ms": mb, "tflops": fb / (mb * 1e-3) / 1e12},
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="cases/sfa.cases")
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--case", default=None)
    a = ap.parse_args()
    dev = "cuda"
    res = []
    for c in parse_cases(a.cases):
        if a.case and not re.search(a.case, c["name"]):
            continue
        try:
            r = run_case(c, a.repeats, dev)
        except torch.cuda.OutOfMemoryError as e:
            print(f"{c['name']}: out of memory ({e})", file=sys.stderr)
            r = [{"case": c["name"], "pass": p, "median_ms": None, "tflops": None} for p in ("fwd", "bwd")]
        torch.cuda.empty_cache()
        for x in r:
            print(f"{x['case']:26s} {x['pass']} {x['median_ms']} ms {x['tflops']} TFLOP/s", flush=True)
        res.extend(r)
        doc = {"name": "torch_gather", "backend": "cuda", "device": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "results": res}
        if a.json:  # rewritten after every case, so a time limit keeps what was measured
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
