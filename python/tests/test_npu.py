"""torch_npu-compatible wrappers: argument handling, layouts, return structure, gradients."""
from __future__ import annotations

import unittest

from gen import block_mask, topk_indices

try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover
    torch = None
    HAVE_TORCH = False

import spattn

needs_torch = unittest.skipUnless(HAVE_TORCH, "PyTorch (>= 2.4) not importable: torch_npu wrapper tests skipped")


def close(tc, a, b, tol=1e-5):
    tc.assertEqual(tuple(a.shape), tuple(b.shape))
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@needs_torch
class TestNpuBlockSparse(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(0)
        self.B, self.N, self.NKV, self.S, self.D = 2, 4, 2, 20, 16
        self.bs = [8, 6]
        self.q = torch.randn(self.B, self.N, self.S, self.D, generator=g)
        self.k = torch.randn(self.B, self.NKV, self.S, self.D, generator=g)
        self.v = torch.randn(self.B, self.NKV, self.S, self.D, generator=g)
        self.do = torch.randn(self.B, self.N, self.S, self.D, generator=g)
        self.m = torch.tensor(block_mask(0, self.B, self.N, self.S, self.S, 8, 6, 0.6), dtype=torch.int8)

    def fwd(self, **kw):
        args = dict(q_input_layout="BNSD", kv_input_layout="BNSD", num_key_value_heads=self.NKV)
        args.update(kw)
        return spattn.npu_block_sparse_attention(self.q, self.k, self.v, self.m, self.bs, **args)

    def test_bnsd_matches_core_and_lse_shape(self):
        out, lse = self.fwd(softmax_lse_flag=1, scale_value=0.0, inner_precise=0)
        o_ref, lse_ref = spattn.block_sparse_attention(self.q, self.k, self.v, self.m, (8, 6), return_lse=True)
        close(self, out, o_ref)
        self.assertEqual(tuple(lse.shape), (self.B, self.N, self.S, 1))
        close(self, lse[..., 0], lse_ref)
        _, lse0 = self.fwd()
        self.assertEqual(lse0.numel(), 0)

    def test_backward_matches_autograd(self):
        q, k, v = (x.clone().requires_grad_(True) for x in (self.q, self.k, self.v))
        out, lse = spattn.npu_block_sparse_attention(q, k, v, self.m, self.bs, q_input_layout="BNSD",
                                                     kv_input_layout="BNSD", num_key_value_heads=self.NKV,
                                                     scale_value=0.3, softmax_lse_flag=1)
        out.backward(self.do)
        dq, dk, dv = spattn.npu_block_sparse_attention_backward(
            self.do, self.q, self.k, self.v, out.detach(), lse, self.m, block_shape=self.bs,
            q_input_layout="BNSD", kv_input_layout="BNSD", num_key_value_heads=self.NKV, scale_value=0.3,
            actual_seq_lengths=[self.S] * self.B, actual_seq_lengths_kv=[self.S] * self.B)
        close(self, dq, q.grad)
        close(self, dk, k.grad)
        close(self, dv, v.grad)

    def test_tnd_varlen(self):
        lens = [7, 13]
        T = sum(lens)
        g = torch.Generator().manual_seed(1)
        q = torch.randn(T, self.N, self.D, generator=g, requires_grad=True)
        k = torch.randn(T, self.NKV, self.D, generator=g, requires_grad=True)
        v = torch.randn(T, self.NKV, self.D, generator=g, requires_grad=True)
        do = torch.randn(T, self.N, self.D, generator=g)
        m = torch.ones(2, self.N, 2, 3, dtype=torch.int8)
        m[0, :, 0, 1] = 0
        out, lse = spattn.npu_block_sparse_attention(q, k, v, m, [8, 6], num_key_value_heads=self.NKV,
                                                     actual_seq_lengths=lens, actual_seq_lengths_kv=lens,
                                                     softmax_lse_flag=1)
        self.assertEqual(tuple(out.shape), (T, self.N, self.D))
        self.assertEqual(tuple(lse.shape), (T, self.N, 1))
        out.backward(do)
        t0 = 0
        for b, L in enumerate(lens):
            sl = slice(t0, t0 + L)
            qb, kb, vb = (x.detach()[sl].transpose(0, 1).unsqueeze(0).requires_grad_(True) for x in (q, k, v))
            mb = m[b:b + 1, :, :-(-L // 8), :-(-L // 6)]
            ob, lb = spattn.block_sparse_attention(qb, kb, vb, mb, (8, 6), return_lse=True)
            ob.backward(do[sl].transpose(0, 1).unsqueeze(0))
            close(self, out[sl], ob[0].transpose(0, 1))
            close(self, lse[sl, :, 0], lb[0].transpose(0, 1))
            close(self, q.grad[sl], qb.grad[0].transpose(0, 1))
            close(self, k.grad[sl], kb.grad[0].transpose(0, 1))
            t0 += L
        dq, dk, dv = spattn.npu_block_sparse_attention_backward(
            do, q.detach(), k.detach(), v.detach(), out.detach(), lse, m, block_shape=[8, 6],
            num_key_value_heads=self.NKV, actual_seq_lengths=lens, actual_seq_lengths_kv=lens)
        close(self, dq, q.grad)
        close(self, dk, k.grad)
        close(self, dv, v.grad)

    def test_bnsd_actual_lengths(self):
        out, lse = self.fwd(actual_seq_lengths=[self.S, 11], actual_seq_lengths_kv=[self.S, 9], softmax_lse_flag=1)
        o1, l1 = spattn.block_sparse_attention(self.q[1:, :, :11], self.k[1:, :, :9], self.v[1:, :, :9],
                                               self.m[1:, :, :2, :2], (8, 6), return_lse=True)
        close(self, out[1:, :, :11], o1)
        close(self, lse[1:, :, :11, 0], l1)
        self.assertTrue(bool((out[1, :, 11:] == 0).all()) and bool(torch.isneginf(lse[1, :, 11:]).all()))
        o0 = spattn.block_sparse_attention(self.q[:1], self.k[:1], self.v[:1], self.m[:1], (8, 6))
        close(self, out[:1], o0)

    def test_argument_errors(self):
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            self.fwd(num_key_value_heads=1)
        with self.assertRaisesRegex(ValueError, "kv_input_layout"):
            self.fwd(kv_input_layout="TND")
        with self.assertRaisesRegex(ValueError, "q_input_layout"):
            self.fwd(q_input_layout="BSH", kv_input_layout="BSH")
        with self.assertRaisesRegex(ValueError, "inner_precise"):
            self.fwd(inner_precise=2)
        with self.assertRaisesRegex(ValueError, "softmax_lse_flag"):
            self.fwd(softmax_lse_flag=3)
        with self.assertRaisesRegex(ValueError, "block_shape"):
            spattn.npu_block_sparse_attention(self.q, self.k, self.v, self.m, [8], q_input_layout="BNSD",
                                              kv_input_layout="BNSD", num_key_value_heads=self.NKV)
        with self.assertRaisesRegex(ValueError, "actual_seq_lengths"):
            spattn.npu_block_sparse_attention(self.q[0].transpose(0, 1), self.k[0].transpose(0, 1),
                                              self.v[0].transpose(0, 1), self.m[:1], self.bs,
                                              num_key_value_heads=self.NKV)
        with self.assertRaisesRegex(ValueError, "block_shape"):
            spattn.npu_block_sparse_attention_backward(self.do, self.q, self.k, self.v, self.q, self.q[..., 0],
                                                       self.m, q_input_layout="BNSD", kv_input_layout="BNSD",
                                                       num_key_value_heads=self.NKV)
        with self.assertRaises(spattn.SpattnError) as cm:   # library check: mask shape
            spattn.npu_block_sparse_attention(self.q, self.k, self.v, self.m, [4, 6], q_input_layout="BNSD",
                                              kv_input_layout="BNSD", num_key_value_heads=self.NKV)
        self.assertIn("block_mask", cm.exception.message)


@needs_torch
class TestNpuSparseFlash(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(2)
        self.B, self.S1, self.S2, self.N1, self.N2, self.D, self.DR, self.K = 2, 9, 14, 4, 1, 16, 8, 5
        self.q = torch.randn(self.B, self.S1, self.N1, self.D, generator=g)
        self.qr = torch.randn(self.B, self.S1, self.N1, self.DR, generator=g)
        self.k = torch.randn(self.B, self.S2, self.N2, self.D, generator=g)
        self.kr = torch.randn(self.B, self.S2, self.N2, self.DR, generator=g)
        self.do = torch.randn(self.B, self.S1, self.N1, self.D, generator=g)
        self.idx = torch.tensor(topk_indices(2, self.B, self.S1, self.S2, self.N2, self.K), dtype=torch.int32)
        self.scale = (self.D + self.DR) ** -0.5

    def fwd(self, **kw):
        args = dict(query_rope=self.qr, key_rope=self.kr, attention_mode=2)
        args.update(kw)
        return spattn.npu_sparse_flash_attention(self.q, self.k, self.k, self.idx, self.scale, **args)

    def test_returns_and_softmax_stats(self):
        o, smax, ssum = self.fwd(return_softmax_lse=True)
        o_ref, lse = spattn.sparse_flash_attention(self.q, self.k, self.idx, q_rope=self.qr, k_rope=self.kr,
                                                   scale=self.scale, return_lse=True)
        close(self, o, o_ref)
        G = self.N1 // self.N2
        self.assertEqual(tuple(smax.shape), (self.B, self.N2, self.S1, G))
        self.assertEqual(tuple(ssum.shape), (self.B, self.N2, self.S1, G))
        close(self, (smax + ssum.log()).permute(0, 2, 1, 3).reshape(self.B, self.S1, self.N1), lse)
        o2, m2, s2 = self.fwd()
        close(self, o2, o)
        self.assertEqual((m2.numel(), s2.numel()), (0, 0))

    def test_sparse_mode_0_is_non_causal(self):
        o, _, _ = self.fwd(sparse_mode=0)
        o_ref = spattn.sparse_flash_attention(self.q, self.k, self.idx, q_rope=self.qr, k_rope=self.kr,
                                              scale=self.scale, causal=False)
        close(self, o, o_ref)

    def test_grad_matches_autograd(self):
        q, qr, k, kr = (x.clone().requires_grad_(True) for x in (self.q, self.qr, self.k, self.kr))
        o, smax, ssum = spattn.npu_sparse_flash_attention(q, k, k, self.idx, self.scale, query_rope=qr,
                                                          key_rope=kr, attention_mode=2, return_softmax_lse=True)
        o.backward(self.do)
        dq, dk, dv, dqr, dkr = spattn.npu_sparse_flash_attention_grad(
            self.q, self.k, self.k, self.idx, self.do, o.detach(), smax, ssum, self.scale, 1,
            query_rope=self.qr, key_rope=self.kr, layout="BSND", sparse_mode=3, attention_mode=2)
        close(self, dq, q.grad)
        close(self, dk + dv, k.grad)          # value is key: d_key and d_value come separately
        close(self, dqr, qr.grad)
        close(self, dkr, kr.grad)

    def test_grad_without_rope_separate_value(self):
        g = torch.Generator().manual_seed(3)
        v = torch.randn(self.B, self.S2, self.N2, self.D, generator=g)
        q, k, vl = (x.clone().requires_grad_(True) for x in (self.q, self.k, v))
        o, smax, ssum = spattn.npu_sparse_flash_attention(q, k, vl, self.idx, 0.25, return_softmax_lse=True)
        o.backward(self.do)
        dq, dk, dv, dqr, dkr = spattn.npu_sparse_flash_attention_grad(
            self.q, self.k, v, self.idx, self.do, o.detach(), smax, ssum, 0.25, 1)
        close(self, dq, q.grad)
        close(self, dk, k.grad)
        close(self, dv, vl.grad)
        self.assertEqual((dqr.numel(), dkr.numel()), (0, 0))

    def test_tnd_prefix_sums(self):
        lq, lk = [4, 9], [6, 14]
        T1, T2 = sum(lq), sum(lk)
        g = torch.Generator().manual_seed(4)
        q = torch.randn(T1, self.N1, self.D, generator=g, requires_grad=True)
        k = torch.randn(T2, self.N2, self.D, generator=g, requires_grad=True)
        do = torch.randn(T1, self.N1, self.D, generator=g)
        parts = [torch.tensor(topk_indices(4 + i, 1, a, b, self.N2, self.K), dtype=torch.int32)[0]
                 for i, (a, b) in enumerate(zip(lq, lk))]
        idx = torch.cat(parts, 0)
        cq = torch.tensor(lq, dtype=torch.int32).cumsum(0).to(torch.int32)
        ck = torch.tensor(lk, dtype=torch.int32).cumsum(0).to(torch.int32)
        o, smax, ssum = spattn.npu_sparse_flash_attention(q, k, k, idx, 0.3, actual_seq_lengths_query=cq,
                                                          actual_seq_lengths_kv=ck, layout_query="TND",
                                                          layout_kv="TND", return_softmax_lse=True)
        self.assertEqual(tuple(smax.shape), (self.N2, T1, self.N1 // self.N2))
        o.backward(do)
        qs = ks = 0
        for a, b, ib in zip(lq, lk, parts):
            ob = spattn.sparse_flash_attention(q.detach()[qs:qs + a][None], k.detach()[ks:ks + b][None], ib[None],
                                               scale=0.3)
            close(self, o[qs:qs + a], ob[0])
            qs, ks = qs + a, ks + b
        dq, dk, dv, dqr, dkr = spattn.npu_sparse_flash_attention_grad(
            q.detach(), k.detach(), k.detach(), idx, do, o.detach(), smax, ssum, 0.3, 1,
            actual_seq_qlen=cq, actual_seq_kvlen=ck, layout="TND")
        close(self, dq, q.grad)
        close(self, dk + dv, k.grad)

    def test_bsnd_actual_lengths(self):
        o, smax, ssum = self.fwd(actual_seq_lengths_query=torch.tensor([self.S1, 6], dtype=torch.int32),
                                 actual_seq_lengths_kv=torch.tensor([self.S2, 8], dtype=torch.int32),
                                 return_softmax_lse=True)
        idx1 = self.idx[1:, :6].clone()
        idx1[idx1 >= 8] = -1
        o1 = spattn.sparse_flash_attention(self.q[1:, :6], self.k[1:, :8], idx1, q_rope=self.qr[1:, :6],
                                           k_rope=self.kr[1:, :8], scale=self.scale)
        close(self, o[1:, :6], o1)
        self.assertTrue(bool((o[1, 6:] == 0).all()) and bool(torch.isneginf(smax[1, :, 6:]).all()))

    def test_argument_errors(self):
        with self.assertRaisesRegex(ValueError, "block_table"):  # PageAttention needs both
            self.fwd(block_table=torch.zeros(1, 1, dtype=torch.int32))
        with self.assertRaisesRegex(ValueError, "PA_BSND"):
            self.fwd(layout_kv="PA_BSND")
        with self.assertRaisesRegex(ValueError, "layout_kv"):
            self.fwd(layout_kv="TND")
        with self.assertRaisesRegex(NotImplementedError, "sparse_mode"):
            self.fwd(sparse_mode=1)
        with self.assertRaisesRegex(NotImplementedError, "pre_tokens"):
            self.fwd(pre_tokens=128)
        with self.assertRaisesRegex(NotImplementedError, "next_tokens"):
            self.fwd(next_tokens=0)
        with self.assertRaisesRegex(ValueError, "attention_mode"):
            self.fwd(attention_mode=1)
        with self.assertRaisesRegex(ValueError, "query_rope"):
            self.fwd(key_rope=None)
        with self.assertRaisesRegex(ValueError, "actual_seq_lengths"):
            self.fwd(layout_query="TND", layout_kv="TND")
        bad = self.idx.clone()
        bad[0, 3, 0, 0] = 99
        with self.assertRaises(spattn.SpattnError) as cm:
            spattn.npu_sparse_flash_attention(self.q, self.k, self.k, bad, self.scale, query_rope=self.qr,
                                              key_rope=self.kr)
        self.assertEqual(cm.exception.status, 600)


if __name__ == "__main__":
    unittest.main()
