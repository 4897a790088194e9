"""ctypes binding of the packed variable-length / paged entry points (spattn_*_varlen).

The lengths are int32 prefix sums ``cu_seqlens_q`` / ``cu_seqlens_kv`` [B+1] on the tensors'
device, ``max_seqlen_q`` / ``max_seqlen_kv`` bound every length, and an optional int32
``block_table`` [B, max_pages] makes k / v (and k_rope and their gradients) pages
[num_pages, page_size, Nkv, D].  Semantics: cases/README.md.  CPU; on CUDA the sfa forward and
backward, the bsa forward and backward, packed and paged, for the shapes of their Hopper kernels
(docs/runbooks/varlen_paged.md; the paged bsa backward not yet run on a GPU); other calls on CUDA
tensors raise SpattnNotSupportedError.
"""
from __future__ import annotations

import ctypes
import operator
import threading
from typing import Optional

from . import _lib
from ._lib import SpattnError, SpattnTensor, ref


def int_arg(name: str, value, lo: int = -2**63, hi: int = 2**63 - 1) -> int:
    """``value`` as an int that fits the C parameter (ctypes would silently wrap it)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise SpattnError(_lib.STATUS_INVALID_VALUE, f"{name}: expected an integer, got {value!r}") from None
    if not lo <= v <= hi:
        raise SpattnError(_lib.STATUS_INVALID_VALUE, f"{name}: {v} does not fit the library's range [{lo}, {hi}]")
    return v

_PT = ctypes.POINTER(SpattnTensor)
_PO = ctypes.POINTER(_lib.SpattnOptions)


class SpattnVarlen(ctypes.Structure):
    """Mirror of spattn_varlen."""

    _fields_ = [
        ("cu_seqlens_q", _PT),
        ("cu_seqlens_kv", _PT),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_kv", ctypes.c_int64),
        ("block_table", _PT),
        ("reserved", ctypes.c_int64 * 4),
    ]


_declared = False
_lock = threading.Lock()


def _h() -> ctypes.CDLL:
    global _declared
    h = _lib.lib()
    if _declared:
        return h
    with _lock:
        i64, i32, dbl, pv = ctypes.c_int64, ctypes.c_int32, ctypes.c_double, ctypes.POINTER(SpattnVarlen)
        h.spattn_bsa_fwd_varlen.argtypes = [_PT, _PT, _PT, _PT, i64, i64, dbl, pv, _PT, _PT, _PO]
        h.spattn_bsa_bwd_varlen.argtypes = [_PT, _PT, _PT, _PT, _PT, _PT, _PT, i64, i64, dbl, pv,
                                            _PT, _PT, _PT, _PO]
        h.spattn_sfa_fwd_varlen.argtypes = [_PT, _PT, _PT, _PT, _PT, _PT, i64, i32, dbl, pv, _PT,
                                            _PT, _PO]
        h.spattn_sfa_bwd_varlen.argtypes = [_PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT, i64, i32,
                                            dbl, pv, _PT, _PT, _PT, _PT, _PT, _PO]
        psz = ctypes.POINTER(ctypes.c_size_t)
        h.spattn_bsa_varlen_workspace_size.argtypes = [_PT, _PT, _PT, _PT, i64, i64, pv, i32, _PO, psz]
        h.spattn_sfa_varlen_workspace_size.argtypes = [_PT, _PT, _PT, _PT, _PT, _PT, i64, i32, pv, i32,
                                                       _PO, psz]
        for f in ("spattn_bsa_fwd_varlen", "spattn_bsa_bwd_varlen", "spattn_sfa_fwd_varlen",
                  "spattn_sfa_bwd_varlen", "spattn_bsa_varlen_workspace_size",
                  "spattn_sfa_varlen_workspace_size"):
            getattr(h, f).restype = ctypes.c_int
        _declared = True
    return h


def varlen(cu_q: SpattnTensor, cu_kv: SpattnTensor, max_q: int, max_kv: int,
           table: Optional[SpattnTensor]) -> SpattnVarlen:
    """The descriptor (it points to the given tensor descriptors: keep them alive)."""
    vl = SpattnVarlen()
    vl.cu_seqlens_q = ctypes.pointer(cu_q)
    vl.cu_seqlens_kv = ctypes.pointer(cu_kv)
    vl.max_seqlen_q = int_arg("max_seqlen_q", max_q)
    vl.max_seqlen_kv = int_arg("max_seqlen_kv", max_kv)
    if table is not None:
        vl.block_table = ctypes.pointer(table)
    return vl


def bsa_fwd(q, k, v, mask, bx, by, scale, vl: SpattnVarlen, o, lse, opt) -> None:
    bx, by = int_arg("bx", bx), int_arg("by", by)
    _lib.check(_h().spattn_bsa_fwd_varlen(ref(q), ref(k), ref(v), ref(mask), bx, by, float(scale),
                                          ctypes.byref(vl), ref(o), ref(lse), ctypes.byref(opt)))


def bsa_bwd(q, k, v, o, dout, lse, mask, bx, by, scale, vl: SpattnVarlen, dq, dk, dv, opt) -> None:
    bx, by = int_arg("bx", bx), int_arg("by", by)
    _lib.check(_h().spattn_bsa_bwd_varlen(ref(q), ref(k), ref(v), ref(o), ref(dout), ref(lse),
                                          ref(mask), bx, by, float(scale), ctypes.byref(vl),
                                          ref(dq), ref(dk), ref(dv), ctypes.byref(opt)))


def sfa_fwd(q, q_rope, k, k_rope, v, idx, sbs, mode, scale, vl: SpattnVarlen, o, lse, opt) -> None:
    sbs, mode = int_arg("sparse_block_size", sbs), int_arg("mode", mode, -2**31, 2**31 - 1)
    _lib.check(_h().spattn_sfa_fwd_varlen(ref(q), ref(q_rope), ref(k), ref(k_rope), ref(v), ref(idx),
                                          sbs, mode, float(scale), ctypes.byref(vl), ref(o), ref(lse),
                                          ctypes.byref(opt)))


def sfa_bwd(q, q_rope, k, k_rope, v, o, dout, lse, idx, sbs, mode, scale, vl: SpattnVarlen,
            dq, dq_rope, dk, dk_rope, dv, opt) -> None:
    sbs, mode = int_arg("sparse_block_size", sbs), int_arg("mode", mode, -2**31, 2**31 - 1)
    _lib.check(_h().spattn_sfa_bwd_varlen(ref(q), ref(q_rope), ref(k), ref(k_rope), ref(v), ref(o),
                                          ref(dout), ref(lse), ref(idx), sbs, mode, float(scale),
                                          ctypes.byref(vl), ref(dq), ref(dq_rope), ref(dk),
                                          ref(dk_rope), ref(dv), ctypes.byref(opt)))


def bsa_workspace_size(q, k, v, mask, bx, by, vl: SpattnVarlen, backward: bool, opt) -> int:
    """Bytes of caller workspace bsa_fwd (backward=False) / bsa_bwd needs with ``opt``."""
    bx, by = int_arg("bx", bx), int_arg("by", by)
    n = ctypes.c_size_t()
    _lib.check(_h().spattn_bsa_varlen_workspace_size(ref(q), ref(k), ref(v), ref(mask), bx, by,
                                                     ctypes.byref(vl), int(bool(backward)),
                                                     ctypes.byref(opt), ctypes.byref(n)))
    return int(n.value)


def sfa_workspace_size(q, q_rope, k, k_rope, v, idx, sbs, mode, vl: SpattnVarlen, backward: bool,
                       opt) -> int:
    """Bytes of caller workspace sfa_fwd (backward=False) / sfa_bwd needs with ``opt``."""
    sbs, mode = int_arg("sparse_block_size", sbs), int_arg("mode", mode, -2**31, 2**31 - 1)
    n = ctypes.c_size_t()
    _lib.check(_h().spattn_sfa_varlen_workspace_size(ref(q), ref(q_rope), ref(k), ref(k_rope), ref(v),
                                                     ref(idx), sbs, mode, ctypes.byref(vl),
                                                     int(bool(backward)), ctypes.byref(opt),
                                                     ctypes.byref(n)))
    return int(n.value)
