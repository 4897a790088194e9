"""Host-side cost of the sfa forward's index verdict (issue 12 item 3), on CUDA tensors.

The forward returns once the index scan's verdict is back (the early verdict, sfa_host.cu); its
kernels run on.  For each shape: wall time until the call returns to the host and until the
stream is idle (medians of 10), and a "host work" loop: 20 forwards, each followed by host work
as long as one forward (a stand-in for the Python / launch work of the next layers), against
20 x (forward + host work) back to back, the time of a call that waits for its kernels.
Usage (device, repo root): SPATTN_LIBRARY=$PWD/build-carry/libspattn.so PYTHONPATH=python \
    python3 bench/gpu/sfa_host_return.py
"""
import statistics, time
import torch
import spattn

SHAPES = [  # name, B, S1, S2, N1, K (sfa suite shapes, N2 = 1, D 512 + 64, bf16)
    ("sfa04-like", 1, 512, 8192, 64, 1024),
    ("sfa01-like", 1, 2048, 2048, 16, 1024),
    ("sfa07-like", 1, 4096, 8192, 64, 2048),
]


def spin(sec):
    t = time.perf_counter()
    while time.perf_counter() - t < sec:
        pass


def main():
    dev, dt = "cuda", torch.bfloat16
    for name, B, S1, S2, N1, K in SHAPES:
        g = torch.Generator(device=dev).manual_seed(1)
        q = torch.randn(B, S1, N1, 512, device=dev, dtype=dt, generator=g)
        qr = torch.randn(B, S1, N1, 64, device=dev, dtype=dt, generator=g)
        k = torch.randn(B, S2, 1, 512, device=dev, dtype=dt, generator=g)
        kr = torch.randn(B, S2, 1, 64, device=dev, dtype=dt, generator=g)
        idx = torch.randint(0, S2, (B, S1, 1, K), device=dev, dtype=torch.int32, generator=g)
        call = lambda: spattn.sparse_flash_attention(q, k, idx, q_rope=qr, k_rope=kr, causal=False)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        ret, tot, loop = [], [], []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            ret.append(t1 - t0)
            tot.append(t2 - t0)
        fwd = statistics.median(tot)
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                call()
                spin(fwd)
            torch.cuda.synchronize()
            loop.append(time.perf_counter() - t0)
        m = lambda xs: statistics.median(xs) * 1e6
        print(f"{name}: the call returns after {m(ret):.0f} us, the stream is idle after {m(tot):.0f} us; "
              f"20 x (call + {fwd * 1e6:.0f} us host work): {m(loop) / 1e3:.2f} ms "
              f"(a call waiting for its kernels: {40 * fwd * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
