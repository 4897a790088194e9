"""A/B of the bsa ring schedules of spattn.distributed: ring (overlapped), ring_plan (the same with
a RingMask made once), ring_v1 (the previous schedule), allgather.  Interleaved timing (every
repeat runs each mode once, in turn, so that drift of a shared machine hits all of them alike)
and, per call, the number of library kernel calls, torch operators and tensor allocations.

    torchrun --nproc-per-node 2 bench/distributed/ring_ab.py                      # GPUs (NCCL)
    torchrun --nproc-per-node 2 bench/distributed/ring_ab.py --device cpu --seq 4096 --heads 2 \
        --block 64 --window 256                                                   # CPU (gloo)

Masks: window (--window tokens, contiguous shards) and causal (head-tail shards).  Prints, per
mask and mode, the median and min over --repeats of the slowest rank, forward and
forward+backward, and the counts (the largest over ranks).  --json writes them.
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

import spattn.distributed as cpd  # noqa: E402
from spattn import _lib, _merge_ops, merge as _merge, block_mask as _bm  # noqa: E402,F401


def masks(kind, nb, bs, window, dev):
    i = torch.arange(nb, device=dev)
    qi, kj = i[:, None], i[None, :]
    if kind == "causal":
        return (kj <= qi).to(torch.uint8)
    return ((kj * bs <= (qi + 1) * bs - 1) & ((kj + 1) * bs - 1 >= qi * bs - window)).to(torch.uint8)


class Counter:
    """Counts library kernel calls (bsa with or without plan, merge) while active."""
    names = [(_lib, "bsa_fwd"), (_lib, "bsa_bwd"), (_bm, "fwd"), (_bm, "bwd"), (_merge_ops, "merge_descs")]

    def __enter__(self):
        self.n, self.saved = 0, []
        for mod, nm in self.names:
            f = getattr(mod, nm)
            self.saved.append((mod, nm, f))

            def wrap(*a, _f=f, **k):
                self.n += 1
                return _f(*a, **k)
            setattr(mod, nm, wrap)
        return self

    def __exit__(self, *exc):
        for mod, nm, f in self.saved:
            setattr(mod, nm, f)


def op_counts(fn):
    """(torch operators, allocations) of one call, from the profiler (CPU-side events)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ev = [e for e in prof.events() if e.name.startswith("aten::")]
    allocs = sum(1 for e in ev if e.name in ("aten::empty", "aten::empty_strided", "aten::empty_like",
                                             "aten::zeros", "aten::full"))
    top = sum(1 for e in ev if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    return top, allocs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--masks", default="window,causal")
    ap.add_argument("--modes", default="ring,ring_plan,ring_v1,allgather")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    dist.barrier()
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dt = torch.bfloat16
    S, N, D, bs = args.seq, args.heads, args.dim, args.block
    out = []
    for kind in args.masks.split(","):
        lb = kind == "causal"
        g = torch.Generator(device=dev).manual_seed(7)
        full = [torch.randn(1, N, S, D, device=dev, generator=g).to(dt) for _ in range(4)]
        q, k, v, do = (cpd.shard(x, 2, load_balance=lb) for x in full)
        del full
        m = masks(kind, S // bs, bs, args.window, dev).expand(1, N, -1, -1)
        rm = cpd.create_ring_mask(m, bs, N, load_balance=lb)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]

        def call(mode, backward):
            mode_, mm = ("ring", rm) if mode == "ring_plan" else (mode, m)
            if not backward:
                with torch.no_grad():
                    return cpd.block_sparse_attention(q, k, v, mm, bs, mode=mode_, load_balance=lb)
            for x in leaves:
                x.grad = None
            o = cpd.block_sparse_attention(*leaves, mm, bs, mode=mode_, load_balance=lb)
            o.backward(do)
            return o

        modes = args.modes.split(",")
        times = {(md, b): [] for md in modes for b in (False, True)}
        for it in range(args.warmup + args.repeats):
            for md in modes:
                for b in (False, True):
                    sync()
                    dist.barrier()
                    t0 = time.perf_counter()
                    call(md, b)
                    sync()
                    ms = (time.perf_counter() - t0) * 1e3
                    t = torch.tensor([ms], dtype=torch.float64, device=dev)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    if it >= args.warmup:
                        times[(md, b)].append(t.item())
        for md in modes:
            with Counter() as c:
                call(md, False)
            nf = c.n
            with Counter() as c:
                call(md, True)
            nfb = c.n
            ops_f, al_f = op_counts(lambda: call(md, False))
            ops_fb, al_fb = op_counts(lambda: call(md, True))
            cnt = torch.tensor([nf, nfb, ops_f, ops_fb, al_f, al_fb], dtype=torch.float64, device=dev)
            dist.all_reduce(cnt, op=dist.ReduceOp.MAX)  # the busiest rank
            nf, nfb, ops_f, ops_fb, al_f, al_fb = (int(x) for x in cnt.tolist())
            row = dict(mask=kind, mode=md, S=S, world=world, device=dev.type,
                       fwd_med=statistics.median(times[(md, False)]), fwd_min=min(times[(md, False)]),
                       fb_med=statistics.median(times[(md, True)]), fb_min=min(times[(md, True)]),
                       lib_calls_fwd=nf, lib_calls_fwdbwd=nfb, torch_ops_fwd=ops_f, torch_ops_fwdbwd=ops_fb,
                       allocs_fwd=al_f, allocs_fwdbwd=al_fb)
            out.append(row)
        rm.close()
    if rank == 0:
        print(f"{world} ranks ({dev.type}), S={S} N={N} D={D} block {bs}, window {args.window}; ms, slowest rank, "
              f"median/min of {args.repeats} interleaved repeats; counts per call, largest over ranks")
        print(f"{'mask':7} {'mode':10} {'fwd med':>8} {'fwd min':>8} {'f+b med':>8} {'f+b min':>8} "
              f"{'lib f':>6} {'lib fb':>6} {'ops f':>6} {'ops fb':>6} {'alloc f':>7} {'alloc fb':>8}")
        for r in out:
            print(f"{r['mask']:7} {r['mode']:10} {r['fwd_med']:8.2f} {r['fwd_min']:8.2f} {r['fb_med']:8.2f} "
                  f"{r['fb_min']:8.2f} {r['lib_calls_fwd']:6d} {r['lib_calls_fwdbwd']:6d} {r['torch_ops_fwd']:6d} "
                  f"{r['torch_ops_fwdbwd']:6d} {r['allocs_fwd']:7d} {r['allocs_fwdbwd']:8d}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(args=vars(args), results=out), f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
