"""NumPy (CPU) forms of the packed variable-length / paged operators (cases/README.md).

Packed arrays [T, N, D]; ``cu_seqlens_q`` / ``cu_seqlens_k`` int32 prefix sums [B+1] (other
integer arrays are converted); ``block_table`` int32 [B, max_pages] makes k / v (k_rope and
their gradients) pages [num_pages, page_size, Nkv, D].  LSE [T, N].  Output rows past
cu_seqlens_q[B] are 0 (LSE -inf).  Every sequence gives bitwise what one dense call on it gives.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import _lib, _varlen
from .numpy_api import _arr, _desc, _indices

__all__ = ["bsa_forward_varlen", "bsa_backward_varlen", "sfa_forward_varlen", "sfa_backward_varlen"]


def _i32(a):
    if a is None:
        return None
    a = np.asarray(a)
    return a if a.dtype == np.int32 or a.dtype.kind not in "iu" else a.astype(np.int32)


def _vl(cu_q, cu_k, max_q, max_k, table):
    cq, ck, bt = _i32(cu_q), _i32(cu_k), _i32(table)
    d = (_desc("cu_seqlens_q", cq), _desc("cu_seqlens_k", ck), _desc("block_table", bt))
    return _varlen.varlen(d[0], d[1], max_q, max_k, d[2]), (cq, ck, bt, d)  # keep alive


def _bounds(max_q, max_k, dq, dk):
    return (dq if max_q is None else max_q), (dk if max_k is None else max_k)


def _pair(block_size):
    if isinstance(block_size, (tuple, list)):
        return int(block_size[0]), int(block_size[1])
    return int(block_size), int(block_size)


def bsa_forward_varlen(q, k, v, block_mask, cu_seqlens_q, cu_seqlens_k, block_size=(64, 64),
                       max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                       block_table=None, scale: Optional[float] = None, num_threads: int = 0):
    """Packed bsa forward: q [Tq, N, D], k, v [Tkv, Nkv, D] (or pages with block_table), mask
    [B, N, ceil(max_seqlen_q/bx), ceil(max_seqlen_k/by)].  Returns (o [Tq, N, D], lse [Tq, N]).
    max_seqlen_* default to the mask's extent."""
    q, k, v, m = _arr(q), _arr(k), _arr(v), _arr(block_mask)
    bx, by = _pair(block_size)
    mq, mk = _bounds(max_seqlen_q, max_seqlen_k, m.shape[-2] * bx, m.shape[-1] * by)
    vl, keep = _vl(cu_seqlens_q, cu_seqlens_k, mq, mk, block_table)
    o = np.zeros(q.shape, q.dtype)
    lse = np.full(q.shape[:-1], -np.inf, np.float32)
    _varlen.bsa_fwd(_desc("q", q), _desc("k", k), _desc("v", v), _desc("block_mask", m), bx, by,
                    _lib.scale_arg(scale), vl, _desc("o", o), _desc("lse", lse),
                    _lib.options(num_threads=num_threads))
    del keep
    return o, lse


def bsa_backward_varlen(q, k, v, block_mask, o, do, lse, cu_seqlens_q, cu_seqlens_k,
                        block_size=(64, 64), max_seqlen_q: Optional[int] = None,
                        max_seqlen_k: Optional[int] = None, block_table=None,
                        scale: Optional[float] = None, num_threads: int = 0, *,
                        deterministic: bool = True):
    """Packed bsa backward.  Returns (dq, dk, dv) shaped like q, k, v; with block_table k, v
    and dk, dv are pages (rows no sequence uses get 0, a page shared by sequences the sum).
    ``deterministic``: as in spattn.bsa_backward."""
    opt = _lib.options(num_threads=num_threads, deterministic=_lib.deterministic_arg(deterministic))
    q, k, v, m, o, do, lse = (_arr(x) for x in (q, k, v, block_mask, o, do, lse))
    bx, by = _pair(block_size)
    mq, mk = _bounds(max_seqlen_q, max_seqlen_k, m.shape[-2] * bx, m.shape[-1] * by)
    vl, keep = _vl(cu_seqlens_q, cu_seqlens_k, mq, mk, block_table)
    dq, dk, dv = np.zeros(q.shape, q.dtype), np.empty(k.shape, k.dtype), np.empty(v.shape, v.dtype)
    _varlen.bsa_bwd(_desc("q", q), _desc("k", k), _desc("v", v), _desc("o", o), _desc("dout", do),
                    _desc("lse", lse), _desc("block_mask", m), bx, by, _lib.scale_arg(scale), vl,
                    _desc("dq", dq), _desc("dk", dk), _desc("dv", dv), opt)
    del keep
    return dq, dk, dv


def _kmax(k, table):
    return table.shape[-1] * k.shape[1] if table is not None else k.shape[0]


def sfa_forward_varlen(q, k, indices, cu_seqlens_q, cu_seqlens_k, v=None, q_rope=None, k_rope=None,
                       sparse_block_size: int = 1, causal: bool = True,
                       max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                       block_table=None, scale: Optional[float] = None, num_threads: int = 0):
    """Packed sfa forward: q [Tq, N1, D], k [Tkv, N2, D] (or pages), indices [Tq, N2, K] (block
    positions inside each sequence's keys).  Returns (o [Tq, N1, D], lse [Tq, N1])."""
    q, k, v, qr, kr = _arr(q), _arr(k), _arr(v), _arr(q_rope), _arr(k_rope)
    idx, bt = _indices(indices), _i32(block_table)
    mq, mk = _bounds(max_seqlen_q, max_seqlen_k, q.shape[0], _kmax(k, bt))
    vl, keep = _vl(cu_seqlens_q, cu_seqlens_k, mq, mk, bt)
    o = np.zeros(q.shape, q.dtype)
    lse = np.full(q.shape[:-1], -np.inf, np.float32)
    _varlen.sfa_fwd(_desc("q", q), _desc("q_rope", qr), _desc("k", k), _desc("k_rope", kr),
                    _desc("v", v), _desc("indices", idx), sparse_block_size,
                    _lib.SFA_MODE_CAUSAL if causal else _lib.SFA_MODE_NONE, _lib.scale_arg(scale), vl,
                    _desc("o", o), _desc("lse", lse), _lib.options(num_threads=num_threads))
    del keep
    return o, lse


def sfa_backward_varlen(q, k, indices, o, do, lse, cu_seqlens_q, cu_seqlens_k, v=None, q_rope=None,
                        k_rope=None, sparse_block_size: int = 1, causal: bool = True,
                        max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                        block_table=None, scale: Optional[float] = None, num_threads: int = 0, *,
                        deterministic: bool = True):
    """Packed sfa backward.  Returns (dq, dk, dv, dq_rope, dk_rope) (None where absent).
    ``deterministic``: as in spattn.sfa_backward."""
    opt = _lib.options(num_threads=num_threads, deterministic=_lib.deterministic_arg(deterministic))
    q, k, v, qr, kr = _arr(q), _arr(k), _arr(v), _arr(q_rope), _arr(k_rope)
    o, do, lse = _arr(o), _arr(do), _arr(lse)
    idx, bt = _indices(indices), _i32(block_table)
    mq, mk = _bounds(max_seqlen_q, max_seqlen_k, q.shape[0], _kmax(k, bt))
    vl, keep = _vl(cu_seqlens_q, cu_seqlens_k, mq, mk, bt)
    dq, dk = np.zeros(q.shape, q.dtype), np.empty(k.shape, k.dtype)
    dv = np.empty(v.shape, v.dtype) if v is not None else None
    dqr = np.zeros(qr.shape, qr.dtype) if qr is not None else None
    dkr = np.empty(kr.shape, kr.dtype) if kr is not None else None
    _varlen.sfa_bwd(_desc("q", q), _desc("q_rope", qr), _desc("k", k), _desc("k_rope", kr),
                    _desc("v", v), _desc("o", o), _desc("dout", do), _desc("lse", lse),
                    _desc("indices", idx), sparse_block_size,
                    _lib.SFA_MODE_CAUSAL if causal else _lib.SFA_MODE_NONE, _lib.scale_arg(scale), vl,
                    _desc("dq", dq), _desc("dq_rope", dqr), _desc("dk", dk), _desc("dk_rope", dkr),
                    _desc("dv", dv), opt)
    del keep
    return dq, dk, dv, dqr, dkr
