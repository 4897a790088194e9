"""Property-based tests (hypothesis): the NumPy and PyTorch wrappers against the independent
float64 reference (reference.py) on small random problems.

Every example draws the shapes (batch, heads, GQA groups, lengths that are not multiples of
the block sizes, head dims), the block sizes / sparse block size, mask mode, dtype, scale,
the memory layout of each input (contiguous, a transposed view, a column slice of a wider
buffer, a reversed view) and a seed for the values, masks and indices (arbitrary indices in
[-1, ceil(S2/sbs)): padding anywhere, duplicates, keys past the causal limit).  Forward and
backward must match the reference within the same tolerances as test_numpy / test_torch.

The examples are derandomized (the same on every run, no example database written); set
SPATTN_HYPOTHESIS_EXAMPLES to change how many each property draws (default 30).
"""
from __future__ import annotations

import os
import unittest

import numpy as np

import spattn
from reference import bsa_ref, sfa_ref
from test_numpy import FP16_TOL, FP32_TOL, assert_close

try:
    from hypothesis import HealthCheck, given, settings, strategies as st
    HAVE_HYPOTHESIS = True
except ImportError:  # pragma: no cover - the test venv always has it (python/run_tests.sh)
    HAVE_HYPOTHESIS = False

try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover
    torch = None
    HAVE_TORCH = False

NO_HYPOTHESIS = "hypothesis not importable: property tests skipped"
NO_TORCH = "PyTorch (>= 2.4) not importable: torch property tests skipped"
EXAMPLES = int(os.environ.get("SPATTN_HYPOTHESIS_EXAMPLES", "30"))
LSE_TOL = (2 ** -12, 2 ** -10)


def _settings(f):
    if not HAVE_HYPOTHESIS:
        return f
    return settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)(f)


def layout(rng, shape, dtype, kind):
    """Random values of `shape` as one of four memory layouts (same values, other strides)."""
    a = rng.standard_normal(shape).astype(dtype)
    if kind == 1:    # a transposed view: dims 1 and 2 swapped in memory
        return np.ascontiguousarray(a.swapaxes(1, 2)).swapaxes(1, 2)
    if kind == 2:    # the first columns of a wider buffer
        wide = np.zeros(shape[:-1] + (shape[-1] + 8,), dtype)
        wide[..., 3:3 + shape[-1]] = a
        return wide[..., 3:3 + shape[-1]]
    if kind == 3:    # a reversed view along dim 1
        return np.ascontiguousarray(a[:, ::-1])[:, ::-1]
    return a


def bsa_problems():
    return st.fixed_dictionaries(dict(
        b=st.integers(1, 2), nkv=st.integers(1, 2), groups=st.integers(1, 3),
        sq=st.integers(1, 24), skv=st.integers(1, 24), d=st.sampled_from([8, 16, 24, 32]),
        bx=st.integers(1, 12), by=st.integers(1, 12), density=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
        scale=st.one_of(st.none(), st.floats(0.05, 1.0)), fp16=st.booleans(),
        layouts=st.lists(st.integers(0, 3), min_size=4, max_size=4), seed=st.integers(0, 2 ** 32 - 1)))


def sfa_problems():
    return st.fixed_dictionaries(dict(
        b=st.integers(1, 2), s1=st.integers(1, 8), s2=st.integers(1, 24), n2=st.integers(1, 2),
        groups=st.integers(1, 4), d=st.sampled_from([8, 16]), dr=st.sampled_from([0, 8]),
        kk=st.integers(1, 6), sbs=st.sampled_from([1, 2, 4]), causal=st.booleans(), shared=st.booleans(),
        scale=st.one_of(st.none(), st.floats(0.05, 1.0)), fp16=st.booleans(),
        layouts=st.lists(st.integers(0, 3), min_size=6, max_size=6), seed=st.integers(0, 2 ** 32 - 1)))


def bsa_inputs(p):
    rng = np.random.default_rng(p["seed"])
    dt = np.float16 if p["fp16"] else np.float32
    n = p["nkv"] * p["groups"]
    qs, ks = (p["b"], n, p["sq"], p["d"]), (p["b"], p["nkv"], p["skv"], p["d"])
    lay = p["layouts"]
    q, k, v, do = (layout(rng, s, dt, kind) for s, kind in zip((qs, ks, ks, qs), lay))
    nbx, nby = -(-p["sq"] // p["bx"]), -(-p["skv"] // p["by"])
    mask = (rng.random((p["b"], n, nbx, nby)) < p["density"]).astype(np.uint8)
    return q, k, v, do, mask, dt


def sfa_inputs(p):
    rng = np.random.default_rng(p["seed"])
    dt = np.float16 if p["fp16"] else np.float32
    b, s1, s2, n2, d, dr = p["b"], p["s1"], p["s2"], p["n2"], p["d"], p["dr"]
    n1 = n2 * p["groups"]
    lay = p["layouts"]
    q = layout(rng, (b, s1, n1, d), dt, lay[0])
    k = layout(rng, (b, s2, n2, d), dt, lay[1])
    v = None if p["shared"] else layout(rng, (b, s2, n2, d), dt, lay[2])
    qr = layout(rng, (b, s1, n1, dr), dt, lay[3]) if dr else None
    kr = layout(rng, (b, s2, n2, dr), dt, lay[4]) if dr else None
    do = layout(rng, (b, s1, n1, d), dt, lay[5])
    nblk = -(-s2 // p["sbs"])
    idx = rng.integers(-1, nblk, size=(b, s1, n2, p["kk"])).astype(np.int32)
    return q, k, v, qr, kr, do, idx, dt


def tol_of(dt):
    return FP32_TOL if dt == np.float32 else FP16_TOL


@unittest.skipUnless(HAVE_HYPOTHESIS, NO_HYPOTHESIS)
class TestPropertiesNumpy(unittest.TestCase):
    if HAVE_HYPOTHESIS:
        @_settings
        @given(bsa_problems())
        def test_bsa_matches_reference(self, p):
            q, k, v, do, mask, dt = bsa_inputs(p)
            bs = (p["bx"], p["by"])
            o, lse = spattn.bsa_forward(q, k, v, mask, bs, scale=p["scale"])
            dq, dk, dv = spattn.bsa_backward(q, k, v, mask, o, do, lse, bs, scale=p["scale"])
            go, glse, gdq, gdk, gdv = bsa_ref(q, k, v, mask, p["bx"], p["by"], p["scale"], do)
            for name, a, g in (("o", o, go), ("dq", dq, gdq), ("dk", dk, gdk), ("dv", dv, gdv)):
                assert_close(self, a, g, tol_of(dt), name)
            assert_close(self, lse, glse, LSE_TOL, "lse")

        @_settings
        @given(sfa_problems())
        def test_sfa_matches_reference(self, p):
            q, k, v, qr, kr, do, idx, dt = sfa_inputs(p)
            kw = dict(v=v, q_rope=qr, k_rope=kr, sparse_block_size=p["sbs"], causal=p["causal"],
                      scale=p["scale"])
            o, lse = spattn.sfa_forward(q, k, idx, **kw)
            grads = spattn.sfa_backward(q, k, idx, o, do, lse, **kw)
            ref = sfa_ref(q, k, idx, v, qr, kr, p["sbs"], p["causal"], p["scale"], do)
            assert_close(self, o, ref[0], tol_of(dt), "o")
            assert_close(self, lse, ref[1], LSE_TOL, "lse")
            for name, a, g in zip(("dq", "dk", "dv", "dq_rope", "dk_rope"), grads, ref[2:]):
                if g is None:
                    self.assertIsNone(a, name)
                else:
                    assert_close(self, a, g, tol_of(dt), name)


def _t(a, grad=True):
    """A torch leaf with the same values and the same strides as the NumPy view a."""
    if a is None:
        return None
    base = torch.from_numpy(np.ascontiguousarray(a))
    if any(s < 0 for s in a.strides):  # torch has no negative strides: keep a plain copy
        return base.clone().requires_grad_(grad)
    t = torch.empty_strided(base.shape, [s // a.itemsize for s in a.strides], dtype=base.dtype)
    t.copy_(base)
    return t.requires_grad_(grad)


@unittest.skipUnless(HAVE_HYPOTHESIS, NO_HYPOTHESIS)
@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class TestPropertiesTorch(unittest.TestCase):
    if HAVE_HYPOTHESIS:
        @_settings
        @given(bsa_problems(), st.sampled_from(["bool", "uint8"]))
        def test_bsa_autograd_matches_reference(self, p, mask_kind):
            q, k, v, do, mask, dt = bsa_inputs(p)
            tq, tk, tv = _t(q), _t(k), _t(v)
            tm = torch.from_numpy(mask)
            tm = tm.bool() if mask_kind == "bool" else tm
            o, lse = spattn.block_sparse_attention(tq, tk, tv, tm, (p["bx"], p["by"]), scale=p["scale"],
                                                   return_lse=True)
            o.backward(torch.from_numpy(np.ascontiguousarray(do)))
            go, glse, gdq, gdk, gdv = bsa_ref(q, k, v, mask, p["bx"], p["by"], p["scale"], do)
            self.assertEqual(o.dtype, tq.dtype)
            for name, a, g in (("o", o, go), ("dq", tq.grad, gdq), ("dk", tk.grad, gdk),
                               ("dv", tv.grad, gdv)):
                assert_close(self, a.detach().numpy(), g, tol_of(dt), name)
            assert_close(self, lse.numpy(), glse, LSE_TOL, "lse")

        @_settings
        @given(sfa_problems(), st.sampled_from([torch.int32, torch.int64] if HAVE_TORCH else [None]))
        def test_sfa_autograd_matches_reference(self, p, idx_dtype):
            q, k, v, qr, kr, do, idx, dt = sfa_inputs(p)
            tq, tk, tv, tqr, tkr = _t(q), _t(k), _t(v), _t(qr), _t(kr)
            o, lse = spattn.sparse_flash_attention(
                tq, tk, torch.from_numpy(idx).to(idx_dtype), v=tv, q_rope=tqr, k_rope=tkr,
                sparse_block_size=p["sbs"], causal=p["causal"], scale=p["scale"], return_lse=True)
            o.backward(torch.from_numpy(np.ascontiguousarray(do)))
            ref = sfa_ref(q, k, idx, v, qr, kr, p["sbs"], p["causal"], p["scale"], do)
            assert_close(self, o.detach().numpy(), ref[0], tol_of(dt), "o")
            assert_close(self, lse.numpy(), ref[1], LSE_TOL, "lse")
            for name, t, g in (("dq", tq, ref[2]), ("dk", tk, ref[3]), ("dv", tv, ref[4]),
                               ("dq_rope", tqr, ref[5]), ("dk_rope", tkr, ref[6])):
                if g is None:
                    self.assertTrue(t is None or t.grad is None or not t.grad.any(), name)
                else:
                    assert_close(self, t.grad.numpy(), g, tol_of(dt), name)


if __name__ == "__main__":
    unittest.main()
