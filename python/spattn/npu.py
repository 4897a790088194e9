"""Drop-in wrappers with torch_npu's names, argument names and return structure.

Conventions (differences from torch_npu are errors, never silent):
  * Layouts: bsa "BNSD" and "TND"; sfa "BSND" and "TND" (q and kv layouts must match), and
    PageAttention for the sfa forward (block_table with layout_kv="PA_BSND": key/value
    [num_blocks, block_size, N2, D], query BSND (all rows) or TND).  TND and PA_BSND run as one
    packed variable-length library call (spattn_*_varlen: no loop over sequences, the lengths
    stay on their device); BNSD/BSND with shorter actual lengths run per batch.
    pre_tokens/next_tokens other than the default and sparse_mode other than 0/3 raise
    NotImplementedError naming the argument.
  * actual_seq_lengths*: bsa takes per-batch lengths (list or tensor); sfa takes per-batch
    lengths for BSND and prefix sums for TND (as torch_npu).  BNSD/BSND rows past a batch's
    length get O = 0, LSE = -inf and zero gradients.
  * scale_value 0.0 means the library default 1/sqrt(D) (1/sqrt(D + Dr) for sfa).
  * inner_precise is accepted (0 or 1) and ignored: accumulation is always fp32.
  * softmax_lse (bsa) is the natural-log LSE, fp32, shape [B, N, S, 1] (BNSD) / [T, N, 1] (TND);
    an empty tensor when softmax_lse_flag=0.
  * softmax_max / softmax_sum (sfa): softmax_max = LSE and softmax_sum = 1, both fp32 with
    torch_npu's shape [B, N2, S1, N1/N2] (BSND) / [N2, T1, N1/N2] (TND), so that
    softmax_max + log(softmax_sum) = LSE.  The grad accepts any such pair (also torch_npu's own
    max/sum).  Empty tensors when return_softmax_lse=False.
  * Absent rope gradients of npu_sparse_flash_attention_grad are empty tensors (as torch_npu).
  * deterministic (keyword, spattn's own; torch_npu has none): spattn_options.deterministic of
    the backward calls, as in spattn.block_sparse_attention.  None (default) reads
    torch.are_deterministic_algorithms_enabled() at the call (for the differentiable forwards:
    kept for their backward); True / False force it.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from . import _lib
from . import _ops  # noqa: F401  (registers torch.ops.spattn.*)
from . import _varlen_ops  # noqa: F401  (registers torch.ops.spattn.*_varlen)

Tensor = torch.Tensor
_MAX64 = 2 ** 63 - 1

__all__ = ["npu_block_sparse_attention", "npu_block_sparse_attention_backward",
           "npu_sparse_flash_attention", "npu_sparse_flash_attention_grad"]


# ----------------------------------------------------------------------------------------------
# helpers: per-batch segments for variable lengths and TND
# ----------------------------------------------------------------------------------------------
def _ints(name: str, x) -> Optional[List[int]]:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return [int(v) for v in x.reshape(-1).tolist()]
    try:
        return [int(v) for v in x]
    except TypeError:
        raise ValueError(f"{name}: expected a list of ints or a 1-D tensor, got {type(x).__name__}") from None


def _take(t: Tensor, kind: str, b: int, start: int, length: int) -> Tensor:
    """Batch b's first ``length`` tokens as a one-batch view (BNSD for bsa, BSND for sfa)."""
    if kind == "BNSD":
        return t[b:b + 1, :, :length]
    if kind == "BSND":
        return t[b:b + 1, :length]
    if kind == "TND_BNSD":
        return t[start:start + length].transpose(0, 1).unsqueeze(0)
    return t[start:start + length].unsqueeze(0)  # "TND" (sfa)


def _put(parts: List[Tensor], kind: str, full: int, fill: float) -> Tensor:
    """Inverse of _take over all batches; padded rows get ``fill``."""
    if kind in ("BNSD", "BSND"):
        dim = 2 if kind == "BNSD" else 1
        out = []
        for p in parts:
            if p.shape[dim] < full:
                shape = list(p.shape)
                shape[dim] = full - p.shape[dim]
                p = torch.cat([p, p.new_full(shape, fill)], dim)
            out.append(p)
        return torch.cat(out, 0)
    if kind == "TND_BNSD":
        return torch.cat([p[0].transpose(0, 1) for p in parts], 0)
    return torch.cat([p[0] for p in parts], 0)


def _segments(kind: str, batch: int, lens_q: Optional[List[int]], lens_k: Optional[List[int]],
              full_q: int, full_k: int, tnd_prefix: bool) -> List[Tuple[int, int, int, int, int]]:
    """(b, q_start, q_len, k_start, k_len) per batch."""
    tnd = kind.startswith("TND")
    if tnd:
        if lens_q is None or lens_k is None:
            raise ValueError("actual_seq_lengths (query and kv) are required with the TND layout")
        if tnd_prefix:
            lens_q = [b - a for a, b in zip([0] + lens_q[:-1], lens_q)]
            lens_k = [b - a for a, b in zip([0] + lens_k[:-1], lens_k)]
        if len(lens_q) != len(lens_k):
            raise ValueError("actual sequence lengths of query and kv must have the same length (B)")
        if sum(lens_q) != full_q or sum(lens_k) != full_k:
            raise ValueError(f"TND: the query/kv lengths sum to {sum(lens_q)}/{sum(lens_k)}, "
                             f"expected the token counts {full_q}/{full_k}")
    else:
        lens_q = lens_q if lens_q is not None else [full_q] * batch
        lens_k = lens_k if lens_k is not None else [full_k] * batch
        if len(lens_q) != batch or len(lens_k) != batch:
            raise ValueError(f"actual sequence lengths must have B={batch} entries")
        if any(not 0 <= L <= full_q for L in lens_q) or any(not 0 <= L <= full_k for L in lens_k):
            raise ValueError(f"actual sequence lengths must lie in [0, S] (S = {full_q} / {full_k})")
    segs, qs, ks = [], 0, 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq < 0 or lk < 0:
            raise ValueError("actual sequence lengths must be non-negative (and prefix sums non-decreasing)")
        segs.append((b, qs, lq, ks, lk))
        if tnd:
            qs, ks = qs + lq, ks + lk
    return segs


def _cu(name: str, x, device: torch.device, prefix: bool) -> Tensor:
    """int32 prefix sums [B+1] on ``device`` from per-batch lengths (prefix=False) or torch_npu's
    prefix sums without the leading 0 (prefix=True).  A tensor stays on its device: no host
    read; the library checks the values (non-decreasing, within the token counts)."""
    if x is None:
        raise ValueError(f"{name} is required with the TND / PA_BSND layouts")
    t = x if isinstance(x, torch.Tensor) else torch.tensor([int(v) for v in x], dtype=torch.int64)
    t = t.reshape(-1).to(device=device, dtype=torch.int64)
    if not prefix:
        t = torch.cumsum(t, 0)
    return torch.cat([t.new_zeros(1), t]).to(torch.int32)


def _is_full(segs, full_q: int, full_k: int) -> bool:
    return all(lq == full_q and lk == full_k for _, _, lq, _, lk in segs)


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def _bsa_common(query: Tensor, key: Tensor, block_shape, q_input_layout: str, kv_input_layout: str,
                num_key_value_heads: int):
    if q_input_layout not in ("BNSD", "TND"):
        raise ValueError(f"q_input_layout: must be 'BNSD' or 'TND', got {q_input_layout!r}")
    if kv_input_layout != q_input_layout:
        raise ValueError(f"kv_input_layout: must equal q_input_layout ({q_input_layout!r}), "
                         f"got {kv_input_layout!r}")
    if block_shape is None or len(block_shape) < 2:
        raise ValueError(f"block_shape: expected [blockShapeX, blockShapeY], got {block_shape!r}")
    bx = _lib.int_arg("block_shape[0]", block_shape[0])  # 16.9 is an error, not 16
    by = _lib.int_arg("block_shape[1]", block_shape[1])
    if bx <= 0 or by <= 0:
        raise ValueError(f"block_shape: values must be > 0, got {list(block_shape)}")
    nkv = key.shape[1] if q_input_layout == "BNSD" and key.dim() == 4 else \
        (key.shape[-2] if key.dim() >= 2 else -1)
    if int(num_key_value_heads) != nkv:
        raise ValueError(f"num_key_value_heads: {num_key_value_heads} does not match the heads of key ({nkv})")
    return bx, by


# ----------------------------------------------------------------------------------------------
# block-sparse attention
# ----------------------------------------------------------------------------------------------
def npu_block_sparse_attention(query: Tensor, key: Tensor, value: Tensor, block_sparse_mask: Tensor,
                               block_shape: Sequence[int], *, q_input_layout: str = "TND",
                               kv_input_layout: str = "TND", num_key_value_heads: int = 1,
                               scale_value: float = 0.0, inner_precise: int = 1,
                               actual_seq_lengths=None, actual_seq_lengths_kv=None,
                               softmax_lse_flag: int = 0,
                               deterministic: Optional[bool] = None) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_block_sparse_attention -> (attention_out, softmax_lse); differentiable."""
    bx, by = _bsa_common(query, key, block_shape, q_input_layout, kv_input_layout, num_key_value_heads)
    det = _ops.resolve_deterministic(deterministic)
    if inner_precise not in (0, 1):
        raise ValueError(f"inner_precise: must be 0 or 1, got {inner_precise}")
    if softmax_lse_flag not in (0, 1):
        raise ValueError(f"softmax_lse_flag: must be 0 or 1, got {softmax_lse_flag}")
    mask = _ops.as_mask(block_sparse_mask)
    scale = float(scale_value)
    bnsd = q_input_layout == "BNSD"
    if not bnsd:  # TND: one packed variable-length call
        cq = _cu("actual_seq_lengths", actual_seq_lengths, query.device, False)
        ck = _cu("actual_seq_lengths_kv", actual_seq_lengths_kv, query.device, False)
        o, lse = torch.ops.spattn.bsa_fwd_varlen(query, key, value, mask, cq, ck, mask.shape[-2] * bx,
                                                 mask.shape[-1] * by, None, bx, by, scale, det)
        softmax_lse = lse.unsqueeze(-1) if softmax_lse_flag else lse.new_empty(0)
        return o, softmax_lse
    kind = "BNSD"
    full_q, full_k = query.shape[2], key.shape[2]
    segs = _segments(kind, query.shape[0], _ints("actual_seq_lengths", actual_seq_lengths),
                     _ints("actual_seq_lengths_kv", actual_seq_lengths_kv), full_q, full_k, False)
    if _is_full(segs, full_q, full_k):
        o, lse = torch.ops.spattn.bsa_fwd(query, key, value, mask, bx, by, scale, det)
    else:
        os_, ls_ = [], []
        for b, qs, lq, ks, lk in segs:
            q_b = _take(query, kind, b, qs, lq)
            if lq == 0 or lk == 0:
                os_.append(torch.zeros_like(q_b))
                ls_.append(torch.full(q_b.shape[:-1], float("-inf"), device=query.device))
                continue
            o_b, l_b = torch.ops.spattn.bsa_fwd(
                q_b, _take(key, kind, b, ks, lk), _take(value, kind, b, ks, lk),
                mask[b:b + 1, :, :_ceil(lq, bx), :_ceil(lk, by)], bx, by, scale, det)
            os_.append(o_b)
            ls_.append(l_b)
        o = _put(os_, kind, full_q, 0.0)
        lse = _put([l_.unsqueeze(-1) for l_ in ls_], kind, full_q, float("-inf")).squeeze(-1)
    softmax_lse = lse.unsqueeze(-1) if softmax_lse_flag else lse.new_empty(0)
    return o, softmax_lse


def npu_block_sparse_attention_backward(d_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
                                        attention_out: Tensor, softmax_lse: Tensor,
                                        block_sparse_mask: Tensor, block_shape: Optional[Sequence[int]] = None,
                                        *, q_input_layout: str = "TND", kv_input_layout: str = "TND",
                                        num_key_value_heads: int = 1, scale_value: float = 0.0,
                                        actual_seq_lengths=None,
                                        actual_seq_lengths_kv=None,
                                        deterministic: Optional[bool] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_block_sparse_attention_backward -> (d_query, d_key, d_value)."""
    bx, by = _bsa_common(query, key, block_shape, q_input_layout, kv_input_layout, num_key_value_heads)
    det = _ops.resolve_deterministic(deterministic)
    mask = _ops.as_mask(block_sparse_mask)
    scale = float(scale_value)
    lse = softmax_lse.squeeze(-1) if softmax_lse.dim() == query.dim() and softmax_lse.shape[-1] == 1 \
        else softmax_lse
    bnsd = q_input_layout == "BNSD"
    if not bnsd:  # TND: one packed variable-length call
        cq = _cu("actual_seq_lengths", actual_seq_lengths, query.device, False)
        ck = _cu("actual_seq_lengths_kv", actual_seq_lengths_kv, query.device, False)
        return tuple(torch.ops.spattn.bsa_bwd_varlen(query, key, value, mask, cq, ck, mask.shape[-2] * bx,
                                                     mask.shape[-1] * by, None, attention_out, d_out, lse,
                                                     bx, by, scale, det))
    kind = "BNSD"
    full_q, full_k = query.shape[2], key.shape[2]
    segs = _segments(kind, query.shape[0], _ints("actual_seq_lengths", actual_seq_lengths),
                     _ints("actual_seq_lengths_kv", actual_seq_lengths_kv), full_q, full_k, False)
    if _is_full(segs, full_q, full_k):
        return tuple(torch.ops.spattn.bsa_bwd(query, key, value, mask, attention_out, d_out, lse, bx, by,
                                              scale, det))
    dqs, dks, dvs = [], [], []
    for b, qs, lq, ks, lk in segs:
        q_b, k_b, v_b = _take(query, kind, b, qs, lq), _take(key, kind, b, ks, lk), _take(value, kind, b, ks, lk)
        if lq == 0 or lk == 0:
            dqs.append(torch.zeros_like(q_b))
            dks.append(torch.zeros_like(k_b))
            dvs.append(torch.zeros_like(v_b))
            continue
        dq, dk, dv = torch.ops.spattn.bsa_bwd(
            q_b, k_b, v_b, mask[b:b + 1, :, :_ceil(lq, bx), :_ceil(lk, by)],
            _take(attention_out, kind, b, qs, lq), _take(d_out, kind, b, qs, lq),
            _take(lse, kind, b, qs, lq), bx, by, scale, det)
        dqs.append(dq)
        dks.append(dk)
        dvs.append(dv)
    return _put(dqs, kind, full_q, 0.0), _put(dks, kind, full_k, 0.0), _put(dvs, kind, full_k, 0.0)


# ----------------------------------------------------------------------------------------------
# sparse flash attention
# ----------------------------------------------------------------------------------------------
def _sfa_common(layout_query: str, layout_kv: str, sparse_mode: int, pre_tokens: int, next_tokens: int,
                attention_mode: int, query_rope, key_rope) -> Tuple[str, int]:
    if layout_query not in ("BSND", "TND"):
        raise ValueError(f"layout_query: must be 'BSND' or 'TND', got {layout_query!r}")
    if layout_kv != layout_query and layout_kv != "PA_BSND":
        raise ValueError(f"layout_kv: must equal layout_query ({layout_query!r}), got {layout_kv!r}")
    if sparse_mode not in (0, 3):
        raise NotImplementedError(f"sparse_mode={sparse_mode}: only 0 (none) and 3 (right-down causal) "
                                  "are supported")
    if pre_tokens != _MAX64:
        raise NotImplementedError("pre_tokens: only the default 2^63-1 is supported")
    if next_tokens != _MAX64:
        raise NotImplementedError("next_tokens: only the default 2^63-1 is supported")
    if attention_mode not in (0, 2):
        raise ValueError(f"attention_mode: must be 0 or 2, got {attention_mode}")
    if (query_rope is None) != (key_rope is None):
        raise ValueError("query_rope and key_rope must be given together")
    mode = _lib.SFA_MODE_CAUSAL if sparse_mode == 3 else _lib.SFA_MODE_NONE
    return ("BSND" if layout_query == "BSND" else "TND"), mode


def _sfa_segs(kind: str, query: Tensor, key: Tensor, lens_q, lens_k):
    bsnd = kind == "BSND"
    full_q = query.shape[1] if bsnd else query.shape[0]
    full_k = key.shape[1] if bsnd else key.shape[0]
    lq = _ints("actual_seq_lengths_query", lens_q)
    lk = _ints("actual_seq_lengths_kv", lens_k)
    batch = query.shape[0] if bsnd else len(lq or [])
    return _segments(kind, batch, lq, lk, full_q, full_k, True), full_q, full_k


def _seg_indices(idx: Tensor, kind: str, b: int, qs: int, lq: int, lk: int, full_k: int, sbs: int) -> Tensor:
    """Batch b's indices; in BSND, blocks past the batch's kv length (inside the padded buffer) -> -1."""
    i_b = _take(idx, kind, b, qs, lq)
    if kind == "BSND" and lk < full_k:
        nb, nfull = _ceil(lk, sbs), _ceil(full_k, sbs)
        i_b = torch.where((i_b >= nb) & (i_b < nfull), torch.full_like(i_b, -1), i_b)
    return i_b


def npu_sparse_flash_attention(query: Tensor, key: Tensor, value: Tensor, sparse_indices: Tensor,
                               scale_value: float, *, block_table: Optional[Tensor] = None,
                               actual_seq_lengths_query=None, actual_seq_lengths_kv=None,
                               query_rope: Optional[Tensor] = None, key_rope: Optional[Tensor] = None,
                               sparse_block_size: int = 1, layout_query: str = "BSND", layout_kv: str = "BSND",
                               sparse_mode: int = 3, pre_tokens: int = _MAX64, next_tokens: int = _MAX64,
                               attention_mode: int = 0,
                               return_softmax_lse: bool = False,
                               deterministic: Optional[bool] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_sparse_flash_attention -> (attention_out, softmax_max, softmax_sum); differentiable."""
    if (block_table is not None) != (layout_kv == "PA_BSND"):
        raise ValueError("block_table and layout_kv='PA_BSND' (PageAttention) go together")
    kind, mode = _sfa_common(layout_query, layout_kv, sparse_mode, pre_tokens, next_tokens, attention_mode,
                             query_rope, key_rope)
    idx = _ops.as_indices(sparse_indices)
    sbs, scale = _lib.int_arg("sparse_block_size", sparse_block_size), float(scale_value)
    det = _ops.resolve_deterministic(deterministic)
    shared = value is key
    if kind == "TND" or block_table is not None:  # one packed variable-length (paged) call
        dev = query.device
        q, qr, ix = query, query_rope, idx
        if kind == "BSND":  # PageAttention with BSND queries: every row of every batch
            if actual_seq_lengths_query is not None:
                raise NotImplementedError("actual_seq_lengths_query with layout_query='BSND' and "
                                          "block_table: use layout_query='TND'")
            b_, s1 = query.shape[0], query.shape[1]
            q, ix = query.flatten(0, 1), idx.flatten(0, 1)
            qr = None if query_rope is None else query_rope.flatten(0, 1)
            cq = (torch.arange(b_ + 1, device=dev, dtype=torch.int32) * s1)
        else:
            cq = _cu("actual_seq_lengths_query", actual_seq_lengths_query, dev, True)
        # kv: prefix sums with TND; per-batch lengths with pages (as torch_npu)
        ck = _cu("actual_seq_lengths_kv", actual_seq_lengths_kv, dev, block_table is None)
        mk = block_table.shape[-1] * key.shape[1] if block_table is not None else key.shape[0]
        o, lse = torch.ops.spattn.sfa_fwd_varlen(q, key, ix, None if shared else value, qr, key_rope,
                                                 cq, ck, q.shape[0], mk, block_table, sbs, mode, scale, det)
        if kind == "BSND":
            o, lse = o.unflatten(0, (b_, s1)), lse.unflatten(0, (b_, s1))
    else:  # BSND with per-batch lengths: one dense call per batch
        segs, full_q, full_k = _sfa_segs(kind, query, key, actual_seq_lengths_query, actual_seq_lengths_kv)
        if kind == "BSND" and _is_full(segs, full_q, full_k):
            o, lse = torch.ops.spattn.sfa_fwd(query, key, idx, None if shared else value, query_rope, key_rope,
                                              sbs, mode, scale, det)
        else:
            os_, ls_ = [], []
            for b, qs, lq, ks, lk in segs:
                q_b = _take(query, kind, b, qs, lq)
                if lq == 0 or lk == 0:
                    os_.append(torch.zeros_like(q_b))
                    ls_.append(torch.full(q_b.shape[:-1], float("-inf"), device=query.device))
                    continue
                k_b = _take(key, kind, b, ks, lk)
                o_b, l_b = torch.ops.spattn.sfa_fwd(
                    q_b, k_b, _seg_indices(idx, kind, b, qs, lq, lk, full_k, sbs),
                    None if shared else _take(value, kind, b, ks, lk),
                    None if query_rope is None else _take(query_rope, kind, b, qs, lq),
                    None if key_rope is None else _take(key_rope, kind, b, ks, lk), sbs, mode, scale, det)
                os_.append(o_b)
                ls_.append(l_b)
            o = _put(os_, kind, full_q, 0.0)
            lse = _put(ls_, kind, full_q, float("-inf"))
    if not return_softmax_lse:
        return o, lse.new_empty(0), lse.new_empty(0)
    n2 = key.shape[-2]
    if kind == "BSND":
        b_, s1, n1 = lse.shape
        smax = lse.reshape(b_, s1, n2, n1 // n2).permute(0, 2, 1, 3).contiguous()
    else:
        t1, n1 = lse.shape
        smax = lse.reshape(t1, n2, n1 // n2).permute(1, 0, 2).contiguous()
    return o, smax, torch.ones_like(smax)


def npu_sparse_flash_attention_grad(query: Tensor, key: Tensor, value: Tensor, sparse_indices: Tensor,
                                    d_out: Tensor, out: Tensor, softmax_max: Tensor, softmax_sum: Tensor,
                                    scale_value: float, sparse_block_size: int, *,
                                    query_rope: Optional[Tensor] = None, key_rope: Optional[Tensor] = None,
                                    actual_seq_qlen=None, actual_seq_kvlen=None, layout: str = "BSND",
                                    sparse_mode: int = 3, pre_tokens: int = _MAX64, next_tokens: int = _MAX64,
                                    attention_mode: int = 0, deterministic: Optional[bool] = None):
    """torch_npu.npu_sparse_flash_attention_grad -> (d_query, d_key, d_value, d_query_rope, d_key_rope).

    d_key and d_value are separate even when value is key (sum them for shared key/value).
    """
    kind, mode = _sfa_common(layout, layout, sparse_mode, pre_tokens, next_tokens, attention_mode,
                             query_rope, key_rope)
    idx = _ops.as_indices(sparse_indices)
    sbs, scale = _lib.int_arg("sparse_block_size", sparse_block_size), float(scale_value)
    det = _ops.resolve_deterministic(deterministic)
    lse4 = (softmax_max.float() + torch.log(softmax_sum.float()))
    if kind == "BSND":
        if lse4.dim() != 4:
            raise ValueError(f"softmax_max: expected [B, N2, S1, N1/N2], got {tuple(softmax_max.shape)}")
        b_, n2, s1, g = lse4.shape
        lse = lse4.permute(0, 2, 1, 3).reshape(b_, s1, n2 * g)
    else:
        if lse4.dim() != 3:
            raise ValueError(f"softmax_max: expected [N2, T1, N1/N2], got {tuple(softmax_max.shape)}")
        n2, t1, g = lse4.shape
        lse = lse4.permute(1, 0, 2).reshape(t1, n2 * g)
    if kind == "TND":  # one packed variable-length call
        cq = _cu("actual_seq_qlen", actual_seq_qlen, query.device, True)
        ck = _cu("actual_seq_kvlen", actual_seq_kvlen, query.device, True)
        dq, dk, dv, dqr, dkr = torch.ops.spattn.sfa_bwd_varlen(
            query, key, idx, value, query_rope, key_rope, cq, ck, query.shape[0], key.shape[0], None,
            out, d_out, lse, sbs, mode, scale, det)
        return (dq, dk, dv, dqr if query_rope is not None else query.new_empty(0),
                dkr if key_rope is not None else key.new_empty(0))
    segs, full_q, full_k = _sfa_segs(kind, query, key, actual_seq_qlen, actual_seq_kvlen)
    if _is_full(segs, full_q, full_k):
        dq, dk, dv, dqr, dkr = torch.ops.spattn.sfa_bwd(query, key, idx, value, query_rope, key_rope, out, d_out,
                                                        lse, sbs, mode, scale, det)
    else:
        parts = [[], [], [], [], []]
        for b, qs, lq, ks, lk in segs:
            q_b, k_b, v_b = _take(query, kind, b, qs, lq), _take(key, kind, b, ks, lk), _take(value, kind, b, ks, lk)
            qr_b = None if query_rope is None else _take(query_rope, kind, b, qs, lq)
            kr_b = None if key_rope is None else _take(key_rope, kind, b, ks, lk)
            if lq == 0 or lk == 0:
                g_b = [torch.zeros_like(t) if t is not None else None for t in (q_b, k_b, v_b, qr_b, kr_b)]
            else:
                g_b = list(torch.ops.spattn.sfa_bwd(
                    q_b, k_b, _seg_indices(idx, kind, b, qs, lq, lk, full_k, sbs), v_b, qr_b, kr_b,
                    _take(out, kind, b, qs, lq), _take(d_out, kind, b, qs, lq), _take(lse, kind, b, qs, lq),
                    sbs, mode, scale, det))
            for i in range(5):
                parts[i].append(g_b[i])
        dq = _put(parts[0], kind, full_q, 0.0)
        dk = _put(parts[1], kind, full_k, 0.0)
        dv = _put(parts[2], kind, full_k, 0.0)
        dqr = _put(parts[3], kind, full_q, 0.0) if query_rope is not None else query.new_empty(0)
        dkr = _put(parts[4], kind, full_k, 0.0) if key_rope is not None else key.new_empty(0)
    return dq, dk, dv, dqr, dkr
