"""Context-parallel spattn (spattn.distributed) on W GPUs vs one GPU: correctness and throughput.

Run (two H200s, NCCL; the library built with CUDA and the package importable):

    torchrun --nproc-per-node 2 bench/distributed/cp_bench.py --json cp.json

CPU smoke test of the script itself (gloo, tiny shapes):

    torchrun --nproc-per-node 2 bench/distributed/cp_bench.py --device cpu --quick

Cases (issue 15): S = 32K and 64K tokens; bsa B=1 N=16 D=128 bf16 blocks 128x128, causal
(head-tail shards) and window (2048 tokens, contiguous shards), modes (--modes) ring, ring_plan
(ring with a RingMask made once), ring_v1 (the previous ring schedule) and allgather; sfa
B=1 N1=64 N2=1 D=512 Dr=64 K=2048 causal bf16 (head-tail shards).  For every case:
  * correctness: the CP output / LSE / gradients on each rank vs the matching shard of the
    single-GPU result (every rank computes the full problem on its own GPU), eco criterion of
    cases/README.md;
  * throughput: median of --repeats timed runs (CUDA events, --warmup runs first, a barrier
    before each), forward and forward+backward; CP times are the max over ranks; single-GPU
    times are the full problem on one GPU.  speedup = t(1 GPU) / t(W GPUs), efficiency =
    speedup / W.  Targets: speedup >= 1.7 on 2 GPUs for sfa and bsa window; ring ahead of
    all-gather on window masks.
Prints one table row per case and pass (last), writes --json when given.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import spattn  # noqa: E402
import spattn.distributed as cpd  # noqa: E402

ECO = {torch.bfloat16: (2 ** -6, 2 ** -6, 1.0), torch.float16: (2 ** -9, 2 ** -9, 0.1),
       torch.float32: (1e-4, 1e-4, 1e-3), "lse": (2 ** -16, 2 ** -10, 0.01)}


def eco(actual, golden, kind=None):
    atol, rtol, lim = ECO[kind or golden.dtype]
    a, g = actual.float(), golden.float()
    inf_ok = torch.isinf(a) & torch.isinf(g) & (torch.sign(a) == torch.sign(g))
    err = torch.where(inf_ok, torch.zeros_like(a), (a - g).abs()).nan_to_num(float("inf"))
    ok = err <= atol + rtol * torch.where(inf_ok, torch.zeros_like(g), g.abs())
    ratio = ok.float().mean().item()
    mx = err.max().item()
    return ratio >= 0.99 and mx <= lim, ratio, mx


def timed(fn, repeats, warmup, dev):
    for _ in range(warmup):
        fn()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    ts = []
    for _ in range(repeats):
        dist.barrier()
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def max_over_ranks(x: float, dev) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def all_ok(ok: bool, dev) -> bool:
    t = torch.tensor([0 if ok else 1], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item() == 0


def window_mask(nb_q, nb_k, bx, by, window, dev):
    qi = torch.arange(nb_q, device=dev)[:, None]
    kj = torch.arange(nb_k, device=dev)[None, :]
    q0, q1 = qi * bx, (qi + 1) * bx - 1
    k0, k1 = kj * by, (kj + 1) * by - 1
    return ((k0 <= q1) & (k1 >= q0 - window)).to(torch.uint8)


def causal_mask(nb_q, nb_k, bx, by, dev):
    qi = torch.arange(nb_q, device=dev)[:, None]
    kj = torch.arange(nb_k, device=dev)[None, :]
    return (kj * by <= (qi + 1) * bx - 1).to(torch.uint8)


def causal_topk(S, K, dev, gen):
    """[1, S, 1, K] int32: row i holds min(K, i+1) allowed keys (the newest, i, always), random
    others (with replacement; duplicates are legal gather terms), -1 padding."""
    out = torch.empty(S, K, dtype=torch.int32, device=dev)
    step = 4096
    for s0 in range(0, S, step):
        rows = torch.arange(s0, min(S, s0 + step), device=dev)
        r = torch.rand(rows.numel(), K, device=dev, generator=gen)
        idx = (r * (rows[:, None] + 1)).long().clamp_max(rows[:, None])
        idx[:, 0] = rows
        small = rows < K  # rows with fewer allowed keys than K: all of them, then padding
        ar = torch.arange(K, device=dev)[None, :]
        idx = torch.where(small[:, None], torch.where(ar <= rows[:, None], ar, -1), idx)
        out[s0:s0 + rows.numel()] = idx.int()
    return out.view(1, S, 1, K)


def run_case(case, args, dev, rank, world, results):
    torch.manual_seed(1234)
    gen = torch.Generator(device=dev).manual_seed(1234)
    S = case["S"]
    dt = torch.bfloat16
    lb = case["lb"]
    sh = lambda x, d: cpd.shard(x, d, load_balance=lb)  # noqa: E731
    rnd = lambda *s: torch.randn(*s, device=dev, generator=gen).to(dt)  # noqa: E731
    if case["op"] == "bsa":
        B, N, D, bs = 1, args.heads_bsa, 128, args.block
        q, k, v, do = rnd(B, N, S, D), rnd(B, N, S, D), rnd(B, N, S, D), rnd(B, N, S, D)
        m = (causal_mask(S // bs, S // bs, bs, bs, dev) if case["mask"] == "causal"
             else window_mask(S // bs, S // bs, bs, bs, args.window, dev)).expand(B, N, -1, -1)
        seq_dim, names = 2, ("q", "k", "v")
        full = (q, k, v)

        def single(*t):
            return spattn.block_sparse_attention(*t, m, bs, return_lse=True)

        mode, mm = case["mode"], m
        if mode == "ring_plan":  # the overlapped ring with its work map and plans built once
            mode, mm = "ring", cpd.create_ring_mask(m, bs, N, load_balance=lb)

        def cp(*t):
            return cpd.block_sparse_attention(*t, mm, bs, return_lse=True, mode=mode, load_balance=lb)
    else:
        B, N1, D, Dr, K = 1, args.heads_sfa, 512, 64, args.topk
        qc, kc, do = rnd(B, S, N1, D + Dr), rnd(B, S, 1, D + Dr), rnd(B, S, N1, D)
        idx = causal_topk(S, K, dev, gen)
        seq_dim, names = 1, ("q", "k")
        full = (qc, kc)

        def single(qq, kk, ii=idx):
            return spattn.sparse_flash_attention(qq[..., :D], kk[..., :D], ii, q_rope=qq[..., D:],
                                                 k_rope=kk[..., D:], return_lse=True)

        def cp(qq, kk):
            return cpd.sparse_flash_attention(qq[..., :D], kk[..., :D], sh(idx, 1), q_rope=qq[..., D:],
                                              k_rope=kk[..., D:], return_lse=True, load_balance=lb)
    name = case["name"]
    # ---- single GPU (full problem on each rank's own GPU) ----
    leaves = [x.clone().requires_grad_() for x in full]
    o1, l1 = single(*leaves)
    o1.backward(do)
    g1 = [x.grad for x in leaves]
    # ---- context parallel ----
    loc = [sh(x, seq_dim).requires_grad_() for x in full]
    dol = sh(do, seq_dim)
    o, lse = cp(*loc)
    o.backward(dol)
    checks = {"o": eco(o, sh(o1, seq_dim)), "lse": eco(lse, sh(l1, seq_dim), "lse")}
    for nm, x, g in zip(names, loc, g1):
        checks["d" + nm] = eco(x.grad, sh(g, seq_dim))
    ok = all_ok(all(c[0] for c in checks.values()), dev)
    worst = {k: (round(max_over_ranks(-c[1], dev) * -1, 5), max_over_ranks(c[2], dev)) for k, c in checks.items()}
    del o1, l1, g1, o, lse
    leaves = [x.detach().clone().requires_grad_() for x in full]

    def fwd1():
        with torch.no_grad():
            single(*leaves)

    def fb1():
        for x in leaves:
            x.grad = None
        single(*leaves)[0].backward(do)

    def fwdw():
        with torch.no_grad():
            cp(*loc)

    def fbw():
        for x in loc:
            x.grad = None
        cp(*loc)[0].backward(dol)
    t = {}
    t["fwd_1gpu"] = max_over_ranks(timed(fwd1, args.repeats, args.warmup, dev), dev)
    t["fwdbwd_1gpu"] = max_over_ranks(timed(fb1, args.repeats, args.warmup, dev), dev)
    t["fwd_cp"] = max_over_ranks(timed(fwdw, args.repeats, args.warmup, dev), dev)
    t["fwdbwd_cp"] = max_over_ranks(timed(fbw, args.repeats, args.warmup, dev), dev)
    row = dict(case=name, world=world, correct=ok, worst=worst, **{k: round(v, 3) for k, v in t.items()},
               speedup_fwd=round(t["fwd_1gpu"] / t["fwd_cp"], 3),
               speedup_fwdbwd=round(t["fwdbwd_1gpu"] / t["fwdbwd_cp"], 3))
    results.append(row)
    if rank == 0:
        print(f"[{name}] correct={ok} worst(min matched, max err)={worst}", flush=True)
    del leaves, loc
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--seq", default="32768,65536", help="global sequence lengths")
    ap.add_argument("--ops", default="bsa,sfa")
    ap.add_argument("--heads-bsa", type=int, default=16)
    ap.add_argument("--heads-sfa", type=int, default=64)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke test of the script)")
    ap.add_argument("--case", default="", help="substring filter on case names")
    ap.add_argument("--modes", default="ring,ring_plan,ring_v1,allgather",
                    help="bsa modes: ring (overlapped ring, mask prepared per call), ring_plan (the same "
                         "with a RingMask built once), ring_v1 (the previous ring schedule), allgather")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.quick:
        args.seq, args.heads_bsa, args.heads_sfa, args.topk, args.block, args.window = "512", 2, 4, 64, 32, 64
        args.repeats, args.warmup = 2, 1
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    dist.barrier()  # every rank's communicator is up before the first (possibly one-sided) ring step
    cases = []
    for S in (int(s) for s in args.seq.split(",")):
        tag = f"{S // 1024}K" if S >= 1024 else str(S)
        if "bsa" in args.ops:
            for mask, lb in (("causal", True), ("window", False)):
                for mode in args.modes.split(","):
                    cases.append(dict(op="bsa", S=S, mask=mask, lb=lb, mode=mode,
                                      name=f"bsa_{mask}_s{tag}_{mode}_lb{int(lb)}"))
        if "sfa" in args.ops:
            cases.append(dict(op="sfa", S=S, lb=True, name=f"sfa_n{args.heads_sfa}_k{args.topk}_s{tag}_lb1"))
    cases = [c for c in cases if args.case in c["name"]]
    results = []
    t0 = time.time()
    for c in cases:
        run_case(c, args, dev, rank, world, results)
    if rank == 0:
        print(f"\n{world} ranks ({dev.type}), {time.time() - t0:.0f} s; times in ms (median of {args.repeats}), "
              "speedup = 1 GPU / W GPUs")
        hdr = f"{'case':34} {'ok':>3} {'fwd 1':>9} {'fwd W':>9} {'x':>6} {'f+b 1':>9} {'f+b W':>9} {'x':>6}"
        print(hdr)
        for r in results:
            print(f"{r['case']:34} {'yes' if r['correct'] else 'NO':>3} {r['fwd_1gpu']:9.2f} {r['fwd_cp']:9.2f} "
                  f"{r['speedup_fwd']:6.2f} {r['fwdbwd_1gpu']:9.2f} {r['fwdbwd_cp']:9.2f} {r['speedup_fwdbwd']:6.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(world=world, device=str(dev), args=vars(args), results=results), f, indent=1)
    dist.destroy_process_group()
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
