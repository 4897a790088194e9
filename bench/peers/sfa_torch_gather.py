#!/usr/bin/env python3
"""Peer for the sfa suite: a plain PyTorch gather implementation of top-k sparse attention.

Forward: gather the selected key rows (index_select on the flattened key tensor), scores by
einsum over D+Dr, mask padding / causal, fp32 softmax, P V with V = the first D columns of the
gathered keys (shared key/value).  Backward: autograd through the same graph.  Tokens are
processed in chunks so the gathered [chunk, K, D+Dr] tensor fits in memory.

Timing: kernel device time (sum of the CUDA kernels' self device time reported by
torch.profiler) per pass, median over the repeats.  Cases, shapes and top-k indices: read from
a `spattn bench --dump DIR` directory (docs/cli.md "Dump files", read by spattn_dump.py beside
this script), so both sides time the very same (scaled) shapes and indices; q, k, dO are
torch.randn (the values do not change the timing).  TFLOP/s from the header's "flops_fwd" /
"flops_bwd" (cases/README.md's count, by spattn).  Output: JSON {"name", "backend", "device",
"scale", "results": [{"case", "op", "pass", "median_ms", "flops", "tflops"}]} (docs/cli.md
schema, for `spattn bench --load ours.json --compare peer.json`).

usage: spattn bench --backend cuda --op sfa --dump DIR --json ours.json
       sfa_torch_gather.py --dump DIR [--json OUT] [--repeats 3] [--case REGEX]
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spattn_dump  # noqa: E402  (beside this script)


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


def run_case(hd, repeats, dev):
    c = dict(hd["shape"], name=hd["case"])
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[c["dtype"]]
    B, S1, S2, N1, N2, D, Dr, K = (c[x] for x in ("B", "S1", "S2", "N1", "N2", "D", "Dr", "K"))
    H = N1 // N2
    gen = torch.Generator(device=dev)
    gen.manual_seed(c.get("seed", 0))
    q = torch.randn(B, S1, N1, D + Dr, generator=gen, device=dev).to(dt)
    kv = torch.randn(B, S2, N2, D + Dr, generator=gen, device=dev).to(dt)
    dout = torch.randn(B, S1, N1, D, generator=gen, device=dev).to(dt)
    idx = spattn_dump.as_torch(hd, dev)  # int32 [B, S1, N2, K], -1 = padding
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
    if npairs != hd["pairs"]:  # the gather must attend exactly the pairs spattn counted
        print(f"{c['name']}: WARNING: {npairs} pairs attended, spattn counted {hd['pairs']:.0f}", file=sys.stderr)
    ff, fb = hd["flops_fwd"], hd["flops_bwd"]
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
        {"case": c["name"], "op": "sfa", "pass": "fwd", "median_ms": mf, "flops": ff, "tflops": ff / (mf * 1e-3) / 1e12},
        {"case": c["name"], "op": "sfa", "pass": "bwd", "median_ms": mb, "flops": fb, "tflops": fb / (mb * 1e-3) / 1e12},
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="directory written by spattn bench --dump")
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--case", default=None, help="regex on case names")
    a = ap.parse_args()
    cases = spattn_dump.load_dir(a.dump, op="sfa", case=a.case)
    scale = min(h.get("scale", 1.0) for h in cases)
    dev = "cuda"
    res = []
    for hd in cases:
        try:
            r = run_case(hd, a.repeats, dev)
        except torch.cuda.OutOfMemoryError as e:
            print(f"{hd['case']}: out of memory ({e})", file=sys.stderr)
            r = [{"case": hd["case"], "op": "sfa", "pass": p, "median_ms": None, "tflops": None}
                 for p in ("fwd", "bwd")]
        torch.cuda.empty_cache()
        for x in r:
            print(f"{x['case']:26s} {x['pass']} {x['median_ms']} ms {x['tflops']} TFLOP/s", flush=True)
        res.extend(r)
        doc = {"name": "torch_gather", "backend": "cuda", "device": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "scale": scale, "results": res}
        if a.json:  # rewritten after every case, so a time limit keeps what was measured
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
