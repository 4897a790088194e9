"""torch.library custom op ``spattn::merge_attention_states(o1, lse1, o2, lse2) -> (o, lse)``
with fake and autograd rules (differentiable in o1, lse1, o2, lse2), and an in-place helper
the distributed ring uses."""
from __future__ import annotations

from typing import Tuple

import torch

from ._ops import _check_devices, _desc, _opts
from .merge import merge_descs

Tensor = torch.Tensor


def _out_dtype(o1: Tensor, o2: Tensor) -> torch.dtype:
    return o1.dtype if o1.dtype == o2.dtype else torch.float32


def merge_into(o1: Tensor, lse1: Tensor, o2: Tensor, lse2: Tensor, o: Tensor, lse: Tensor) -> None:
    """o, lse <- merge(o1, lse1, o2, lse2); o/lse may be the very tensors o1/lse1 (in place)."""
    dev = _check_devices([("o1", o1), ("lse1", lse1), ("o2", o2), ("lse2", lse2), ("o", o), ("lse", lse)])
    merge_descs(_desc("o1", o1), _desc("lse1", lse1), _desc("o2", o2), _desc("lse2", lse2), _desc("o", o),
                _desc("lse", lse), _opts(dev))


@torch.library.custom_op("spattn::merge_attention_states", mutates_args=())
def merge_attention_states(o1: Tensor, lse1: Tensor, o2: Tensor, lse2: Tensor) -> Tuple[Tensor, Tensor]:
    o = torch.empty(o1.shape, dtype=_out_dtype(o1, o2), device=o1.device)
    lse = torch.empty(o1.shape[:-1], dtype=torch.float32, device=o1.device)
    merge_into(o1, lse1, o2, lse2, o, lse)
    return o, lse


@merge_attention_states.register_fake
def _(o1, lse1, o2, lse2):
    return (o1.new_empty(o1.shape, dtype=_out_dtype(o1, o2)),
            o1.new_empty(o1.shape[:-1], dtype=torch.float32))


def _setup(ctx, inputs, output):
    o1, lse1, o2, lse2 = inputs
    o, lse = output
    ctx.save_for_backward(o1, lse1, o2, lse2, o, lse)
    ctx.dtypes = (o1.dtype, o2.dtype)


def _weight(lse_i: Tensor, lse: Tensor) -> Tensor:
    # exp(lse_i - lse), 0 where input i is empty (also when both are: lse = -inf)
    empty = lse_i == float("-inf")
    return torch.where(empty, torch.zeros_like(lse_i), torch.exp(torch.where(empty, lse, lse_i) - lse))


def _backward(ctx, grad_o, grad_lse):
    o1, lse1, o2, lse2, o, lse = ctx.saved_tensors
    go = grad_o.float() if grad_o is not None else torch.zeros(o.shape, device=o.device)
    gl = grad_lse if grad_lse is not None else torch.zeros_like(lse)
    of = o.float()
    grads = []
    for oi, li, dt in ((o1, lse1, ctx.dtypes[0]), (o2, lse2, ctx.dtypes[1])):
        a = _weight(li, lse)
        live = (a > 0).unsqueeze(-1)
        diff = torch.where(live, oi.float() - of, torch.zeros_like(of))
        d_o = (a.unsqueeze(-1) * go).to(dt)
        d_l = a * ((go * diff).sum(-1) + gl)
        grads += [d_o, d_l]
    return grads[0], grads[1], grads[2], grads[3]


merge_attention_states.register_autograd(_backward, setup_context=_setup)
