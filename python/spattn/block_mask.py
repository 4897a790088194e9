"""Reusable bsa plans (spattn_bsa_plan_*), the counterpart of FlexAttention's ``BlockMask``.

``create_block_mask(mask, block_size, seq_lens, num_kv_heads)`` validates the block mask and
builds the library's plan once (on CUDA: the kernels' schedules on the device); the returned
:class:`BlockMask` goes to ``block_sparse_attention`` / ``bsa_forward`` / ``bsa_backward`` in
place of the raw mask, any number of times.  The plan keeps its own copy of the mask: the
object holds only the C handle and the shapes, and frees the plan in ``close()`` / on garbage
collection.  Results are bitwise identical to passing the raw mask.
"""
from __future__ import annotations

import ctypes
import importlib.util
import threading
import weakref
from typing import Optional, Sequence, Tuple, Union

from . import _lib
from ._lib import SpattnError

__all__ = ["BlockMask", "create_block_mask"]

# With torch >= 2.10 a BlockMask is a torch "opaque reference type": custom ops take it as an
# argument and torch.compile passes it into the graph as an input (see _plan_ops.py).
_Base: type = object
if importlib.util.find_spec("torch") is not None:
    try:
        from torch._opaque_base import OpaqueBase as _Base  # type: ignore[no-redef]
    except Exception:  # older (or broken) torch: _plan_ops.py passes the integer handle instead
        pass

_declared = False
_declare_lock = threading.Lock()
# live plans by handle (for the int-handle custom ops of torch < 2.10)
_LIVE: "weakref.WeakValueDictionary[int, BlockMask]" = weakref.WeakValueDictionary()


def plan_lib() -> ctypes.CDLL:
    """libspattn with the plan entry points declared."""
    global _declared
    h = _lib.lib()
    if _declared:
        return h
    with _declare_lock:
        PT, PO = ctypes.POINTER(_lib.SpattnTensor), ctypes.POINTER(_lib.SpattnOptions)
        i64, i32, dbl, vp = ctypes.c_int64, ctypes.c_int32, ctypes.c_double, ctypes.c_void_p
        try:
            h.spattn_bsa_plan_create.argtypes = [PT, i64, i64, i64, i64, i64, PO, ctypes.POINTER(vp)]
        except AttributeError:
            raise SpattnError(_lib.STATUS_NOT_SUPPORTED,
                              f"{_lib.library_path()} has no bsa plans (spattn_bsa_plan_create): "
                              "rebuild the library", "SPATTN_STATUS_NOT_SUPPORTED") from None
        h.spattn_bsa_plan_create.restype = ctypes.c_int
        h.spattn_bsa_plan_destroy.argtypes = [vp]
        h.spattn_bsa_plan_destroy.restype = None
        h.spattn_bsa_fwd_plan.argtypes = [vp, PT, PT, PT, dbl, PT, PT, PO]
        h.spattn_bsa_fwd_plan.restype = ctypes.c_int
        h.spattn_bsa_bwd_plan.argtypes = [vp, PT, PT, PT, PT, PT, PT, dbl, PT, PT, PT, PO]
        h.spattn_bsa_bwd_plan.restype = ctypes.c_int
        h.spattn_bsa_plan_workspace_size.argtypes = [vp, PT, PT, PT, i32, PO, ctypes.POINTER(ctypes.c_size_t)]
        h.spattn_bsa_plan_workspace_size.restype = ctypes.c_int
        _declared = True
    return h


class _Plan:
    """Owner of one spattn_bsa_plan* (shared by copies of a BlockMask, which torch.compile
    makes while tracing): destroyed once, when closed or when the last holder is gone."""

    __slots__ = ("handle", "__weakref__")

    def __init__(self, handle: int):
        self.handle = int(handle)

    def close(self) -> None:
        h, self.handle = self.handle, 0
        if h:
            # (CUDA: the library's cudaFree waits for kernels still using the plan)
            plan_lib().spattn_bsa_plan_destroy(h)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class BlockMask(_Base):
    """A block mask made into a reusable library plan (make one with :func:`create_block_mask`).

    Attributes: ``shape`` (B, N, ceil(Sq/bx), ceil(Skv/by)), ``block_size`` (bx, by),
    ``seq_lens`` (Sq, Skv), ``num_heads`` N, ``num_kv_heads`` Nkv, ``device`` ('cpu' or
    'cuda:<i>'), ``handle`` (the spattn_bsa_plan* as an int, 0 once closed).  q, k, v given with
    it must be [B, N, Sq, D] and [B, Nkv, Skv, D] on ``device``.  ``close()`` frees the plan
    (also on garbage collection; a call in flight or a pending backward keeps it alive).
    """

    def __init__(self, handle: int, shape: Tuple[int, int, int, int], block_size: Tuple[int, int],
                 seq_lens: Tuple[int, int], num_kv_heads: int, device: str):
        self._plan = _Plan(handle)
        self.shape = tuple(int(s) for s in shape)
        self.block_size = tuple(int(b) for b in block_size)
        self.seq_lens = tuple(int(s) for s in seq_lens)
        self.num_kv_heads = int(num_kv_heads)
        self.device = device
        _LIVE[self._plan.handle] = self

    @property
    def num_heads(self) -> int:
        return self.shape[1]

    @property
    def handle(self) -> int:
        return self._plan.handle

    @property
    def closed(self) -> bool:
        return not self._plan.handle

    def ptr(self) -> int:
        """The plan pointer for a library call (raises once closed)."""
        h = self._plan.handle
        if not h:
            raise SpattnError(100, "block_mask: this BlockMask was closed", "SPATTN_STATUS_NULL_POINTER")
        return h

    def close(self) -> None:
        """Free the library plan now (idempotent).  Later calls with this object raise."""
        _LIVE.pop(self._plan.handle, None)
        self._plan.close()

    def __copy__(self) -> "BlockMask":
        return self  # immutable: copies are the same plan

    def __deepcopy__(self, memo) -> "BlockMask":
        return self

    def __enter__(self) -> "BlockMask":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = ", closed" if self.closed else ""
        return (f"BlockMask(shape={self.shape}, block_size={self.block_size}, seq_lens={self.seq_lens}, "
                f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, device='{self.device}'{state})")


def _device_of_torch(t) -> Tuple[int, int, str]:
    dev = t.device
    if dev.type == "cpu":
        return _lib.DEVICE_CPU, 0, "cpu"
    if dev.type == "cuda":
        import torch
        i = dev.index if dev.index is not None else torch.cuda.current_device()
        return _lib.DEVICE_CUDA, i, f"cuda:{i}"
    raise SpattnError(_lib.STATUS_BAD_DEVICE, f"block_mask: device {dev} is not supported (cpu, cuda)",
                      "SPATTN_STATUS_BAD_DEVICE")


def create_block_mask(block_mask, block_size: Union[int, Sequence[int]] = (64, 64),
                      seq_lens: Optional[Sequence[int]] = None, num_kv_heads: Optional[int] = None, *,
                      device=None) -> BlockMask:
    """A reusable plan of ``block_mask`` for block_sparse_attention / bsa_forward / bsa_backward.

    block_mask: [B, N, ceil(Sq/bx), ceil(Skv/by)] bool/uint8/int8 (nonzero = attended), a NumPy
    array or a torch tensor (CPU or CUDA); the plan copies it, so it may change afterwards.
    block_size: (bx, by) or one int, as for block_sparse_attention.  seq_lens: (Sq, Skv); None
    means whole blocks (ceil(Sq/bx) * bx, ceil(Skv/by) * by).  num_kv_heads: Nkv (N % Nkv == 0);
    None means N.  device: where the plan lives (default: the mask's device); a mask elsewhere
    is copied there first (CUDA needs torch).  Errors raise SpattnError with the library's text.
    """
    bx, by = _lib.block_size_pair(block_size)
    is_torch = type(block_mask).__module__.startswith("torch") and hasattr(block_mask, "data_ptr")
    if not is_torch and device is not None and str(device) != "cpu":
        import torch
        block_mask, is_torch = torch.as_tensor(block_mask), True
    if is_torch:
        import torch
        m = block_mask
        if device is not None:
            m = m.to(device)
        if m.dtype in (torch.bool, torch.int8):
            m = m.view(torch.uint8)
        if m.dtype != torch.uint8:
            raise SpattnError(_lib.STATUS_BAD_DTYPE,
                              f"block_mask: dtype {m.dtype} is not supported (bool, uint8, int8)",
                              "SPATTN_STATUS_BAD_DTYPE")
        dt, di, dev_name = _device_of_torch(m)
        keep = m
        desc = _lib.make_tensor("block_mask", m.data_ptr(), _lib.U8, tuple(m.shape), tuple(m.stride()), dt, di)
        if dt == _lib.DEVICE_CUDA:
            opt = _lib.options(cuda_stream=torch.cuda.current_stream(m.device).cuda_stream)
        else:
            opt = _lib.options()
    else:
        import numpy as np
        from .numpy_api import _desc
        m = block_mask if isinstance(block_mask, np.ndarray) else np.asarray(block_mask)
        if m.dtype in (np.bool_, np.int8):
            m = m.view(np.uint8)
        keep = m
        desc = _desc("block_mask", m)
        dev_name = "cpu"
        opt = _lib.options()
    ndim = len(keep.shape)
    shape = tuple(int(s) for s in keep.shape)
    if seq_lens is None:
        sq = min(_lib.INT64_MAX, max(1, bx * shape[2])) if ndim == 4 and bx > 0 else 1
        skv = min(_lib.INT64_MAX, max(1, by * shape[3])) if ndim == 4 and by > 0 else 1
    else:
        if not isinstance(seq_lens, (tuple, list)) or len(seq_lens) != 2:
            raise SpattnError(_lib.STATUS_INVALID_VALUE, f"seq_lens: expected (Sq, Skv), got {seq_lens!r}")
        sq, skv = _lib.int_arg("seq_lens[0] (Sq)", seq_lens[0]), _lib.int_arg("seq_lens[1] (Skv)", seq_lens[1])
    if num_kv_heads is None:
        nkv = shape[1] if ndim >= 2 else 1
    else:
        nkv = _lib.int_arg("num_kv_heads", num_kv_heads)
    h = plan_lib()
    out = ctypes.c_void_p()
    _lib.check(h.spattn_bsa_plan_create(ctypes.byref(desc), bx, by, sq, skv, nkv, ctypes.byref(opt),
                                        ctypes.byref(out)))
    del keep  # the plan holds its own copy
    return BlockMask(out.value, shape, (bx, by), (sq, skv), nkv, dev_name)


# ---------------------------------------------------------------------------------------------
# library calls with a plan (descriptors built by the NumPy or torch layer)
# ---------------------------------------------------------------------------------------------
def fwd(plan: BlockMask, q, k, v, scale: float, o, lse, opt: _lib.SpattnOptions) -> None:
    r = _lib.ref
    _lib.check(plan_lib().spattn_bsa_fwd_plan(plan.ptr(), r(q), r(k), r(v), float(scale), r(o), r(lse),
                                              ctypes.byref(opt)))


def bwd(plan: BlockMask, q, k, v, o, dout, lse, scale: float, dq, dk, dv, opt: _lib.SpattnOptions) -> None:
    r = _lib.ref
    _lib.check(plan_lib().spattn_bsa_bwd_plan(plan.ptr(), r(q), r(k), r(v), r(o), r(dout), r(lse), float(scale),
                                              r(dq), r(dk), r(dv), ctypes.byref(opt)))


def workspace_size(plan: BlockMask, q, k, v, backward: bool, opt: _lib.SpattnOptions) -> int:
    """Bytes of caller workspace a forward (backward=False) or backward with the plan needs."""
    r = _lib.ref
    n = ctypes.c_size_t()
    _lib.check(plan_lib().spattn_bsa_plan_workspace_size(plan.ptr(), r(q), r(k), r(v), int(bool(backward)),
                                                         ctypes.byref(opt), ctypes.byref(n)))
    return int(n.value)
