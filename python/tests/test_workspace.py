"""Caller workspaces of the PyTorch ops (spattn._ops.run): each plain, varlen, paged and plan call
on CUDA tensors first asks its spattn_*_workspace_size for exactly that call (the same tensors,
scalars and options) and passes a buffer of that many bytes from torch's caching allocator, so
that the library allocates nothing; CPU calls pass none, as before.  A spy on the ctypes
functions of the loaded library reads every query's arguments and result and every call's
options.  Without a CUDA device the CUDA behaviour runs on CPU tensors, with "cpu" added to
_ops.WORKSPACE_DEVICES (the CPU backend takes a caller workspace too); results must be bitwise
those of calls without a workspace.  Also: a too-small answer is not papered over (the call is
refused, WORKSPACE_TOO_SMALL: the queries must answer enough for any layout of the tensors they
do not see), and a failing query leaves the error to the call.  Skipped (with the reason
printed) without torch."""
from __future__ import annotations

import contextlib
import unittest

try:
    import torch
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:  # pragma: no cover - CI without torch
    torch = None
    HAVE_TORCH = False

import libspy
import spattn
from spattn import _lib

needs_torch = unittest.skipUnless(HAVE_TORCH, "PyTorch (>= 2.4) not importable: workspace tests skipped")

# argument names of the spied functions
ARGS = {
    "spattn_bsa_fwd_ex": "q k v mask bx by scale o lse opt",
    "spattn_bsa_bwd_ex": "q k v o dout lse mask bx by scale dq dk dv opt",
    "spattn_bsa_workspace_size": "q k v mask bx by backward opt bytes",
    "spattn_sfa_fwd_ex": "q qr k kr v idx sbs mode scale o lse opt",
    "spattn_sfa_bwd_ex": "q qr k kr v o dout lse idx sbs mode scale dq dqr dk dkr dv opt",
    "spattn_sfa_workspace_size": "q qr k kr v idx sbs mode backward opt bytes",
    "spattn_bsa_fwd_varlen": "q k v mask bx by scale vl o lse opt",
    "spattn_bsa_bwd_varlen": "q k v o dout lse mask bx by scale vl dq dk dv opt",
    "spattn_bsa_varlen_workspace_size": "q k v mask bx by vl backward opt bytes",
    "spattn_sfa_fwd_varlen": "q qr k kr v idx sbs mode scale vl o lse opt",
    "spattn_sfa_bwd_varlen": "q qr k kr v o dout lse idx sbs mode scale vl dq dqr dk dkr dv opt",
    "spattn_sfa_varlen_workspace_size": "q qr k kr v idx sbs mode vl backward opt bytes",
    "spattn_bsa_fwd_plan": "plan q k v scale o lse opt",
    "spattn_bsa_bwd_plan": "plan q k v o dout lse scale dq dk dv opt",
    "spattn_bsa_plan_workspace_size": "plan q k v backward opt bytes",
}


def query_of(call: str) -> str:
    """spattn_bsa_fwd_ex -> spattn_bsa_workspace_size, spattn_sfa_bwd_varlen ->
    spattn_sfa_varlen_workspace_size, spattn_bsa_fwd_plan -> spattn_bsa_plan_workspace_size"""
    _, op, _, kind = call.split("_")
    return f"spattn_{op}_" + ("" if kind == "ex" else kind + "_") + "workspace_size"


def workspace_of(args):
    return args["opt"]["workspace"], args["opt"]["workspace_size"]


def snap(x):
    """A comparable value of one ctypes argument (descriptors by what they describe)."""
    from spattn._varlen import SpattnVarlen
    obj = getattr(x, "_obj", x)  # byref(...) -> the structure
    if isinstance(obj, _lib.SpattnTensor):
        n = obj.ndim
        return ("tensor", obj.data, obj.dtype, obj.device_type, obj.device_id, tuple(obj.shape[:n]),
                tuple(obj.strides[:n]))
    if isinstance(obj, _lib.SpattnOptions):
        return {f: getattr(obj, f) for f in ("backend", "num_threads", "cuda_stream", "workspace",
                                             "workspace_size", "deterministic")}
    if isinstance(obj, SpattnVarlen):
        table = snap(obj.block_table.contents) if obj.block_table else None
        return ("varlen", snap(obj.cu_seqlens_q.contents), snap(obj.cu_seqlens_kv.contents),
                obj.max_seqlen_q, obj.max_seqlen_kv, table)
    return obj


@contextlib.contextmanager
def spy(size_answer=None):
    """Records [name, {argument: snap}, status] of every spied library call made inside (queries
    get "bytes": their answer).  size_answer(bytes): what the queries answer instead (None: they
    fail with status 101)."""
    rec = []

    def make(name, orig):
        names = ARGS[name].split()

        def wrapper(*args):
            entry = [name, {n: snap(a) for n, a in zip(names, args)}, None]
            rec.append(entry)
            st = orig(*args)
            if name.endswith("_workspace_size"):
                if size_answer is not None:
                    want = size_answer(args[-1]._obj.value)
                    if want is None:
                        st = _lib.STATUS_INVALID_VALUE
                    else:
                        args[-1]._obj.value = want
                entry[1]["bytes"] = args[-1]._obj.value
            entry[2] = st
            return st
        return wrapper
    with libspy.wrapped(ARGS, make):
        yield rec


@contextlib.contextmanager
def workspace_devices(devs):
    from spattn import _ops
    was = _ops.WORKSPACE_DEVICES
    _ops.WORKSPACE_DEVICES = tuple(devs)
    try:
        yield
    finally:
        _ops.WORKSPACE_DEVICES = was


def cuda_ok() -> bool:
    return HAVE_TORCH and torch.cuda.is_available() and spattn.cuda_available()


# ---------------------------------------------------------------------------------------------
# every op kind, in shapes the CUDA backend runs forward and backward (bf16; bsa D 64; sfa D 512 +
# 64 with shared key/value; pages of 8 / 16 rows).
# ---------------------------------------------------------------------------------------------
def _t(g, dev, *shape):
    return torch.randn(*shape, generator=g).to(dev, torch.bfloat16).requires_grad_(True)


def _i32(x, dev):
    return torch.tensor(x, dtype=torch.int32, device=dev)


def _pages(k, cu, page_size, table):
    """Pages [num_pages, page_size, ...] holding the packed rows of k where `table` puts them."""
    pages = torch.zeros(int(table.max()) + 1, page_size, *k.shape[1:], dtype=k.dtype, device=k.device)
    for b in range(len(cu) - 1):
        for j in range(cu[b + 1] - cu[b]):
            pages[int(table[b, j // page_size]), j % page_size] = k[cu[b] + j].detach()
    return pages.requires_grad_(True)


def forms(dev):
    """{name: (run(deterministic) -> output, leaves)}"""
    g = torch.Generator().manual_seed(3)
    q, k, v = _t(g, dev, 1, 4, 40, 64), _t(g, dev, 1, 2, 48, 64), _t(g, dev, 1, 2, 48, 64)
    m = (torch.rand(1, 4, 3, 3, generator=g) < 0.7).to(torch.uint8).to(dev)
    bm = spattn.create_block_mask(m, (16, 16), seq_lens=(40, 48), num_kv_heads=2)

    cu_k = [0, 7, 23, 31]  # bsa varlen: 3 sequences, 5 / 20 / 3 queries, 7 / 16 / 8 keys
    qv, kv, vv = _t(g, dev, 28, 4, 64), _t(g, dev, 31, 2, 64), _t(g, dev, 31, 2, 64)
    mv = (torch.rand(3, 4, 3, 2, generator=g) < 0.7).to(torch.uint8).to(dev)
    table8 = _i32([[3, 0], [1, 4], [2, 0]], dev)  # pages of 8 rows, shuffled; page 0 unused
    kp, vp = _pages(kv, cu_k, 8, table8.cpu()), _pages(vv, cu_k, 8, table8.cpu())
    vl_b = dict(cu_seqlens_q=_i32([0, 5, 25, 28], dev), cu_seqlens_k=_i32(cu_k, dev), max_seqlen_q=20,
                max_seqlen_k=16)

    s1, s2, n1, kk = 8, 64, 16, 16  # sfa: 16 query heads, one key head, D 512 + 64
    qs, qsr = _t(g, dev, 1, s1, n1, 512), _t(g, dev, 1, s1, n1, 64)
    ks, ksr = _t(g, dev, 1, s2, 1, 512), _t(g, dev, 1, s2, 1, 64)
    idx = torch.stack([torch.randperm(s2 - s1 + i + 1, generator=g)[:kk] for i in range(s1)])
    idx = idx.view(1, s1, 1, kk).to(torch.int32).to(dev)

    cu_ks = [0, 24, 64]  # sfa varlen: 2 sequences, 3 / 5 queries, 24 / 40 keys
    qsv, qsvr = _t(g, dev, 8, n1, 512), _t(g, dev, 8, n1, 64)
    ksv, ksvr = _t(g, dev, 64, 1, 512), _t(g, dev, 64, 1, 64)
    ix = torch.stack([torch.randperm(24 if t < 3 else 40, generator=g)[:kk] for t in range(8)])
    ix = ix.view(8, 1, kk).to(torch.int32).to(dev)
    table16 = _i32([[2, 0, 0], [1, 3, 4]], dev)  # pages of 16 rows
    ksp, kspr = _pages(ksv, cu_ks, 16, table16.cpu()), _pages(ksvr, cu_ks, 16, table16.cpu())
    vl_s = dict(cu_seqlens_q=_i32([0, 3, 8], dev), cu_seqlens_k=_i32(cu_ks, dev), max_seqlen_q=5,
                max_seqlen_k=40)

    bsa, sfa = spattn.block_sparse_attention, spattn.sparse_flash_attention
    return {
        "bsa": (lambda det: bsa(q, k, v, m, (16, 16), deterministic=det), (q, k, v)),
        "bsa plan": (lambda det: bsa(q, k, v, bm, deterministic=det), (q, k, v)),
        "bsa varlen": (lambda det: bsa(qv, kv, vv, mv, (8, 8), deterministic=det, **vl_b), (qv, kv, vv)),
        "bsa paged": (lambda det: bsa(qv, kp, vp, mv, (8, 8), block_table=table8, deterministic=det,
                                      **vl_b), (qv, kp, vp)),
        "sfa": (lambda det: sfa(qs, ks, idx, q_rope=qsr, k_rope=ksr, deterministic=det), (qs, qsr, ks, ksr)),
        "sfa varlen": (lambda det: sfa(qsv, ksv, ix, q_rope=qsvr, k_rope=ksvr, deterministic=det, **vl_s),
                       (qsv, qsvr, ksv, ksvr)),
        "sfa paged": (lambda det: sfa(qsv, ksp, ix, q_rope=qsvr, k_rope=kspr, block_table=table16,
                                      deterministic=det, **vl_s), (qsv, qsvr, ksp, kspr)),
    }


DENSE = ("bsa", "bsa plan", "sfa")  # (the CUDA varlen backwards refuse a stride-0 dO)


def forward_backward(form, det, dout="squares"):
    """[output, gradients] of one forward + backward; dout "ones" backpropagates o.sum(), whose
    dO has stride 0."""
    run, leaves = form
    for t in leaves:
        t.grad = None
    o = run(det)
    (o.sum() if dout == "ones" else (o.float() ** 2).sum()).backward()
    return [o.detach().clone()] + [t.grad.clone() for t in leaves]


def assert_same(tc, got, want, exact, what):
    """Bitwise, or (a CUDA backward whose simple kernels add with fp32 atomics) to bf16 rounding."""
    for a, b in zip(got, want):
        if exact:
            tc.assertTrue(torch.equal(a, b), f"{what}: differs with a workspace")
        else:
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2 * float(b.abs().max()),
                                       msg=what)


def calls_of(rec):
    return [(n, a) for n, a, _ in rec if not n.endswith("_workspace_size")]


@needs_torch
class TestWorkspace(unittest.TestCase):
    def devices(self):
        """(device, WORKSPACE_DEVICES that give its calls a workspace)."""
        return [("cpu", ("cpu", "cuda"))] + ([("cuda", ("cuda",))] if cuda_ok() else [])

    def check_plumbing(self, rec):
        """Every call came right after its own query (same arguments, the call's options) and got
        exactly the bytes the query answered (none for 0) and succeeded.  Returns [(call, bytes)]."""
        out, i = [], 0
        while i < len(rec):
            name, qa, qst = rec[i]
            self.assertTrue(name.endswith("_workspace_size"), f"a call without its query: {rec[i]}")
            self.assertEqual(qst, _lib.STATUS_SUCCESS, rec[i])
            call, ca, cst = rec[i + 1]
            self.assertEqual(query_of(call), name, (rec[i], rec[i + 1]))
            self.assertEqual(qa["backward"], int("_bwd_" in call), call)
            for key, val in qa.items():
                if key not in ("backward", "bytes", "opt"):
                    self.assertEqual(ca[key], val, f"{call}: argument {key} differs from its query's")
            ws, ws_size = workspace_of(ca)
            self.assertEqual(ca["opt"], dict(qa["opt"], workspace=ws, workspace_size=ws_size), call)
            self.assertEqual((ws is not None, ws_size), (qa["bytes"] > 0, qa["bytes"]), call)
            self.assertEqual(cst, _lib.STATUS_SUCCESS, rec[i + 1])
            i += 2
            out.append((call, qa["bytes"]))
        return out

    def test_every_op_passes_its_queried_workspace(self):
        for dev, ws_devs in self.devices():
            for name, form in forms(dev).items():
                for det in (True, False):
                    with self.subTest(device=dev, form=name, deterministic=det):
                        with workspace_devices(()):
                            plain = forward_backward(form, det)
                        with workspace_devices(ws_devs), spy() as rec:
                            got = forward_backward(form, det)
                        calls = self.check_plumbing(rec)
                        self.assertEqual(len(calls), 2, rec)  # one forward, one backward
                        self.assertIn("_fwd_", calls[0][0])
                        self.assertIn("_bwd_", calls[1][0])
                        if dev == "cpu":  # (the CPU backend always needs scratch: not vacuous)
                            self.assertTrue(all(n > 0 for _, n in calls), calls)
                        assert_same(self, got, plain, dev == "cpu" or det, name)  # det: bitwise

    def test_cpu_calls_unchanged(self):
        """By default CPU tensors get no workspace (and no query): the library mallocs."""
        for name, form in forms("cpu").items():
            with self.subTest(form=name), spy() as rec:
                forward_backward(form, True)
                self.assertEqual([n for n, _, _ in rec if n.endswith("_workspace_size")], [])
                calls = calls_of(rec)
                self.assertEqual(len(calls), 2)
                for call, a in calls:
                    self.assertEqual(workspace_of(a), (None, 0), call)

    def test_too_small_answer_is_refused(self):
        """A query answering less than the call needs is a library defect: the call answers
        WORKSPACE_TOO_SMALL (nothing retries it without a workspace and hides it)."""
        # CPU tensors: the CPU backend needs scratch for every op, so the answer is really short
        for name, form in forms("cpu").items():
            with self.subTest(form=name):
                with workspace_devices(("cpu", "cuda")), spy(lambda n: min(n, 8)) as rec, \
                        self.assertRaises(spattn.SpattnError) as cm:
                    forward_backward(form, True)
                self.assertEqual(cm.exception.status, _lib.STATUS_WORKSPACE_TOO_SMALL, rec)
                self.assertEqual(len(calls_of(rec)), 1, rec)  # the forward, refused

    def test_stride0_dout(self):
        """o.sum()'s gradient (stride 0) through every op: correct with the workspaces."""
        for dev, ws_devs in self.devices():
            for name, form in forms(dev).items():
                if name not in DENSE:
                    continue
                # CUDA sfa: a stride-0 dO takes the simple kernels (deterministic: int64 fixed point)
                det = True
                with self.subTest(device=dev, form=name):
                    with workspace_devices(()):
                        plain = forward_backward(form, det, "ones")
                    with workspace_devices(ws_devs), spy() as rec:
                        got = forward_backward(form, det, "ones")
                    self.check_plumbing(rec)
                    assert_same(self, got, plain, True, name)

    def test_failed_query_leaves_the_error_to_the_call(self):
        for dev, ws_devs in self.devices():
            with self.subTest(device=dev), workspace_devices(ws_devs):
                form = forms(dev)["bsa"]
                with spy(lambda n: None) as rec:
                    forward_backward(form, True)
                self.assertEqual(len(calls_of(rec)), 2, rec)
                for call, a in calls_of(rec):
                    self.assertEqual(workspace_of(a), (None, 0), call)
                q = torch.zeros(1, 2, 16, 64, device=dev)
                bad = torch.ones(1, 2, 1, 2, dtype=torch.uint8, device=dev)  # [.., 1, 1] expected
                errors = []
                for devs in ((), ws_devs):
                    with workspace_devices(devs), self.assertRaises(spattn.SpattnError) as cm:
                        spattn.block_sparse_attention(q, q, q, bad, (16, 16))
                    errors.append((cm.exception.status, cm.exception.message))
                self.assertEqual(errors[0], errors[1])


if __name__ == "__main__":
    unittest.main()
