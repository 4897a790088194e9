"""Independent float64 NumPy reference (dense, weight-matrix form) and input generators.

Attention with a non-negative integer weight W[b, h, i, j] (how many times query i attends key
j: 0/1 for bsa, occurrence counts for sfa's gather semantics):
  LSE_i = log sum_j W_ij exp(S_ij),  P_ij = W_ij exp(S_ij - LSE_i),  O = P V
and rows with no weight give O = 0, LSE = -inf, zero gradients.
"""
from __future__ import annotations

import numpy as np


def attention_fwd(q, k, v, w, scale):
    """q [B,H,Sq,Dk], k [B,H,Skv,Dk], v [B,H,Skv,Dv], w [B,H,Sq,Skv] -> (o, lse, p)."""
    q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    s_m = np.where(w > 0, s, -np.inf)
    mx = s_m.max(-1, keepdims=True)
    empty = ~np.isfinite(mx)
    mx = np.where(empty, 0.0, mx)
    e = w * np.exp(np.where(w > 0, s - mx, -np.inf))
    tot = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)
        lse = np.where(tot[..., 0] > 0, np.log(np.where(tot[..., 0] > 0, tot[..., 0], 1.0)) + mx[..., 0],
                       -np.inf)
    o = np.einsum("bhij,bhjd->bhid", p, v)
    return o, lse, p


def attention_bwd(q, k, v, p, o, do, scale):
    """Gradients (dq, dk, dv) of attention_fwd given P and O (float64)."""
    q, k, v, o, do = (np.asarray(x, np.float64) for x in (q, k, v, o, do))
    dv = np.einsum("bhij,bhid->bhjd", p, do)
    dp = np.einsum("bhid,bhjd->bhij", do, v)
    delta = (do * o).sum(-1, keepdims=True)
    ds = p * (dp - delta)
    dq = scale * np.einsum("bhij,bhjd->bhid", ds, k)
    dk = scale * np.einsum("bhij,bhid->bhjd", ds, q)
    return dq, dk, dv


def _expand(x, groups):
    return np.repeat(x, groups, axis=1)


def _reduce(dx, groups):
    b, h, s, d = dx.shape
    return dx.reshape(b, h // groups, groups, s, d).sum(2)


# ---------------------------------------------------------------------------------------------
# bsa (BNSD)
# ---------------------------------------------------------------------------------------------
def bsa_weights(mask, sq, skv, bx, by):
    m = (np.asarray(mask) != 0).astype(np.float64)
    return np.repeat(np.repeat(m, bx, axis=2)[:, :, :sq], by, axis=3)[:, :, :, :skv]


def bsa_ref(q, k, v, mask, bx, by, scale=None, do=None):
    """(o, lse) and, with do, (dq, dk, dv) in float64."""
    n, nkv, d = q.shape[1], k.shape[1], q.shape[3]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    g = n // nkv
    w = bsa_weights(mask, q.shape[2], k.shape[2], bx, by)
    ke, ve = _expand(k, g), _expand(v, g)
    o, lse, p = attention_fwd(q, ke, ve, w, scale)
    if do is None:
        return o, lse
    dq, dk, dv = attention_bwd(q, ke, ve, p, o, do, scale)
    return o, lse, dq, _reduce(dk, g), _reduce(dv, g)


def random_block_mask(rng, b, n, sq, skv, bx, by, density=0.5):
    nbx, nby = -(-sq // bx), -(-skv // by)
    m = (rng.random((b, n, nbx, nby)) < density).astype(np.uint8)
    return m


# ---------------------------------------------------------------------------------------------
# sfa (BSND)
# ---------------------------------------------------------------------------------------------
def sfa_weights(indices, s1, s2, n1, sbs, causal):
    """Occurrence counts W [B, N1, S1, S2] from indices [B, S1, N2, K]."""
    idx = np.asarray(indices)
    b, _, n2, kk = idx.shape
    g = n1 // n2
    w = np.zeros((b, n2, s1, s2))
    for bb in range(b):
        for i in range(s1):
            lim = s2 - s1 + i if causal else s2 - 1
            for h in range(n2):
                for x in idx[bb, i, h]:
                    if x < 0:
                        continue
                    for j in range(x * sbs, min((x + 1) * sbs, s2)):
                        if j <= lim:
                            w[bb, h, i, j] += 1
    return np.repeat(w, g, axis=1)


def sfa_ref(q, k, indices, v=None, q_rope=None, k_rope=None, sbs=1, causal=True, scale=None, do=None):
    """BSND inputs; returns (o, lse) and with do also (dq, dk, dv, dq_rope, dk_rope) (float64).

    With v None (shared key/value) dv is None and its contribution is inside dk.
    """
    t = lambda x: None if x is None else np.asarray(x, np.float64).transpose(0, 2, 1, 3)  # noqa: E731
    qt, kt, vt, qrt, krt = t(q), t(k), t(v), t(q_rope), t(k_rope)
    b, n1, s1, d = qt.shape
    n2, s2 = kt.shape[1], kt.shape[2]
    g = n1 // n2
    dr = 0 if qrt is None else qrt.shape[3]
    scale = 1.0 / np.sqrt(d + dr) if scale is None else scale
    qf = qt if qrt is None else np.concatenate([qt, qrt], -1)
    kf = kt if krt is None else np.concatenate([kt, krt], -1)
    vv = kt if vt is None else vt
    w = sfa_weights(indices, s1, s2, n1, sbs, causal)
    kfe, ve = _expand(kf, g), _expand(vv, g)
    o, lse, p = attention_fwd(qf, kfe, ve, w, scale)
    bt = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    if do is None:
        return bt(o), lse.transpose(0, 2, 1)
    dqf, dkf, dv = attention_bwd(qf, kfe, ve, p, o, t(do), scale)
    dkf, dv = _reduce(dkf, g), _reduce(dv, g)
    dk = dkf[..., :d].copy()
    if vt is None:
        dk += dv
        dv_out = None
    else:
        dv_out = bt(dv)
    dq_rope = None if qrt is None else bt(dqf[..., d:])
    dk_rope = None if krt is None else bt(dkf[..., d:])
    return bt(o), lse.transpose(0, 2, 1), bt(dqf[..., :d]), bt(dk), dv_out, dq_rope, dk_rope


def random_indices(rng, b, s1, s2, n2, kk, sbs=1, causal=True, pad_anywhere=True, duplicates=False):
    """Top-k indices per the spec: distinct allowed blocks incl. the newest, -1 padding."""
    nblk = -(-s2 // sbs)
    idx = np.full((b, s1, n2, kk), -1, np.int32)
    for bb in range(b):
        for i in range(s1):
            lim = s2 - s1 + i if causal else s2 - 1
            if lim < 0:
                continue
            last = min(lim // sbs, nblk - 1)
            for h in range(n2):
                allowed = np.arange(last + 1)
                take = min(kk, last + 1)
                others = rng.permutation(allowed[:-1])[: take - 1]
                row = np.concatenate([[last], others]).astype(np.int32)
                if duplicates and take >= 2:
                    row[-1] = row[0]
                slots = rng.permutation(kk)[:take] if pad_anywhere else np.arange(take)
                idx[bb, i, h, slots] = rng.permutation(row)
    return idx
