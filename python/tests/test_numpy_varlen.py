"""NumPy packed variable-length / paged operators (spattn.numpy_varlen): every sequence equals a
dense call on it (bitwise), paged equals packed, the backward matches per-sequence backwards,
and bad prefix sums / tables are refused before anything is written.  Needs NumPy only."""
from __future__ import annotations

import unittest

import numpy as np

import spattn
from spattn import numpy_varlen as nv


def cu_of(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def to_pages(x, lens, ps, rng):
    need = [-(-L // ps) for L in lens]
    P = sum(need) + 1
    perm = rng.permutation(P)
    table = np.full((len(lens), max(need + [1])), -1, np.int32)
    pages = np.zeros((P, ps) + x.shape[1:], x.dtype)
    u = t0 = 0
    for b, L in enumerate(lens):
        for j in range(need[b]):
            table[b, j] = perm[u]
            u += 1
        for j in range(L):
            pages[table[b, j // ps], j % ps] = x[t0 + j]
        t0 += L
    return pages, table


class TestNumpyVarlen(unittest.TestCase):
    def test_bsa(self):
        rng = np.random.default_rng(14)
        lq, lk, N, NKV, D, bx, by = [9, 0, 20, 1], [5, 3, 17, 0], 4, 2, 16, 4, 8
        q = rng.standard_normal((sum(lq), N, D), dtype=np.float32)
        k = rng.standard_normal((sum(lk), NKV, D), dtype=np.float32)
        v = rng.standard_normal((sum(lk), NKV, D), dtype=np.float32)
        do = rng.standard_normal(q.shape, dtype=np.float32)
        m = (rng.random((4, N, -(-max(lq) // bx), -(-max(lk) // by))) < 0.6).astype(np.uint8)
        cq, ck = cu_of(lq), cu_of(lk)
        o, lse = nv.bsa_forward_varlen(q, k, v, m, cq, ck, (bx, by))
        dq, dk, dv = nv.bsa_backward_varlen(q, k, v, m, o, do, lse, cq, ck, (bx, by))
        for b in range(4):
            sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            if lq[b] and lk[b]:
                t = lambda x: np.ascontiguousarray(x.transpose(1, 0, 2))[None]  # noqa: E731
                mb = np.ascontiguousarray(m[b:b + 1, :, :-(-lq[b] // bx), :-(-lk[b] // by)])
                ob, lb = spattn.bsa_forward(t(q[sq]), t(k[sk]), t(v[sk]), mb, (bx, by))
                g = spattn.bsa_backward(t(q[sq]), t(k[sk]), t(v[sk]), mb, ob, t(do[sq]), lb, (bx, by))
                np.testing.assert_array_equal(o[sq], ob[0].transpose(1, 0, 2))
                np.testing.assert_array_equal(lse[sq], lb[0].T)
                np.testing.assert_array_equal(dq[sq], g[0][0].transpose(1, 0, 2))
                np.testing.assert_array_equal(dk[sk], g[1][0].transpose(1, 0, 2))
                np.testing.assert_array_equal(dv[sk], g[2][0].transpose(1, 0, 2))
            elif lq[b]:
                self.assertTrue((o[sq] == 0).all() and np.isneginf(lse[sq]).all())
            else:
                self.assertTrue((dk[sk] == 0).all() and (dv[sk] == 0).all())
        kp, table = to_pages(k, lk, 4, rng)
        vp = np.zeros_like(kp)
        t0 = 0
        for b, L in enumerate(lk):
            for j in range(L):
                vp[table[b, j // 4], j % 4] = v[t0 + j]
            t0 += L
        op, lp = nv.bsa_forward_varlen(q, kp, vp, m, cq, ck, (bx, by), block_table=table)
        np.testing.assert_array_equal(op, o)
        np.testing.assert_array_equal(lp, lse)
        # paged backward: page rows hold the packed rows' gradients bitwise, the rest is 0
        dqp, dkp, dvp = nv.bsa_backward_varlen(q, kp, vp, m, o, do, lse, cq, ck, (bx, by), block_table=table)
        np.testing.assert_array_equal(dqp, dq)
        used = np.zeros(kp.shape[:2], bool)
        t0 = 0
        for b, L in enumerate(lk):
            for j in range(L):
                pg, r = table[b, j // 4], j % 4
                used[pg, r] = True
                np.testing.assert_array_equal(dkp[pg, r], dk[t0 + j])
                np.testing.assert_array_equal(dvp[pg, r], dv[t0 + j])
            t0 += L
        self.assertTrue((dkp[~used] == 0).all() and (dvp[~used] == 0).all())
        # a page shared by two sequences (a common prompt) gets the sum of their gradients
        lk2, cq2 = [4, 4], cu_of([3, 5])
        kp2, vp2 = kp[:2], vp[:2]
        t2 = np.array([[1], [1]], np.int32)
        m2 = np.ones((2, N, 2, 1), np.uint8)
        q2, do2 = q[:8], do[:8]
        o2, l2 = nv.bsa_forward_varlen(q2, kp2, vp2, m2, cq2, cu_of(lk2), (bx, by), block_table=t2)
        _, dk2, dv2 = nv.bsa_backward_varlen(q2, kp2, vp2, m2, o2, do2, l2, cq2, cu_of(lk2), (bx, by),
                                             block_table=t2)
        want_k, want_v = np.zeros_like(kp2[1]), np.zeros_like(vp2[1])
        for b in range(2):
            sq = slice(cq2[b], cq2[b + 1])
            t = lambda x: np.ascontiguousarray(x.transpose(1, 0, 2))[None]  # noqa: E731
            mb = np.ascontiguousarray(m2[b:b + 1, :, :-(-(cq2[b + 1] - cq2[b]) // bx)])
            kb, vb = t(kp2[1]), t(vp2[1])
            ob, lb = spattn.bsa_forward(t(q2[sq]), kb, vb, mb, (bx, by))
            g = spattn.bsa_backward(t(q2[sq]), kb, vb, mb, ob, t(do2[sq]), lb, (bx, by))
            want_k += g[1][0].transpose(1, 0, 2)
            want_v += g[2][0].transpose(1, 0, 2)
        np.testing.assert_allclose(dk2[1], want_k, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dv2[1], want_v, rtol=1e-5, atol=1e-5)
        self.assertTrue((dk2[0] == 0).all() and (dv2[0] == 0).all())

    def test_sfa(self):
        rng = np.random.default_rng(15)
        lq, lk, N1, D, Dr, K = [7, 1, 0, 12], [10, 4, 6, 25], 4, 16, 8, 4
        q = rng.standard_normal((sum(lq), N1, D), dtype=np.float32)
        qr = rng.standard_normal((sum(lq), N1, Dr), dtype=np.float32)
        k = rng.standard_normal((sum(lk), 1, D), dtype=np.float32)
        kr = rng.standard_normal((sum(lk), 1, Dr), dtype=np.float32)
        do = rng.standard_normal(q.shape, dtype=np.float32)
        idx = np.concatenate([rng.integers(-1, L, (a, 1, K)) for a, L in zip(lq, lk)]).astype(np.int32)
        cq, ck = cu_of(lq), cu_of(lk)
        o, lse = nv.sfa_forward_varlen(q, k, idx, cq, ck, q_rope=qr, k_rope=kr)
        dq, dk, _, dqr, dkr = nv.sfa_backward_varlen(q, k, idx, o, do, lse, cq, ck, q_rope=qr, k_rope=kr)
        for b in range(4):
            sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            if not lq[b]:
                continue
            ob, lb = spattn.sfa_forward(q[sq][None], k[sk][None], idx[sq][None], q_rope=qr[sq][None],
                                        k_rope=kr[sk][None])
            np.testing.assert_array_equal(o[sq], ob[0])
            np.testing.assert_array_equal(lse[sq], lb[0])
        kp, table = to_pages(k, lk, 8, rng)
        krp = np.zeros((kp.shape[0], 8, 1, Dr), np.float32)
        t0 = 0
        for b, L in enumerate(lk):
            for j in range(L):
                krp[table[b, j // 8], j % 8] = kr[t0 + j]
            t0 += L
        op, lp = nv.sfa_forward_varlen(q, kp, idx, cq, ck, q_rope=qr, k_rope=krp, block_table=table)
        np.testing.assert_array_equal(op, o)
        g = nv.sfa_backward_varlen(q, kp, idx, o, do, lse, cq, ck, q_rope=qr, k_rope=krp, block_table=table)
        np.testing.assert_array_equal(g[0], dq)
        np.testing.assert_array_equal(g[3], dqr)
        t0 = 0
        for b, L in enumerate(lk):
            for j in range(L):
                np.testing.assert_allclose(g[1][table[b, j // 8], j % 8], dk[t0 + j], rtol=1e-6, atol=1e-6)
                np.testing.assert_allclose(g[4][table[b, j // 8], j % 8], dkr[t0 + j], rtol=1e-6, atol=1e-6)
            t0 += L

    def test_refusals(self):
        q = np.ones((6, 2, 8), np.float32)
        m = np.ones((2, 2, 1, 1), np.uint8)
        for cq, needle in (([0, 4, 3], "non-decreasing"), ([1, 3, 6], r"\[0\] must be 0"),
                           ([0, 3, 9], "exceeds")):
            with self.assertRaisesRegex(spattn.SpattnError, needle) as cm:
                nv.bsa_forward_varlen(q, q, q, m, np.array(cq), np.array([0, 3, 6]), 8)
            self.assertEqual(cm.exception.status, 600)
        kp = np.ones((3, 4, 2, 8), np.float32)
        with self.assertRaisesRegex(spattn.SpattnError, "page id") as cm:
            nv.bsa_forward_varlen(q, kp, kp, m, np.array([0, 3, 6]), np.array([0, 3, 6]), 8,
                                  block_table=np.array([[0], [3]], np.int32))


if __name__ == "__main__":
    unittest.main()
