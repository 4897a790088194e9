"""spattn.distributed on the CPU with the gloo backend (2 and 3 processes, torch.multiprocessing):
outputs and gradients of the context-parallel sfa and bsa (ring and all-gather, head-tail and
contiguous shards, causal / window / random masks with empty rows) equal the single-process
result within the eco criterion; the ring's step skipping; torch.compile(fullgraph=True) on 2
processes.  Skipped (with the reason printed) where torch or torch.distributed is absent."""
from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import traceback
import unittest

import metrics
from gen import topk_indices

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    HAVE = (hasattr(torch, "library") and hasattr(torch.library, "custom_op") and dist.is_available()
            and dist.is_gloo_available())
    WHY = "torch.distributed with gloo not available: distributed tests skipped"
except ImportError:  # pragma: no cover - CI without torch
    torch = None
    HAVE = False
    WHY = "PyTorch not importable: distributed tests skipped"

COMPILE_BACKEND = os.environ.get("SPATTN_TEST_COMPILE_BACKEND", "aot_eager")
# eco (cases/README.md): dtype -> (atol, rtol, max-error limit); fp32 tensors tightly.
ECO = {"bfloat16": (2 ** -6, 2 ** -6, 1.0), "float16": (2 ** -9, 2 ** -9, 0.1), "float32": (1e-4, 1e-4, 1e-3),
       "lse": (2 ** -16, 2 ** -10, 0.01)}


def eco(name, actual, golden, kind=None):
    """(ok, message) for one tensor under the eco criterion, golden = the single-process result."""
    atol, rtol, lim = ECO[kind or str(golden.dtype).replace("torch.", "")]
    a, g = actual.double(), golden.double()
    both_inf = torch.isinf(a) & torch.isinf(g) & (torch.sign(a) == torch.sign(g))
    err = torch.where(both_inf, torch.zeros_like(a), (a - g).abs())
    err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
    ok_el = err <= atol + rtol * torch.where(both_inf, torch.zeros_like(g), g.abs())
    ratio = ok_el.double().mean().item() if ok_el.numel() else 1.0
    mx = err.max().item() if err.numel() else 0.0
    return ratio >= 0.99 and mx <= lim, f"{name}: matched {ratio:.4f}, max err {mx:.3g}", mx


# ---------------------------------------------------------------------------------------------
# the work each rank does (module-level so that spawn can pickle it)
# ---------------------------------------------------------------------------------------------
def _masks(kind, b, n, nb, seed):
    i = torch.arange(nb)
    if kind == "causal":
        m = (i[None, :] <= i[:, None])
    elif kind == "window":
        m = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - 1)
    else:  # random with some empty block rows
        g = torch.Generator().manual_seed(seed)
        m = torch.rand(b, n, nb, nb, generator=g) < 0.3
        m[..., 1, :] = False
        return m.to(torch.uint8)
    return m.to(torch.uint8).expand(b, n, nb, nb)


def _bsa_cases(world):
    bf, f32, f16 = torch.bfloat16, torch.float32, torch.float16
    if world == 2:
        combos = [(bf, "causal", "ring", True), (f32, "causal", "allgather", True), (bf, "window", "allgather", True),
                  (f32, "window", "ring", True), (bf, "random", "ring", True), (f32, "random", "allgather", True),
                  (bf, "window", "ring", False), (f16, "causal", "allgather", False)]
    else:
        combos = [(bf, "causal", "ring", True), (bf, "random", "allgather", True), (f32, "window", "ring", True),
                  (bf, "random", "ring", False)]
    return [dict(dtype=d, kind=k, mode=m, lb=lb) for d, k, m, lb in combos]


def _sfa_cases(world):
    cases = [dict(dtype=torch.bfloat16, causal=True, sbs=1, rope=True, v=False, lb=True),
            dict(dtype=torch.float32, causal=True, sbs=4, rope=True, v=False, lb=True),
            dict(dtype=torch.bfloat16, causal=False, sbs=1, rope=False, v=True, lb=False),
            dict(dtype=torch.float16, causal=True, sbs=2, rope=False, v=True, lb=False)]
    return cases if world == 2 else cases[:3:2]


def _check_all(res, name, pairs):
    for key, a, g, kind in pairs:
        ok, msg, mx = eco(key, a, g, kind)
        res["max"][f"{name} {key}"] = mx
        if not ok:
            res["fail"].append(f"{name}: {msg}")


def _run_bsa(res, world, rank, cpd, spattn):
    B, N, NKV, D, bs = 1, 2, 1, 32, 16
    for ci, c in enumerate(_bsa_cases(world)):
        lb = c["lb"]
        S = (2 if lb else 1) * world * 32
        g = torch.Generator().manual_seed(100 + ci)
        q, k, v, do = (torch.randn(B, h, S, D, generator=g).to(c["dtype"]) for h in (N, NKV, NKV, N))
        mask = _masks(c["kind"], B, N, S // bs, 7 + ci)
        qf, kf, vf = (x.clone().requires_grad_() for x in (q, k, v))
        o_ref, lse_ref = spattn.block_sparse_attention(qf, kf, vf, mask, (bs, bs), return_lse=True)
        (o_ref.float() * do.float()).sum().backward()
        sh = lambda x: cpd.shard(x, 2, load_balance=lb)  # noqa: E731
        ql, kl, vl = (sh(x).requires_grad_() for x in (q, k, v))
        o, lse = cpd.block_sparse_attention(ql, kl, vl, mask, (bs, bs), return_lse=True, mode=c["mode"],
                                            load_balance=lb)
        (o.float() * sh(do).float()).sum().backward()
        name = f"bsa W{world} {str(c['dtype'])[6:]} {c['kind']} {c['mode']} lb={int(lb)}"
        _check_all(res, name, [("o", o, sh(o_ref), None), ("lse", lse, sh(lse_ref), "lse"),
                               ("dq", ql.grad, sh(qf.grad), None), ("dk", kl.grad, sh(kf.grad), None),
                               ("dv", vl.grad, sh(vf.grad), None)])
        res["n"] += 1


def _ring_mask_case(kind, B, N, S, bx, by, world, lb, seed):
    """Global block masks for the overlapped ring: random with empty block rows and a never
    attended key chunk (steps without work for some ranks), "offset" (each query chunk attends
    only the key chunk owned by the rank two (W=2: one) before: step 0 empty, later steps not),
    window with bx != by, causal, "none" (a rank whose rows attend nothing)."""
    g = torch.Generator().manual_seed(seed)
    nbx, nby = S // bx, S // by
    n = 2 * world if lb else world
    Lx, Ly = nbx // n, nby // n
    qi = torch.arange(nbx)[:, None]
    kj = torch.arange(nby)[None, :]
    if kind == "random":
        m = torch.rand(B, N, nbx, nby, generator=g) < 0.3
        m[..., 2, :] = False                       # empty block rows
        m[..., :, Ly:2 * Ly] = False               # key chunk 1 never attended: its ring steps skip
        return m.to(torch.uint8)
    if kind == "offset":
        owner = {c: r for r in range(world) for c in ([r, 2 * world - 1 - r] if lb else [r])}
        back = 2 if world > 2 else 1
        qr = torch.tensor([owner[int(i) // Lx] for i in range(nbx)])[:, None]
        kr = torch.tensor([owner[int(j) // Ly] for j in range(nby)])[None, :]
        m = (kr == (qr - back) % world) & (torch.rand(B, N, nbx, nby, generator=g) < 0.5)
        return m.to(torch.uint8)
    if kind == "window":  # token window of 24 on blocks bx x by
        m = (kj * by <= (qi + 1) * bx - 1) & ((kj + 1) * by - 1 >= qi * bx - 24)
    elif kind == "causal":
        m = kj * by <= (qi + 1) * bx - 1
    else:  # "none": the rows of the first query chunk attend nothing, the others causal
        m = (kj * by <= (qi + 1) * bx - 1) & (qi >= Lx)
    return m.to(torch.uint8).expand(B, N, nbx, nby)


def _ring_cases(world):
    bf, f32, f16 = torch.bfloat16, torch.float32, torch.float16
    # (dtype, mask kind, load_balance, N, Nkv, bx, by, blocks per chunk along x)
    if world == 2:
        return [(bf, "random", True, 4, 2, 16, 16, 3), (f32, "offset", False, 2, 2, 16, 16, 3),
                (bf, "window", False, 4, 1, 16, 8, 3), (f32, "causal", True, 4, 2, 8, 16, 4),
                (f16, "none", True, 2, 1, 16, 16, 1)]
    return [(bf, "random", False, 4, 2, 16, 16, 3), (f32, "offset", True, 2, 1, 16, 16, 1),
            (bf, "window", True, 2, 2, 8, 16, 4), (f32, "none", False, 4, 2, 16, 8, 3)]


def _run_ring(res, world, rank, cpd, spattn):
    """The overlapped ring (mode="ring") against the single-process result: forward and every
    gradient within eco; bitwise the same on a second call and through a reused RingMask."""
    B, D = 1, 16
    for ci, (dt, kind, lb, N, NKV, bx, by, lx) in enumerate(_ring_cases(world)):
        n = 2 * world if lb else world
        S = n * lx * bx
        g = torch.Generator().manual_seed(400 + ci)
        q, k, v, do = (torch.randn(B, h, S, D, generator=g).to(dt) for h in (N, NKV, NKV, N))
        mask = _ring_mask_case(kind, B, N, S, bx, by, world, lb, 50 + ci)
        qf, kf, vf = (x.clone().requires_grad_() for x in (q, k, v))
        o_ref, lse_ref = spattn.block_sparse_attention(qf, kf, vf, mask, (bx, by), return_lse=True)
        (o_ref.float() * do.float()).sum().backward()
        sh = lambda x: cpd.shard(x, 2, load_balance=lb)  # noqa: E731
        rm = cpd.create_ring_mask(mask, (bx, by), NKV, load_balance=lb)
        runs = []
        for m in (mask, mask, rm):
            ql, kl, vl = (sh(x).requires_grad_() for x in (q, k, v))
            o, lse = cpd.block_sparse_attention(ql, kl, vl, m, (bx, by), return_lse=True, mode="ring",
                                                load_balance=lb)
            (o.float() * sh(do).float()).sum().backward()
            runs.append((o, lse, ql.grad, kl.grad, vl.grad))
        rm.close()
        name = f"ring W{world} {str(dt)[6:]} {kind} lb={int(lb)} N{N}/{NKV} {bx}x{by}"
        o, lse, dq, dk, dv = runs[0]
        _check_all(res, name, [("o", o, sh(o_ref), None), ("lse", lse, sh(lse_ref), "lse"),
                               ("dq", dq, sh(qf.grad), None), ("dk", dk, sh(kf.grad), None),
                               ("dv", dv, sh(vf.grad), None)])
        for j, what in ((1, "second call"), (2, "RingMask")):
            for nm, a, b in zip(("o", "lse", "dq", "dk", "dv"), runs[0], runs[j]):
                if not torch.equal(a, b):  # (no NaN here; -inf == -inf)
                    res["fail"].append(f"{name}: {nm} of the {what} is not bitwise equal")
        res["n"] += 1
    # a RingMask is checked against the call; a closed one is refused
    m = _ring_mask_case("causal", 1, 2, 2 * world * 32, 16, 16, world, True, 0)
    q = torch.randn(1, 2, 2 * 32, 16)
    kv1 = torch.randn(1, 1, 2 * 32, 16)
    rm = cpd.create_ring_mask(m, 16, 2)
    for args, what in (((q, kv1, kv1, rm, 16), "Nkv 1 for a mask made with Nkv 2"),
                       ((q, q, q, rm, (16, 8)), "another block size")):
        try:
            cpd.block_sparse_attention(*args, mode="ring")
            res["fail"].append(f"RingMask W{world}: {what} was accepted")
        except ValueError:
            pass
    rm.close()
    try:
        cpd.block_sparse_attention(q, q, q, rm, 16, mode="ring")
        res["fail"].append(f"RingMask W{world}: a closed RingMask was accepted")
    except ValueError:
        pass


def _run_sfa(res, world, rank, cpd, spattn):
    B, N1, N2, D, Dr, K = 1, 4, 1, 32, 16, 12
    for ci, c in enumerate(_sfa_cases(world)):
        lb = c["lb"]
        S = (2 if lb else 1) * world * 24
        g = torch.Generator().manual_seed(200 + ci)
        mk = lambda *s: torch.randn(*s, generator=g).to(c["dtype"])  # noqa: E731
        q, k, do = mk(B, S, N1, D), mk(B, S, N2, D), mk(B, S, N1, D)
        qr, kr = (mk(B, S, N1, Dr), mk(B, S, N2, Dr)) if c["rope"] else (None, None)
        v = mk(B, S, N2, D) if c["v"] else None
        sbs = c["sbs"]
        idx = torch.tensor(topk_indices(300 + ci, B, S, S, N2, K, sbs=sbs, causal=c["causal"]), dtype=torch.int32)
        leaves = [x.clone().requires_grad_() if x is not None else None for x in (q, k, v, qr, kr)]
        o_ref, lse_ref = spattn.sparse_flash_attention(leaves[0], leaves[1], idx, v=leaves[2], q_rope=leaves[3],
                                                       k_rope=leaves[4], sparse_block_size=sbs,
                                                       causal=c["causal"], return_lse=True)
        (o_ref.float() * do.float()).sum().backward()
        sh = lambda x: cpd.shard(x, 1, load_balance=lb) if x is not None else None  # noqa: E731
        loc = [sh(x).requires_grad_() if x is not None else None for x in (q, k, v, qr, kr)]
        o, lse = cpd.sparse_flash_attention(loc[0], loc[1], sh(idx), v=loc[2], q_rope=loc[3], k_rope=loc[4],
                                            sparse_block_size=sbs, causal=c["causal"], return_lse=True,
                                            load_balance=lb)
        (o.float() * sh(do).float()).sum().backward()
        name = f"sfa W{world} {str(c['dtype'])[6:]} causal={int(c['causal'])} sbs={sbs} lb={int(lb)}"
        checks = [("o", o, sh(o_ref), None), ("lse", lse, sh(lse_ref), "lse")]
        for nm, a, ref in zip(("dq", "dk", "dv", "dq_rope", "dk_rope"), loc, leaves):
            if a is not None:
                checks.append((nm, a.grad, sh(ref.grad), None))
        _check_all(res, name, checks)
        res["n"] += 1


def _run_skip(res, world, rank, cpd):
    """The ring skips steps without work: a block-diagonal mask needs no transfer at all."""
    if world < 2:
        return
    for mode in ("ring", "ring_v1"):
        _run_skip_mode(res, world, rank, cpd, mode)


def _run_skip_mode(res, world, rank, cpd, mode):
    # "ring" sends k and v as one [2, B, Nkv, n, D] message, "ring_v1" as two [B, Nkv, n, D]
    per = 1 if mode == "ring" else 2
    bs, S, D = 16, 2 * world * 32, 32
    mask = torch.eye(S // bs, dtype=torch.uint8).expand(1, 1, -1, -1)
    calls = {"p2p": 0}
    orig = dist.batch_isend_irecv

    def counting(ops):
        calls["p2p"] += len(ops)
        return orig(ops)
    dist.batch_isend_irecv = counting
    try:
        q = torch.randn(1, 1, S // world, D, requires_grad=True)
        o = cpd.block_sparse_attention(q, q, q, mask, bs, mode=mode)
        o.sum().backward()
    finally:
        dist.batch_isend_irecv = orig
    if calls["p2p"]:
        res["fail"].append(f"{mode} skip W{world}: {calls['p2p']} point-to-point transfers on a block-diagonal "
                           "mask")
    # causal without load balancing: rank 0 needs nothing from the others
    mask = torch.ones(S // bs, S // bs, dtype=torch.uint8).tril().expand(1, 1, -1, -1)
    calls["p2p"] = 0
    dist.batch_isend_irecv = counting
    try:
        q = torch.randn(1, 1, S // world, D)
        cpd.block_sparse_attention(q, q, q, mask, bs, mode=mode, load_balance=False)
    finally:
        dist.batch_isend_irecv = orig
    want = ((world - 1 - rank) + rank) * per  # k, v sent to every later rank, received from every earlier
    if calls["p2p"] != want:
        res["fail"].append(f"{mode} skip W{world} rank {rank}: {calls['p2p']} transfers on causal, expected {want}")
    # window of one block, contiguous shards: each rank r > 0 receives only the last key block of
    # rank r-1 (one block of k and of v), in the forward
    nb = S // bs
    i = torch.arange(nb)
    mask = ((i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - 1)).to(torch.uint8).expand(1, 1, -1, -1)
    sizes = []

    def sizing(ops):
        sizes.extend(op.tensor.shape[-2] for op in ops if op.op is dist.irecv)
        return orig(ops)
    dist.batch_isend_irecv = sizing
    try:
        q = torch.randn(1, 1, S // world, D)
        cpd.block_sparse_attention(q, q, q, mask, bs, mode=mode, load_balance=False)
    finally:
        dist.batch_isend_irecv = orig
    if sizes != ([bs] * per if rank > 0 else []):
        res["fail"].append(f"{mode} window W{world} rank {rank}: received key lengths {sizes}, expected one block")
    res["n"] += 1


def _run_compile(res, world, rank, cpd, spattn):
    torch._dynamo.reset()
    B, N, D, bs = 1, 2, 32, 16
    S = 2 * world * 32
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, N, S, D, generator=g) for _ in range(3))
    mask = _masks("causal", B, N, S // bs, 0)
    sh = lambda x: cpd.shard(x, 2)  # noqa: E731

    rm = cpd.create_ring_mask(mask, bs, N)  # a RingMask in the graph (its id is a constant)

    def f_bsa(q, k, v):
        return cpd.block_sparse_attention(q, k, v, mask, bs, mode="ring").sum() + \
            cpd.block_sparse_attention(q, k, v, mask, bs, mode="allgather").sum() + \
            cpd.block_sparse_attention(q, k, v, rm, bs, mode="ring").pow(2).sum()
    ins = [sh(x).requires_grad_() for x in (q, k, v)]
    ins2 = [x.detach().clone().requires_grad_() for x in ins]
    f_bsa(*ins).backward()
    torch.compile(f_bsa, fullgraph=True, backend=COMPILE_BACKEND)(*ins2).backward()
    for nm, a, b in zip("qkv", ins, ins2):
        if not torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-5):
            res["fail"].append(f"compile bsa W{world}: d{nm} differs from eager")
    S1, N1, K = 2 * world * 24, 4, 12
    qs, ks = torch.randn(1, S1, N1, 48, generator=g), torch.randn(1, S1, 1, 48, generator=g)
    idx = torch.tensor(topk_indices(9, 1, S1, S1, 1, K), dtype=torch.int32)

    def f_sfa(qc, kc, idx):
        return cpd.sparse_flash_attention(qc[..., :32], kc[..., :32], idx, q_rope=qc[..., 32:],
                                          k_rope=kc[..., 32:]).pow(2).sum()
    a = [cpd.shard(x, 1).requires_grad_() for x in (qs, ks)]
    b = [x.detach().clone().requires_grad_() for x in a]
    f_sfa(a[0], a[1], cpd.shard(idx, 1)).backward()
    torch.compile(f_sfa, fullgraph=True, backend=COMPILE_BACKEND)(b[0], b[1], cpd.shard(idx, 1)).backward()
    for nm, x, y in zip(("dq", "dk"), a, b):
        if not torch.allclose(x.grad, y.grad, atol=1e-5, rtol=1e-5):
            res["fail"].append(f"compile sfa W{world}: {nm} differs from eager")
    res["n"] += 1


def _worker(rank, world, port, outdir, parts):
    res = {"fail": [], "max": {}, "n": 0}
    try:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        torch.set_num_threads(1)
        # a hang (a mismatched point-to-point step) fails after 3 minutes instead of gloo's 30
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=180))
        import spattn
        import spattn.distributed as cpd
        if "bsa" in parts:
            _run_bsa(res, world, rank, cpd, spattn)
        if "ring" in parts:
            _run_ring(res, world, rank, cpd, spattn)
        if "sfa" in parts:
            _run_sfa(res, world, rank, cpd, spattn)
        if "skip" in parts:
            _run_skip(res, world, rank, cpd)
        if "compile" in parts:
            _run_compile(res, world, rank, cpd, spattn)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # reported by the parent
        res["fail"].append(f"rank {rank}: " + traceback.format_exc())
    with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(res, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(HAVE, WHY)
class TestDistributedGloo(unittest.TestCase):
    def run_world(self, world, parts):
        with tempfile.TemporaryDirectory() as d:
            mp.start_processes(_worker, args=(world, _free_port(), d, parts), nprocs=world, join=True,
                               start_method="spawn")
            fails, n = [], 0
            for r in range(world):
                with open(os.path.join(d, f"rank{r}.pkl"), "rb") as f:
                    res = pickle.load(f)
                fails += res["fail"]
                n += res["n"]
                for key, mx in res["max"].items():
                    metrics.record(f"distributed {key}", mx)
        self.assertFalse(fails, "\n".join(fails[:20]))
        self.assertGreater(n, 0)

    def test_world2(self):
        self.run_world(2, ("bsa", "ring", "sfa", "skip", "compile"))

    def test_world3(self):
        self.run_world(3, ("bsa", "ring", "sfa", "skip"))


if __name__ == "__main__":
    unittest.main()
