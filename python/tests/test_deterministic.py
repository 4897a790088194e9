"""spattn_options.deterministic from Python (issue 11 item 2): the value every library call
receives (a spy on the ctypes functions reads the options struct of each call), for the PyTorch
functions (deterministic=None follows torch.are_deterministic_algorithms_enabled() at the
forward call; True / False force it; forward calls keep the default 1), their varlen / paged /
plan / torch_npu / context-parallel forms, the custom ops' trailing ``deterministic=-1``, and
the NumPy backward functions; CPU gradients are bitwise the same either way; torch.compile
(fullgraph=True) with deterministic=False.  Skipped (with the reason printed) without torch
(the NumPy part needs only NumPy)."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import unittest

try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover - CI without torch
    torch = None
    HAVE_TORCH = False

HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
if HAVE_NUMPY:
    import numpy as np

import libspy
import spattn
from spattn import _lib

needs_torch = unittest.skipUnless(HAVE_TORCH, "PyTorch (>= 2.4) not importable: deterministic torch tests skipped")
needs_numpy = unittest.skipUnless(HAVE_NUMPY, "NumPy not importable: deterministic NumPy tests skipped")
COMPILE_BACKEND = os.environ.get("SPATTN_TEST_COMPILE_BACKEND", "aot_eager")

# the library calls that take a spattn_options pointer as their last argument
_CALLS = ["spattn_bsa_fwd_ex", "spattn_bsa_bwd_ex", "spattn_sfa_fwd_ex", "spattn_sfa_bwd_ex",
          "spattn_bsa_fwd_varlen", "spattn_bsa_bwd_varlen", "spattn_sfa_fwd_varlen", "spattn_sfa_bwd_varlen",
          "spattn_bsa_fwd_plan", "spattn_bsa_bwd_plan"]


@contextlib.contextmanager
def spy():
    """Records (call name, options.deterministic) of every library call in _CALLS made inside:
    wrappers read the options struct each call receives (ctypes.byref(opt)._obj)."""
    rec = []

    def make(name, orig):
        def wrapper(*args):
            rec.append((name, int(args[-1]._obj.deterministic)))
            return orig(*args)
        return wrapper
    with libspy.wrapped(_CALLS, make):
        yield rec


def backward_values(rec):
    return sorted({d for n, d in rec if "_bwd_" in n})


def forward_values(rec):
    return sorted({d for n, d in rec if "_fwd_" in n})


@contextlib.contextmanager
def torch_deterministic(on: bool):
    """torch.use_deterministic_algorithms(on) inside; the previous setting restored after."""
    was, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn)


def leaf(x):
    return x.detach().clone().requires_grad_(True)


# ---------------------------------------------------------------------------------------------
# the PyTorch forms: each builds inputs once and returns (run(deterministic) -> loss, leaves)
# ---------------------------------------------------------------------------------------------
def _bsa_inputs(g):
    q = torch.randn(1, 4, 19, 16, generator=g)
    k, v = torch.randn(1, 2, 23, 16, generator=g), torch.randn(1, 2, 23, 16, generator=g)
    m = (torch.rand(1, 4, 5, 5, generator=g) < 0.6).to(torch.uint8)
    return q, k, v, m


def form_bsa(g):
    q, k, v, m = _bsa_inputs(g)

    def run(det, x):
        return spattn.block_sparse_attention(*x, m, (4, 5), deterministic=det)
    return run, (q, k, v)


def form_bsa_plan(g):
    q, k, v, m = _bsa_inputs(g)
    bm = spattn.create_block_mask(m, (4, 5), seq_lens=(19, 23), num_kv_heads=2)

    def run(det, x):
        return spattn.block_sparse_attention(*x, bm, deterministic=det)
    return run, (q, k, v)


def _varlen_bsa(g, paged):
    lq, lk = [5, 9, 3], [7, 2, 8]
    q, k, v = (torch.randn(sum(L), h, 8, generator=g) for L, h in ((lq, 4), (lk, 2), (lk, 2)))
    m = (torch.rand(3, 4, 3, 3, generator=g) < 0.7).to(torch.uint8)
    cq = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
    ck = torch.tensor([0, 7, 9, 17], dtype=torch.int32)
    table = None
    if paged:  # pages of 4 rows in order: sequence b's keys start at page 2 * b (page_size 4)
        kp, vp = torch.zeros(6, 4, 2, 8), torch.zeros(6, 4, 2, 8)
        for b, (s, L) in enumerate(zip([0, 7, 9], lk)):
            for j in range(L):
                kp[2 * b + j // 4, j % 4], vp[2 * b + j // 4, j % 4] = k[s + j], v[s + j]
        k, v = kp, vp
        table = torch.arange(6, dtype=torch.int32).view(3, 2)

    def run(det, x):
        return spattn.block_sparse_attention(*x, m, (4, 3), cu_seqlens_q=cq, cu_seqlens_k=ck,
                                             block_table=table, deterministic=det)
    return run, (q, k, v)


def form_bsa_varlen(g):
    return _varlen_bsa(g, False)


def form_bsa_paged(g):
    return _varlen_bsa(g, True)


def _sfa_inputs(g, s1=6, s2=10, kk=4):
    q, qr = torch.randn(1, s1, 4, 16, generator=g), torch.randn(1, s1, 4, 8, generator=g)
    k, kr = torch.randn(1, s2, 1, 16, generator=g), torch.randn(1, s2, 1, 8, generator=g)
    idx = torch.stack([torch.randperm(s2, generator=g)[:kk] for _ in range(s1)])
    idx = torch.where(idx <= s2 - s1 + torch.arange(s1)[:, None], idx, torch.full_like(idx, -1))  # causal
    return q, qr, k, kr, idx.view(1, s1, 1, -1).to(torch.int32)


def form_sfa(g):
    q, qr, k, kr, idx = _sfa_inputs(g)

    def run(det, x):
        return spattn.sparse_flash_attention(x[0], x[2], idx, q_rope=x[1], k_rope=x[3], deterministic=det)
    return run, (q, qr, k, kr)


def form_sfa_varlen(g):
    q, qr, k, kr, idx = _sfa_inputs(g)
    cq = torch.tensor([0, 2, 6], dtype=torch.int32)
    ck = torch.tensor([0, 4, 10], dtype=torch.int32)
    # positions inside each sequence's keys: first sequence 4 keys, second 6
    ix = torch.stack([torch.tensor([0, 1, -1, -1]), torch.tensor([1, 3, 0, -1]), torch.tensor([0, 2, -1, 5]),
                      torch.tensor([1, -1, 4, 3]), torch.tensor([2, 0, 1, -1]), torch.tensor([5, 4, 3, 2]),
                      ]).to(torch.int32).view(6, 1, 4)

    def run(det, x):
        return spattn.sparse_flash_attention(x[0][0], x[2][0], ix, q_rope=x[1][0], k_rope=x[3][0],
                                             cu_seqlens_q=cq, cu_seqlens_k=ck, deterministic=det)
    return run, (q, qr, k, kr)


def form_npu_bsa(g):
    q, k, v, m = _bsa_inputs(g)

    def run(det, x):
        return spattn.npu_block_sparse_attention(*x, m, [4, 5], q_input_layout="BNSD", kv_input_layout="BNSD",
                                                 num_key_value_heads=2, deterministic=det)[0]
    return run, (q, k, v)


def form_npu_bsa_lengths(g):  # BNSD with actual lengths: one call per batch
    q, k, v = torch.randn(2, 2, 12, 8, generator=g), torch.randn(2, 2, 12, 8, generator=g), \
        torch.randn(2, 2, 12, 8, generator=g)
    m = torch.ones(2, 2, 3, 3, dtype=torch.uint8)

    def run(det, x):
        return spattn.npu_block_sparse_attention(*x, m, [4, 4], q_input_layout="BNSD", kv_input_layout="BNSD",
                                                 num_key_value_heads=2, actual_seq_lengths=[12, 7],
                                                 actual_seq_lengths_kv=[9, 12], deterministic=det)[0]
    return run, (q, k, v)


def form_npu_bsa_tnd(g):
    run_v, x = _varlen_bsa(g, False)
    m = torch.ones(3, 4, 3, 3, dtype=torch.uint8)

    def run(det, x):
        return spattn.npu_block_sparse_attention(*x, m, [4, 3], q_input_layout="TND", kv_input_layout="TND",
                                                 num_key_value_heads=2, actual_seq_lengths=[5, 9, 3],
                                                 actual_seq_lengths_kv=[7, 2, 8], deterministic=det)[0]
    return run, x


def form_npu_sfa(g):
    q, qr, k, kr, idx = _sfa_inputs(g)

    def run(det, x):
        return spattn.npu_sparse_flash_attention(x[0], x[2], x[2], idx, 0.2, query_rope=x[1], key_rope=x[3],
                                                 deterministic=det)[0]
    return run, (q, qr, k, kr)


TORCH_FORMS = {"bsa": form_bsa, "bsa plan": form_bsa_plan, "bsa varlen": form_bsa_varlen,
               "bsa paged": form_bsa_paged, "sfa": form_sfa, "sfa varlen": form_sfa_varlen,
               "npu bsa BNSD": form_npu_bsa, "npu bsa lengths": form_npu_bsa_lengths,
               "npu bsa TND": form_npu_bsa_tnd, "npu sfa": form_npu_sfa}


@needs_torch
class TestTorchDeterministic(unittest.TestCase):
    def grads(self, run, x, det, torch_flag=False, flip_before_backward=False):
        """(records, gradients) of one forward + backward."""
        xs = [leaf(t) for t in x]
        with spy() as rec:
            with torch_deterministic(torch_flag):
                o = run(det, xs)
            if flip_before_backward:
                with torch_deterministic(not torch_flag):
                    (o.float() ** 2).sum().backward()
            else:
                (o.float() ** 2).sum().backward()
        return rec, [t.grad for t in xs]

    def test_value_reaches_the_backward_call(self):
        for name, make in TORCH_FORMS.items():
            run, x = make(torch.Generator().manual_seed(11))
            for det, flag, want in ((None, True, 1), (None, False, 0), (True, False, 1), (True, True, 1),
                                    (False, True, 0), (False, False, 0)):
                with self.subTest(form=name, deterministic=det, torch_flag=flag):
                    rec, _ = self.grads(run, x, det, flag)
                    self.assertEqual(backward_values(rec), [want], rec)
                    self.assertEqual(forward_values(rec), [1], rec)   # forward calls keep the default

    def test_none_is_read_at_the_forward_call(self):
        run, x = form_bsa(torch.Generator().manual_seed(12))
        for flag in (True, False):
            with self.subTest(torch_flag_at_forward=flag):
                rec, _ = self.grads(run, x, None, flag, flip_before_backward=True)
                self.assertEqual(backward_values(rec), [int(flag)], rec)

    def test_global_setting_restored(self):
        before = torch.are_deterministic_algorithms_enabled()
        run, x = form_bsa(torch.Generator().manual_seed(13))
        self.grads(run, x, None, not before)
        self.assertEqual(torch.are_deterministic_algorithms_enabled(), before)

    def test_cpu_gradients_identical(self):
        # the CPU backend is deterministic either way: True and False give the same bits
        for name, make in TORCH_FORMS.items():
            run, x = make(torch.Generator().manual_seed(14))
            with self.subTest(form=name):
                _, g1 = self.grads(run, x, True)
                _, g0 = self.grads(run, x, False)
                _, gn = self.grads(run, x, None)
                for a, b, c in zip(g1, g0, gn):
                    self.assertTrue(torch.equal(a, b) and torch.equal(a, c), name)

    def test_npu_backward_wrappers(self):
        g = torch.Generator().manual_seed(15)
        q, k, v, m = _bsa_inputs(g)
        o, lse = spattn.npu_block_sparse_attention(q, k, v, m, [4, 5], q_input_layout="BNSD",
                                                   kv_input_layout="BNSD", num_key_value_heads=2,
                                                   softmax_lse_flag=1)
        do = torch.randn(o.shape, generator=g)
        sq, sqr, sk, skr, idx = _sfa_inputs(g)
        so, smax, ssum = spattn.npu_sparse_flash_attention(sq, sk, sk, idx, 0.2, query_rope=sqr, key_rope=skr,
                                                           return_softmax_lse=True)
        sdo = torch.randn(so.shape, generator=g)
        out = {}
        for det, flag, want in ((None, True, 1), (None, False, 0), (True, False, 1), (False, True, 0)):
            with self.subTest(deterministic=det, torch_flag=flag):
                with spy() as rec, torch_deterministic(flag):
                    gb = spattn.npu_block_sparse_attention_backward(
                        do, q, k, v, o, lse, m, [4, 5], q_input_layout="BNSD", kv_input_layout="BNSD",
                        num_key_value_heads=2, deterministic=det)
                    gs = spattn.npu_sparse_flash_attention_grad(
                        sq, sk, sk, idx, sdo, so, smax, ssum, 0.2, 1, query_rope=sqr, key_rope=skr,
                        deterministic=det)
                self.assertEqual([d for _, d in rec], [want, want], rec)
                out[want] = [t for t in list(gb) + list(gs) if t.numel()]
        for a, b in zip(out[0], out[1]):
            self.assertTrue(torch.equal(a, b))

    def test_ops_unset_and_explicit(self):
        # the ops' trailing deterministic=-1 keeps the old schemas: -1 / absent = the library default
        g = torch.Generator().manual_seed(16)
        q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))
        m = torch.ones(1, 2, 3, 2, dtype=torch.uint8)
        o, lse = torch.ops.spattn.bsa_fwd(q, k, v, m, 4, 6, 0.0)
        do = torch.randn_like(o)
        for args, want in (((), 1), ((-1,), 1), ((0,), 0), ((1,), 1)):
            with self.subTest(extra=args), spy() as rec:
                torch.ops.spattn.bsa_bwd(q, k, v, m, o, do, lse, 4, 6, 0.0, *args)
                self.assertEqual(rec, [("spattn_bsa_bwd_ex", want)])
        # a forward op called without the argument hands -1 to its backward: the default
        ql = leaf(q)
        with spy() as rec, torch_deterministic(False):
            torch.ops.spattn.bsa_fwd(ql, k, v, m, 4, 6, 0.0)[0].sum().backward()
        self.assertEqual(backward_values(rec), [1])
        for bad in (2, -2):
            with self.subTest(bad=bad), self.assertRaises(spattn.SpattnError) as cm:
                torch.ops.spattn.bsa_bwd(q, k, v, m, o, do, lse, 4, 6, 0.0, bad)
            self.assertEqual(cm.exception.status, _lib.STATUS_BAD_OPTIONS)
            with self.assertRaises(spattn.SpattnError):
                torch.ops.spattn.bsa_fwd(q, k, v, m, 4, 6, 0.0, bad)
        for bad in ("yes", 2, 0.5):
            with self.subTest(public=bad), self.assertRaises(spattn.SpattnError) as cm:
                spattn.block_sparse_attention(q, k, v, m, (4, 6), deterministic=bad)
            self.assertEqual(cm.exception.status, _lib.STATUS_BAD_OPTIONS)

    def test_opcheck_with_deterministic(self):
        g = torch.Generator().manual_seed(17)
        q, k, v = (torch.randn(1, 2, 12, 8, generator=g, requires_grad=True) for _ in range(3))
        m = torch.ones(1, 2, 3, 2, dtype=torch.uint8)
        torch.library.opcheck(torch.ops.spattn.bsa_fwd.default, (q, k, v, m, 4, 6, 0.0, 0))
        o, lse = torch.ops.spattn.bsa_fwd(q, k, v, m, 4, 6, 0.0, 0)
        torch.library.opcheck(torch.ops.spattn.bsa_bwd.default,
                              (q.detach(), k.detach(), v.detach(), m, o.detach(), torch.randn_like(o), lse, 4, 6,
                               0.0, 0))

    def test_compile_fullgraph(self):
        # as test_torch's compile tests (CPU here): one graph with deterministic=False, the value
        # reaches the backward call, gradients equal eager
        g = torch.Generator().manual_seed(18)
        q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
        m = torch.ones(1, 2, 2, 2, dtype=torch.uint8)
        m[:, :, 0, 1] = 0
        sq, sqr, sk, skr, idx = _sfa_inputs(g)

        def f(q, k, v, det):
            o = spattn.block_sparse_attention(q, k, v, m, (8, 8), deterministic=det)
            return (o * o).sum()

        def fs(q, qr, k, kr, det):
            o = spattn.sparse_flash_attention(q, k, idx, q_rope=qr, k_rope=kr, deterministic=det)
            return (o * o).sum()

        for fn, x in ((f, (q, k, v)), (fs, (sq, sqr, sk, skr))):
            eager = [leaf(t) for t in x]
            fn(*eager, False).backward()
            for det, flag, want in ((False, True, 0), (True, False, 1), (None, True, 1), (None, False, 0)):
                with self.subTest(fn=fn.__name__, deterministic=det, torch_flag=flag):
                    torch._dynamo.reset()   # (one lambda code object: stay clear of the recompile limit)
                    cf = torch.compile(lambda *a: fn(*a, det), fullgraph=True, backend=COMPILE_BACKEND)
                    xc = [leaf(t) for t in x]
                    with spy() as rec:
                        with torch_deterministic(flag):
                            loss = cf(*xc)
                        loss.backward()
                    self.assertEqual(backward_values(rec), [want], rec)
                    for a, e in zip(xc, eager):
                        torch.testing.assert_close(a.grad, e.grad, rtol=0, atol=0)


def _dist_world1():
    """A one-process gloo group (the default group) for the context-parallel forms, or a reason."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_gloo_available()):
        return None, "torch.distributed with gloo not available"
    if dist.is_initialized():
        return None, "a default process group already exists in this process"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist, None


@needs_torch
class TestDistributedDeterministic(unittest.TestCase):
    def test_value_reaches_the_backward_calls(self):
        dist, why = _dist_world1()
        if dist is None:
            self.skipTest(why)
        try:
            import spattn.distributed as cpd
            g = torch.Generator().manual_seed(19)
            q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
            m = torch.ones(4, 4, dtype=torch.uint8).tril().expand(1, 2, 4, 4)
            sq, sqr, sk, skr, idx = _sfa_inputs(g, 8, 8, 3)   # indices: global key positions
            runs = {
                "ring": lambda det, x: cpd.block_sparse_attention(*x, m, 4, mode="ring", deterministic=det),
                "ring_v1": lambda det, x: cpd.block_sparse_attention(*x, m, 4, mode="ring_v1", deterministic=det),
                "allgather": lambda det, x: cpd.block_sparse_attention(*x, m, 4, mode="allgather",
                                                                      deterministic=det),
                "sfa": lambda det, x: cpd.sparse_flash_attention(x[0], x[2], idx, q_rope=x[1], k_rope=x[3],
                                                                 deterministic=det),
            }
            t = TestTorchDeterministic()
            for name, run in runs.items():
                x = (sq, sqr, sk, skr) if name == "sfa" else (q, k, v)
                grads = {}
                for det, flag, want in ((None, True, 1), (None, False, 0), (True, False, 1), (False, True, 0)):
                    with self.subTest(mode=name, deterministic=det, torch_flag=flag):
                        rec, grads[(det, flag)] = t.grads(run, x, det, flag)
                        self.assertEqual(backward_values(rec), [want], rec)
                for gr in grads.values():
                    for a, b in zip(gr, grads[(True, False)]):
                        self.assertTrue(torch.equal(a, b), name)
        finally:
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# NumPy
# ---------------------------------------------------------------------------------------------
@needs_numpy
class TestNumpyDeterministic(unittest.TestCase):
    def setUp(self):
        rng = np.random.default_rng(20)
        self.q, self.k, self.v = (rng.standard_normal((1, 2, 12, 8)).astype(np.float32) for _ in range(3))
        self.m = np.ones((1, 2, 3, 2), np.uint8)
        self.o, self.lse = spattn.bsa_forward(self.q, self.k, self.v, self.m, (4, 6))
        self.do = rng.standard_normal(self.o.shape).astype(np.float32)
        self.sq = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
        self.sk = rng.standard_normal((1, 6, 1, 8)).astype(np.float32)
        self.idx = np.array([[0, -1], [1, 0], [2, 1], [3, 0]], np.int32).reshape(1, 4, 1, 2)
        self.so, self.slse = spattn.sfa_forward(self.sq, self.sk, self.idx)
        self.sdo = rng.standard_normal(self.so.shape).astype(np.float32)

    def calls(self):
        from spattn import numpy_varlen as nv
        cu = np.array([0, 12], np.int32)
        tq = lambda x: x[0].transpose(1, 0, 2).copy()  # noqa: E731  [1, N, S, D] -> [S, N, D]
        plan = spattn.create_block_mask(self.m, (4, 6), seq_lens=(12, 12))
        return {
            "bsa": lambda **kw: spattn.bsa_backward(self.q, self.k, self.v, self.m, self.o, self.do, self.lse,
                                                    (4, 6), **kw),
            "bsa plan": lambda **kw: spattn.bsa_backward(self.q, self.k, self.v, plan, self.o, self.do, self.lse,
                                                         **kw),
            "sfa": lambda **kw: spattn.sfa_backward(self.sq, self.sk, self.idx, self.so, self.sdo, self.slse,
                                                    **kw),
            "bsa varlen": lambda **kw: nv.bsa_backward_varlen(
                tq(self.q), tq(self.k), tq(self.v), self.m, tq(self.o), tq(self.do),
                self.lse[0].T.copy(), cu, cu, (4, 6), **kw),
            "sfa varlen": lambda **kw: nv.sfa_backward_varlen(
                self.sq[0], self.sk[0], self.idx[0], self.so[0], self.sdo[0], self.slse[0],
                np.array([0, 4], np.int32), np.array([0, 6], np.int32), **kw),
        }

    def test_value_reaches_the_call(self):
        for name, call in self.calls().items():
            out = {}
            for kw, want in (({}, 1), ({"deterministic": True}, 1), ({"deterministic": False}, 0),
                             ({"deterministic": np.bool_(False)}, 0)):
                with self.subTest(call=name, kw=kw), spy() as rec:
                    out[want] = [x for x in call(**kw) if x is not None]
                    self.assertEqual([d for _, d in rec], [want], rec)
            for a, b in zip(out[0], out[1]):   # the CPU backend: the same bits either way
                self.assertTrue(np.array_equal(a, b), name)

    def test_bad_value(self):
        for bad in (2, -1, "no", None):
            with self.subTest(bad=bad), self.assertRaises(spattn.SpattnError) as cm:
                self.calls()["bsa"](deterministic=bad)
            self.assertEqual(cm.exception.status, _lib.STATUS_BAD_OPTIONS)

    def test_forward_unaffected(self):
        with spy() as rec:
            spattn.bsa_forward(self.q, self.k, self.v, self.m, (4, 6))
        self.assertEqual(rec, [("spattn_bsa_fwd_ex", 1)])


if __name__ == "__main__":
    unittest.main()
