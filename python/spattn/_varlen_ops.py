"""torch.library custom ops of the packed variable-length / paged forms (namespace ``spattn``).

  spattn::bsa_fwd_varlen(q, k, v, block_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, block_table?, bx, by, scale, deterministic=-1) -> (o, lse)
  spattn::bsa_bwd_varlen(q, k, v, block_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, block_table?, o, dout, lse, bx, by, scale,
                         deterministic=-1) -> (dq, dk, dv)
  spattn::sfa_fwd_varlen(q, k, indices, v?, q_rope?, k_rope?, cu_seqlens_q, cu_seqlens_k,
                         max_seqlen_q, max_seqlen_k, block_table?, sbs, mode, scale,
                         deterministic=-1) -> (o, lse)
  spattn::sfa_bwd_varlen(..., block_table?, o, dout, lse, sbs, mode, scale, deterministic=-1)
      -> (dq, dk, dv, dq_rope, dk_rope)   (absent gradients are empty tensors)
``deterministic``: spattn_options.deterministic of the backward call, as in _ops (-1 = the
library default; the forward ops only hand it to their backward).

Packed tensors [T, N, D] (k/v pages [num_pages, page_size, Nkv, D] with block_table, and so
are their gradients: page rows no sequence uses get 0, a page shared by sequences the sum), LSE
[T, N].  The prefix sums stay where they are (int64 ones are converted to int32 on their
device): no host synchronisation.  Output rows past cu_seqlens_q[B] are 0 (LSE -inf).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _ops, _varlen
from ._ops import _check_devices, _desc, as_indices, as_mask, check_deterministic, run

_fake_check_devices = getattr(_ops, "_fake_check_devices", _check_devices)

Tensor = torch.Tensor


def _i32(t: Optional[Tensor]) -> Optional[Tensor]:
    if t is None or t.dtype == torch.int32 or t.dtype.is_floating_point:
        return t  # int32 already, or a dtype the library rejects with a clear message
    # Saturate instead of wrapping (2**32 must not become 0): a saturated prefix sum or page id
    # is out of range for any real tensor, so the library's validation rejects it, and no host
    # synchronisation is needed for a range check.
    return t.clamp(-2**31, 2**31 - 1).to(torch.int32)


def _vl(cq: Tensor, ck: Tensor, max_q: int, max_k: int, bt: Optional[Tensor]):
    d = (_desc("cu_seqlens_q", cq), _desc("cu_seqlens_k", ck), _desc("block_table", bt))
    return _varlen.varlen(d[0], d[1], max_q, max_k, d[2]), d  # keep the descriptors alive


def _lse_like(q: Tensor) -> Tensor:
    return torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)


# ----------------------------------------------------------------------------------------------
# bsa
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("spattn::bsa_fwd_varlen", mutates_args=())
def bsa_fwd_varlen(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                   block_table: Optional[Tensor], bx: int, by: int,
                   scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor]:
    check_deterministic(deterministic)  # (used by the backward only)
    m, cq, ck, bt = as_mask(block_mask), _i32(cu_seqlens_q), _i32(cu_seqlens_k), _i32(block_table)
    dev = _check_devices([("q", q), ("k", k), ("v", v), ("block_mask", m), ("cu_seqlens_q", cq),
                          ("cu_seqlens_k", ck), ("block_table", bt)])
    o, lse = torch.zeros_like(q, memory_format=torch.contiguous_format), _lse_like(q)
    vl, keep = _vl(cq, ck, max_seqlen_q, max_seqlen_k, bt)
    ins = _desc("q", q), _desc("k", k), _desc("v", v), _desc("block_mask", m)
    outs = _desc("o", o), _desc("lse", lse)
    run(dev, -1, lambda opt: _varlen.bsa_workspace_size(*ins, bx, by, vl, False, opt),
        lambda opt: _varlen.bsa_fwd(*ins, bx, by, scale, vl, *outs, opt))
    del keep
    return o, lse


@bsa_fwd_varlen.register_fake
def _(q, k, v, block_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
      bx, by, scale, deterministic=-1):
    check_deterministic(deterministic)
    _fake_check_devices([("q", q), ("k", k), ("v", v), ("block_mask", block_mask),
                         ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                         ("block_table", block_table)])
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("spattn::bsa_bwd_varlen", mutates_args=())
def bsa_bwd_varlen(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                   block_table: Optional[Tensor], o: Tensor, dout: Tensor, lse: Tensor, bx: int,
                   by: int, scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor]:
    m, cq, ck, bt = as_mask(block_mask), _i32(cu_seqlens_q), _i32(cu_seqlens_k), _i32(block_table)
    dev = _check_devices([("q", q), ("k", k), ("v", v), ("block_mask", m), ("cu_seqlens_q", cq),
                          ("cu_seqlens_k", ck), ("block_table", bt), ("o", o), ("dout", dout),
                          ("lse", lse)])
    cf = torch.contiguous_format
    dq = torch.zeros_like(q, memory_format=cf)
    # every dk / dv row is written (packed rows past cu_seqlens_k[B] and unused page rows: 0)
    dk, dv = torch.empty_like(k, memory_format=cf), torch.empty_like(v, memory_format=cf)
    vl, keep = _vl(cq, ck, max_seqlen_q, max_seqlen_k, bt)
    qkv = _desc("q", q), _desc("k", k), _desc("v", v)
    fwd = _desc("o", o), _desc("dout", dout), _desc("lse", lse)
    md = _desc("block_mask", m)
    grads = _desc("dq", dq), _desc("dk", dk), _desc("dv", dv)
    run(dev, check_deterministic(deterministic),
        lambda opt: _varlen.bsa_workspace_size(*qkv, md, bx, by, vl, True, opt),
        lambda opt: _varlen.bsa_bwd(*qkv, *fwd, md, bx, by, scale, vl, *grads, opt))
    del keep
    return dq, dk, dv


@bsa_bwd_varlen.register_fake
def _(q, k, v, block_mask, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
      o, dout, lse, bx, by, scale, deterministic=-1):
    check_deterministic(deterministic)
    _fake_check_devices([("q", q), ("k", k), ("v", v), ("block_mask", block_mask),
                         ("block_table", block_table), ("o", o), ("dout", dout), ("lse", lse)])
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _bsa_setup(ctx, inputs, output):
    q, k, v, block_mask, cq, ck, mq, mk, bt, bx, by, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, block_mask, cq, ck, bt, o, lse)
    ctx.args = (mq, mk, bx, by, scale, deterministic)
    ctx.mark_non_differentiable(lse)


def _bsa_backward(ctx, grad_o, grad_lse):
    q, k, v, block_mask, cq, ck, bt, o, lse = ctx.saved_tensors
    mq, mk, bx, by, scale, deterministic = ctx.args
    # o.sum().backward() hands an expanded (stride 0) grad_o: the CUDA varlen backward reads dO by
    # TMA only (contiguous rows; other views: NOT_SUPPORTED), so make it a plain tensor (a no-op
    # when it is one)
    grad_o = grad_o.contiguous()
    dq, dk, dv = bsa_bwd_varlen(q, k, v, block_mask, cq, ck, mq, mk, bt, o, grad_o, lse, bx, by,
                                scale, deterministic)
    return (dq, dk, dv) + (None,) * 10


bsa_fwd_varlen.register_autograd(_bsa_backward, setup_context=_bsa_setup)


# ----------------------------------------------------------------------------------------------
# sfa
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("spattn::sfa_fwd_varlen", mutates_args=())
def sfa_fwd_varlen(q: Tensor, k: Tensor, indices: Tensor, v: Optional[Tensor],
                   q_rope: Optional[Tensor], k_rope: Optional[Tensor], cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                   block_table: Optional[Tensor], sbs: int, mode: int,
                   scale: float, deterministic: int = -1) -> Tuple[Tensor, Tensor]:
    check_deterministic(deterministic)  # (used by the backward only)
    idx, cq, ck, bt = as_indices(indices), _i32(cu_seqlens_q), _i32(cu_seqlens_k), _i32(block_table)
    dev = _check_devices([("q", q), ("k", k), ("indices", idx), ("v", v), ("q_rope", q_rope),
                          ("k_rope", k_rope), ("cu_seqlens_q", cq), ("cu_seqlens_k", ck),
                          ("block_table", bt)])
    o, lse = torch.zeros_like(q, memory_format=torch.contiguous_format), _lse_like(q)
    vl, keep = _vl(cq, ck, max_seqlen_q, max_seqlen_k, bt)
    ins = (_desc("q", q), _desc("q_rope", q_rope), _desc("k", k), _desc("k_rope", k_rope), _desc("v", v),
           _desc("indices", idx))
    outs = _desc("o", o), _desc("lse", lse)
    run(dev, -1, lambda opt: _varlen.sfa_workspace_size(*ins, sbs, mode, vl, False, opt),
        lambda opt: _varlen.sfa_fwd(*ins, sbs, mode, scale, vl, *outs, opt))
    del keep
    return o, lse


@sfa_fwd_varlen.register_fake
def _(q, k, indices, v, q_rope, k_rope, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      block_table, sbs, mode, scale, deterministic=-1):
    check_deterministic(deterministic)
    _fake_check_devices([("q", q), ("k", k), ("indices", indices), ("v", v), ("q_rope", q_rope),
                         ("k_rope", k_rope), ("block_table", block_table)])
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("spattn::sfa_bwd_varlen", mutates_args=())
def sfa_bwd_varlen(q: Tensor, k: Tensor, indices: Tensor, v: Optional[Tensor],
                   q_rope: Optional[Tensor], k_rope: Optional[Tensor], cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                   block_table: Optional[Tensor], o: Tensor, dout: Tensor, lse: Tensor, sbs: int,
                   mode: int, scale: float,
                   deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    idx, cq, ck, bt = as_indices(indices), _i32(cu_seqlens_q), _i32(cu_seqlens_k), _i32(block_table)
    dev = _check_devices([("q", q), ("k", k), ("indices", idx), ("v", v), ("q_rope", q_rope),
                          ("k_rope", k_rope), ("cu_seqlens_q", cq), ("cu_seqlens_k", ck),
                          ("block_table", bt), ("o", o), ("dout", dout), ("lse", lse)])
    cf = torch.contiguous_format
    dq = torch.zeros_like(q, memory_format=cf)
    dk = torch.empty_like(k, memory_format=cf)
    dv = torch.empty_like(v, memory_format=cf) if v is not None else None
    dqr = torch.zeros_like(q_rope, memory_format=cf) if q_rope is not None else None
    dkr = torch.empty_like(k_rope, memory_format=cf) if k_rope is not None else None
    vl, keep = _vl(cq, ck, max_seqlen_q, max_seqlen_k, bt)
    ins, fwd, idd, grads = _ops.sfa_bwd_descs(q, q_rope, k, k_rope, v, o, dout, lse, idx, dq, dqr, dk,
                                              dkr, dv)
    run(dev, check_deterministic(deterministic),
        lambda opt: _varlen.sfa_workspace_size(*ins, idd, sbs, mode, vl, True, opt),
        lambda opt: _varlen.sfa_bwd(*ins, *fwd, idd, sbs, mode, scale, vl, *grads, opt))
    del keep
    empty = q.new_empty(0)
    return (dq, dk, dv if dv is not None else empty, dqr if dqr is not None else empty.clone(),
            dkr if dkr is not None else empty.clone())


@sfa_bwd_varlen.register_fake
def _(q, k, indices, v, q_rope, k_rope, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      block_table, o, dout, lse, sbs, mode, scale, deterministic=-1):
    check_deterministic(deterministic)

    def like(t):
        return t.new_empty(t.shape) if t is not None else q.new_empty(0)
    return like(q), like(k), like(v), like(q_rope), like(k_rope)


def _sfa_setup(ctx, inputs, output):
    q, k, indices, v, q_rope, k_rope, cq, ck, mq, mk, bt, sbs, mode, scale, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, indices, v, q_rope, k_rope, cq, ck, bt, o, lse)
    ctx.args = (mq, mk, sbs, mode, scale, deterministic)
    ctx.has_v, ctx.has_rope = v is not None, q_rope is not None
    ctx.mark_non_differentiable(lse)


def _sfa_backward(ctx, grad_o, grad_lse):
    q, k, indices, v, q_rope, k_rope, cq, ck, bt, o, lse = ctx.saved_tensors
    mq, mk, sbs, mode, scale, deterministic = ctx.args
    grad_o = grad_o.contiguous()  # see _bsa_backward
    dq, dk, dv, dqr, dkr = sfa_bwd_varlen(q, k, indices, v, q_rope, k_rope, cq, ck, mq, mk, bt, o,
                                          grad_o, lse, sbs, mode, scale, deterministic)
    return (dq, dk, None, dv if ctx.has_v else None, dqr if ctx.has_rope else None,
            dkr if ctx.has_rope else None) + (None,) * 9


sfa_fwd_varlen.register_autograd(_sfa_backward, setup_context=_sfa_setup)
