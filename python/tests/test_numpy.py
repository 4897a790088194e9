"""NumPy API vs the independent float64 reference; error mapping."""
from __future__ import annotations

import os
import unittest

import numpy as np

import spattn
from reference import bsa_ref, random_block_mask, random_indices, sfa_ref

FP32_TOL = (2e-4, 2e-4)     # atol, rtol vs float64
FP16_TOL = (2 ** -9 * 4, 2 ** -9 * 4)


def assert_close(tc: unittest.TestCase, actual, golden, tol, name: str) -> float:
    """Elementwise |a - g| <= atol + rtol |g|; infinities must match exactly.  Returns max error."""
    a = np.asarray(actual, np.float64)
    g = np.asarray(golden, np.float64)
    tc.assertEqual(a.shape, g.shape, f"{name}: shape")
    inf = ~np.isfinite(g)
    tc.assertTrue(np.array_equal(a[inf], g[inf]), f"{name}: infinities differ")
    tc.assertTrue(np.all(np.isfinite(a[~inf])), f"{name}: unexpected NaN/Inf")
    err = np.abs(a[~inf] - g[~inf])
    bound = tol[0] + tol[1] * np.abs(g[~inf])
    worst = float(err.max()) if err.size else 0.0
    tc.assertTrue(np.all(err <= bound), f"{name}: max error {worst:.3g} above tolerance")
    return worst


def rnd(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


class TestBsaNumpy(unittest.TestCase):
    def run_case(self, b, n, nkv, sq, skv, d, bx, by, dtype=np.float32, density=0.5, seed=0,
                 empty_rows=False, scale=None):
        rng = np.random.default_rng(seed)
        q, k, v = rnd(rng, (b, n, sq, d), dtype), rnd(rng, (b, nkv, skv, d), dtype), rnd(rng, (b, nkv, skv, d), dtype)
        do = rnd(rng, (b, n, sq, d), dtype)
        m = random_block_mask(rng, b, n, sq, skv, bx, by, density)
        if empty_rows:
            m[:, :, 0, :] = 0
        o, lse = spattn.bsa_forward(q, k, v, m, (bx, by), scale=scale)
        dq, dk, dv = spattn.bsa_backward(q, k, v, m, o, do, lse, (bx, by), scale=scale)
        go, glse, gdq, gdk, gdv = bsa_ref(q, k, v, m, bx, by, scale, do)
        tol = FP32_TOL if dtype == np.float32 else FP16_TOL
        self.assertEqual(o.dtype, dtype)
        self.assertEqual(lse.dtype, np.float32)
        for name, a, g in (("o", o, go), ("dq", dq, gdq), ("dk", dk, gdk), ("dv", dv, gdv)):
            assert_close(self, a, g, tol, name)
        assert_close(self, lse, glse, (2 ** -12, 2 ** -10), "lse")
        if empty_rows:
            self.assertTrue(np.all(np.isneginf(lse[:, :, :bx])))
            self.assertTrue(np.all(o[:, :, :bx] == 0) and np.all(dq[:, :, :bx] == 0))

    def test_partial_blocks_gqa(self):
        self.run_case(1, 4, 2, 19, 23, 16, 4, 5)

    def test_mha_two_batches(self):
        self.run_case(2, 2, 2, 32, 40, 8, 16, 16, density=0.6, seed=1)

    def test_sq_ne_skv_custom_scale(self):
        self.run_case(1, 2, 1, 24, 9, 32, 8, 3, seed=2, scale=0.3)

    def test_empty_rows(self):
        self.run_case(1, 2, 2, 20, 20, 8, 6, 7, seed=3, empty_rows=True)

    def test_fp16(self):
        self.run_case(1, 2, 1, 21, 17, 16, 5, 4, dtype=np.float16, density=0.7, seed=4)

    def test_strided_views_and_bool_mask(self):
        rng = np.random.default_rng(5)
        b, n, s, d, bx = 1, 2, 16, 8, 4
        qkv = rnd(rng, (b, s, 3, n, d))  # packed BS(3)ND buffer: q/k/v are strided BNSD views
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        self.assertFalse(q.flags.c_contiguous)
        m = random_block_mask(rng, b, n, s, s, bx, bx, 0.6).astype(bool)
        o, lse = spattn.bsa_forward(q, k, v, m, bx)
        o2, lse2 = spattn.bsa_forward(*(np.ascontiguousarray(x) for x in (q, k, v)), m.astype(np.uint8), (bx, bx))
        np.testing.assert_allclose(o, o2, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(lse, lse2, rtol=1e-6, atol=1e-6)


class TestSfaNumpy(unittest.TestCase):
    def run_case(self, b, s1, s2, n1, n2, d, dr, kk, sbs=1, causal=True, shared=True, dtype=np.float32,
                 duplicates=False, seed=0, concat=False, scale=None):
        rng = np.random.default_rng(seed)
        if concat:
            qc, kc = rnd(rng, (b, s1, n1, d + dr), dtype), rnd(rng, (b, s2, n2, d + dr), dtype)
            q, qr, k, kr = qc[..., :d], qc[..., d:], kc[..., :d], kc[..., d:]
        else:
            q, k = rnd(rng, (b, s1, n1, d), dtype), rnd(rng, (b, s2, n2, d), dtype)
            qr = rnd(rng, (b, s1, n1, dr), dtype) if dr else None
            kr = rnd(rng, (b, s2, n2, dr), dtype) if dr else None
        v = None if shared else rnd(rng, (b, s2, n2, d), dtype)
        do = rnd(rng, (b, s1, n1, d), dtype)
        idx = random_indices(rng, b, s1, s2, n2, kk, sbs, causal, duplicates=duplicates)
        kw = dict(v=v, q_rope=qr, k_rope=kr, sparse_block_size=sbs, causal=causal, scale=scale)
        o, lse = spattn.sfa_forward(q, k, idx, **kw)
        dq, dk, dv, dqr, dkr = spattn.sfa_backward(q, k, idx, o, do, lse, **kw)
        go, glse, gdq, gdk, gdv, gdqr, gdkr = sfa_ref(q, k, idx, v, qr, kr, sbs, causal, scale, do)
        tol = FP32_TOL if dtype == np.float32 else FP16_TOL
        for name, a, g in (("o", o, go), ("dq", dq, gdq), ("dk", dk, gdk), ("dv", dv, gdv),
                           ("dq_rope", dqr, gdqr), ("dk_rope", dkr, gdkr)):
            if g is None:
                self.assertIsNone(a, name)
            else:
                assert_close(self, a, g, tol, name)
        assert_close(self, lse, glse, (2 ** -12, 2 ** -10), "lse")
        return o, lse, dq, dk, dv, dqr, dkr

    def test_rope_shared_kv_causal(self):
        self.run_case(1, 12, 20, 4, 1, 16, 8, 6)

    def test_separate_v_no_rope_mode0(self):
        self.run_case(2, 9, 15, 2, 2, 8, 0, 5, causal=False, shared=False, seed=1)

    def test_block_indices_sbs4(self):
        self.run_case(1, 10, 30, 4, 2, 8, 8, 3, sbs=4, seed=2)

    def test_duplicates_and_padding(self):
        self.run_case(1, 8, 12, 2, 1, 16, 8, 6, duplicates=True, seed=3)

    def test_more_queries_than_keys_empty_rows(self):
        # S1 > S2 under the causal mode: the first S1 - S2 rows attend nothing.
        o, lse, dq, *_ = self.run_case(1, 10, 6, 2, 1, 8, 8, 4, seed=4)
        self.assertTrue(np.all(np.isneginf(lse[:, :4])) and np.all(o[:, :4] == 0) and np.all(dq[:, :4] == 0))

    def test_concatenated_vs_split_rope(self):
        a = self.run_case(1, 8, 16, 4, 1, 16, 8, 5, seed=5, concat=True)
        b = self.run_case(1, 8, 16, 4, 1, 16, 8, 5, seed=5, concat=False)
        # Same seed, same values drawn in another order: compare each against the reference only.
        self.assertEqual(a[0].shape, b[0].shape)

    def test_concat_views_equal_copies(self):
        rng = np.random.default_rng(6)
        b, s1, s2, n1, n2, d, dr = 1, 7, 11, 2, 1, 8, 8
        qc, kc = rnd(rng, (b, s1, n1, d + dr)), rnd(rng, (b, s2, n2, d + dr))
        idx = random_indices(rng, b, s1, s2, n2, 4)
        o1, l1 = spattn.sfa_forward(qc[..., :d], kc[..., :d], idx, q_rope=qc[..., d:], k_rope=kc[..., d:])
        c = np.ascontiguousarray
        o2, l2 = spattn.sfa_forward(c(qc[..., :d]), c(kc[..., :d]), idx, q_rope=c(qc[..., d:]),
                                    k_rope=c(kc[..., d:]))
        np.testing.assert_allclose(o1, o2, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(l1, l2, rtol=1e-6, atol=1e-6)

    def test_fp16_scale(self):
        self.run_case(1, 8, 16, 2, 1, 16, 8, 5, dtype=np.float16, seed=7, scale=0.2)

    def test_int64_indices_accepted(self):
        rng = np.random.default_rng(8)
        q, k = rnd(rng, (1, 4, 2, 8)), rnd(rng, (1, 6, 1, 8))
        idx = random_indices(rng, 1, 4, 6, 1, 3)
        o1, _ = spattn.sfa_forward(q, k, idx)
        o2, _ = spattn.sfa_forward(q, k, idx.astype(np.int64))
        np.testing.assert_array_equal(o1, o2)


class TestErrors(unittest.TestCase):
    def setUp(self):
        rng = np.random.default_rng(0)
        self.q = rnd(rng, (1, 2, 16, 8))
        self.m = np.ones((1, 2, 2, 2), np.uint8)

    def expect(self, status, fn, *names):
        with self.assertRaises(spattn.SpattnError) as cm:
            fn()
        e = cm.exception
        self.assertIsInstance(e, ValueError)
        self.assertEqual(e.status, status, str(e))
        self.assertTrue(e.status_name.startswith("SPATTN_STATUS_"), e.status_name)
        for n in names:
            self.assertIn(n, e.message)
        return e

    def test_shape_mismatch(self):
        q = self.q
        self.expect(201, lambda: spattn.bsa_forward(q, q, q[..., :4].copy(), self.m, 8), "v")

    def test_bad_mask_shape(self):
        q = self.q
        self.expect(201, lambda: spattn.bsa_forward(q, q, q, np.ones((1, 2, 3, 2), np.uint8), 8), "block_mask")

    def test_bad_ndim(self):
        q = self.q
        self.expect(200, lambda: spattn.bsa_forward(q[0], q, q, self.m, 8), "q")

    def test_bad_dtype(self):
        q = self.q
        self.expect(300, lambda: spattn.bsa_forward(q.astype(np.float64), q, q, self.m, 8), "q")
        self.expect(300, lambda: spattn.bsa_forward(q, q.astype(np.float16), q, self.m, 8), "k")

    def test_invalid_block_size(self):
        q = self.q
        self.expect(101, lambda: spattn.bsa_forward(q, q, q, self.m, (0, 8)), "bx")

    def test_not_supported_head_dim(self):
        rng = np.random.default_rng(1)
        q = rnd(rng, (1, 1, 8, 12))
        e = self.expect(700, lambda: spattn.bsa_forward(q, q, q, np.ones((1, 1, 1, 1), np.uint8), 8), "D")
        self.assertIsInstance(e, NotImplementedError)

    def test_sfa_bad_index(self):
        rng = np.random.default_rng(2)
        q, k = rnd(rng, (1, 4, 2, 8)), rnd(rng, (1, 6, 1, 8))
        idx = np.zeros((1, 4, 1, 2), np.int32)
        idx[0, 1, 0, 1] = 6
        self.expect(600, lambda: spattn.sfa_forward(q, k, idx), "indices")

    def test_sfa_bad_sbs(self):
        rng = np.random.default_rng(3)
        q, k = rnd(rng, (1, 4, 2, 8)), rnd(rng, (1, 6, 1, 8))
        idx = np.zeros((1, 4, 1, 2), np.int32)
        self.expect(101, lambda: spattn.sfa_forward(q, k, idx, sparse_block_size=3), "sbs")

    def test_sfa_rope_without_k_rope(self):
        rng = np.random.default_rng(4)
        q, k = rnd(rng, (1, 4, 2, 8)), rnd(rng, (1, 6, 1, 8))
        idx = np.zeros((1, 4, 1, 2), np.int32)
        with self.assertRaises(spattn.SpattnError):
            spattn.sfa_forward(q, k, idx, q_rope=q)

    def test_too_many_dims(self):
        q = np.zeros((1,) * 9, np.float32)
        self.expect(200, lambda: spattn.bsa_forward(q, q, q, self.m, 8), "q")


class TestPackage(unittest.TestCase):
    def test_torch_names_without_torch(self):
        import importlib.util
        if importlib.util.find_spec("torch") is None:
            with self.assertRaisesRegex(ImportError, "needs PyTorch"):
                spattn.block_sparse_attention
        else:
            self.assertTrue(callable(spattn.npu_sparse_flash_attention))

    @unittest.skipUnless(__import__("importlib").util.find_spec("ml_dtypes"), "ml_dtypes not installed: "
                         "NumPy bfloat16 test skipped")
    def test_bfloat16_via_ml_dtypes(self):
        import ml_dtypes
        rng = np.random.default_rng(9)
        bf = ml_dtypes.bfloat16
        q, k, v = (rnd(rng, (1, 2, 24, 16)).astype(bf) for _ in range(3))
        m = random_block_mask(rng, 1, 2, 24, 24, 8, 8, 0.7)
        o, lse = spattn.bsa_forward(q, k, v, m, 8)
        self.assertEqual(o.dtype, bf)
        go, glse = bsa_ref(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), m, 8, 8)
        err = np.abs(o.astype(np.float64) - go)
        self.assertLessEqual(float(err.max()), 1.0)
        self.assertGreaterEqual(float((err <= 2 ** -6 * (1 + np.abs(go))).mean()), 0.99)


class TestLibraryInfo(unittest.TestCase):
    def test_version_and_queries(self):
        self.assertEqual(spattn.version(), spattn.__version__)
        self.assertIn(spattn.cpu_isa(), ("avx512", "avx2", "generic"))
        self.assertIsInstance(spattn.cuda_available(), bool)
        path = spattn.library_path()
        self.assertTrue(path.endswith(".so") or ".so." in path)
        if not os.environ.get("SPATTN_LIBRARY"):   # an installed package loads its bundled copy
            self.assertEqual(os.path.dirname(path), os.path.join(os.path.dirname(spattn.__file__), "lib"))


if __name__ == "__main__":
    unittest.main()
