"""Host-side cost of the calls' early verdicts, on CUDA tensors (issues 12 and 14).

The sfa forward returns once its index scan's verdict is back, the packed bsa forward / backward
once their prefix-sum check's verdict is (src/cuda/verdict.h); their kernels run on.  Per shape:
wall time until the call returns to the host and until the stream is idle (medians of 10), and
20 forwards each followed by host work as long as one forward (a stand-in for the Python /
launch work of the next layers) against calls that wait for their kernels (20 x (forward + host
work)).  Packed bsa also forward + backward (autograd).
Usage (device, repo root): SPATTN_LIBRARY=$PWD/build-carry/libspattn.so PYTHONPATH=python \
    python3 bench/gpu/host_return.py [sfa] [bsa]     (default: both)
"""
import statistics, sys, time
import torch
import spattn

SFA_SHAPES = [  # name, B, S1, S2, N1, K (sfa suite shapes, N2 = 1, D 512 + 64, bf16)
    ("sfa04-like", 1, 512, 8192, 64, 1024),
    ("sfa01-like", 1, 2048, 2048, 16, 1024),
    ("sfa07-like", 1, 4096, 8192, 64, 2048),
]
BSA_SHAPES = [  # name, sequences, total tokens, heads, block (bx = by), D; causal blocks per sequence
    ("bsav08-like", 32, 32768, 16, 128, 128),
    ("short seqs", 64, 8192, 8, 64, 128),
]


def spin(sec):
    t = time.perf_counter()
    while time.perf_counter() - t < sec:
        pass


def us(xs):
    return statistics.median(xs) * 1e6


def timed(call):
    """(median us until the call returns, median seconds until the stream is idle)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    ret, tot = [], []
    for _ in range(10):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        ret.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        tot.append(time.perf_counter() - t0)
    return us(ret), statistics.median(tot)


def overlap(name, call, f):
    loop = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            call()
            spin(f)
        torch.cuda.synchronize()
        loop.append(time.perf_counter() - t0)
    print(f"{name}: 20 x (forward + {f * 1e6:.0f} us host work): {us(loop) / 1e3:.2f} ms "
          f"(calls waiting for their kernels: {40 * f * 1e3:.2f} ms)")


def sfa():
    dev, dt = "cuda", torch.bfloat16
    for name, B, S1, S2, N1, K in SFA_SHAPES:
        g = torch.Generator(device=dev).manual_seed(1)
        q = torch.randn(B, S1, N1, 512, device=dev, dtype=dt, generator=g)
        qr = torch.randn(B, S1, N1, 64, device=dev, dtype=dt, generator=g)
        k = torch.randn(B, S2, 1, 512, device=dev, dtype=dt, generator=g)
        kr = torch.randn(B, S2, 1, 64, device=dev, dtype=dt, generator=g)
        idx = torch.randint(0, S2, (B, S1, 1, K), device=dev, dtype=torch.int32, generator=g)
        call = lambda: spattn.sparse_flash_attention(q, k, idx, q_rope=qr, k_rope=kr, causal=False)
        r, f = timed(call)
        print(f"{name}: the call returns after {r:.0f} us, the stream is idle after {f * 1e6:.0f} us")
        overlap(name, call, f)


def bsa():
    dev, dt = "cuda", torch.bfloat16
    for name, B, T, N, blk, D in BSA_SHAPES:
        g = torch.Generator().manual_seed(1)
        cuts = torch.sort(torch.randperm(T - 1, generator=g)[: B - 1] + 1).values
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(torch.int32)
        mx = int((cu[1:] - cu[:-1]).max())
        nb = (mx + blk - 1) // blk
        mask = torch.tril(torch.ones(nb, nb, dtype=torch.uint8)).expand(B, N, nb, nb).contiguous().to(dev)
        cu = cu.to(dev)
        q, k, v = (torch.randn(T, N, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
        kw = dict(block_size=blk, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)
        fwd = lambda: spattn.block_sparse_attention(q, k, v, mask, **kw)
        r, f = timed(fwd)
        print(f"{name} forward: the call returns after {r:.0f} us, the stream is idle after {f * 1e6:.0f} us")
        r2, f2 = timed(lambda: fwd().sum().backward())
        print(f"{name} forward + backward: the call returns after {r2:.0f} us, the stream is idle after "
              f"{f2 * 1e6:.0f} us")
        with torch.no_grad():
            overlap(name, fwd, f)


if __name__ == "__main__":
    which = sys.argv[1:] or ["sfa", "bsa"]
    if "sfa" in which:
        sfa()
    if "bsa" in which:
        bsa()
