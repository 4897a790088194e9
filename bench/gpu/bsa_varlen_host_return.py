"""Host-side cost of the packed bsa calls' prefix-sum verdict (issue 14), on CUDA tensors.

The packed forward / backward return once the device check's verdict is back (the early verdict,
src/cuda/verdict.h); their kernels run on.  For each shape: wall time until the forward returns
to the host and until the stream is idle (medians of 10), the same for forward + backward
(autograd), and 20 forwards each followed by host work as long as one forward, against the
time of calls that wait for their kernels (20 x (forward + host work)).
Usage (device, repo root): SPATTN_LIBRARY=$PWD/build-carry/libspattn.so PYTHONPATH=python \
    python3 bench/gpu/bsa_varlen_host_return.py
"""
import statistics, time
import torch
import spattn

SHAPES = [  # name, sequences, total tokens, heads, block (bx = by), D; causal blocks per sequence
    ("bsav08-like", 32, 32768, 16, 128, 128),
    ("short seqs", 64, 8192, 8, 64, 128),
]


def spin(sec):
    t = time.perf_counter()
    while time.perf_counter() - t < sec:
        pass


def main():
    dev, dt = "cuda", torch.bfloat16
    for name, B, T, N, blk, D in SHAPES:
        g = torch.Generator().manual_seed(1)
        cuts = torch.sort(torch.randperm(T - 1, generator=g)[: B - 1] + 1).values
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(torch.int32)
        mx = int((cu[1:] - cu[:-1]).max())
        nb = (mx + blk - 1) // blk
        mask = torch.tril(torch.ones(nb, nb, dtype=torch.uint8)).expand(B, N, nb, nb).contiguous().to(dev)
        cu = cu.to(dev)
        q = torch.randn(T, N, D, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(T, N, D, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(T, N, D, device=dev, dtype=dt, requires_grad=True)
        kw = dict(block_size=blk, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)
        fwd = lambda: spattn.block_sparse_attention(q, k, v, mask, **kw)
        def both():
            fwd().sum().backward()
        m = lambda xs: statistics.median(xs) * 1e6
        for label, call in (("forward", lambda: fwd()), ("forward + backward", both)):
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            ret, tot = [], []
            for _ in range(10):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                call()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                ret.append(t1 - t0)
                tot.append(time.perf_counter() - t0)
            if label == "forward":
                f = statistics.median(tot)
            print(f"{name} {label}: the call returns after {m(ret):.0f} us, the stream is idle after {m(tot):.0f} us")
        with torch.no_grad():
            loop = []
            for _ in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(20):
                    fwd()
                    spin(f)
                torch.cuda.synchronize()
                loop.append(time.perf_counter() - t0)
        print(f"{name}: 20 x (forward + {f * 1e6:.0f} us host work): {m(loop) / 1e3:.2f} ms "
              f"(calls waiting for their kernels: {40 * f * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
