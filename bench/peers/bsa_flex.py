#!/usr/bin/env python3
"""Peer timings for the block-sparse attention cases (cases/bsa.cases), run on the GPU machine.

FlexAttention (torch.nn.attention.flex_attention): mask_mod reads the case's block mask
tensor (mask[b, h, q // bx, kv // by]), create_block_mask builds its sparse schedule,
flex_attention is torch.compile'd, backward by autograd.  cuDNN SDPA
(scaled_dot_product_attention under SDPBackend.CUDNN_ATTENTION) on the dense cases.

Timing: device time of the peer's kernels, from torch.profiler (sum of the CUDA kernel times
of one iteration, one profiler session per iteration), median over --reps iterations, a
buffer of twice the L2 size written before every iteration.  Block-mask creation is not
timed (it is a one-off per mask in real use).  Backward: q, k, v gradients of one
out.backward(dO) on a retained graph.

Masks: read from <masks>/<case>.u8 when present (bench/gpu/bsa_bench writes them, so both
sides time the very same masks); otherwise generated from cases/README.md's rules.
TFLOP/s counted as cases/README.md says: forward 4*D*pairs, backward 10*D*pairs, pairs
counted exactly from the mask.

Writes JSON {"name", "backend", "device", "results": [{"case", "pass", "median_ms",
"tflops"}]} per peer (flex, cudnn).
Usage: python3 bench/peers/bsa_flex.py [--cases cases/bsa.cases] [--masks DIR]
       [--out-flex flex.json] [--out-cudnn cudnn.json] [--reps 10] [--case SUBSTR]
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch._dynamo
import torch._functorch.config
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.profiler import ProfilerActivity, profile


def load_cases(path):
    cases = []
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        tok = line.split()
        c = {"name": tok[0], "Nkv": None, "seed": 0}
        for t in tok[1:]:
            k, v = t.split("=", 1)
            c[k] = v
        for k in ("B", "N", "Sq", "Skv", "D", "bx", "by", "window", "glob", "win", "rand", "seed"):
            if k in c and c[k] is not None:
                c[k] = int(c[k])
        c["Nkv"] = int(c["Nkv"]) if c["Nkv"] else c["N"]
        if "density" in c:
            c["density"] = float(c["density"])
        cases.append(c)
    return cases


def gen_mask(c, nbx, nby):
    g = torch.Generator().manual_seed(int(c.get("seed", 0)) + 17)
    B, N, Sq, Skv, bx, by = c["B"], c["N"], c["Sq"], c["Skv"], c["bx"], c["by"]
    off = Skv - Sq
    r = torch.arange(nbx).view(-1, 1)
    col = torch.arange(nby).view(1, -1)
    qs, qe = r * bx, torch.clamp((r + 1) * bx, max=Sq) - 1
    ks, ke = col * by, torch.clamp((col + 1) * by, max=Skv) - 1
    pat = c["pattern"]
    if pat == "dense":
        m = torch.ones(nbx, nby, dtype=torch.bool)
    elif pat == "causal":
        m = ks <= qe + off
    elif pat == "window":
        m = (ks <= qe + off) & (ke >= qs + off - c["window"])
    elif pat == "bigbird":
        m = (col < c["glob"]) | (r < c["glob"]) | ((ks <= qe + c["win"] * by) & (ke >= qs - c["win"] * by))
    elif pat == "random":
        return (torch.rand(B, N, nbx, nby, generator=g) < c["density"]).to(torch.uint8)
    else:
        raise ValueError(pat)
    m = m.expand(B, N, nbx, nby).clone()
    if pat == "bigbird":
        extra = torch.randint(0, nby, (B, N, nbx, c["rand"]), generator=g)
        m.scatter_(3, extra, True)
    return m.to(torch.uint8)


def count_pairs(c, mask):
    nbx, nby = mask.shape[2], mask.shape[3]
    rows = torch.tensor([min((i + 1) * c["bx"], c["Sq"]) - i * c["bx"] for i in range(nbx)], dtype=torch.float64)
    cols = torch.tensor([min((j + 1) * c["by"], c["Skv"]) - j * c["by"] for j in range(nby)], dtype=torch.float64)
    return float((mask.to(torch.float64) * rows.view(-1, 1) * cols.view(1, -1)).sum())


_flush = None


def flush_l2():
    global _flush
    if _flush is None:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        _flush = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
    _flush.fill_(1.0)


def kernel_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush_l2()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        tot_us = 0.0
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tot_us += e.time_range.end - e.time_range.start
        times.append(tot_us / 1000.0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="cases/bsa.cases")
    ap.add_argument("--masks", default=None)
    ap.add_argument("--out-flex", default="bsa_flex.json")
    ap.add_argument("--out-cudnn", default="bsa_cudnn.json")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--case", default=None)
    a = ap.parse_args()
    dev = torch.cuda.get_device_name(0)
    # repeated backward on one retained graph (each timed iteration runs out.backward again)
    torch._functorch.config.donated_buffer = False
    torch._dynamo.config.recompile_limit = 1000
    torch._dynamo.config.accumulated_recompile_limit = 10000
    flex_c = torch.compile(flex_attention)
    res_flex, res_cudnn = [], []
    print(f"{'case':28s} {'flex_fwd_ms':>11s} {'TF':>7s} {'flex_bwd_ms':>11s} {'TF':>7s} {'cudnn_fwd':>9s} {'cudnn_bwd':>9s}")
    for c in load_cases(a.cases):
        if a.case and a.case not in c["name"]:
            continue
        B, N, Nkv, Sq, Skv, D, bx, by = c["B"], c["N"], c["Nkv"], c["Sq"], c["Skv"], c["D"], c["bx"], c["by"]
        nbx, nby = (Sq + bx - 1) // bx, (Skv + by - 1) // by
        path = os.path.join(a.masks, c["name"] + ".u8") if a.masks else None
        if path and os.path.exists(path):
            import numpy as np
            mask = torch.from_numpy(np.fromfile(path, dtype=np.uint8).reshape(B, N, nbx, nby))
        else:
            mask = gen_mask(c, nbx, nby)
        pairs = count_pairs(c, mask)
        dt = torch.bfloat16 if c.get("dtype") == "bf16" else torch.float16
        torch._dynamo.reset()  # compile each case fresh (never the eager fallback)
        gen = torch.Generator(device="cuda").manual_seed(int(c.get("seed", 0)))
        q = torch.randn(B, N, Sq, D, device="cuda", dtype=dt, generator=gen).requires_grad_()
        k = torch.randn(B, Nkv, Skv, D, device="cuda", dtype=dt, generator=gen).requires_grad_()
        v = torch.randn(B, Nkv, Skv, D, device="cuda", dtype=dt, generator=gen).requires_grad_()
        dO = torch.randn(B, N, Sq, D, device="cuda", dtype=dt, generator=gen)
        mask_d = mask.to("cuda").bool()

        def mask_mod(b, h, q_idx, kv_idx):
            return mask_d[b, h, q_idx // bx, kv_idx // by]

        bm = create_block_mask(mask_mod, B, N, Sq, Skv, device="cuda", _compile=True)
        gqa = Nkv != N

        def fwd():
            with torch.no_grad():
                return flex_c(q, k, v, block_mask=bm, enable_gqa=gqa)

        out = flex_c(q, k, v, block_mask=bm, enable_gqa=gqa)

        def bwd():
            q.grad = k.grad = v.grad = None
            out.backward(dO, retain_graph=True)

        ff, fb = 4.0 * D * pairs, 10.0 * D * pairs
        tf = kernel_ms(fwd, a.reps)
        tb = kernel_ms(bwd, a.reps)
        res_flex.append({"case": c["name"], "pass": "fwd", "median_ms": tf, "tflops": ff / tf / 1e9})
        res_flex.append({"case": c["name"], "pass": "bwd", "median_ms": tb, "tflops": fb / tb / 1e9})
        cf = cb = float("nan")
        if c["pattern"] == "dense":
            def cfwd():
                with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)

            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out2 = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)

            def cbwd():
                q.grad = k.grad = v.grad = None
                out2.backward(dO, retain_graph=True)

            cf = kernel_ms(cfwd, a.reps)
            cb = kernel_ms(cbwd, a.reps)
            res_cudnn.append({"case": c["name"], "pass": "fwd", "median_ms": cf, "tflops": ff / cf / 1e9})
            res_cudnn.append({"case": c["name"], "pass": "bwd", "median_ms": cb, "tflops": fb / cb / 1e9})
            del out2
        print(f"{c['name']:28s} {tf:11.4f} {ff / tf / 1e9:7.1f} {tb:11.4f} {fb / tb / 1e9:7.1f} {cf:9.4f} {cb:9.4f}", flush=True)
        del out, q, k, v, dO, bm
        torch.cuda.empty_cache()
        write(a, dev, res_flex, res_cudnn)  # after every case: partial results survive a time limit
    write(a, dev, res_flex, res_cudnn)
    return 0


def write(a, dev, res_flex, res_cudnn):
    for path, name, res in ((a.out_flex, "flex", res_flex), (a.out_cudnn, "cudnn_sdpa", res_cudnn)):
        with open(path, "w") as f:
            json.dump({"name": name, "backend": "cuda", "device": dev, "torch": torch.__version__, "results": res}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
