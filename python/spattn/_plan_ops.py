"""torch.library custom ops of bsa with a reusable plan (a spattn.BlockMask), fake and autograd.

  spattn::bsa_fwd_plan(q, k, v, plan, scale, deterministic=-1) -> (o, lse)
  spattn::bsa_bwd_plan(q, k, v, plan, o, dout, lse, scale, deterministic=-1) -> (dq, dk, dv)

``deterministic``: spattn_options.deterministic of the backward call, as in _ops (-1 = the
library default; the forward op only hands it to its backward).

With torch >= 2.10 ``plan`` is the BlockMask itself, registered as an opaque reference type:
torch.compile makes it a graph input (no recompilation for another plan of the same type) and
the autograd context keeps it alive until the backward.  Older torch gets the plan's integer
handle (a constant of the compiled graph), looked up among the live plans when the op runs.
"""
from __future__ import annotations

from typing import Tuple

import torch

from . import _ops
from . import block_mask as _bm
from ._lib import SpattnError
from .block_mask import BlockMask

Tensor = torch.Tensor

try:
    from torch._library.opaque_object import register_opaque_type
    from torch._opaque_base import OpaqueBase
    OPAQUE = issubclass(BlockMask, OpaqueBase)
    if OPAQUE:
        register_opaque_type(BlockMask, typ="reference")
except ImportError:  # torch < 2.10
    OPAQUE = False


def plan_arg(plan: BlockMask):
    """What the ops take for ``plan``: the object (opaque types) or its handle."""
    return plan if OPAQUE else plan.ptr()


def _resolve(plan) -> BlockMask:
    if isinstance(plan, BlockMask):
        return plan
    obj = _bm._LIVE.get(int(plan))
    if obj is None:
        raise SpattnError(100, "block_mask: this BlockMask was closed", "SPATTN_STATUS_NULL_POINTER")
    return obj


def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, plan, scale: float,
              deterministic: int = -1) -> Tuple[Tensor, Tensor]:
    _ops.check_deterministic(deterministic)  # (used by the backward only)
    pl = _resolve(plan)
    dev = _ops._check_devices([("q", q), ("k", k), ("v", v)])
    o = _ops._empty_like_shape(q, q.shape)
    lse = _ops._empty_like_shape(q, q.shape[:-1], torch.float32)
    qd, kd, vd = _ops._desc("q", q), _ops._desc("k", k), _ops._desc("v", v)
    od, ld = _ops._desc("o", o), _ops._desc("lse", lse)
    # (with the caller workspace nothing is allocated: CUDA-graph capturable)
    _ops.run(dev, -1, lambda opt: _bm.workspace_size(pl, qd, kd, vd, False, opt),
             lambda opt: _bm.fwd(pl, qd, kd, vd, scale, od, ld, opt))
    return o, lse


def _bwd_impl(q: Tensor, k: Tensor, v: Tensor, plan, o: Tensor, dout: Tensor, lse: Tensor,
              scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor]:
    det = _ops.check_deterministic(deterministic)
    pl = _resolve(plan)
    dev = _ops._check_devices([("q", q), ("k", k), ("v", v), ("o", o), ("dout", dout), ("lse", lse)])
    cf = torch.contiguous_format
    dq, dk, dv = (torch.empty_like(q, memory_format=cf), torch.empty_like(k, memory_format=cf),
                  torch.empty_like(v, memory_format=cf))
    d = _ops._desc
    qd, kd, vd = d("q", q), d("k", k), d("v", v)
    rest = d("o", o), d("dout", dout), d("lse", lse), scale, d("dq", dq), d("dk", dk), d("dv", dv)
    _ops.run(dev, det, lambda opt: _bm.workspace_size(pl, qd, kd, vd, True, opt),
             lambda opt: _bm.bwd(pl, qd, kd, vd, *rest, opt))
    return dq, dk, dv


if OPAQUE:
    def _fwd(q: Tensor, k: Tensor, v: Tensor, plan: BlockMask, scale: float,
             deterministic: int = -1) -> Tuple[Tensor, Tensor]:
        return _fwd_impl(q, k, v, plan, scale, deterministic)

    def _bwd(q: Tensor, k: Tensor, v: Tensor, plan: BlockMask, o: Tensor, dout: Tensor, lse: Tensor,
             scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor]:
        return _bwd_impl(q, k, v, plan, o, dout, lse, scale, deterministic)
else:
    def _fwd(q: Tensor, k: Tensor, v: Tensor, plan: int, scale: float,
             deterministic: int = -1) -> Tuple[Tensor, Tensor]:
        return _fwd_impl(q, k, v, plan, scale, deterministic)

    def _bwd(q: Tensor, k: Tensor, v: Tensor, plan: int, o: Tensor, dout: Tensor, lse: Tensor,
             scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor]:
        return _bwd_impl(q, k, v, plan, o, dout, lse, scale, deterministic)

bsa_fwd_plan = torch.library.custom_op("spattn::bsa_fwd_plan", _fwd, mutates_args=())
bsa_bwd_plan = torch.library.custom_op("spattn::bsa_bwd_plan", _bwd, mutates_args=())


@bsa_fwd_plan.register_fake
def _(q, k, v, plan, scale, deterministic=-1):
    _ops.check_deterministic(deterministic)
    _ops._fake_check_devices([("q", q), ("k", k), ("v", v)])
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@bsa_bwd_plan.register_fake
def _(q, k, v, plan, o, dout, lse, scale, deterministic=-1):
    _ops.check_deterministic(deterministic)
    _ops._fake_check_devices([("q", q), ("k", k), ("v", v), ("o", o), ("dout", dout), ("lse", lse)])
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx, inputs, output):
    q, k, v, plan, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.plan, ctx.scale, ctx.deterministic = plan, scale, deterministic
    # int handles (old torch): hold the BlockMask so that it outlives the backward
    ctx.plan_obj = None if OPAQUE else _bm._LIVE.get(int(plan))
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    grad_o = grad_o.contiguous()  # o.sum().backward(): an expanded grad_o (see _ops._bsa_backward)
    dq, dk, dv = bsa_bwd_plan(q, k, v, ctx.plan, o, grad_o, lse, ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None


bsa_fwd_plan.register_autograd(_backward, setup_context=_setup)
