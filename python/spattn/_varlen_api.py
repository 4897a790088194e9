"""The packed variable-length / paged forms of spattn.block_sparse_attention and
spattn.sparse_flash_attention (called by them when cu_seqlens_q / cu_seqlens_k are given)."""
from __future__ import annotations

import operator
from typing import Optional

import torch

from . import _lib
from . import _varlen_ops  # noqa: F401  (registers torch.ops.spattn.*_varlen)
from ._ops import as_mask

Tensor = torch.Tensor


def _int(name: str, x) -> int:
    try:
        if isinstance(x, bool):
            raise TypeError
        return operator.index(x)
    except TypeError:
        raise ValueError(f"{name}: expected an integer, got {x!r}") from None


def _pair(block_size):
    if not isinstance(block_size, (tuple, list)):
        b = _int("block_size", block_size)
        return b, b
    if len(block_size) != 2:
        raise ValueError(f"block_size: expected an integer or (bx, by), got {block_size!r}")
    return _int("block_size[0]", block_size[0]), _int("block_size[1]", block_size[1])


def _need(cu_q, cu_k):
    if cu_q is None or cu_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (block_table needs them too)")


def bsa(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, block_size, scale, return_lse: bool,
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, deterministic: int = -1):
    _need(cu_seqlens_q, cu_seqlens_k)
    bx, by = _pair(block_size)
    m = as_mask(block_mask)
    # default bounds from the mask's shape [B, N, ceil(max_q/bx), ceil(max_k/by)]: no host read
    mq = _int("max_seqlen_q", max_seqlen_q) if max_seqlen_q is not None else m.shape[-2] * bx
    mk = _int("max_seqlen_k", max_seqlen_k) if max_seqlen_k is not None else m.shape[-1] * by
    o, lse = torch.ops.spattn.bsa_fwd_varlen(q, k, v, m, cu_seqlens_q, cu_seqlens_k, mq, mk,
                                             block_table, bx, by, _lib.scale_arg(scale), deterministic)
    return (o, lse) if return_lse else o


def sfa(q: Tensor, k: Tensor, indices: Tensor, v: Optional[Tensor], q_rope, k_rope, sbs, causal,
        scale, return_lse: bool, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table,
        deterministic: int = -1):
    _need(cu_seqlens_q, cu_seqlens_k)
    if (q_rope is None) != (k_rope is None):
        raise ValueError("q_rope and k_rope must be given together")
    # default bounds: the token counts (the page capacity with block_table), no host read
    mq = _int("max_seqlen_q", max_seqlen_q) if max_seqlen_q is not None else q.shape[0]
    if max_seqlen_k is not None:
        mk = _int("max_seqlen_k", max_seqlen_k)
    else:
        mk = block_table.shape[-1] * k.shape[1] if block_table is not None else k.shape[0]
    o, lse = torch.ops.spattn.sfa_fwd_varlen(q, k, indices, v, q_rope, k_rope, cu_seqlens_q,
                                             cu_seqlens_k, mq, mk, block_table,
                                             _int("sparse_block_size", sbs),
                                             _lib.SFA_MODE_CAUSAL if causal else _lib.SFA_MODE_NONE,
                                             _lib.scale_arg(scale), deterministic)
    return (o, lse) if return_lse else o
