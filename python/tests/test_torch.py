"""PyTorch API: autograd vs a dense masked float64 PyTorch implementation, gradcheck, custom-op
checks, torch.compile(fullgraph=True), CUDA tensors (when available).  Skipped without torch."""
from __future__ import annotations

import os
import unittest

import metrics
from gen import block_mask, topk_indices

try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover - CI without torch
    torch = None
    HAVE_TORCH = False

import spattn

NO_TORCH = "PyTorch (>= 2.4) not importable: torch tests skipped"
needs_torch = unittest.skipUnless(HAVE_TORCH, NO_TORCH)


def cuda_ok() -> bool:
    return HAVE_TORCH and torch.cuda.is_available() and spattn.cuda_available()


def devices():
    return ["cpu"] + (["cuda"] if cuda_ok() else [])


COMPILE_BACKEND = os.environ.get("SPATTN_TEST_COMPILE_BACKEND", "aot_eager")
# Eco criterion (cases/README.md): (atol, rtol, max-error limit); fp32 outputs (from fp32
# inputs) are compared elementwise and tightly instead.
ECO = {"float16": (2 ** -9, 2 ** -9, 0.1), "bfloat16": (2 ** -6, 2 ** -6, 1.0), "lse": (2 ** -16, 2 ** -10, 0.01)}


# ---------------------------------------------------------------------------------------------
# dense masked reference in PyTorch (float64, autograd)
# ---------------------------------------------------------------------------------------------
def dense_attention(q, k, v, w, scale):
    """q [B,H,Sq,Dk], k [B,H,Skv,Dk], v [B,H,Skv,Dv], weights w [B,H,Sq,Skv] (counts) -> (o, lse)."""
    s = scale * q @ k.transpose(-1, -2)
    logw = torch.where(w > 0, torch.log(w.clamp_min(1)), torch.full_like(w, float("-inf")))
    x = s + logw
    empty = (w > 0).sum(-1, keepdim=True) == 0
    lse = torch.logsumexp(torch.where(empty, torch.zeros_like(x), x), -1, keepdim=True)
    p = torch.where(w > 0, torch.exp(x - lse), torch.zeros_like(x))
    o = p @ v
    lse = torch.where(empty, torch.full_like(lse, float("-inf")), lse)
    return o, lse[..., 0]


def dense_bsa(q, k, v, mask, bx, by, scale=None):
    n, nkv, sq, skv, d = q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    scale = d ** -0.5 if scale is None else scale
    g = n // nkv
    m = (mask != 0).to(torch.float64)
    w = m.repeat_interleave(bx, 2)[:, :, :sq].repeat_interleave(by, 3)[:, :, :, :skv]
    return dense_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), w, scale)


def sfa_dense_weights(indices, s1, s2, n1, sbs, causal):
    idx = indices.long()
    b, _, n2, kk = idx.shape
    j = torch.arange(s2, device=idx.device)
    blk = j // sbs                                                     # [S2]
    hit = (idx[..., None] == blk) & (idx[..., None] >= 0)              # [B,S1,N2,K,S2]
    w = hit.sum(3).to(torch.float64)                                   # [B,S1,N2,S2]
    if causal:
        lim = s2 - s1 + torch.arange(s1, device=idx.device)
        w = w * (j[None, :] <= lim[:, None])[None, :, None, :]
    return w.permute(0, 2, 1, 3).repeat_interleave(n1 // n2, 1)      # [B,N1,S1,S2]


def dense_sfa(q, k, indices, v=None, q_rope=None, k_rope=None, sbs=1, causal=True, scale=None):
    """BSND in, BSND out (o [B,S1,N1,D], lse [B,S1,N1])."""
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    b, s1, n1, d = q.shape
    s2, n2 = k.shape[1], k.shape[2]
    dr = 0 if q_rope is None else q_rope.shape[-1]
    scale = (d + dr) ** -0.5 if scale is None else scale
    qf = q if q_rope is None else torch.cat([q, q_rope], -1)
    kf = k if k_rope is None else torch.cat([k, k_rope], -1)
    vv = k if v is None else v
    g = n1 // n2
    w = sfa_dense_weights(indices, s1, s2, n1, sbs, causal)
    o, lse = dense_attention(t(qf), t(kf).repeat_interleave(g, 1), t(vv).repeat_interleave(g, 1), w, scale)
    return t(o), lse.transpose(1, 2)


# ---------------------------------------------------------------------------------------------
# comparisons
# ---------------------------------------------------------------------------------------------
def compare(tc, key, actual, golden, dtype):
    a = actual.detach().double().cpu()
    g = golden.detach().double().cpu()
    tc.assertEqual(tuple(a.shape), tuple(g.shape), key)
    inf = ~torch.isfinite(g)
    tc.assertTrue(torch.equal(a[inf], g[inf]), f"{key}: infinities differ")
    tc.assertTrue(bool(torch.isfinite(a[~inf]).all()), f"{key}: unexpected NaN/Inf")
    err = (a[~inf] - g[~inf]).abs()
    worst = float(err.max()) if err.numel() else 0.0
    metrics.record(key, worst)
    name = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    if name == "float32":
        bound = 2e-4 + 2e-4 * g[~inf].abs()
        tc.assertTrue(bool((err <= bound).all()), f"{key}: max error {worst:.3g}")
    else:
        atol, rtol, limit = ECO[name]
        ratio = float((err <= atol + rtol * g[~inf].abs()).double().mean()) if err.numel() else 1.0
        tc.assertTrue(ratio >= 0.99 and worst <= limit, f"{key}: matched {ratio:.4f}, max error {worst:.3g}")


def tol_kind(device, dtype):
    """fp32 on CUDA may use TF32 tensor cores: judge it by the fp16 eco criterion there."""
    return "float16" if device == "cuda" and dtype == torch.float32 else dtype


def leaf(x):
    return x.detach().clone().requires_grad_(True)


def run_or_skip(tc, fn):
    """Call fn; a SpattnNotSupportedError (e.g. no CUDA kernel for this dtype) becomes a skip."""
    try:
        return fn()
    except spattn.SpattnNotSupportedError as e:
        tc.skipTest(f"not supported by this build: {e.message}")


# ---------------------------------------------------------------------------------------------
# bsa
# ---------------------------------------------------------------------------------------------
@needs_torch
class TestBsaTorch(unittest.TestCase):
    def check(self, device, dtype, b, n, nkv, sq, skv, d, bx, by, density=0.5, seed=0, scale=None,
              mask_dtype=None):
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(b, n, sq, d, generator=gen).to(dtype).to(device)
        k = torch.randn(b, nkv, skv, d, generator=gen).to(dtype).to(device)
        v = torch.randn(b, nkv, skv, d, generator=gen).to(dtype).to(device)
        do = torch.randn(b, n, sq, d, generator=gen).to(dtype).to(device)
        m = torch.tensor(block_mask(seed, b, n, sq, skv, bx, by, density), dtype=torch.uint8, device=device)
        if mask_dtype is not None:
            m = m.to(mask_dtype)
        ql, kl, vl = leaf(q), leaf(k), leaf(v)
        o, lse = run_or_skip(self, lambda: spattn.block_sparse_attention(ql, kl, vl, m, (bx, by), scale,
                                                                         return_lse=True))
        self.assertEqual(o.dtype, dtype)
        self.assertEqual(lse.dtype, torch.float32)
        self.assertFalse(lse.requires_grad)
        o.backward(do)
        r = [leaf(x.double()) for x in (q, k, v)]
        go, glse = dense_bsa(r[0], r[1], r[2], m, bx, by, scale)
        go.backward(do.double())
        tag = f"{device} {str(dtype)[6:]} bsa"
        dtype = tol_kind(device, dtype)
        compare(self, f"{tag} o", o, go, dtype)
        compare(self, f"{tag} lse", lse, glse.float(), torch.float32 if dtype == torch.float32 else "lse")
        for nm, a, g in (("dq", ql.grad, r[0].grad), ("dk", kl.grad, r[1].grad), ("dv", vl.grad, r[2].grad)):
            compare(self, f"{tag} {nm}", a, g, dtype)

    def test_autograd_vs_dense_fp32(self):
        for dev in devices():
            with self.subTest(device=dev):
                self.check(dev, torch.float32, 1, 4, 2, 19, 23, 16, 4, 5)
                self.check(dev, torch.float32, 2, 2, 2, 24, 16, 8, 8, 8, seed=1, scale=0.25,
                           mask_dtype=torch.bool)

    def test_autograd_low_precision(self):
        for dev in devices():
            for dt in (torch.float16, torch.bfloat16):
                with self.subTest(device=dev, dtype=dt):
                    self.check(dev, dt, 1, 2, 1, 40, 33, 32, 16, 8, density=0.7, seed=2,
                               mask_dtype=torch.int8)

    def test_strided_packed_qkv(self):
        for dev in devices():
            gen = torch.Generator().manual_seed(3)
            b, s, n, d, bs = 1, 16, 2, 8, 4
            qkv = torch.randn(b, s, 3, n, d, generator=gen).to(dev).requires_grad_(True)
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))     # strided BNSD views
            m = torch.tensor(block_mask(3, b, n, s, s, bs, bs, 0.6), dtype=torch.uint8, device=dev)
            o = spattn.block_sparse_attention(q, k, v, m, bs)
            o.sum().backward()                                             # dout with zero strides
            ref = leaf(qkv.detach().double())
            rq, rk, rv = (ref[:, :, i].transpose(1, 2) for i in range(3))
            go, _ = dense_bsa(rq, rk, rv, m, bs, bs)
            go.sum().backward()
            compare(self, f"{dev} float32 bsa packed o", o, go, torch.float32)
            compare(self, f"{dev} float32 bsa packed dqkv", qkv.grad, ref.grad, torch.float32)

    def test_gradcheck_fp32(self):
        # The library has no fp64 kernels (fp16/bf16/fp32 only), so gradcheck runs in fp32 with
        # finite-difference tolerances; the tight check is the fp64 dense comparison above.
        gen = torch.Generator().manual_seed(4)
        q, k, v = (torch.randn(1, 2, 8, 8, generator=gen, requires_grad=True) for _ in range(3))
        m = torch.tensor([[[[1, 0], [1, 1]], [[0, 1], [1, 1]]]], dtype=torch.uint8)
        fn = lambda q, k, v: spattn.block_sparse_attention(q, k, v, m, (4, 4))  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(fn, (q, k, v), eps=1e-2, atol=2e-3, rtol=2e-2,
                                                 nondet_tol=1e-6, fast_mode=True))

    def test_fp64_rejected(self):
        q = torch.randn(1, 1, 8, 8, dtype=torch.float64)
        with self.assertRaises(spattn.SpattnError) as cm:
            spattn.block_sparse_attention(q, q, q, torch.ones(1, 1, 1, 1, dtype=torch.uint8), 8)
        self.assertEqual(cm.exception.status, 300)

    def test_opcheck(self):
        gen = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(1, 2, 12, 8, generator=gen, requires_grad=True) for _ in range(3))
        m = torch.ones(1, 2, 3, 2, dtype=torch.uint8)
        torch.library.opcheck(torch.ops.spattn.bsa_fwd.default, (q, k, v, m, 4, 6, 0.0))
        o, lse = torch.ops.spattn.bsa_fwd(q, k, v, m, 4, 6, 0.0)
        torch.library.opcheck(torch.ops.spattn.bsa_bwd.default,
                              (q.detach(), k.detach(), v.detach(), m, o.detach(), torch.randn_like(o), lse, 4, 6, 0.0))

    def test_compile_fullgraph(self):
        for dev in devices():
            gen = torch.Generator().manual_seed(6)
            q, k, v = (torch.randn(1, 2, 16, 8, generator=gen).to(dev) for _ in range(3))
            m = torch.ones(1, 2, 2, 2, dtype=torch.uint8, device=dev)
            m[:, :, 0, 1] = 0

            def f(q, k, v):
                o = spattn.block_sparse_attention(q, k, v, m, (8, 8))
                return (o * o).sum()

            qe, ke, ve = leaf(q), leaf(k), leaf(v)
            f(qe, ke, ve).backward()
            cf = torch.compile(f, fullgraph=True, backend=COMPILE_BACKEND)
            qc, kc, vc = leaf(q), leaf(k), leaf(v)
            cf(qc, kc, vc).backward()
            for a, e in ((qc, qe), (kc, ke), (vc, ve)):
                torch.testing.assert_close(a.grad, e.grad, rtol=1e-5, atol=1e-5)

    def test_errors(self):
        q = torch.randn(1, 2, 16, 8)
        m = torch.ones(1, 2, 2, 2, dtype=torch.uint8)
        with self.assertRaises(spattn.SpattnError) as cm:
            spattn.block_sparse_attention(q, q, q[..., :4], m, 8)
        self.assertEqual(cm.exception.status, 201)
        self.assertIn("v", cm.exception.message)
        with self.assertRaises(ValueError):
            spattn.block_sparse_attention(q, q, q, m, (8, 8, 8))
        if cuda_ok():
            with self.assertRaises(spattn.SpattnError) as cm:
                spattn.block_sparse_attention(q, q.cuda(), q, m, 8)
            self.assertEqual(cm.exception.status, 500)
            self.assertIn("k", cm.exception.message)

    @unittest.skipUnless(cuda_ok(), "no CUDA device (or libspattn built without CUDA)")
    def test_cuda_current_stream(self):
        gen = torch.Generator().manual_seed(7)
        q, k, v = (torch.randn(1, 2, 128, 64, generator=gen).to(torch.bfloat16).cuda() for _ in range(3))
        m = torch.ones(1, 2, 2, 2, dtype=torch.uint8, device="cuda")
        ref = run_or_skip(self, lambda: spattn.block_sparse_attention(q, k, v, m, 64))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            out = spattn.block_sparse_attention(q, k, v, m, 64)
        s.synchronize()
        self.assertTrue(torch.equal(out, ref))


# ---------------------------------------------------------------------------------------------
# sfa
# ---------------------------------------------------------------------------------------------
@needs_torch
class TestSfaTorch(unittest.TestCase):
    def check(self, device, dtype, b, s1, s2, n1, n2, d, dr, kk, sbs=1, causal=True, shared=True,
              concat=True, duplicates=False, seed=0, scale=None):
        gen = torch.Generator().manual_seed(seed)
        qc = torch.randn(b, s1, n1, d + dr, generator=gen).to(dtype).to(device)
        kc = torch.randn(b, s2, n2, d + dr, generator=gen).to(dtype).to(device)
        v = None if shared else torch.randn(b, s2, n2, d, generator=gen).to(dtype).to(device)
        do = torch.randn(b, s1, n1, d, generator=gen).to(dtype).to(device)
        idx = torch.tensor(topk_indices(seed, b, s1, s2, n2, kk, sbs, causal, duplicates=duplicates),
                           dtype=torch.int32, device=device)

        def split(x, lf):
            x = leaf(x) if lf else x
            if not dr:
                return x, x, None
            if concat:
                return x, x[..., :d], x[..., d:]
            return x, x[..., :d].contiguous(), x[..., d:].contiguous()

        qbuf, q, qr = split(qc, True)
        kbuf, k, kr = split(kc, True)
        vl = leaf(v) if v is not None else None
        o, lse = run_or_skip(self, lambda: spattn.sparse_flash_attention(
            q, k, idx, v=vl, q_rope=qr, k_rope=kr, sparse_block_size=sbs, causal=causal, scale=scale,
            return_lse=True))
        o.backward(do)
        rq_buf, rk_buf = leaf(qc.double()), leaf(kc.double())
        rv = leaf(v.double()) if v is not None else None
        go, glse = dense_sfa(rq_buf[..., :d], rk_buf[..., :d], idx, rv,
                             rq_buf[..., d:] if dr else None, rk_buf[..., d:] if dr else None, sbs, causal, scale)
        go.backward(do.double())
        tag = f"{device} {str(dtype)[6:]} sfa"
        dtype = tol_kind(device, dtype)
        compare(self, f"{tag} o", o, go, dtype)
        compare(self, f"{tag} lse", lse, glse.float(), torch.float32 if dtype == torch.float32 else "lse")
        if concat or not dr:
            compare(self, f"{tag} dq", qbuf.grad, rq_buf.grad, dtype)
            compare(self, f"{tag} dk", kbuf.grad, rk_buf.grad, dtype)
        if v is not None:
            compare(self, f"{tag} dv", vl.grad, rv.grad, dtype)

    def test_autograd_rope_concat_shared_kv(self):
        for dev in devices():
            with self.subTest(device=dev):
                self.check(dev, torch.float32, 1, 12, 20, 4, 1, 16, 8, 6)

    def test_autograd_separate_v_gqa_mode0(self):
        for dev in devices():
            with self.subTest(device=dev):
                self.check(dev, torch.float32, 2, 9, 15, 4, 2, 8, 0, 5, causal=False, shared=False, seed=1)

    def test_autograd_sbs_duplicates_split_rope(self):
        for dev in devices():
            with self.subTest(device=dev):
                self.check(dev, torch.float32, 1, 10, 24, 2, 1, 16, 8, 4, sbs=4, duplicates=True, seed=2,
                           concat=False)

    def test_autograd_low_precision(self):
        for dev in devices():
            for dt in (torch.float16, torch.bfloat16):
                with self.subTest(device=dev, dtype=dt):
                    self.check(dev, dt, 1, 16, 40, 8, 1, 32, 16, 12, seed=3)

    def test_gradcheck_fp32(self):
        # fp32 finite differences (no fp64 kernels); see the bsa test for why.
        gen = torch.Generator().manual_seed(4)
        q = torch.randn(1, 4, 2, 8, generator=gen, requires_grad=True)
        qr = torch.randn(1, 4, 2, 8, generator=gen, requires_grad=True)
        k = torch.randn(1, 6, 1, 8, generator=gen, requires_grad=True)
        kr = torch.randn(1, 6, 1, 8, generator=gen, requires_grad=True)
        idx = torch.tensor(topk_indices(4, 1, 4, 6, 1, 3), dtype=torch.int32)
        fn = lambda q, k, qr, kr: spattn.sparse_flash_attention(q, k, idx, q_rope=qr, k_rope=kr)  # noqa: E731
        self.assertTrue(torch.autograd.gradcheck(fn, (q, k, qr, kr), eps=1e-2, atol=2e-3, rtol=2e-2,
                                                 nondet_tol=1e-6, fast_mode=True))

    def test_opcheck(self):
        gen = torch.Generator().manual_seed(5)
        q = torch.randn(1, 6, 2, 8, generator=gen, requires_grad=True)
        k = torch.randn(1, 9, 1, 8, generator=gen, requires_grad=True)
        qr = torch.randn(1, 6, 2, 8, generator=gen, requires_grad=True)
        kr = torch.randn(1, 9, 1, 8, generator=gen, requires_grad=True)
        idx = torch.tensor(topk_indices(5, 1, 6, 9, 1, 4), dtype=torch.int32)
        torch.library.opcheck(torch.ops.spattn.sfa_fwd.default, (q, k, idx, None, qr, kr, 1, 3, 0.0))
        o, lse = torch.ops.spattn.sfa_fwd(q, k, idx, None, qr, kr, 1, 3, 0.0)
        d = [x.detach() for x in (q, k, qr, kr)]
        torch.library.opcheck(torch.ops.spattn.sfa_bwd.default,
                              (d[0], d[1], idx, None, d[2], d[3], o.detach(), torch.randn_like(o), lse, 1, 3, 0.0))

    def test_compile_fullgraph(self):
        for dev in devices():
            gen = torch.Generator().manual_seed(6)
            qc = torch.randn(1, 8, 4, 24, generator=gen).to(dev)
            kc = torch.randn(1, 12, 1, 24, generator=gen).to(dev)
            idx = torch.tensor(topk_indices(6, 1, 8, 12, 1, 5), dtype=torch.int32).to(dev)

            def f(qc, kc):
                o = spattn.sparse_flash_attention(qc[..., :16], kc[..., :16], idx, q_rope=qc[..., 16:],
                                                  k_rope=kc[..., 16:])
                return (o * o).sum()

            with self.subTest(device=dev):
                # The CUDA sfa kernels cover the suites' head dims (D=512, Dr=64) in fp16/bf16
                # only: this fp32 D=16+8 graph is a skip there, not a failure.
                qe, ke = leaf(qc), leaf(kc)
                run_or_skip(self, lambda: f(qe, ke).backward())
                cf = torch.compile(f, fullgraph=True, backend=COMPILE_BACKEND)
                qcc, kcc = leaf(qc), leaf(kc)
                cf(qcc, kcc).backward()
                torch.testing.assert_close(qcc.grad, qe.grad, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(kcc.grad, ke.grad, rtol=1e-5, atol=1e-5)

    def test_errors(self):
        q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 6, 1, 8)
        idx = torch.zeros(1, 4, 1, 2, dtype=torch.int32)
        bad = idx.clone()
        bad[0, 2, 0, 1] = 6
        with self.assertRaises(spattn.SpattnError) as cm:
            spattn.sparse_flash_attention(q, k, bad)
        self.assertEqual(cm.exception.status, 600)
        with self.assertRaises(ValueError):
            spattn.sparse_flash_attention(q, k, idx, q_rope=q)
        o1 = spattn.sparse_flash_attention(q, k, idx.long())      # int64 indices are converted
        o2 = spattn.sparse_flash_attention(q, k, idx)
        self.assertTrue(torch.equal(o1, o2))


# ---------------------------------------------------------------------------------------------
# Realistic shapes on CUDA (the GPU kernels may only cover the suites' head dims)
# ---------------------------------------------------------------------------------------------
@needs_torch
@unittest.skipUnless(cuda_ok(), "no CUDA device (or libspattn built without CUDA)")
class TestCudaSuiteShapes(unittest.TestCase):
    def test_bsa_suite_shapes(self):
        t = TestBsaTorch()
        for dt in (torch.bfloat16, torch.float16):
            for (b, n, nkv, sq, skv, d, bx, by) in ((1, 4, 2, 300, 260, 128, 64, 64), (1, 2, 2, 200, 200, 64, 48, 80)):
                with self.subTest(dtype=dt, d=d):
                    t.check("cuda", dt, b, n, nkv, sq, skv, d, bx, by, density=0.5, seed=11)

    def test_sfa_suite_shapes(self):
        t = TestSfaTorch()
        for dt in (torch.bfloat16, torch.float16):
            with self.subTest(dtype=dt):
                t.check("cuda", dt, 1, 64, 256, 16, 1, 512, 64, 64, seed=12)

    def test_sfa_nsa_shapes(self):
        # the small-head Hopper forward's separate-V shape (D 128, no rope, GQA, blocks of 64
        # keys; 48 heads per key head: two chunks of heads); the backward key-major (sfa_bwd_kmaj.cu)
        t = TestSfaTorch()
        for dt in (torch.bfloat16, torch.float16):
            for (n1, n2) in ((32, 2), (96, 2)):
                with self.subTest(dtype=dt, n1=n1, n2=n2):
                    t.check("cuda", dt, 1, 24, 700, n1, n2, 128, 0, 8, sbs=64, shared=False, seed=13)

    def test_sfa_cuda_graph(self):
        """sfa forward + backward on the Hopper kernels (16 heads: key-major backward; 64: token-
        major) captured in a CUDA graph, replayed on new inputs: bitwise the eager calls."""
        from graphs import capture
        b, s1, s2, d, dr, kk = 1, 64, 256, 512, 64, 64
        idx = torch.tensor(topk_indices(3, b, s1, s2, 1, kk, 1, True), dtype=torch.int32, device="cuda")
        for n1 in (16, 64):
            with self.subTest(n1=n1):
                def inputs(seed):
                    gen = torch.Generator().manual_seed(seed)
                    return [torch.randn(*shape, generator=gen).to(torch.bfloat16).cuda()
                            for shape in ((b, s1, n1, d + dr), (b, s2, 1, d + dr), (b, s1, n1, d))]

                def attend(qc, kc):
                    return spattn.sparse_flash_attention(qc[..., :d], kc[..., :d], idx, q_rope=qc[..., d:],
                                                         k_rope=kc[..., d:], deterministic=True)

                qc, kc, do = inputs(0)
                sq, sk = qc.clone().requires_grad_(True), kc.clone().requires_grad_(True)
                sdo = do.clone()

                def step():
                    sq.grad = sk.grad = None
                    o = attend(sq, sk)
                    o.backward(sdo)
                    return o

                run_or_skip(self, step)
                g, so = capture(step)
                q2, k2, do2 = inputs(1)
                with torch.no_grad():
                    for dst, src in ((sq, q2), (sk, k2), (sdo, do2)):
                        dst.copy_(src)
                g.replay()
                torch.cuda.synchronize()
                rq, rk = q2.clone().requires_grad_(True), k2.clone().requires_grad_(True)
                ro = attend(rq, rk)
                ro.backward(do2)
                for name, a, e in (("o", so, ro), ("dq", sq.grad, rq.grad), ("dk", sk.grad, rk.grad)):
                    self.assertTrue(torch.equal(a, e), f"{name}: the replay differs from the eager call")


if __name__ == "__main__":
    unittest.main()
