"""spattn.create_block_mask / BlockMask (reusable bsa plans): bitwise equality with the raw mask
(NumPy and torch, forward and gradients), GQA, odd block sizes, reuse, copies of the mask,
errors with the library's message, lifetime, torch.compile(fullgraph=True), CUDA when present."""
from __future__ import annotations

import gc
import importlib.util
import os
import unittest

import spattn
from gen import block_mask

HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
if HAVE_NUMPY:
    import numpy as np

try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover - CI without torch
    torch = None
    HAVE_TORCH = False

needs_numpy = unittest.skipUnless(HAVE_NUMPY, "NumPy not importable: BlockMask NumPy tests skipped")
needs_torch = unittest.skipUnless(HAVE_TORCH, "PyTorch (>= 2.4) not importable: BlockMask torch tests skipped")
COMPILE_BACKEND = os.environ.get("SPATTN_TEST_COMPILE_BACKEND", "aot_eager")

# (b, n, nkv, sq, skv, d, bx, by, density): GQA, odd block sizes, partial edge blocks, Sq != Skv,
# empty rows (low density), one block covering everything
CASES = [
    (1, 4, 2, 19, 23, 16, 4, 5, 0.5),
    (2, 4, 1, 100, 150, 32, 48, 80, 0.6),
    (1, 2, 2, 70, 200, 16, 16, 128, 0.3),
    (1, 3, 3, 33, 17, 8, 64, 64, 1.0),
    (2, 2, 1, 40, 40, 8, 8, 8, 0.15),
]


def cuda_ok() -> bool:
    return HAVE_TORCH and torch.cuda.is_available() and spattn.cuda_available()


def bitwise(a, b) -> bool:
    """Equal bits (NaN and -inf included)."""
    if HAVE_TORCH and isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(-1).view(torch.uint8),
                                                                         b.view(-1).view(torch.uint8))
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@needs_numpy
class TestBlockMaskNumpy(unittest.TestCase):
    def inputs(self, case, dtype=None, seed=0):
        b, n, nkv, sq, skv, d, bx, by, dens = case
        rng = np.random.default_rng(seed)
        dtype = dtype or np.float32
        q = rng.standard_normal((b, n, sq, d)).astype(dtype)
        k = rng.standard_normal((b, nkv, skv, d)).astype(dtype)
        v = rng.standard_normal((b, nkv, skv, d)).astype(dtype)
        do = rng.standard_normal((b, n, sq, d)).astype(dtype)
        m = np.array(block_mask(seed, b, n, sq, skv, bx, by, dens), dtype=np.uint8)
        return q, k, v, do, m

    def test_bitwise_fwd_bwd(self):
        for i, case in enumerate(CASES):
            for dtype in (np.float32, np.float16):
                with self.subTest(case=case, dtype=dtype.__name__):
                    b, n, nkv, sq, skv, d, bx, by, _ = case
                    q, k, v, do, m = self.inputs(case, dtype, seed=i)
                    mask = (m.astype(bool), m.view(np.int8), m)[i % 3]
                    with spattn.create_block_mask(mask, (bx, by), (sq, skv), nkv) as bm:
                        o1, l1 = spattn.bsa_forward(q, k, v, m, (bx, by))
                        o2, l2 = spattn.bsa_forward(q, k, v, bm)
                        self.assertTrue(bitwise(o1, o2) and bitwise(l1, l2))
                        g1 = spattn.bsa_backward(q, k, v, m, o1, do, l1, (bx, by))
                        g2 = spattn.bsa_backward(q, k, v, bm, o2, do, l2)
                        for a, e in zip(g1, g2):
                            self.assertTrue(bitwise(a, e))

    def test_reuse_and_mask_copied(self):
        b, n, nkv, sq, skv, d, bx, by, _ = case = CASES[1]
        _, _, _, _, m = self.inputs(case)
        strided = np.repeat(m, 2, axis=3)[..., ::2]       # a non-contiguous view of the same mask
        bm = spattn.create_block_mask(strided, (bx, by), (sq, skv), nkv)
        strided[...] = 0                                   # the plan has its own copy
        for seed in range(3):                              # one plan, several calls
            q, k, v, do, _ = self.inputs(case, seed=seed)
            o1, l1 = spattn.bsa_forward(q, k, v, m, (bx, by), scale=0.3)
            o2, l2 = spattn.bsa_forward(q, k, v, bm, scale=0.3)
            self.assertTrue(bitwise(o1, o2) and bitwise(l1, l2))
            g1 = spattn.bsa_backward(q, k, v, m, o1, do, l1, (bx, by), scale=0.3)
            g2 = spattn.bsa_backward(q, k, v, bm, o2, do, l2, scale=0.3)
            self.assertTrue(all(bitwise(a, e) for a, e in zip(g1, g2)))

    def test_attributes_and_defaults(self):
        m = np.ones((2, 4, 3, 5), np.uint8)
        bm = spattn.create_block_mask(m, 16)
        self.assertEqual(bm.shape, (2, 4, 3, 5))
        self.assertEqual(bm.block_size, (16, 16))
        self.assertEqual(bm.seq_lens, (48, 80))            # whole blocks by default
        self.assertEqual((bm.num_heads, bm.num_kv_heads), (4, 4))
        self.assertEqual(bm.device, "cpu")
        self.assertNotEqual(bm.handle, 0)
        r = repr(bm)
        for part in ("shape=(2, 4, 3, 5)", "block_size=(16, 16)", "seq_lens=(48, 80)", "num_kv_heads=4",
                     "device='cpu'"):
            self.assertIn(part, r)
        bm.close()
        bm.close()                                         # idempotent
        self.assertTrue(bm.closed)
        self.assertIn("closed", repr(bm))
        self.assertEqual(bm.handle, 0)

    def test_errors(self):
        b, n, nkv, sq, skv, d, bx, by, _ = case = CASES[1]
        q, k, v, do, m = self.inputs(case)
        cases = [  # (call, status, text in the library's message)
            (lambda: spattn.create_block_mask(m, (bx, by), (sq + bx, skv), nkv), 201, "ceil(Sq/bx)"),
            (lambda: spattn.create_block_mask(m, (bx, by), (sq, skv), 3), 201, "Nkv"),
            (lambda: spattn.create_block_mask(m, (0, by), (sq, skv), nkv), 101, "bx"),
            (lambda: spattn.create_block_mask(m[0], (bx, by), (sq, skv), nkv), 200, "block_mask"),
            (lambda: spattn.create_block_mask(m.astype(np.float32), (bx, by), (sq, skv), nkv), 300,
             "block_mask"),
            (lambda: spattn.create_block_mask(m, (bx, by), (sq,), nkv), 101, "seq_lens"),
            (lambda: spattn.create_block_mask(m, (bx, by), (sq, 1.5), nkv), 101, "Skv"),
        ]
        bm = spattn.create_block_mask(m, (bx, by), (sq, skv), nkv)
        cases += [
            (lambda: spattn.bsa_forward(q[:, :, :-1], k, v, bm), 201, "Sq of the plan"),
            (lambda: spattn.bsa_forward(q, k[:, :, 1:], v, bm), 201, "Skv of the plan"),
            (lambda: spattn.bsa_forward(q[:1], k, v, bm), 201, "B of the plan"),
            (lambda: spattn.bsa_forward(q, k, v[..., :-1], bm), 201, "v"),
            (lambda: spattn.bsa_backward(q, k, v, bm, q, do[:, :, :-1], np.zeros(q.shape[:-1], np.float32)),
             201, "dout"),
        ]
        for call, status, text in cases:
            with self.subTest(status=status, text=text):
                with self.assertRaises(spattn.SpattnError) as cm:
                    call()
                self.assertEqual(cm.exception.status, status, cm.exception.message)
                self.assertIn(text, cm.exception.message)
        bm.close()
        with self.assertRaises(spattn.SpattnError) as cm:
            spattn.bsa_forward(q, k, v, bm)
        self.assertEqual(cm.exception.status, 100)
        self.assertIn("closed", cm.exception.message)

    def test_workspace_size(self):
        from spattn import block_mask as bmod
        from spattn.numpy_api import _desc
        b, n, nkv, sq, skv, d, bx, by, _ = case = CASES[1]
        q, k, v, _, m = self.inputs(case)
        bm = spattn.create_block_mask(m, (bx, by), (sq, skv), nkv)
        opt = spattn._lib.options()
        for backward in (False, True):
            size = bmod.workspace_size(bm, _desc("q", q), _desc("k", k), _desc("v", v), backward, opt)
            self.assertIsInstance(size, int)
            self.assertGreaterEqual(size, 0)
        with self.assertRaises(spattn.SpattnError) as cm:
            bmod.workspace_size(bm, _desc("q", q[:, :, 1:]), _desc("k", k), _desc("v", v), False, opt)
        self.assertIn("Sq of the plan", cm.exception.message)

    def test_freed_on_gc(self):
        import weakref
        m = np.ones((1, 1, 2, 2), np.uint8)
        bm = spattn.create_block_mask(m, 8)
        plan = weakref.ref(bm._plan)
        del bm
        gc.collect()
        self.assertIsNone(plan())


@needs_torch
class TestBlockMaskTorch(unittest.TestCase):
    def inputs(self, case, dtype=torch.float32, device="cpu", seed=0):
        b, n, nkv, sq, skv, d, bx, by, dens = case
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(b, n, sq, d, generator=gen).to(dtype).to(device)
        k = torch.randn(b, nkv, skv, d, generator=gen).to(dtype).to(device)
        v = torch.randn(b, nkv, skv, d, generator=gen).to(dtype).to(device)
        do = torch.randn(b, n, sq, d, generator=gen).to(dtype).to(device)
        m = torch.tensor(block_mask(seed, b, n, sq, skv, bx, by, dens), dtype=torch.uint8, device=device)
        return q, k, v, do, m

    @staticmethod
    def run_grad(fn, q, k, v, do):
        ql, kl, vl = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        o, lse = fn(ql, kl, vl)
        o.backward(do)
        return o.detach(), lse, ql.grad, kl.grad, vl.grad

    def check_bitwise(self, case, dtype, device, seed, compile_fn=None, bm=None):
        b, n, nkv, sq, skv, d, bx, by, _ = case
        q, k, v, do, m = self.inputs(case, dtype, device, seed)
        mask = (m.bool(), m.view(torch.int8), m)[seed % 3]
        bm = bm or spattn.create_block_mask(mask, (bx, by), (sq, skv), nkv)
        # deterministic=True: bitwise gradients also on CUDA (whatever torch's global setting)
        raw = self.run_grad(lambda q, k, v: spattn.block_sparse_attention(q, k, v, m, (bx, by), return_lse=True,
                                                                          deterministic=True), q, k, v, do)
        f = compile_fn or spattn.block_sparse_attention
        got = self.run_grad(lambda q, k, v: f(q, k, v, bm, return_lse=True, deterministic=True), q, k, v, do)
        for name, a, e in zip(("o", "lse", "dq", "dk", "dv"), got, raw):
            self.assertTrue(bitwise(a, e), f"{name} differs ({device} {dtype} {case})")
        return bm

    def test_bitwise_autograd(self):
        for i, case in enumerate(CASES):
            for dtype in (torch.float32, torch.bfloat16):
                with self.subTest(case=case, dtype=dtype):
                    self.check_bitwise(case, dtype, "cpu", i)

    def test_numpy_and_torch_plans_agree(self):
        if not HAVE_NUMPY:
            self.skipTest("NumPy not importable")
        b, n, nkv, sq, skv, d, bx, by, _ = case = CASES[0]
        _, _, _, _, m = self.inputs(case)
        bm = spattn.create_block_mask(m.numpy(), (bx, by), (sq, skv), nkv)
        self.check_bitwise(case, torch.float32, "cpu", 0, bm=bm)

    def test_reuse_and_lifetime(self):
        b, n, nkv, sq, skv, d, bx, by, _ = case = CASES[1]
        q, k, v, do, m = self.inputs(case)
        bm = spattn.create_block_mask(m, (bx, by), (sq, skv), nkv)
        m.zero_()                                          # the plan has its own copy
        for seed in range(3):
            qs, ks, vs, dos, ms = self.inputs(case, seed=0)
            qs = qs + seed
            raw = self.run_grad(lambda q, k, v: spattn.block_sparse_attention(q, k, v, ms, (bx, by), return_lse=True),
                                qs, ks, vs, dos)
            got = self.run_grad(lambda q, k, v: spattn.block_sparse_attention(q, k, v, bm, return_lse=True),
                                qs, ks, vs, dos)
            self.assertTrue(all(bitwise(a, e) for a, e in zip(got, raw)))
        # a pending backward keeps the plan alive after the caller drops it
        ql = q.detach().clone().requires_grad_(True)
        o = spattn.block_sparse_attention(ql, k, v, bm)
        ref = self.run_grad(lambda q, k, v: spattn.block_sparse_attention(q, k, v, bm, return_lse=True), q, k, v, do)
        del bm
        gc.collect()
        o.backward(do)
        self.assertTrue(bitwise(ql.grad, ref[2]))

    def test_errors(self):
        b, n, nkv, sq, skv, d, bx, by, _ = case = CASES[1]
        q, k, v, do, m = self.inputs(case)
        bm = spattn.create_block_mask(m, (bx, by), (sq, skv), nkv)
        for call, text in ((lambda: spattn.block_sparse_attention(q[:, :, :-1], k, v, bm), "Sq of the plan"),
                           (lambda: spattn.block_sparse_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), bm),
                            "Nkv of the plan"),
                           (lambda: spattn.block_sparse_attention(q[:, :2], k, v, bm), "N of the plan")):
            with self.subTest(text=text):
                with self.assertRaises(spattn.SpattnError) as cm:
                    call()
                self.assertEqual(cm.exception.status, 201)
                self.assertIn(text, cm.exception.message)
        with self.assertRaises(spattn.SpattnError) as cm:
            spattn.create_block_mask(m.float(), (bx, by), (sq, skv), nkv)
        self.assertEqual(cm.exception.status, 300)
        with self.assertRaises(spattn.SpattnNotSupportedError):
            cu = torch.tensor([0, sq], dtype=torch.int32)
            spattn.block_sparse_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), bm,
                                          cu_seqlens_q=cu, cu_seqlens_k=cu)
        if cuda_ok():
            with self.assertRaises(spattn.SpattnError) as cm:
                spattn.block_sparse_attention(q.cuda(), k.cuda(), v.cuda(), bm)
            self.assertEqual(cm.exception.status, 500)
        bm.close()
        with self.assertRaises(spattn.SpattnError) as cm:
            spattn.block_sparse_attention(q, k, v, bm)
        self.assertEqual(cm.exception.status, 100)

    def test_compile_fullgraph(self):
        from torch._dynamo.testing import CompileCounterWithBackend
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend(COMPILE_BACKEND)
        cf = torch.compile(spattn.block_sparse_attention, fullgraph=True, backend=cnt)
        b, n, nkv, sq, skv, d, bx, by, _ = case = CASES[1]
        for seed in range(2):                              # two plans of the same shapes
            with self.subTest(seed=seed):
                self.check_bitwise(case, torch.float32, "cpu", seed, compile_fn=cf)
        # the plan captured by the compiled function instead of passed to it
        bm = spattn.create_block_mask(self.inputs(case)[4], (bx, by), (sq, skv), nkv)
        closed_over = torch.compile(lambda q, k, v, _, return_lse, deterministic: spattn.block_sparse_attention(
            q, k, v, bm, return_lse=return_lse, deterministic=deterministic), fullgraph=True,
            backend=COMPILE_BACKEND)
        self.check_bitwise(case, torch.float32, "cpu", 0, compile_fn=closed_over, bm=bm)
        from spattn import _plan_ops
        if _plan_ops.OPAQUE:  # torch >= 2.10: the plan is a graph input (older torch: a constant)
            self.assertEqual(cnt.frame_count, 1, "a second plan of the same shapes recompiled")

    def test_opcheck(self):
        from spattn import _plan_ops
        gen = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(1, 2, 12, 8, generator=gen, requires_grad=True) for _ in range(3))
        bm = spattn.create_block_mask(torch.tensor([[[[1, 0], [1, 1], [0, 1]]] * 2], dtype=torch.uint8), (4, 6))
        p = _plan_ops.plan_arg(bm)
        torch.library.opcheck(torch.ops.spattn.bsa_fwd_plan.default, (q, k, v, p, 0.0))
        o, lse = torch.ops.spattn.bsa_fwd_plan(q, k, v, p, 0.0)
        torch.library.opcheck(torch.ops.spattn.bsa_bwd_plan.default,
                              (q.detach(), k.detach(), v.detach(), p, o.detach(), torch.randn_like(o), lse, 0.0))

    @unittest.skipUnless(cuda_ok(), "no CUDA device (or libspattn built without CUDA)")
    def test_cuda(self):
        case = (2, 4, 2, 200, 300, 64, 48, 80, 0.5)         # GQA, odd blocks, partial edge blocks
        b, n, nkv, sq, skv, d, bx, by, _ = case
        try:
            bm = self.check_bitwise(case, torch.bfloat16, "cuda", 0)
        except spattn.SpattnNotSupportedError as e:
            self.skipTest(f"not supported by this build: {e.message}")
        self.assertTrue(bm.device.startswith("cuda"))
        _, _, _, _, m = self.inputs(case)                  # a CPU mask copied to the device
        bm2 = spattn.create_block_mask(m, (bx, by), (sq, skv), nkv, device="cuda")
        self.check_bitwise(case, torch.float16, "cuda", 0, bm=bm2)
        cf = torch.compile(spattn.block_sparse_attention, fullgraph=True, backend=COMPILE_BACKEND)
        self.check_bitwise(case, torch.bfloat16, "cuda", 0, compile_fn=cf, bm=bm2)

    @unittest.skipUnless(cuda_ok(), "no CUDA device (or libspattn built without CUDA)")
    def test_cuda_graph_capture(self):
        """Forward + backward with a reused plan captured in a CUDA graph (the ops take their
        workspace from torch's allocator), replayed on new inputs: equal to eager."""
        case = (1, 4, 2, 256, 384, 64, 64, 128, 0.5)
        b, n, nkv, sq, skv, d, bx, by, _ = case
        q, k, v, do, m = self.inputs(case, torch.bfloat16, "cuda", 0)
        try:
            bm = spattn.create_block_mask(m, (bx, by), (sq, skv), nkv)
            spattn.block_sparse_attention(q, k, v, bm)
        except spattn.SpattnNotSupportedError as e:
            self.skipTest(f"not supported by this build: {e.message}")
        sq_, sk_, sv_ = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        sdo = do.clone()

        def step():
            for x in (sq_, sk_, sv_):
                x.grad = None
            o = spattn.block_sparse_attention(sq_, sk_, sv_, bm, deterministic=True)   # bitwise dq on CUDA
            o.backward(sdo)
            return o

        from graphs import capture
        g, so = capture(step)
        q2, k2, v2, do2, _ = self.inputs(case, torch.bfloat16, "cuda", 1)
        with torch.no_grad():
            for dst, src in ((sq_, q2), (sk_, k2), (sv_, v2), (sdo, do2)):
                dst.copy_(src)
        g.replay()
        torch.cuda.synchronize()
        ref = self.run_grad(lambda q, k, v: spattn.block_sparse_attention(q, k, v, bm, return_lse=True,
                                                                          deterministic=True), q2, k2, v2, do2)
        for name, a, e in (("o", so, ref[0]), ("dq", sq_.grad, ref[2]), ("dk", sk_.grad, ref[3]),
                           ("dv", sv_.grad, ref[4])):
            self.assertTrue(bitwise(a.detach(), e), f"{name} differs after replay")


if __name__ == "__main__":
    unittest.main()
