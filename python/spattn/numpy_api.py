"""NumPy forward/backward functions (CPU).  Arrays are passed as strided descriptors, no copies.

Floating arrays: float32 or float16 (and bfloat16 when the ``ml_dtypes`` dtype is used); all
floating arrays of one call share one dtype.  LSE is float32.  Block masks: uint8, int8 or bool
(nonzero = attended).  sfa indices: int32 (other integer arrays are converted).
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from . import _lib
from . import block_mask as _block_mask
from ._lib import SpattnError
from .block_mask import BlockMask

__all__ = ["bsa_forward", "bsa_backward", "sfa_forward", "sfa_backward"]


def _dtype_code(name: str, a: np.ndarray) -> int:
    dt = a.dtype
    if dt == np.float32:
        return _lib.F32
    if dt == np.float16:
        return _lib.F16
    if dt.name == "bfloat16" and dt.itemsize == 2:
        return _lib.BF16
    if dt == np.int32:
        return _lib.I32
    if dt == np.uint8 or dt == np.int8 or dt == np.bool_:
        return _lib.U8
    raise SpattnError(_lib.STATUS_BAD_DTYPE,
                      f"{name}: dtype {dt} is not supported (float32, float16, bfloat16; int32 indices; "
                      "uint8/int8/bool masks)", "SPATTN_STATUS_BAD_DTYPE")


def _desc(name: str, a: Optional[np.ndarray]) -> Optional[_lib.SpattnTensor]:
    if a is None:
        return None
    code = _dtype_code(name, a)
    item = a.dtype.itemsize
    if any(s % item for s in a.strides):
        raise SpattnError(_lib.STATUS_BAD_STRIDE,
                          f"{name}: byte strides {a.strides} are not multiples of the element size {item}",
                          "SPATTN_STATUS_BAD_STRIDE")
    return _lib.make_tensor(name, a.ctypes.data, code, a.shape, [s // item for s in a.strides])


def _arr(a):
    if a is None:
        return None
    return a if isinstance(a, np.ndarray) else np.asarray(a)


def _indices(a) -> np.ndarray:
    a = _arr(a)
    if a.dtype != np.int32 and a.dtype.kind in "iu":
        if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
            raise SpattnError(600, "indices: values do not fit in int32", "SPATTN_STATUS_BAD_INDEX")
        a = a.astype(np.int32)
    return a


def _block_size(block_size) -> Tuple[int, int]:
    return _lib.block_size_pair(block_size)


def _out(shape, dtype) -> np.ndarray:
    return np.empty(tuple(shape), dtype=dtype)


def bsa_forward(q, k, v, block_mask, block_size=(64, 64), scale: Optional[float] = None,
                num_threads: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Block-sparse attention forward, BNSD.  Returns (o [B,N,Sq,D], lse [B,N,Sq] float32).

    ``block_size`` is (bx, by) or one int; ``scale`` None means 1/sqrt(D).  ``block_mask`` may be
    a CPU spattn.BlockMask (spattn.create_block_mask; its block size is used, ``block_size``
    ignored): a reusable plan, bitwise equal to the raw mask.
    """
    if isinstance(block_mask, BlockMask):
        q, k, v = _arr(q), _arr(k), _arr(v)
        o, lse = _out(q.shape, q.dtype), _out(q.shape[:-1], np.float32)
        _block_mask.fwd(block_mask, _desc("q", q), _desc("k", k), _desc("v", v), _lib.scale_arg(scale),
                        _desc("o", o), _desc("lse", lse), _lib.options(num_threads=num_threads))
        return o, lse
    q, k, v, m = _arr(q), _arr(k), _arr(v), _arr(block_mask)
    bx, by = _block_size(block_size)
    o = _out(q.shape, q.dtype)
    lse = _out(q.shape[:-1], np.float32)
    _lib.bsa_fwd(_desc("q", q), _desc("k", k), _desc("v", v), _desc("block_mask", m), bx, by,
                 _lib.scale_arg(scale), _desc("o", o), _desc("lse", lse), _lib.options(num_threads=num_threads))
    return o, lse


def bsa_backward(q, k, v, block_mask, o, do, lse, block_size=(64, 64), scale: Optional[float] = None,
                 num_threads: int = 0, *,
                 deterministic: bool = True) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block-sparse attention backward.  Returns (dq, dk, dv) shaped like q, k, v.

    ``block_mask`` may be a spattn.BlockMask, as for bsa_forward.  ``deterministic`` is
    spattn_options.deterministic: True (default) = bitwise reproducible; False allows faster
    kernels whose summation order varies (CUDA only: the CPU backend, the only one the NumPy
    functions reach, gives the same bits either way).
    """
    opt = _lib.options(num_threads=num_threads, deterministic=_lib.deterministic_arg(deterministic))
    if isinstance(block_mask, BlockMask):
        q, k, v, o, do, lse = _arr(q), _arr(k), _arr(v), _arr(o), _arr(do), _arr(lse)
        dq, dk, dv = _out(q.shape, q.dtype), _out(k.shape, k.dtype), _out(v.shape, v.dtype)
        _block_mask.bwd(block_mask, _desc("q", q), _desc("k", k), _desc("v", v), _desc("o", o),
                        _desc("dout", do), _desc("lse", lse), _lib.scale_arg(scale), _desc("dq", dq),
                        _desc("dk", dk), _desc("dv", dv), opt)
        return dq, dk, dv
    q, k, v, m = _arr(q), _arr(k), _arr(v), _arr(block_mask)
    o, do, lse = _arr(o), _arr(do), _arr(lse)
    bx, by = _block_size(block_size)
    dq, dk, dv = _out(q.shape, q.dtype), _out(k.shape, k.dtype), _out(v.shape, v.dtype)
    _lib.bsa_bwd(_desc("q", q), _desc("k", k), _desc("v", v), _desc("block_mask", m), bx, by,
                 _lib.scale_arg(scale), _desc("o", o), _desc("dout", do), _desc("lse", lse),
                 _desc("dq", dq), _desc("dk", dk), _desc("dv", dv), opt)
    return dq, dk, dv


def _mode(causal: bool) -> int:
    return _lib.SFA_MODE_CAUSAL if causal else _lib.SFA_MODE_NONE


def sfa_forward(q, k, indices, v=None, q_rope=None, k_rope=None, sparse_block_size: int = 1,
                causal: bool = True, scale: Optional[float] = None,
                num_threads: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Top-k sparse flash attention forward, BSND.  Returns (o [B,S1,N1,D], lse [B,S1,N1] float32).

    ``v`` None means v is k (shared key/value); ``causal`` True is mode 3 (right-down causal);
    ``scale`` None means 1/sqrt(D + Dr).
    """
    q, k, v, qr, kr = _arr(q), _arr(k), _arr(v), _arr(q_rope), _arr(k_rope)
    idx = _indices(indices)
    o = _out(q.shape, q.dtype)
    lse = _out(q.shape[:-1], np.float32)
    _lib.sfa_fwd(_desc("q", q), _desc("q_rope", qr), _desc("k", k), _desc("k_rope", kr), _desc("v", v),
                 _desc("indices", idx), sparse_block_size, _mode(causal), _lib.scale_arg(scale),
                 _desc("o", o), _desc("lse", lse), _lib.options(num_threads=num_threads))
    return o, lse


def sfa_backward(q, k, indices, o, do, lse, v=None, q_rope=None, k_rope=None, sparse_block_size: int = 1,
                 causal: bool = True, scale: Optional[float] = None, num_threads: int = 0, *,
                 deterministic: bool = True):
    """Top-k sparse flash attention backward.

    Returns (dq, dk, dv, dq_rope, dk_rope); dv is None when v is None (its contribution is then
    inside dk), the rope gradients are None without rope.  ``deterministic``: as in bsa_backward.
    """
    opt = _lib.options(num_threads=num_threads, deterministic=_lib.deterministic_arg(deterministic))
    q, k, v, qr, kr = _arr(q), _arr(k), _arr(v), _arr(q_rope), _arr(k_rope)
    o, do, lse = _arr(o), _arr(do), _arr(lse)
    idx = _indices(indices)
    dq, dk = _out(q.shape, q.dtype), _out(k.shape, k.dtype)
    dv = _out(v.shape, v.dtype) if v is not None else None
    dqr = _out(qr.shape, qr.dtype) if qr is not None else None
    dkr = _out(kr.shape, kr.dtype) if kr is not None else None
    _lib.sfa_bwd(_desc("q", q), _desc("q_rope", qr), _desc("k", k), _desc("k_rope", kr), _desc("v", v),
                 _desc("o", o), _desc("dout", do), _desc("lse", lse), _desc("indices", idx),
                 sparse_block_size, _mode(causal), _lib.scale_arg(scale), _desc("dq", dq),
                 _desc("dq_rope", dqr), _desc("dk", dk), _desc("dk_rope", dkr), _desc("dv", dv), opt)
    return dq, dk, dv, dqr, dkr
