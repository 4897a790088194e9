"""Packed variable-length batches and paged keys from Python (issue 14): the cu_seqlens /
block_table forms of spattn.block_sparse_attention and spattn.sparse_flash_attention against
one dense call per sequence (values and gradients), paged against packed, the torch_npu TND
and PA_BSND mappings, torch.compile(fullgraph=True), and the library's refusals."""
from __future__ import annotations

import unittest

try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover
    torch = None
    HAVE_TORCH = False

import spattn

needs_torch = unittest.skipUnless(HAVE_TORCH, "PyTorch (>= 2.4) not importable: varlen tests skipped")


def close(tc, a, b, tol=1e-5):
    tc.assertEqual(tuple(a.shape), tuple(b.shape))
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def cu_of(lens):
    return torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)


def paged(x, lens, ps, g):
    """Pages [P, ps, H, W] of the packed rows x [T, H, W] over a shuffled block table."""
    need = [-(-L // ps) for L in lens]
    P = sum(need) + 2
    perm = torch.randperm(P, generator=g)
    maxp = max(need + [1])
    table = torch.full((len(lens), maxp), -1, dtype=torch.int32)
    pages = torch.zeros(P, ps, *x.shape[1:], dtype=x.dtype)
    u, t0 = 0, 0
    for b, L in enumerate(lens):
        for j in range(need[b]):
            table[b, j] = int(perm[u])
            u += 1
        for j in range(L):
            pages[table[b, j // ps], j % ps] = x[t0 + j]
        t0 += L
    return pages, table


@needs_torch
class TestBsaVarlen(unittest.TestCase):
    def setUp(self):
        self.g = torch.Generator().manual_seed(14)
        self.lq, self.lk = [5, 0, 17, 1, 9], [7, 4, 0, 3, 12]
        self.N, self.NKV, self.D, self.bx, self.by = 4, 2, 16, 4, 3
        Tq, Tk = sum(self.lq), sum(self.lk)
        g = self.g
        self.q = torch.randn(Tq, self.N, self.D, generator=g)
        self.k = torch.randn(Tk, self.NKV, self.D, generator=g)
        self.v = torch.randn(Tk, self.NKV, self.D, generator=g)
        self.do = torch.randn(Tq, self.N, self.D, generator=g)
        mq, mk = max(self.lq), max(self.lk)
        self.m = torch.rand(len(self.lq), self.N, -(-mq // self.bx), -(-mk // self.by), generator=g) < 0.6
        self.cq, self.ck = cu_of(self.lq), cu_of(self.lk)

    def run_varlen(self, q, k, v, **kw):
        return spattn.block_sparse_attention(q, k, v, self.m, (self.bx, self.by), return_lse=True,
                                             cu_seqlens_q=self.cq, cu_seqlens_k=self.ck, **kw)

    def test_int64_prefix_sums_beyond_int32_rejected(self):
        # 2**32 + 5 must not wrap to 5 (a valid-looking length): it saturates and is refused
        cq = self.cq.to(torch.int64).clone()
        cq[1:] += 2 ** 32
        with self.assertRaises(spattn.SpattnError):
            spattn.block_sparse_attention(self.q, self.k, self.v, self.m, (self.bx, self.by),
                                          cu_seqlens_q=cq, cu_seqlens_k=self.ck,
                                          max_seqlen_q=max(self.lq), max_seqlen_k=max(self.lk))

    def test_matches_dense_per_sequence(self):
        q, k, v = (x.clone().requires_grad_(True) for x in (self.q, self.k, self.v))
        o, lse = self.run_varlen(q, k, v, max_seqlen_q=max(self.lq), max_seqlen_k=max(self.lk))
        self.assertEqual(tuple(lse.shape), (q.shape[0], self.N))
        o.backward(self.do)
        qs = ks = 0
        for b, (a, c) in enumerate(zip(self.lq, self.lk)):
            sq, sk = slice(qs, qs + a), slice(ks, ks + c)
            if a and c:
                qb, kb, vb = (x[s].transpose(0, 1).unsqueeze(0).requires_grad_(True)
                              for x, s in ((self.q, sq), (self.k, sk), (self.v, sk)))
                ob, lb = spattn.block_sparse_attention(qb, kb, vb, self.m[b:b + 1, :, :-(-a // self.bx), :-(-c // self.by)],
                                                       (self.bx, self.by), return_lse=True)
                ob.backward(self.do[sq].transpose(0, 1).unsqueeze(0))
                self.assertTrue(torch.equal(o[sq], ob[0].transpose(0, 1)))
                self.assertTrue(torch.equal(lse[sq], lb[0].transpose(0, 1)))
                self.assertTrue(torch.equal(q.grad[sq], qb.grad[0].transpose(0, 1)))
                self.assertTrue(torch.equal(k.grad[sk], kb.grad[0].transpose(0, 1)))
                self.assertTrue(torch.equal(v.grad[sk], vb.grad[0].transpose(0, 1)))
            elif a:  # queries without keys
                self.assertTrue(bool((o[sq] == 0).all()) and bool(torch.isneginf(lse[sq]).all()))
                self.assertTrue(bool((q.grad[sq] == 0).all()))
            else:  # keys without queries
                self.assertTrue(bool((k.grad[sk] == 0).all()) and bool((v.grad[sk] == 0).all()))
            qs, ks = qs + a, ks + c

    def test_sum_backward_expanded_grad(self):
        # o.sum().backward() hands the backward an expanded (stride 0) grad_o, which the CUDA
        # varlen backward cannot read by TMA (it refused it: NOT_SUPPORTED); the op makes it a
        # plain tensor: the gradients equal those of an explicit grad of ones, bitwise
        devs = ["cpu"] + (["cuda"] if torch.cuda.is_available() and spattn.cuda_available() else [])
        for dev in devs:
            dt = torch.float32 if dev == "cpu" else torch.bfloat16
            g = torch.Generator().manual_seed(3)
            lens, N, D, blk = [70, 0, 33], 2, 64, 16
            T, nb = sum(lens), -(-max(lens) // blk)
            cu = cu_of(lens).to(dev)
            m = (torch.rand(len(lens), N, nb, nb, generator=g) < 0.7).to(dev)
            base = [torch.randn(T, N, D, generator=g).to(dev, dt) for _ in range(3)]
            grads = []
            for explicit in (False, True):
                q, k, v = (x.clone().requires_grad_(True) for x in base)
                o = spattn.block_sparse_attention(q, k, v, m, blk, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                  max_seqlen_q=max(lens), max_seqlen_k=max(lens),
                                                  deterministic=True)
                if explicit:
                    o.backward(torch.ones_like(o))
                else:
                    o.sum().backward()
                grads.append([x.grad for x in (q, k, v)])
            for a, b in zip(*grads):
                with self.subTest(device=dev):
                    self.assertTrue(torch.equal(a, b))

    def test_paged_forward_and_default_bounds(self):
        o, lse = self.run_varlen(self.q, self.k, self.v)  # max_seqlen from the mask's extent
        for ps in (1, 4):
            kp, table = paged(self.k, self.lk, ps, self.g)
            vp = torch.zeros_like(kp)
            t0 = 0
            for b, L in enumerate(self.lk):  # same table for v
                for j in range(L):
                    vp[table[b, j // ps], j % ps] = self.v[t0 + j]
                t0 += L
            op, lp = self.run_varlen(self.q, kp, vp, block_table=table)
            self.assertTrue(torch.equal(op, o) and torch.equal(lp, lse))

    def test_paged_backward(self):
        # gradients through paged k / v: page rows hold the packed rows' gradients (bitwise),
        # rows no sequence uses get 0
        q, k, v = (x.clone().requires_grad_(True) for x in (self.q, self.k, self.v))
        o, _ = self.run_varlen(q, k, v)
        o.backward(self.do)
        ps = 4
        kp, table = paged(self.k, self.lk, ps, self.g)
        vp = torch.zeros_like(kp)
        used = torch.zeros(kp.shape[:2], dtype=torch.bool)
        t0 = 0
        for b, L in enumerate(self.lk):
            for j in range(L):
                vp[table[b, j // ps], j % ps] = self.v[t0 + j]
                used[table[b, j // ps], j % ps] = True
            t0 += L
        qp, kp, vp = (x.clone().requires_grad_(True) for x in (self.q, kp, vp))
        op, _ = self.run_varlen(qp, kp, vp, block_table=table)
        op.backward(self.do)
        self.assertTrue(torch.equal(qp.grad, q.grad))
        t0 = 0
        for b, L in enumerate(self.lk):
            for j in range(L):
                self.assertTrue(torch.equal(kp.grad[table[b, j // ps], j % ps], k.grad[t0 + j]))
                self.assertTrue(torch.equal(vp.grad[table[b, j // ps], j % ps], v.grad[t0 + j]))
            t0 += L
        self.assertTrue(bool((kp.grad[~used] == 0).all()) and bool((vp.grad[~used] == 0).all()))

    def test_int64_prefix_sums_and_errors(self):
        o, _ = self.run_varlen(self.q, self.k, self.v)
        o2 = spattn.block_sparse_attention(self.q, self.k, self.v, self.m, (self.bx, self.by),
                                           cu_seqlens_q=self.cq.long(), cu_seqlens_k=self.ck.long())
        self.assertTrue(torch.equal(o, o2))
        bad = self.cq.clone()
        bad[2] = bad[3] + 1
        with self.assertRaisesRegex(spattn.SpattnError, "non-decreasing") as cm:
            spattn.block_sparse_attention(self.q, self.k, self.v, self.m, (self.bx, self.by),
                                          cu_seqlens_q=bad, cu_seqlens_k=self.ck)
        self.assertEqual(cm.exception.status, 600)
        with self.assertRaisesRegex(ValueError, "together"):
            spattn.block_sparse_attention(self.q, self.k, self.v, self.m, (self.bx, self.by), cu_seqlens_q=self.cq)

    def test_compile_fullgraph(self):
        mq, mk = max(self.lq), max(self.lk)

        def f(q, k, v, m, cq, ck):
            return spattn.block_sparse_attention(q, k, v, m, (self.bx, self.by), cu_seqlens_q=cq,
                                                 cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk)
        try:
            cf = torch.compile(f, fullgraph=True, backend="eager")
        except Exception as e:  # pragma: no cover
            self.skipTest(f"torch.compile unavailable: {e}")
        eager = f(self.q, self.k, self.v, self.m, self.cq, self.ck)
        self.assertTrue(torch.equal(cf(self.q, self.k, self.v, self.m, self.cq, self.ck), eager))


@needs_torch
class TestSfaVarlen(unittest.TestCase):
    def setUp(self):
        g = self.g = torch.Generator().manual_seed(15)
        self.lq, self.lk = [6, 0, 11, 1, 4], [9, 5, 14, 0, 30]
        self.N1, self.N2, self.D, self.Dr, self.K = 4, 2, 16, 8, 5
        Tq, Tk = sum(self.lq), sum(self.lk)
        self.q = torch.randn(Tq, self.N1, self.D, generator=g)
        self.qr = torch.randn(Tq, self.N1, self.Dr, generator=g)
        self.k = torch.randn(Tk, self.N2, self.D, generator=g)
        self.kr = torch.randn(Tk, self.N2, self.Dr, generator=g)
        self.do = torch.randn(Tq, self.N1, self.D, generator=g)
        parts = []
        for a, c in zip(self.lq, self.lk):  # sequence-local keys, -1 padding
            r = torch.randint(-1, max(c, 1), (a, self.N2, self.K), generator=g, dtype=torch.int32)
            parts.append(r if c else torch.full_like(r, -1))
        self.idx = torch.cat(parts)
        self.cq, self.ck = cu_of(self.lq), cu_of(self.lk)

    def run_varlen(self, q, k, qr, kr, **kw):
        return spattn.sparse_flash_attention(q, k, self.idx, q_rope=qr, k_rope=kr, causal=True,
                                             return_lse=True, cu_seqlens_q=self.cq, cu_seqlens_k=self.ck,
                                             **kw)

    def test_matches_dense_per_sequence(self):
        q, k, qr, kr = (x.clone().requires_grad_(True) for x in (self.q, self.k, self.qr, self.kr))
        o, lse = self.run_varlen(q, k, qr, kr)
        o.backward(self.do)
        qs = ks = 0
        for b, (a, c) in enumerate(zip(self.lq, self.lk)):
            sq, sk = slice(qs, qs + a), slice(ks, ks + c)
            if a and c:
                qb, kb, qrb, krb = (x[s][None].clone().requires_grad_(True)
                                    for x, s in ((self.q, sq), (self.k, sk), (self.qr, sq), (self.kr, sk)))
                ob, lb = spattn.sparse_flash_attention(qb, kb, self.idx[sq][None], q_rope=qrb, k_rope=krb,
                                                       causal=True, return_lse=True)
                ob.backward(self.do[sq][None])
                self.assertTrue(torch.equal(o[sq], ob[0]) and torch.equal(lse[sq], lb[0]))
                close(self, q.grad[sq], qb.grad[0])
                close(self, qr.grad[sq], qrb.grad[0])
                close(self, k.grad[sk], kb.grad[0])
                close(self, kr.grad[sk], krb.grad[0])
            elif a:
                self.assertTrue(bool((o[sq] == 0).all()) and bool(torch.isneginf(lse[sq]).all()))
            else:
                self.assertTrue(bool((k.grad[sk] == 0).all()))
            qs, ks = qs + a, ks + c

    def test_paged_forward_backward(self):
        q, k, qr, kr = (x.clone().requires_grad_(True) for x in (self.q, self.k, self.qr, self.kr))
        o, lse = self.run_varlen(q, k, qr, kr)
        o.backward(self.do)
        ps = 4
        kp, table = paged(self.k, self.lk, ps, self.g)
        krp = torch.zeros(kp.shape[0], ps, self.N2, self.Dr)
        t0 = 0
        for b, L in enumerate(self.lk):
            for j in range(L):
                krp[table[b, j // ps], j % ps] = self.kr[t0 + j]
            t0 += L
        qp, kp, qrp, krp = (x.clone().requires_grad_(True) for x in (self.q, kp, self.qr, krp))
        op, lp = self.run_varlen(qp, kp, qrp, krp, block_table=table)
        self.assertTrue(torch.equal(op, o) and torch.equal(lp, lse))
        op.backward(self.do)
        self.assertTrue(torch.equal(qp.grad, q.grad))
        t0 = 0
        for b, L in enumerate(self.lk):  # page rows hold the packed rows' gradients
            for j in range(L):
                close(self, kp.grad[table[b, j // ps], j % ps], k.grad[t0 + j])
                close(self, krp.grad[table[b, j // ps], j % ps], kr.grad[t0 + j])
            t0 += L

    def test_npu_tnd_and_pa_bsnd(self):
        cq, ck = self.cq[1:], self.ck[1:]  # torch_npu: prefix sums without the leading 0
        o, smax, ssum = spattn.npu_sparse_flash_attention(
            self.q, self.k, self.k, self.idx, 0.2, actual_seq_lengths_query=cq, actual_seq_lengths_kv=ck,
            query_rope=self.qr, key_rope=self.kr, layout_query="TND", layout_kv="TND", return_softmax_lse=True)
        ref = spattn.sparse_flash_attention(self.q, self.k, self.idx, q_rope=self.qr, k_rope=self.kr, scale=0.2,
                                            cu_seqlens_q=self.cq, cu_seqlens_k=self.ck)
        self.assertTrue(torch.equal(o, ref))
        dq, dk, dv, dqr, dkr = spattn.npu_sparse_flash_attention_grad(
            self.q, self.k, self.k, self.idx, self.do, o, smax, ssum, 0.2, 1, query_rope=self.qr,
            key_rope=self.kr, actual_seq_qlen=cq, actual_seq_kvlen=ck, layout="TND")
        q, k, qr, kr = (x.clone().requires_grad_(True) for x in (self.q, self.k, self.qr, self.kr))
        spattn.sparse_flash_attention(q, k, self.idx, q_rope=qr, k_rope=kr, scale=0.2, cu_seqlens_q=self.cq,
                                      cu_seqlens_k=self.ck).backward(self.do)
        close(self, dq, q.grad)
        close(self, dk + dv, k.grad)
        close(self, dkr, kr.grad)
        # PageAttention, BSND queries: B sequences of S1 queries each over paged keys
        B, S1, ps = 3, 4, 8
        lk = [9, 20, 1]
        g = self.g
        qb = torch.randn(B, S1, self.N1, self.D, generator=g)
        kt = torch.randn(sum(lk), self.N2, self.D, generator=g)
        idx = torch.stack([torch.randint(-1, -(-L // 1), (S1, self.N2, self.K), generator=g, dtype=torch.int32)
                           for L in lk])
        kp, table = paged(kt, lk, ps, g)
        o_pa, _, _ = spattn.npu_sparse_flash_attention(qb, kp, kp, idx, 0.3, block_table=table,
                                                       actual_seq_lengths_kv=torch.tensor(lk),
                                                       layout_query="BSND", layout_kv="PA_BSND")
        o_tnd = spattn.sparse_flash_attention(qb.flatten(0, 1), kt, idx.flatten(0, 1), scale=0.3,
                                              cu_seqlens_q=cu_of([S1] * B), cu_seqlens_k=cu_of(lk))
        self.assertTrue(torch.equal(o_pa, o_tnd.unflatten(0, (B, S1))))

    def test_compile_fullgraph_and_errors(self):
        def f(q, k, idx, qr, kr, cq, ck):
            return spattn.sparse_flash_attention(q, k, idx, q_rope=qr, k_rope=kr, cu_seqlens_q=cq,
                                                 cu_seqlens_k=ck, max_seqlen_q=max(self.lq),
                                                 max_seqlen_k=max(self.lk))
        try:
            cf = torch.compile(f, fullgraph=True, backend="eager")
        except Exception as e:  # pragma: no cover
            self.skipTest(f"torch.compile unavailable: {e}")
        args = (self.q, self.k, self.idx, self.qr, self.kr, self.cq, self.ck)
        self.assertTrue(torch.equal(cf(*args), f(*args)))
        bad = self.idx.clone()
        bad[0, 0, 0] = 9  # < max_seqlen_k, but sequence 0 has 9 keys: block 9 is out of range
        with self.assertRaisesRegex(spattn.SpattnError, "sequence 0") as cm:
            spattn.sparse_flash_attention(self.q, self.k, bad, cu_seqlens_q=self.cq, cu_seqlens_k=self.ck)
        self.assertEqual(cm.exception.status, 600)


if __name__ == "__main__":
    unittest.main()
