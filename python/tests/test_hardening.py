"""Issue 16 regressions in the Python layer: integer arguments checked instead of wrapped or
truncated, int64 indices range-checked, mixed devices (meta) rejected, the NaN/Inf semantics
through NumPy and torch, scales beyond fp32, and the package build's CMake folder."""
from __future__ import annotations

import importlib.util
import os
import tempfile
import unittest
from pathlib import Path

import numpy as np

import spattn

try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover - CI without torch
    torch = None
    HAVE_TORCH = False
needs_torch = unittest.skipUnless(HAVE_TORCH, "PyTorch (>= 2.4) not importable: torch tests skipped")

HERE = Path(__file__).resolve().parent


def bsa_inputs(seed=0, sq=48, skv=64, d=16, blk=16):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 2, s, d), dtype=np.float32) for s in (sq, skv, skv))  # N = Nkv = 2
    mask = np.ones((1, 2, -(-sq // blk), -(-skv // blk)), np.uint8)
    mask[:, 0, 1, :] = 0          # head 0, block row 1: rows without keys
    mask[:, 1, 0, 1] = 0
    return q, k, v, mask


class TestIntegerArguments(unittest.TestCase):
    """Defect 7: ctypes used to wrap 2**70 to 0 and int() truncated 16.9 to 16."""

    def assert_rejected(self, fn, status, *names):
        with self.assertRaises(spattn.SpattnError) as cm:
            fn()
        self.assertEqual(cm.exception.status, status, cm.exception.message)
        for n in names:
            self.assertIn(n, cm.exception.message)

    def test_numpy_block_size(self):
        q, k, v, m = bsa_inputs()
        for bs, name in ((16.9, "block_size"), ((16.9, 16.9), "bx"), ((16, 2 ** 70), "by"),
                         (2 ** 70, "block_size"), ((16, 16, 16), "block_size"), ("16", "block_size")):
            with self.subTest(block_size=bs):
                self.assert_rejected(lambda: spattn.bsa_forward(q, k, v, m, block_size=bs), 101, name)
        o, _ = spattn.bsa_forward(q, k, v, m, block_size=(np.int64(16), 16))   # NumPy ints are fine
        self.assertEqual(o.shape, q.shape)

    def test_numpy_sbs_and_threads(self):
        rng = np.random.default_rng(1)
        q, k = rng.standard_normal((1, 4, 2, 8), dtype=np.float32), rng.standard_normal((1, 8, 1, 8), dtype=np.float32)
        idx = np.zeros((1, 4, 1, 2), np.int32)
        self.assert_rejected(lambda: spattn.sfa_forward(q, k, idx, sparse_block_size=2 ** 64), 101,
                             "sparse_block_size")
        self.assert_rejected(lambda: spattn.sfa_forward(q, k, idx, sparse_block_size=2.0), 101,
                             "sparse_block_size")
        self.assert_rejected(lambda: spattn.sfa_forward(q, k, idx, num_threads=2 ** 40), 102, "num_threads")
        self.assert_rejected(lambda: spattn.sfa_forward(q, k, idx, num_threads=1.5), 102, "num_threads")

    def test_scale_beyond_fp32(self):
        q, k, v, m = bsa_inputs()
        self.assert_rejected(lambda: spattn.bsa_forward(q, k, v, m, block_size=16, scale=1e39), 101,
                             "scale", "fp32")

    @needs_torch
    def test_torch_block_size_and_sbs(self):
        q = torch.randn(1, 2, 32, 8)
        m = torch.ones(1, 2, 2, 2, dtype=torch.bool)
        for bs in (16.9, (16.9, 16.9), 2 ** 70, (16, 2 ** 64)):
            with self.subTest(block_size=bs):
                self.assert_rejected(lambda: spattn.block_sparse_attention(q, q, q, m, bs), 101)
        qs, ks = torch.randn(1, 4, 2, 8), torch.randn(1, 8, 1, 8)
        idx = torch.zeros(1, 4, 1, 2, dtype=torch.int32)
        self.assert_rejected(lambda: spattn.sparse_flash_attention(qs, ks, idx, sparse_block_size=2 ** 64),
                             101, "sparse_block_size")
        self.assert_rejected(lambda: spattn.npu_block_sparse_attention(
            q, q, q, m, [16.9, 16.9], q_input_layout="BNSD", kv_input_layout="BNSD",
            num_key_value_heads=2), 101, "block_shape")
        self.assert_rejected(lambda: spattn.npu_sparse_flash_attention(
            qs, ks, ks, idx, 0.5, sparse_block_size=2.5, sparse_mode=0), 101, "sparse_block_size")


@needs_torch
class TestTorchIndicesAndDevices(unittest.TestCase):
    def test_int64_indices_out_of_int32(self):
        """Defect 4: 2**32 used to become key 0 and 2**32 - 1 padding."""
        q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 8, 1, 8)
        for bad in (2 ** 32, 2 ** 32 - 1, -2 ** 31 - 1, 2 ** 40):
            idx = torch.zeros(1, 4, 1, 2, dtype=torch.int64)
            idx[0, 1, 0, 1] = bad
            with self.subTest(value=bad), self.assertRaises(spattn.SpattnError) as cm:
                spattn.sparse_flash_attention(q, k, idx, causal=False)
            self.assertEqual(cm.exception.status, 600)
            self.assertIn("indices", cm.exception.message)
        idx = torch.tensor([[0, 3], [1, -1], [7, 2], [5, 5]], dtype=torch.int64).view(1, 4, 1, 2)
        self.assertTrue(torch.equal(spattn.sparse_flash_attention(q, k, idx, causal=False),
                                    spattn.sparse_flash_attention(q, k, idx.int(), causal=False)))

    def test_int64_indices_compile(self):
        q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 8, 1, 8)
        idx = torch.tensor([[0, 3], [1, -1], [7, 2], [5, 5]], dtype=torch.int64).view(1, 4, 1, 2)
        f = torch.compile(spattn.sparse_flash_attention, fullgraph=True, backend="aot_eager")
        self.assertTrue(torch.equal(f(q, k, idx, causal=False),
                                    spattn.sparse_flash_attention(q, k, idx.int(), causal=False)))
        bad = idx.clone()
        bad[0, 0, 0, 0] = 2 ** 32
        with self.assertRaises(spattn.SpattnError):
            f(q, k, bad, causal=False)

    def test_meta_mixed_with_cpu(self):
        """Defect 3: a meta mask / k / indices among CPU tensors returned uninitialised memory."""
        q = torch.randn(1, 2, 32, 8, requires_grad=True)
        m = torch.ones(1, 2, 2, 2, dtype=torch.uint8)
        cases = {
            "block_mask": lambda: spattn.block_sparse_attention(q, q, q, m.to("meta"), 16),
            "k": lambda: spattn.block_sparse_attention(q, q.detach().to("meta"), q, m, 16),
        }
        qs, ks = torch.randn(1, 4, 2, 8), torch.randn(1, 8, 1, 8)
        idx = torch.zeros(1, 4, 1, 2, dtype=torch.int32)
        cases["indices"] = lambda: spattn.sparse_flash_attention(qs, ks, idx.to("meta"))
        cases["k "] = lambda: spattn.sparse_flash_attention(qs, ks.to("meta"), idx)
        for name, fn in cases.items():
            with self.subTest(tensor=name), self.assertRaises(spattn.SpattnError) as cm:
                fn()
            self.assertEqual(cm.exception.status, 500, cm.exception.message)
            self.assertIn("meta", cm.exception.message)
        # all on meta: shape inference still works
        o = spattn.block_sparse_attention(q.detach().to("meta"), q.detach().to("meta"),
                                          q.detach().to("meta"), m.to("meta"), 16)
        self.assertEqual((o.device.type, tuple(o.shape)), ("meta", (1, 2, 32, 8)))


class TestNonFinite(unittest.TestCase):
    """Defect 5: NaN / Inf follow IEEE arithmetic on the dense formula over the attended keys."""

    def test_numpy_nan_in_q_row(self):
        q, k, v, m = bsa_inputs()
        q[0, 1, 5, 3] = np.nan            # head 1, row 5: attends block columns 0, 2, 3
        q[0, 0, 20, 0] = np.nan           # head 0, row 20: no key at all
        o, lse = spattn.bsa_forward(q, k, v, m, block_size=16)
        self.assertTrue(np.isnan(o[0, 1, 5]).all() and np.isnan(lse[0, 1, 5]))
        self.assertTrue((o[0, 0, 20] == 0).all() and lse[0, 0, 20] == -np.inf)
        rest = np.ones(o.shape[:3], bool)
        rest[0, 1, 5] = False
        self.assertTrue(np.isfinite(o[rest]).all())
        do = np.ones_like(o)
        dq, dk, dv = spattn.bsa_backward(q, k, v, m, o, do, lse, block_size=16)
        self.assertTrue(np.isnan(dq[0, 1, 5]).all())
        self.assertTrue((dq[0, 0, 20] == 0).all())
        # keys of row (1, 5): blocks 0, 2, 3 -> NaN; block 1 (keys 16..31) is not attended by it
        self.assertTrue(np.isnan(dk[0, 1, :16]).all() and np.isnan(dv[0, 1, 32:]).all())
        self.assertTrue(np.isfinite(dk[0, 1, 16:32]).all() and np.isfinite(dv[0, 1, 16:32]).all())
        self.assertTrue(np.isfinite(dk[0, 0]).all() and np.isfinite(dv[0, 0]).all())

    def test_numpy_inf_and_all_nan_k(self):
        q, k, v, m = bsa_inputs(seed=3)
        q[0, 1, 40, 2] = np.inf
        o, lse = spattn.bsa_forward(q, k, v, m, block_size=16)
        self.assertTrue(np.isnan(o[0, 1, 40]).all() and np.isnan(lse[0, 1, 40]))
        k[:] = np.nan
        o, lse = spattn.bsa_forward(q, k, v, m, block_size=16)
        self.assertTrue(np.isnan(o[0, 1]).all() and np.isnan(lse[0, 1]).all())
        self.assertTrue((o[0, 0, 16:32] == 0).all() and (lse[0, 0, 16:32] == -np.inf).all())

    def test_numpy_sfa_nan_in_v(self):
        rng = np.random.default_rng(5)
        q, k, v = (rng.standard_normal(s, dtype=np.float32) for s in ((1, 4, 2, 8), (1, 8, 1, 8), (1, 8, 1, 8)))
        idx = np.array([[0, 3], [1, -1], [7, 2], [5, 6]], np.int32).reshape(1, 4, 1, 2)
        v[0, 2, 0, 4] = np.nan            # key 2, column 4: only query 2 selects it
        o, lse = spattn.sfa_forward(q, k, idx, v=v, causal=False)
        self.assertTrue(np.isnan(o[0, 2, :, 4]).all())
        self.assertTrue(np.isfinite(lse).all())
        self.assertEqual(int(np.isnan(o).sum()), 2)   # 2 heads x column 4 of query 2

    def test_numpy_fp16_keeps_nan_and_inf(self):
        q, k, v, m = (x.astype(np.float16) if x.dtype == np.float32 else x for x in bsa_inputs(seed=9))
        q[0, 1, 5, 0] = np.nan
        v[0, 0, 3, 2] = np.inf            # key 3 of head 0: attended by rows 0..15 and 32..47
        o, lse = spattn.bsa_forward(q, k, v, m, block_size=16)
        self.assertTrue(np.isnan(o[0, 1, 5]).all() and np.isnan(lse[0, 1, 5]))
        self.assertTrue(np.isposinf(o[0, 0, :16, 2]).all() and np.isposinf(o[0, 0, 32:, 2]).all())
        self.assertTrue((o[0, 0, 16:32] == 0).all() and np.isfinite(lse[0, 0, :16]).all())

    @needs_torch
    def test_torch_bf16_nan(self):
        q, k, v, m = (torch.from_numpy(x) for x in bsa_inputs(seed=11))
        q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
        k[0, 1, 40, 0] = float("nan")     # key 40 of head 1: block column 2, attended by all rows
        o = spattn.block_sparse_attention(q, k, v, m, 16)
        self.assertTrue(torch.isnan(o[0, 1]).all() and torch.isfinite(o[0, 0]).all())

    @needs_torch
    def test_torch_autograd_nan(self):
        q, k, v, m = (torch.from_numpy(x) for x in bsa_inputs(seed=7))
        q[0, 1, 5, 3] = float("nan")
        q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
        o, lse = spattn.block_sparse_attention(q, k, v, m, 16, return_lse=True)
        self.assertTrue(torch.isnan(o[0, 1, 5]).all() and torch.isnan(lse[0, 1, 5]))
        self.assertEqual(int(torch.isnan(o).sum()), 16)
        o.sum().backward()
        self.assertTrue(torch.isnan(q.grad[0, 1, 5]).all())
        self.assertEqual(int(torch.isnan(q.grad).sum()), 16)
        self.assertTrue(torch.isnan(k.grad[0, 1, :16]).all() and torch.isfinite(k.grad[0, 1, 16:32]).all())
        self.assertTrue(torch.isfinite(k.grad[0, 0]).all() and torch.isfinite(v.grad[0, 0]).all())


class TestPackageBuild(unittest.TestCase):
    """Defect 8: the tests' SPATTN_CUDA=OFF CMake cache was reused by a plain `pip install`."""

    def test_cmake_folder_per_cuda_setting(self):
        path = HERE.parent / "setup.py"
        if not path.is_file():
            self.skipTest("setup.py not next to the tests (installed elsewhere)")
        spec = importlib.util.spec_from_file_location("spattn_setup", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)      # setup() runs only as __main__
        tmp = Path(tempfile.gettempdir())
        d_off, a_off = mod.cmake_config(tmp, {"SPATTN_CUDA": "OFF"})
        d_auto, a_auto = mod.cmake_config(tmp, {})
        d_on, a_on = mod.cmake_config(tmp, {"SPATTN_CUDA": "1"})
        self.assertEqual(len({d_off, d_auto, d_on}), 3)
        self.assertIn("-DSPATTN_CUDA=OFF", a_off)
        self.assertIn("-DSPATTN_CUDA=ON", a_auto)       # explicit: overrides any cached OFF
        self.assertIn("-DSPATTN_CUDA=ON", a_on)


if __name__ == "__main__":
    unittest.main()
