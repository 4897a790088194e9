"""merge_attention_states: combine two partial attention results (split-KV, cascade, ring).

``merge_attention_states(o1, lse1, o2, lse2) -> (o, lse)`` takes NumPy arrays (CPU) or torch
tensors (CPU or CUDA; differentiable, ``torch.ops.spattn.merge_attention_states``):

    lse = log(exp(lse1) + exp(lse2)),   o = exp(lse1 - lse) * o1 + exp(lse2 - lse) * o2

o1, o2 ``[rows..., D]`` (any layout: BNSD with LSE [B,N,S], BSND with LSE [B,S,N], ...), fp16 /
bf16 / fp32 (each its own dtype; the result has the promoted dtype, fp32 when they differ);
lse1, lse2 ``[rows...]`` float32.  A row with LSE = -inf is empty in that input (its O is not
read); rows empty in both give O = 0, LSE = -inf.  Semantics: ``spattn_merge_attention_states``
in include/spattn.h.
"""
from __future__ import annotations

import ctypes
import threading

from . import _lib

__all__ = ["merge_attention_states"]

_declared = False
_decl_lock = threading.Lock()


def _fn():
    global _declared
    h = _lib.lib()
    if not _declared:
        with _decl_lock:
            pt = ctypes.POINTER(_lib.SpattnTensor)
            h.spattn_merge_attention_states_ex.argtypes = [pt, pt, pt, pt, pt, pt, ctypes.POINTER(_lib.SpattnOptions)]
            h.spattn_merge_attention_states_ex.restype = ctypes.c_int
            _declared = True
    return h.spattn_merge_attention_states_ex


def merge_descs(o1, lse1, o2, lse2, o, lse, opt: _lib.SpattnOptions) -> None:
    """The library call on descriptors (``o``/``lse`` may be the very views o1/lse1 or o2/lse2)."""
    r = _lib.ref
    _lib.check(_fn()(r(o1), r(lse1), r(o2), r(lse2), r(o), r(lse), ctypes.byref(opt)))


def _is_torch(x) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch")


def merge_attention_states_numpy(o1, lse1, o2, lse2, num_threads: int = 0):
    """NumPy version (CPU).  Returns (o, lse float32)."""
    import numpy as np

    from .numpy_api import _arr, _desc
    o1, lse1, o2, lse2 = _arr(o1), _arr(lse1), _arr(o2), _arr(lse2)
    dt = o1.dtype if o1.dtype == o2.dtype else np.dtype(np.float32)
    o = np.empty(o1.shape, dtype=dt)
    lse = np.empty(o1.shape[:-1], dtype=np.float32)
    merge_descs(_desc("o1", o1), _desc("lse1", lse1), _desc("o2", o2), _desc("lse2", lse2), _desc("o", o),
                _desc("lse", lse), _lib.options(num_threads=num_threads))
    return o, lse


def merge_attention_states(o1, lse1, o2, lse2):
    """Merge two attention states; see the module docstring.  Returns (o, lse)."""
    if _is_torch(o1):
        from . import _merge_ops  # noqa: F401  (registers torch.ops.spattn.merge_attention_states)
        import torch
        return torch.ops.spattn.merge_attention_states(o1, lse1, o2, lse2)
    return merge_attention_states_numpy(o1, lse1, o2, lse2)
