"""PyTorch functions with autograd (through the ``torch.ops.spattn`` custom ops)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from . import _lib
from . import _ops  # noqa: F401  (registers torch.ops.spattn.*)
from . import _plan_ops  # noqa: F401  (registers torch.ops.spattn.bsa_*_plan)
from .block_mask import BlockMask

Tensor = torch.Tensor

__all__ = ["block_sparse_attention", "sparse_flash_attention"]


def _pair(block_size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    return _lib.block_size_pair(block_size)


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, block_mask: Union[Tensor, BlockMask],
                           block_size: Union[int, Sequence[int]] = (64, 64), scale: Optional[float] = None,
                           return_lse: bool = False, *, cu_seqlens_q: Optional[Tensor] = None,
                           cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                           max_seqlen_k: Optional[int] = None, block_table: Optional[Tensor] = None,
                           deterministic: Optional[bool] = None):
    """Block-sparse attention, layout BNSD.

    q [B, N, Sq, D]; k, v [B, Nkv, Skv, D] (N % Nkv == 0); block_mask [B, N, ceil(Sq/bx),
    ceil(Skv/by)] (bool/uint8/int8, nonzero = attended); block_size (bx, by) or one int; scale
    None = 1/sqrt(D).  Returns o [B, N, Sq, D], or (o, lse [B, N, Sq] float32) with return_lse.
    Differentiable in q, k, v (lse is not differentiable).

    block_mask may be a spattn.BlockMask (spattn.create_block_mask): a reusable plan that
    carries the mask and its block size (block_size is then ignored); forward and backward use
    it, bitwise equal to passing the raw mask.

    Packed variable-length batch (cases/README.md): with cu_seqlens_q / cu_seqlens_k (int32 or
    int64 prefix sums [B+1], on q's device) q is [Tq, N, D], k, v [Tkv, Nkv, D], block_mask
    [B, N, ceil(max_seqlen_q/bx), ceil(max_seqlen_k/by)] (block indices restart per sequence),
    lse [Tq, N]; max_seqlen_* default to the mask's extent (no host read).  block_table int32
    [B, max_pages] makes k, v pages [num_pages, page_size, Nkv, D] (their gradients too: rows no
    sequence uses get 0, a page shared by sequences the sum).  CPU and CUDA tensors (on CUDA the
    shapes spattn.h lists for spattn_bsa_*_varlen; others raise SpattnNotSupportedError).

    deterministic (spattn_options.deterministic of the backward): None (default) reads
    torch.are_deterministic_algorithms_enabled() at this call (the value is kept for the
    backward of the result); True = bitwise reproducible gradients; False lets the CUDA backward
    use faster kernels whose summation order varies from run to run (dQ added in any order).  The
    forward and the CPU backend are deterministic either way.
    """
    det = _ops.resolve_deterministic(deterministic)
    if isinstance(block_mask, BlockMask):
        if cu_seqlens_q is not None or cu_seqlens_k is not None or block_table is not None:
            raise _lib.SpattnNotSupportedError(_lib.STATUS_NOT_SUPPORTED, "block_mask: a BlockMask (plan) "
                                               "does not take a packed variable-length batch; pass the raw mask")
        o, lse = torch.ops.spattn.bsa_fwd_plan(q, k, v, _plan_ops.plan_arg(block_mask), _lib.scale_arg(scale),
                                               det)
        return (o, lse) if return_lse else o
    if cu_seqlens_q is not None or cu_seqlens_k is not None or block_table is not None:
        from . import _varlen_api
        return _varlen_api.bsa(q, k, v, block_mask, block_size, scale, return_lse, cu_seqlens_q,
                               cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, det)
    bx, by = _pair(block_size)
    o, lse = torch.ops.spattn.bsa_fwd(q, k, v, _ops.as_mask(block_mask), bx, by, _lib.scale_arg(scale), det)
    return (o, lse) if return_lse else o


def sparse_flash_attention(q: Tensor, k: Tensor, indices: Tensor, v: Optional[Tensor] = None,
                           q_rope: Optional[Tensor] = None, k_rope: Optional[Tensor] = None,
                           sparse_block_size: int = 1, causal: bool = True, scale: Optional[float] = None,
                           return_lse: bool = False, *, cu_seqlens_q: Optional[Tensor] = None,
                           cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                           max_seqlen_k: Optional[int] = None, block_table: Optional[Tensor] = None,
                           deterministic: Optional[bool] = None):
    """Top-k sparse flash attention (sparse MLA), layout BSND.

    q [B, S1, N1, D], k [B, S2, N2, D], indices [B, S1, N2, K] int32 (-1 = padding; block index
    when sparse_block_size > 1); v None = shared key/value (v is k); q_rope/k_rope [.., Dr]
    optional (the score runs over D + Dr); causal True = right-down causal (mode 3); scale None =
    1/sqrt(D + Dr).  Returns o [B, S1, N1, D], or (o, lse [B, S1, N1] float32) with return_lse.

    Packed variable-length batch (cases/README.md): with cu_seqlens_q / cu_seqlens_k (prefix
    sums [B+1] on q's device) q is [Tq, N1, D], k [Tkv, N2, D], indices [Tq, N2, K] (block
    positions inside each sequence's own keys; causal uses each sequence's lengths), lse
    [Tq, N1].  block_table int32 [B, max_pages] makes k, v, k_rope pages [num_pages, page_size,
    N2, *] (forward and backward).  max_seqlen_* default to the token counts.  CPU and CUDA
    tensors.

    deterministic (spattn_options.deterministic of the backward): None (default) reads
    torch.are_deterministic_algorithms_enabled() at this call (the value is kept for the
    backward of the result); True = bitwise reproducible gradients; False lets the CUDA backward
    use fp32 atomics, whose summation order varies from run to run (both modes run on every CUDA
    shape).  The forward and the CPU backend are deterministic either way.
    """
    det = _ops.resolve_deterministic(deterministic)
    if cu_seqlens_q is not None or cu_seqlens_k is not None or block_table is not None:
        from . import _varlen_api
        return _varlen_api.sfa(q, k, indices, v, q_rope, k_rope, sparse_block_size, causal, scale,
                               return_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               block_table, det)
    if (q_rope is None) != (k_rope is None):
        raise ValueError("q_rope and k_rope must be given together")
    # indices go to the op as given: it converts them to int32 with a range check, on the real
    # values (also under torch.compile, where the op body runs eagerly)
    o, lse = torch.ops.spattn.sfa_fwd(q, k, indices, v, q_rope, k_rope,
                                      _lib.int_arg("sparse_block_size", sparse_block_size),
                                      _lib.SFA_MODE_CAUSAL if causal else _lib.SFA_MODE_NONE,
                                      _lib.scale_arg(scale), det)
    return (o, lse) if return_lse else o
