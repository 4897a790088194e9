"""torch.library custom ops over libspattn (namespace ``spattn``), with fake and autograd rules.

Ops (all outputs freshly allocated, contiguous):
  spattn::bsa_fwd(q, k, v, block_mask, bx, by, scale, deterministic=-1) -> (o, lse)
  spattn::bsa_bwd(q, k, v, block_mask, o, dout, lse, bx, by, scale, deterministic=-1)
      -> (dq, dk, dv)
  spattn::sfa_fwd(q, k, indices, v?, q_rope?, k_rope?, sbs, mode, scale, deterministic=-1)
      -> (o, lse)
  spattn::sfa_bwd(q, k, indices, v?, q_rope?, k_rope?, o, dout, lse, sbs, mode, scale,
                  deterministic=-1) -> (dq, dk, dv, dq_rope, dk_rope)
      (absent gradients are empty tensors)
``scale`` 0 means the library default.  CUDA tensors run on torch's current stream, with a
workspace from torch's caching allocator (``run``).
``deterministic`` is spattn_options.deterministic of the backward call: -1 (unset) the library
default (1, bitwise reproducible), 1, or 0 (faster CUDA backward kernels whose summation order
varies).  A forward op does not use it: it hands it to the backward op of its autograd node (an
op argument, so torch.compile keeps one graph).  The public functions pass 0 or 1 (their
``deterministic=None`` reads torch.are_deterministic_algorithms_enabled()).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from . import _lib
from ._lib import SpattnError

Tensor = torch.Tensor

_DTYPES = {
    torch.float32: _lib.F32,
    torch.float16: _lib.F16,
    torch.bfloat16: _lib.BF16,
    torch.int32: _lib.I32,
    torch.uint8: _lib.U8,
}


def as_mask(m: Tensor) -> Tensor:
    """A block mask as uint8 without a copy (bool and int8 are reinterpreted)."""
    if m.dtype in (torch.bool, torch.int8):
        return m.view(torch.uint8)
    return m


def _compiling() -> bool:
    f = getattr(torch.compiler, "is_compiling", None)
    return bool(f and f())


def as_indices(idx: Tensor) -> Tensor:
    """sfa indices as int32 (other integer dtypes are converted after a range check: a plain
    cast would turn 2**32 into key 0 and 2**32 - 1 into padding).  While torch.compile traces,
    they are left as they are: the op converts them on the real values when it runs."""
    if idx.dtype == torch.int32 or idx.dtype.is_floating_point or idx.dtype.is_complex \
            or idx.dtype == torch.bool:
        return idx  # int32 already, or a dtype the library rejects with a clear message
    if _compiling() or idx.device.type == "meta":
        return idx
    if idx.numel():
        lo, hi = (int(x) for x in torch.aminmax(idx))
        if lo < _lib.INT32_MIN or hi > _lib.INT32_MAX:
            bad = lo if lo < _lib.INT32_MIN else hi
            raise SpattnError(_lib.STATUS_BAD_INDEX,
                              f"indices: value {bad} does not fit in int32 (valid: -1 or a block "
                              "index in [0, ceil(S2/sbs)))", "SPATTN_STATUS_BAD_INDEX")
    return idx.to(torch.int32)


def _desc(name: str, t: Optional[Tensor]) -> Optional[_lib.SpattnTensor]:
    if t is None:
        return None
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise SpattnError(_lib.STATUS_BAD_DTYPE,
                          f"{name}: dtype {t.dtype} is not supported (float16, bfloat16, float32; int32 "
                          "indices; uint8 masks)", "SPATTN_STATUS_BAD_DTYPE")
    dev = t.device
    if dev.type == "cpu":
        dt, di = _lib.DEVICE_CPU, 0
    elif dev.type == "cuda":
        dt, di = _lib.DEVICE_CUDA, dev.index if dev.index is not None else torch.cuda.current_device()
    else:
        raise SpattnError(_lib.STATUS_BAD_DEVICE, f"{name}: device {dev} is not supported (cpu, cuda)",
                          "SPATTN_STATUS_BAD_DEVICE")
    return _lib.make_tensor(name, t.data_ptr(), code, tuple(t.shape), tuple(t.stride()), dt, di)


def _check_devices(named: List[Tuple[str, Optional[Tensor]]]) -> torch.device:
    ref_name, ref_t = named[0]
    assert ref_t is not None
    for name, t in named[1:]:
        if t is not None and t.device != ref_t.device:
            raise SpattnError(_lib.STATUS_BAD_DEVICE,
                              f"{name}: on {t.device}, expected the device of {ref_name} ({ref_t.device})",
                              "SPATTN_STATUS_BAD_DEVICE")
    return ref_t.device


def _fake_check_devices(named: List[Tuple[str, Optional[Tensor]]]) -> None:
    """The fake (meta) rule runs instead of the real op whenever any input is on `meta`: a mix of
    meta and real tensors must fail here, not return uninitialised outputs."""
    _check_devices(named)


def resolve_deterministic(deterministic: Optional[bool]) -> int:
    """The ops' ``deterministic`` argument from a public function's keyword: None reads
    torch.are_deterministic_algorithms_enabled() now (at the forward call: the autograd node
    keeps the value for its backward); True / False force 1 / 0."""
    if deterministic is None:
        return int(torch.are_deterministic_algorithms_enabled())
    return _lib.deterministic_arg(deterministic)


def check_deterministic(deterministic: int) -> int:
    """An op's ``deterministic``: -1 (unset: the library default), 0 or 1."""
    if deterministic == -1:
        return -1
    return _lib.deterministic_arg(deterministic)


def _opts(device: torch.device, deterministic: int = -1) -> _lib.SpattnOptions:
    """Options of a call on ``device``; ``deterministic`` -1 keeps the library default."""
    det = None if deterministic == -1 else deterministic
    if device.type == "cuda":
        return _lib.options(cuda_stream=torch.cuda.current_stream(device).cuda_stream, deterministic=det)
    return _lib.options(deterministic=det)


# Devices whose calls get their scratch from torch's caching allocator.  Without it the CUDA
# backend takes it from the default stream-ordered pool, which unmaps it at every synchronisation
# (release threshold 0): hundreds of MB re-mapped per call, several ms (bsa backward, H200).  The
# CPU backend mallocs its scratch itself, as torch would: CPU calls are left as they were.
WORKSPACE_DEVICES = ("cuda",)


def run(dev: torch.device, deterministic: int, size, call) -> None:
    """``call(opt)`` with the options of a call on ``dev`` (``deterministic`` as in _opts), on
    WORKSPACE_DEVICES with a workspace of ``size(opt)`` bytes (queried with the call's own
    options) from torch's caching allocator, so that the library allocates nothing.

    Dropping the tensor once the call returns is safe: the library enqueues its kernels on
    torch's current stream, and the allocator is stream-ordered, so only work queued after them
    on that stream reuses the memory."""
    opt = _opts(dev, deterministic)
    ws = None
    if dev.type in WORKSPACE_DEVICES:
        try:
            n = size(opt)
        except SpattnError:
            n = 0  # (the call reports what is wrong itself, as without a workspace)
        if n:
            ws = torch.empty(n, dtype=torch.uint8, device=dev)
            opt.workspace, opt.workspace_size = ws.data_ptr(), n
    call(opt)


def sfa_bwd_descs(q, q_rope, k, k_rope, v, o, dout, lse, idx, dq, dqr, dk, dkr, dv):
    """The descriptors of an sfa backward call (plain or varlen), grouped as its C signature:
    (q, q_rope, k, k_rope, v), (o, dout, lse), indices, (dq, dq_rope, dk, dk_rope, dv)."""
    ins = (_desc("q", q), _desc("q_rope", q_rope), _desc("k", k), _desc("k_rope", k_rope), _desc("v", v))
    fwd = _desc("o", o), _desc("dout", dout), _desc("lse", lse)
    grads = (_desc("dq", dq), _desc("dq_rope", dqr), _desc("dk", dk), _desc("dk_rope", dkr),
             _desc("dv", dv))
    return ins, fwd, _desc("indices", idx), grads


def _empty_like_shape(t: Tensor, shape, dtype=None) -> Tensor:
    return torch.empty(tuple(shape), dtype=dtype or t.dtype, device=t.device)


# ----------------------------------------------------------------------------------------------
# bsa
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("spattn::bsa_fwd", mutates_args=())
def bsa_fwd(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, bx: int, by: int,
            scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor]:
    check_deterministic(deterministic)  # (used by the backward only)
    m = as_mask(block_mask)
    dev = _check_devices([("q", q), ("k", k), ("v", v), ("block_mask", m)])
    o = _empty_like_shape(q, q.shape)
    lse = _empty_like_shape(q, q.shape[:-1], torch.float32)
    ins = _desc("q", q), _desc("k", k), _desc("v", v), _desc("block_mask", m)
    outs = _desc("o", o), _desc("lse", lse)
    run(dev, -1, lambda opt: _lib.bsa_workspace_size(*ins, bx, by, False, opt),
        lambda opt: _lib.bsa_fwd(*ins, bx, by, scale, *outs, opt))
    return o, lse


@bsa_fwd.register_fake
def _(q, k, v, block_mask, bx, by, scale, deterministic=-1):
    check_deterministic(deterministic)
    _fake_check_devices([("q", q), ("k", k), ("v", v), ("block_mask", block_mask)])
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("spattn::bsa_bwd", mutates_args=())
def bsa_bwd(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, o: Tensor, dout: Tensor, lse: Tensor,
            bx: int, by: int, scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor]:
    m = as_mask(block_mask)
    dev = _check_devices([("q", q), ("k", k), ("v", v), ("block_mask", m), ("o", o), ("dout", dout),
                          ("lse", lse)])
    dq, dk, dv = torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)
    ins = _desc("q", q), _desc("k", k), _desc("v", v), _desc("block_mask", m)
    rest = (_desc("o", o), _desc("dout", dout), _desc("lse", lse), _desc("dq", dq), _desc("dk", dk),
            _desc("dv", dv))
    run(dev, check_deterministic(deterministic),
        lambda opt: _lib.bsa_workspace_size(*ins, bx, by, True, opt),
        lambda opt: _lib.bsa_bwd(*ins, bx, by, scale, *rest, opt))
    return dq, dk, dv


@bsa_bwd.register_fake
def _(q, k, v, block_mask, o, dout, lse, bx, by, scale, deterministic=-1):
    check_deterministic(deterministic)
    _fake_check_devices([("q", q), ("k", k), ("v", v), ("block_mask", block_mask), ("o", o),
                         ("dout", dout), ("lse", lse)])
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _bsa_setup(ctx, inputs, output):
    q, k, v, block_mask, bx, by, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, block_mask, o, lse)
    ctx.bx, ctx.by, ctx.scale, ctx.deterministic = bx, by, scale, deterministic
    ctx.mark_non_differentiable(lse)


def _bsa_backward(ctx, grad_o, grad_lse):
    q, k, v, block_mask, o, lse = ctx.saved_tensors
    # o.sum().backward() hands an expanded (stride 0) grad_o: the CUDA kernels read dO by TMA
    # (contiguous rows), so make it a plain tensor (a no-op when it is one)
    grad_o = grad_o.contiguous()
    dq, dk, dv = bsa_bwd(q, k, v, block_mask, o, grad_o, lse, ctx.bx, ctx.by, ctx.scale,
                         ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None


bsa_fwd.register_autograd(_bsa_backward, setup_context=_bsa_setup)


# ----------------------------------------------------------------------------------------------
# sfa
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("spattn::sfa_fwd", mutates_args=())
def sfa_fwd(q: Tensor, k: Tensor, indices: Tensor, v: Optional[Tensor], q_rope: Optional[Tensor],
            k_rope: Optional[Tensor], sbs: int, mode: int, scale: float,
            deterministic: int = -1) -> Tuple[Tensor, Tensor]:
    check_deterministic(deterministic)  # (used by the backward only)
    idx = as_indices(indices)
    dev = _check_devices([("q", q), ("k", k), ("indices", idx), ("v", v), ("q_rope", q_rope),
                          ("k_rope", k_rope)])
    o = _empty_like_shape(q, q.shape)
    lse = _empty_like_shape(q, q.shape[:-1], torch.float32)
    ins = (_desc("q", q), _desc("q_rope", q_rope), _desc("k", k), _desc("k_rope", k_rope), _desc("v", v),
           _desc("indices", idx))
    outs = _desc("o", o), _desc("lse", lse)
    run(dev, -1, lambda opt: _lib.sfa_workspace_size(*ins, sbs, mode, False, opt),
        lambda opt: _lib.sfa_fwd(*ins, sbs, mode, scale, *outs, opt))
    return o, lse


@sfa_fwd.register_fake
def _(q, k, indices, v, q_rope, k_rope, sbs, mode, scale, deterministic=-1):
    check_deterministic(deterministic)
    _fake_check_devices([("q", q), ("k", k), ("indices", indices), ("v", v), ("q_rope", q_rope),
                         ("k_rope", k_rope)])
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("spattn::sfa_bwd", mutates_args=())
def sfa_bwd(q: Tensor, k: Tensor, indices: Tensor, v: Optional[Tensor], q_rope: Optional[Tensor],
            k_rope: Optional[Tensor], o: Tensor, dout: Tensor, lse: Tensor, sbs: int, mode: int,
            scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    idx = as_indices(indices)
    dev = _check_devices([("q", q), ("k", k), ("indices", idx), ("v", v), ("q_rope", q_rope),
                          ("k_rope", k_rope), ("o", o), ("dout", dout), ("lse", lse)])
    cf = torch.contiguous_format
    dq = torch.empty_like(q, memory_format=cf)
    dk = torch.empty_like(k, memory_format=cf)
    dv = torch.empty_like(v, memory_format=cf) if v is not None else None
    dqr = torch.empty_like(q_rope, memory_format=cf) if q_rope is not None else None
    dkr = torch.empty_like(k_rope, memory_format=cf) if k_rope is not None else None
    ins, fwd, idd, grads = sfa_bwd_descs(q, q_rope, k, k_rope, v, o, dout, lse, idx, dq, dqr, dk, dkr, dv)
    run(dev, check_deterministic(deterministic),
        lambda opt: _lib.sfa_workspace_size(*ins, idd, sbs, mode, True, opt),
        lambda opt: _lib.sfa_bwd(*ins, *fwd, idd, sbs, mode, scale, *grads, opt))
    empty = q.new_empty(0)
    return (dq, dk, dv if dv is not None else empty, dqr if dqr is not None else empty.clone(),
            dkr if dkr is not None else empty.clone())


@sfa_bwd.register_fake
def _(q, k, indices, v, q_rope, k_rope, o, dout, lse, sbs, mode, scale, deterministic=-1):
    check_deterministic(deterministic)
    _fake_check_devices([("q", q), ("k", k), ("indices", indices), ("v", v), ("q_rope", q_rope),
                         ("k_rope", k_rope), ("o", o), ("dout", dout), ("lse", lse)])

    def like(t):
        return t.new_empty(t.shape) if t is not None else q.new_empty(0)
    return like(q), like(k), like(v), like(q_rope), like(k_rope)


def _sfa_setup(ctx, inputs, output):
    q, k, indices, v, q_rope, k_rope, sbs, mode, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, indices, v, q_rope, k_rope, o, lse)
    ctx.sbs, ctx.mode, ctx.scale, ctx.deterministic = sbs, mode, scale, deterministic
    ctx.has_v, ctx.has_rope = v is not None, q_rope is not None
    ctx.mark_non_differentiable(lse)


def _sfa_backward(ctx, grad_o, grad_lse):
    q, k, indices, v, q_rope, k_rope, o, lse = ctx.saved_tensors
    grad_o = grad_o.contiguous()  # see _bsa_backward
    dq, dk, dv, dqr, dkr = sfa_bwd(q, k, indices, v, q_rope, k_rope, o, grad_o, lse, ctx.sbs, ctx.mode,
                                   ctx.scale, ctx.deterministic)
    return (dq, dk, None, dv if ctx.has_v else None, dqr if ctx.has_rope else None,
            dkr if ctx.has_rope else None, None, None, None, None)


sfa_fwd.register_autograd(_sfa_backward, setup_context=_sfa_setup)
