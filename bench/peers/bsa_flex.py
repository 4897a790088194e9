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

Cases, shapes and masks: read from a `spattn bench --dump DIR` directory (one JSON header and
one raw uint8 mask per case, docs/cli.md "Dump files", read by spattn_dump.py beside this
script), so both sides time the very same (scaled) shapes and masks.  TFLOP/s as
cases/README.md counts them: forward 4*D*pairs, backward 10*D*pairs, pairs counted by spattn
from the mask (the header's "flops_fwd" / "flops_bwd").  Inputs: torch.randn (the values do
not change the timing).

Writes JSON {"name", "backend", "device", "scale", "results": [{"case", "op", "pass",
"median_ms", "flops", "tflops"}]} per peer (flex, cudnn_sdpa): the bench schema of docs/cli.md,
for `spattn bench --load ours.json --compare flex.json`.
Usage: spattn bench --backend cuda --op bsa --dump DIR --json ours.json
       python3 bench/peers/bsa_flex.py --dump DIR [--out-flex flex.json]
       [--out-cudnn cudnn.json] [--reps 10] [--case REGEX]
"""
import argparse
import json
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spattn_dump  # noqa: E402  (beside this script)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


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
    ap.add_argument("--dump", required=True, help="directory written by spattn bench --dump")
    ap.add_argument("--out-flex", default="bsa_flex.json")
    ap.add_argument("--out-cudnn", default="bsa_cudnn.json")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--case", default=None, help="regex on case names")
    a = ap.parse_args()
    cases = spattn_dump.load_dir(a.dump, op="bsa", case=a.case)
    dev = torch.cuda.get_device_name(0)
    a.scale = min(h.get("scale", 1.0) for h in cases)
    # repeated backward on one retained graph (each timed iteration runs out.backward again)
    torch._functorch.config.donated_buffer = False
    torch._dynamo.config.recompile_limit = 1000
    torch._dynamo.config.accumulated_recompile_limit = 10000
    flex_c = torch.compile(flex_attention)
    res_flex, res_cudnn = [], []
    print(f"{'case':28s} {'flex_fwd_ms':>11s} {'TF':>7s} {'flex_bwd_ms':>11s} {'TF':>7s} {'cudnn_fwd':>9s} {'cudnn_bwd':>9s}")
    for hd in cases:
        c = hd["shape"]
        c["name"] = hd["case"]
        B, N, Nkv, Sq, Skv, D, bx, by = c["B"], c["N"], c["Nkv"], c["Sq"], c["Skv"], c["D"], c["bx"], c["by"]
        mask = spattn_dump.as_torch(hd)  # uint8 [B, N, ceil(Sq/bx), ceil(Skv/by)]
        dt = DTYPES[c["dtype"]]
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

        ff, fb = hd["flops_fwd"], hd["flops_bwd"]
        tf = kernel_ms(fwd, a.reps)
        tb = kernel_ms(bwd, a.reps)
        res_flex.append(entry(c, "fwd", tf, ff))
        res_flex.append(entry(c, "bwd", tb, fb))
        cf = cb = float("nan")
        if c["pattern"] == "dense" and dt != torch.float32:  # cuDNN: fp16 / bf16 only
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
            res_cudnn.append(entry(c, "fwd", cf, ff))
            res_cudnn.append(entry(c, "bwd", cb, fb))
            del out2
        print(f"{c['name']:28s} {tf:11.4f} {ff / tf / 1e9:7.1f} {tb:11.4f} {fb / tb / 1e9:7.1f} {cf:9.4f} {cb:9.4f}", flush=True)
        del out, q, k, v, dO, bm
        torch.cuda.empty_cache()
        write(a, dev, res_flex, res_cudnn)  # after every case: partial results survive a time limit
    write(a, dev, res_flex, res_cudnn)
    return 0


def entry(c, pas, ms, flops):
    return {"case": c["name"], "op": "bsa", "pass": pas, "median_ms": ms, "flops": flops,
            "tflops": flops / (ms * 1e-3) / 1e12}


def write(a, dev, res_flex, res_cudnn):
    for path, name, res in ((a.out_flex, "flex", res_flex), (a.out_cudnn, "cudnn_sdpa", res_cudnn)):
        with open(path, "w") as f:
            json.dump({"name": name, "backend": "cuda", "device": dev, "torch": torch.__version__,
                       "scale": a.scale, "results": res}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
