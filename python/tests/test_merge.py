"""spattn.merge_attention_states: NumPy and torch (CPU; CUDA when available) against the fp64
formula, empty rows (-inf LSE, garbage O), mixed dtypes, strided views, autograd (gradcheck)
and torch.compile(fullgraph=True).  The torch part is skipped without torch."""
from __future__ import annotations

import math
import os
import random
import unittest

import metrics

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None
try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover
    torch = None
    HAVE_TORCH = False

import spattn

COMPILE_BACKEND = os.environ.get("SPATTN_TEST_COMPILE_BACKEND", "aot_eager")


def golden(o1, l1, o2, l2):
    """fp64 formula on nested Python lists of rows: o [R][D], l [R]."""
    go, gl = [], []
    for a, b, x, y in zip(l1, l2, o1, o2):
        if a == -math.inf and b == -math.inf:
            go.append([0.0] * len(x))
            gl.append(-math.inf)
            continue
        m = max(a, b)
        w1 = 0.0 if a == -math.inf else math.exp(a - m)
        w2 = 0.0 if b == -math.inf else math.exp(b - m)
        s = w1 + w2
        go.append([(w1 * u if w1 else 0.0) / s + (w2 * v if w2 else 0.0) / s for u, v in zip(x, y)])
        gl.append(m + math.log(s))
    return go, gl


def lse_rows(r, rows):
    out = []
    for i in range(rows):
        k = r.randrange(5)
        out.append(-math.inf if k == 0 else r.gauss(0, 6))
    return out


@unittest.skipUnless(np is not None, "NumPy not importable")
class TestMergeNumpy(unittest.TestCase):
    def test_formula(self):
        r = random.Random(1)
        B, N, S, D = 2, 3, 7, 16
        rows = B * N * S
        o1 = np.array([[r.gauss(0, 1) for _ in range(D)] for _ in range(rows)], dtype=np.float32)
        o2 = np.array([[r.gauss(0, 1) for _ in range(D)] for _ in range(rows)], dtype=np.float32)
        l1 = np.array(lse_rows(r, rows), dtype=np.float32)
        l2 = np.array(lse_rows(r, rows), dtype=np.float32)
        l1[3] = l2[3] = -np.inf
        o1[l1 == -np.inf] = np.nan  # not read
        go, gl = golden(o1.tolist(), l1.tolist(), o2.tolist(), l2.tolist())
        # BSND-shaped views of BNSD buffers: o [B, S, N, D] strided
        v = lambda a: a.reshape(B, N, S, D).transpose(0, 2, 1, 3)  # noqa: E731
        vl = lambda a: a.reshape(B, N, S).transpose(0, 2, 1)  # noqa: E731
        o, lse = spattn.merge_attention_states(v(o1), vl(l1), v(o2), vl(l2))
        self.assertEqual(o.shape, (B, S, N, D))
        o = o.transpose(0, 2, 1, 3).reshape(rows, D)
        lse = lse.transpose(0, 2, 1).reshape(rows)
        err = np.abs(o - np.array(go)).max()
        metrics.record("merge numpy fp32 o", err)
        self.assertLess(err, 1e-5)
        gl = np.array(gl)
        self.assertTrue(np.array_equal(np.isinf(lse), np.isinf(gl)))
        fin = np.isfinite(gl)
        self.assertLess(np.abs(lse[fin] - gl[fin]).max(), 1e-5)
        self.assertTrue((o[3] == 0).all() and lse[3] == -np.inf)

    def test_fp16_mixed(self):
        r = np.random.default_rng(2)
        o1 = r.standard_normal((5, 8)).astype(np.float16)
        o2 = r.standard_normal((5, 8)).astype(np.float32)
        l1, l2 = r.standard_normal(5).astype(np.float32), r.standard_normal(5).astype(np.float32)
        o, lse = spattn.merge_attention_states(o1, l1, o2, l2)
        self.assertEqual(o.dtype, np.float32)
        go, _ = golden(o1.astype(np.float64).tolist(), l1.tolist(), o2.tolist(), l2.tolist())
        self.assertLess(np.abs(o - np.array(go)).max(), 1e-5)

    def test_bad_shape(self):
        o = np.zeros((4, 8), np.float32)
        with self.assertRaises(spattn.SpattnError):
            spattn.merge_attention_states(o, np.zeros(5, np.float32), o, np.zeros(4, np.float32))


@unittest.skipUnless(HAVE_TORCH, "PyTorch (>= 2.4) not importable: torch merge tests skipped")
class TestMergeTorch(unittest.TestCase):
    def devices(self):
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() and spattn.cuda_available() else [])

    def test_dtypes_and_empty_rows(self):
        for dev in self.devices():
            for dt in (torch.float16, torch.bfloat16, torch.float32):
                g = torch.Generator().manual_seed(3)
                o1, o2 = (torch.randn(2, 4, 9, 24, generator=g).to(dt) for _ in range(2))
                l1, l2 = (torch.randn(2, 4, 9, generator=g) * 5 for _ in range(2))
                l1[0, 0, :3] = -math.inf
                l2[0, 0, 2:5] = -math.inf
                o1[0, 0, :3] = float("nan")
                # BSND-style strided views of BNSD buffers (o [B, S, N, D], lse [B, S, N])
                o, lse = spattn.merge_attention_states(*(x.to(dev).transpose(1, 2) for x in (o1, l1, o2, l2)))
                o, lse = o.transpose(1, 2), lse.transpose(1, 2)
                L = torch.logaddexp(l1.double(), l2.double())
                w1 = torch.where(l1 == -math.inf, 0.0, torch.exp(l1.double() - L)).nan_to_num(0.0)
                w2 = torch.where(l2 == -math.inf, 0.0, torch.exp(l2.double() - L)).nan_to_num(0.0)
                ref = w1[..., None] * o1.double().nan_to_num(0.0) + w2[..., None] * o2.double()
                err = (o.cpu().double() - ref).abs().max().item()
                metrics.record(f"merge torch {dev} {dt} o", err)
                tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}[dt]
                self.assertLess(err, tol, f"{dev} {dt}")
                self.assertTrue((o[0, 0, 2] == 0).all() and lse[0, 0, 2].item() == -math.inf)

    def test_gradcheck(self):
        g = torch.Generator().manual_seed(4)
        o1, o2 = (torch.randn(3, 5, 8, generator=g, dtype=torch.float64) for _ in range(2))
        l1, l2 = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(2))

        def f(a, b, c, d):
            o, lse = torch.ops.spattn.merge_attention_states(a.float(), b.float(), c.float(), d.float())
            return o.double(), lse.double()
        args = [x.requires_grad_() for x in (o1, l1, o2, l2)]
        self.assertTrue(torch.autograd.gradcheck(f, args, eps=1e-3, atol=2e-3, rtol=1e-2))

    def test_compile(self):
        torch._dynamo.reset()
        g = torch.Generator().manual_seed(5)
        o1, o2 = (torch.randn(2, 6, 16, generator=g, requires_grad=True) for _ in range(2))
        l1, l2 = (torch.randn(2, 6, generator=g) for _ in range(2))

        def f(a, b, c, d):
            o, lse = spattn.merge_attention_states(a, b, c, d)
            return o.pow(2).sum() + lse.sum()
        torch.compile(f, fullgraph=True, backend=COMPILE_BACKEND)(o1, l1, o2, l2).backward()
        ga, gc = o1.grad.clone(), o2.grad.clone()
        o1.grad = o2.grad = None
        f(o1, l1, o2, l2).backward()
        self.assertTrue(torch.allclose(ga, o1.grad) and torch.allclose(gc, o2.grad))


if __name__ == "__main__":
    unittest.main()
