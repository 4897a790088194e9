"""Packed variable-length calls vs the per-sequence loop they replace (issue 14, item 6).

Bar: a packed batch of 32 sequences of random lengths (32K tokens in all) runs within 1.15x of
the same work as one sequence with the equivalent block-diagonal mask, and >= 5x faster than the
per-sequence loop.  Per shape and pass (forward; forward + backward by autograd, o.backward(g)
with a fixed random g, the forward included in the time), three variants, each timed by wall
clock from a synchronised stream to a synchronised stream (median of --repeats, 3 warm-ups):
  packed  one call with cu_seqlens_q/k (already on the device) and max_seqlen_q/k as ints.
  loop    what the torch_npu wrappers did before packed calls: cu_seqlens.cpu().tolist() (a host
          sync), one dense call per sequence on views of the packed tensors (bsa BNSD
          q[s:e].transpose(0, 1)[None], sfa BSND q[s:e][None]), torch.cat of the outputs back
          to TND; all of it is timed.
  diag    the same work as one dense sequence (only the call is timed; inputs built before).
          bsa: every sequence starts at a block boundary of a padded buffer (the padding is
          printed), mask = block-diagonal of the per-sequence causal masks.  Rows of a
          sequence's last partial block see the buffer's zero padding keys, so diag's output
          differs there: it is a timing reference only.  sfa: B = 1 over all T tokens,
          causal=False, each token's indices shifted by its sequence's first row.  The indices
          are drawn sequence-local and valid under the per-sequence causal rule (token at local
          position p picks min(K, p + 1) distinct keys in [0, p], rest -1), so causal=True in
          packed/loop and causal=False in diag select the same keys.
Before timing, once per shape: max |packed - loop| of the forward outputs (sfa: also diag).
Shapes (bf16): bsa 32 random-length sequences / 32768 tokens, N 16 / Nkv 4, D 128, block 64,
causal blocks per sequence; the same with N = Nkv = 16, block 128; 256 x 64 tokens, N 8, D 128,
block 64.  sfa 32 random-length sequences / 32768 tokens, N1 16, N2 1, D 512 + Dr 64, shared
K/V, K 2048 indices, causal.  Lengths: torch.Generator seed 7 (>= 1 each, summing to the total).
Usage (device, repo root): SPATTN_LIBRARY=$PWD/build-carry/libspattn.so PYTHONPATH=python \
    python3 bench/gpu/varlen_loop.py [--repeats 10] [--only bsa|sfa] [--scale S] [--device cuda]
--scale shrinks the token counts (and K; many-short keeps 64-token sequences, fewer of them);
CPU smoke test: --device cpu --scale 0.015625 --repeats 1.
"""
import argparse, statistics, time
import torch
import spattn

BSA_SHAPES = [  # name, sequences, total tokens, N, Nkv, D, block, random lengths
    ("bsa 32 seq, N16/Nkv4, blk 64", 32, 32768, 16, 4, 128, 64, True),
    ("bsa 32 seq, N16/Nkv16, blk 128", 32, 32768, 16, 16, 128, 128, True),
    ("bsa many short 256 x 64", 256, 16384, 8, 8, 128, 64, False),
]
SFA_SHAPES = [  # name, sequences, total tokens, N1, N2, D, Dr, K
    ("sfa 32 seq, N1 16, D 512+64, K 2048", 32, 32768, 16, 1, 512, 64, 2048),
]
DT = torch.bfloat16


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(call, dev, repeats):
    """Median ms of call(), from an idle device to an idle device, after 3 warm-ups."""
    for _ in range(3):
        call()
    ts = []
    for _ in range(repeats):
        sync(dev)
        t0 = time.perf_counter()
        call()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def lengths(nseq, total, rand):
    """Sequence lengths >= 1 summing to total: random cut points (seed 7) or all equal."""
    if not rand:
        return [total // nseq] * nseq
    g = torch.Generator().manual_seed(7)
    cuts = torch.sort(torch.randperm(total - 1, generator=g)[: nseq - 1] + 1).values.tolist()
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


def prefix(lens, dev):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=dev)


def nograd(f):
    def call():
        with torch.no_grad():
            return f()
    return call


def fwd_bwd(f, leaves, grad):
    """Forward + backward by autograd (the forward is part of what is timed)."""
    def call():
        for t in leaves:
            t.grad = None
        f().backward(grad)
    return call


def report(name, rows, note):
    print(f"\n{name}  ({note})")
    print(f"{'pass':<10}{'packed ms':>11}{'loop ms':>11}{'diag ms':>11}{'packed/diag':>13}{'loop/packed':>13}")
    for p, a, b, c in rows:
        print(f"{p:<10}{a:>11.3f}{b:>11.3f}{c:>11.3f}{a / c:>13.3f}{b / a:>13.2f}")


def run_shape(name, calls, leaves, grads, dev, repeats, note):
    """calls: variant -> forward function; leaves/grads: variant -> (leaf tensors, fixed grad)."""
    rows = []
    for p in ("fwd", "fwd+bwd"):
        ms = []
        for var in ("packed", "loop", "diag"):
            f = calls[var]
            c = nograd(f) if p == "fwd" else fwd_bwd(f, leaves[var], grads[var])
            ms.append(timed(c, dev, repeats))
        rows.append((p, *ms))
    report(name, rows, note)


# ---------------------------------------------------------------------------------------------- bsa
def bsa_loop(q, k, v, mask, cu, blk):
    c = cu.cpu().tolist()  # the host sync the packed call avoids
    outs = []
    for b in range(len(c) - 1):
        s, e = c[b], c[b + 1]
        n = -(-(e - s) // blk)
        o = spattn.block_sparse_attention(q[s:e].transpose(0, 1)[None], k[s:e].transpose(0, 1)[None],
                                          v[s:e].transpose(0, 1)[None], mask[b:b + 1, :, :n, :n], blk)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs, 0)


def bsa_diag_inputs(q, k, v, lens, blk, N):
    """Padded [1, H, P, D] copies (each sequence from a block boundary) + block-diagonal mask."""
    nbs = [-(-n // blk) for n in lens]
    pos, seg, p0 = [], [], 0
    for i, (n, nb) in enumerate(zip(lens, nbs)):
        pos.append(torch.arange(p0, p0 + n))
        seg += [i] * nb
        p0 += nb * blk
    pos = torch.cat(pos).to(q.device)

    def pad(t):
        out = t.new_zeros(1, t.shape[1], p0, t.shape[2])
        out[0][:, pos] = t.detach().transpose(0, 1)
        return out.requires_grad_()
    seg = torch.tensor(seg)
    nb = len(seg)
    tri = torch.arange(nb)[None, :] <= torch.arange(nb)[:, None]
    m = ((seg[:, None] == seg[None, :]) & tri).to(torch.uint8)
    return pad(q), pad(k), pad(v), m.expand(1, N, nb, nb).contiguous().to(q.device), p0


def bench_bsa(dev, repeats, scale):
    for name, nseq, total, N, Nkv, D, blk, rand in BSA_SHAPES:
        if rand:
            T = max(nseq, round(total * scale))
        else:  # equal lengths: keep the length, scale the count
            T = max(2, round(nseq * scale)) * (total // nseq)
            nseq = T // (total // nseq)
        lens = lengths(nseq, T, rand)
        cu, mx = prefix(lens, dev), max(lens)
        nbm = -(-mx // blk)
        mask = torch.tril(torch.ones(nbm, nbm, dtype=torch.uint8)).expand(nseq, N, nbm, nbm).contiguous().to(dev)
        g = torch.Generator(device=dev).manual_seed(7)
        q = torch.randn(T, N, D, device=dev, dtype=DT, generator=g).requires_grad_()
        k, v = (torch.randn(T, Nkv, D, device=dev, dtype=DT, generator=g).requires_grad_() for _ in range(2))
        gq = torch.randn(T, N, D, device=dev, dtype=DT, generator=g)
        qd, kd, vd, md, P = bsa_diag_inputs(q, k, v, lens, blk, N)
        gd = torch.randn(1, N, P, D, device=dev, dtype=DT, generator=g)
        calls = {
            "packed": lambda: spattn.block_sparse_attention(q, k, v, mask, blk, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                            max_seqlen_q=mx, max_seqlen_k=mx),
            "loop": lambda: bsa_loop(q, k, v, mask, cu, blk),
            "diag": lambda: spattn.block_sparse_attention(qd, kd, vd, md, blk),
        }
        with torch.no_grad():
            err = (calls["packed"]().float() - calls["loop"]().float()).abs().max().item()
        note = (f"T {T}, lengths {min(lens)}..{mx}, diag padded to {P} tokens (+{100 * (P - T) / T:.1f} %), "
                f"max|packed - loop| fwd {err:.3g}")
        leaves = {"packed": (q, k, v), "loop": (q, k, v), "diag": (qd, kd, vd)}
        run_shape(name, calls, leaves, {"packed": gq, "loop": gq, "diag": gd}, dev, repeats, note)


# ---------------------------------------------------------------------------------------------- sfa
def sfa_indices(lens, K, dev, g):
    """[T, 1, K] int32, sequence-local: local position p gets min(K, p + 1) distinct keys in [0, p]
    (random order), then -1."""
    W = max(max(lens), K)
    local = torch.cat([torch.arange(n) for n in lens]).to(dev)
    out = []
    for c in range(0, len(local), 1024):  # chunks bound the [rows, W] score buffer
        p = local[c:c + 1024, None]
        sc = torch.rand(p.shape[0], W, device=dev, generator=g)
        sc = torch.where(torch.arange(W, device=dev)[None] <= p, sc, torch.full_like(sc, -1.0))
        val, idx = sc.topk(K, dim=1)
        out.append(torch.where(val >= 0, idx, torch.full_like(idx, -1)).to(torch.int32))
    return torch.cat(out)[:, None]


def sfa_loop(q, k, idx, qr, kr, cu):
    c = cu.cpu().tolist()  # the host sync the packed call avoids
    outs = []
    for b in range(len(c) - 1):
        s, e = c[b], c[b + 1]
        o = spattn.sparse_flash_attention(q[s:e][None], k[s:e][None], idx[s:e][None], q_rope=qr[s:e][None],
                                          k_rope=kr[s:e][None], causal=True)
        outs.append(o[0])
    return torch.cat(outs, 0)


def bench_sfa(dev, repeats, scale):
    for name, nseq, total, N1, N2, D, Dr, K in SFA_SHAPES:
        T = max(nseq, round(total * scale))
        K = max(4, round(K * scale))
        lens = lengths(nseq, T, True)
        cu, mx = prefix(lens, dev), max(lens)
        g = torch.Generator(device=dev).manual_seed(7)
        q = torch.randn(T, N1, D, device=dev, dtype=DT, generator=g).requires_grad_()
        qr = torch.randn(T, N1, Dr, device=dev, dtype=DT, generator=g).requires_grad_()
        k = torch.randn(T, N2, D, device=dev, dtype=DT, generator=g).requires_grad_()
        kr = torch.randn(T, N2, Dr, device=dev, dtype=DT, generator=g).requires_grad_()
        go = torch.randn(T, N1, D, device=dev, dtype=DT, generator=g)
        idx = sfa_indices(lens, K, dev, g)
        starts = torch.repeat_interleave(cu[:-1].long(), torch.tensor(lens, device=dev))
        idx_d = torch.where(idx >= 0, idx + starts[:, None, None].to(torch.int32), idx)
        calls = {
            "packed": lambda: spattn.sparse_flash_attention(q, k, idx, q_rope=qr, k_rope=kr, causal=True,
                                                            cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                            max_seqlen_q=mx, max_seqlen_k=mx),
            "loop": lambda: sfa_loop(q, k, idx, qr, kr, cu),
            "diag": lambda: spattn.sparse_flash_attention(q[None], k[None], idx_d[None], q_rope=qr[None],
                                                          k_rope=kr[None], causal=False)[0],
        }
        with torch.no_grad():
            o = calls["packed"]().float()
            e_loop = (o - calls["loop"]().float()).abs().max().item()
            e_diag = (o - calls["diag"]().float()).abs().max().item()
        valid = (idx >= 0).sum(-1).float().mean().item()
        note = (f"T {T}, K {K} ({valid:.0f} valid on average), lengths {min(lens)}..{mx}, "
                f"max|packed - loop| fwd {e_loop:.3g}, max|packed - diag| fwd {e_diag:.3g}")
        leaves = (q, qr, k, kr)
        run_shape(name, calls, dict.fromkeys(calls, leaves), dict.fromkeys(calls, go), dev, repeats, note)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--only", choices=("bsa", "sfa"))
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the token counts (and of K)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dev = torch.device(a.device)
    print(f"spattn {spattn.version()}, {dev}" + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")
          + f", bf16, median of {a.repeats} after 3 warm-ups")
    if a.only != "sfa":
        bench_bsa(dev, a.repeats, a.scale)
    if a.only != "bsa":
        bench_sfa(dev, a.repeats, a.scale)
