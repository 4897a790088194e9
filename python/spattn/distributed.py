"""Context parallelism for spattn on torch.distributed (NCCL on GPUs, gloo on CPUs).

Every rank of a process group holds one shard of the sequence (queries and keys/values alike,
self-attention: global Sq == Skv == S).  With ``load_balance=True`` (the default, PyTorch's
head-tail balancing for causal masks) the sequence is cut into 2W chunks of L = S / (2W) tokens
and rank r holds chunks r and 2W-1-r back to back; with ``load_balance=False`` rank r holds the
r-th of W contiguous chunks.  ``shard``/``unshard``/``shard_positions`` convert.

Operators (autograd, torch.compile(fullgraph=True) keeps one graph):

* ``sparse_flash_attention`` (sfa, BSND): all-gathers the key shards (k, k_rope, v side by side
  in one buffer, one collective) with ``spattn::cp_gather_seq`` (backward: fp32 reduce-scatter
  of dK/dV), runs the ordinary sfa op
  per local chunk against the keys up to that chunk (causal limits stay global), ``indices``
  hold GLOBAL key (block) positions.
* ``block_sparse_attention`` (bsa, BNSD), the GLOBAL block mask on every rank:
  ``mode="allgather"``: all-gathers k and v, runs the local query rows against all keys with
  the local mask rows; ``mode="ring"``: ``spattn::cp_bsa_ring_fwd/bwd``.  At ring step t rank r
  receives the key/value shard of rank r-t (sent directly, double-buffered) only when the
  mask blocks between its rows and those columns are not all empty: steps (and chunk pairs)
  without work are skipped entirely, computation and communication.  Partial results are
  merged with their LSE (``merge_attention_states``) into an fp32 accumulator.  The backward
  reuses the global O and LSE; each partial dK/dV goes back to its owner in fp32.

Constraints: every rank's shard has the same length; L (the chunk) is a multiple of the block
sizes bx and by (bsa).  Collectives run on torch's current stream (NCCL) as ordinary
synchronous torch.distributed calls; with NCCL call ``torch.cuda.set_device`` first.
"""
from __future__ import annotations

import itertools
import weakref
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from . import _lib
from . import _ops  # noqa: F401  (registers torch.ops.spattn.*)
from ._merge_ops import merge_into

Tensor = torch.Tensor

__all__ = ["shard", "unshard", "shard_positions", "sparse_flash_attention", "block_sparse_attention",
           "RingMask", "create_ring_mask"]


# ----------------------------------------------------------------------------------------------
# groups and shard layout
# ----------------------------------------------------------------------------------------------
def _pg(group_name: str):
    return dist.distributed_c10d._resolve_process_group(group_name)


def _group_name(group) -> str:
    pg = group if group is not None else dist.group.WORLD
    return pg.group_name


def _chunks(rank: int, world: int, load_balance: bool) -> List[int]:
    """Global chunk ids rank `rank` holds, in local order."""
    return [rank, 2 * world - 1 - rank] if load_balance else [rank]


def _nchunks(world: int, load_balance: bool) -> int:
    return 2 * world if load_balance else world


def _rank_order_perm(world: int, load_balance: bool) -> List[int]:
    """perm[c] = position of global chunk c in the rank-ordered (all-gathered) chunk list."""
    pos = {}
    for r in range(world):
        for j, c in enumerate(_chunks(r, world, load_balance)):
            pos[c] = len(pos)
    return [pos[c] for c in range(_nchunks(world, load_balance))]


def _rank_world(group) -> Tuple[int, int]:
    pg = group if group is not None else dist.group.WORLD
    return dist.get_rank(pg), dist.get_world_size(pg)


def shard_positions(seq_len: int, group=None, load_balance: bool = True, rank: Optional[int] = None,
                    world: Optional[int] = None) -> Tensor:
    """Global token positions (int64) of this rank's shard, in local order."""
    if rank is None or world is None:
        rank, world = _rank_world(group)
    n = _nchunks(world, load_balance)
    if seq_len % n:
        raise ValueError(f"seq_len={seq_len} must be a multiple of {n} chunks (world {world}, "
                         f"load_balance={load_balance})")
    L = seq_len // n
    return torch.cat([torch.arange(c * L, (c + 1) * L) for c in _chunks(rank, world, load_balance)])


def shard(x: Tensor, dim: int, group=None, load_balance: bool = True) -> Tensor:
    """This rank's shard of a full-sequence tensor (every rank holds all of x), contiguous."""
    rank, world = _rank_world(group)
    n = _nchunks(world, load_balance)
    S = x.shape[dim]
    if S % n:
        raise ValueError(f"x: dimension {dim} ({S}) must be a multiple of {n} chunks")
    L = S // n
    return torch.cat([x.narrow(dim, c * L, L) for c in _chunks(rank, world, load_balance)], dim).contiguous()


def unshard(x: Tensor, dim: int, group=None, load_balance: bool = True) -> Tensor:
    """The full sequence in global order from every rank's shard (all-gather; differentiable,
    the backward reduce-scatters in fp32)."""
    return torch.ops.spattn.cp_gather_seq(x, dim % x.dim(), load_balance, _group_name(group))


# ----------------------------------------------------------------------------------------------
# sequence all-gather / reduce-scatter as custom ops with autograd
# ----------------------------------------------------------------------------------------------
def _gather_impl(x: Tensor, dim: int, load_balance: bool, pg) -> Tensor:
    world = dist.get_world_size(pg)
    xm = x.movedim(dim, 0).contiguous()
    out = xm.new_empty((world * xm.shape[0],) + tuple(xm.shape[1:]))
    dist.all_gather_into_tensor(out, xm, group=pg)
    n = _nchunks(world, load_balance)
    perm = _rank_order_perm(world, load_balance)
    if perm != list(range(n)):
        L = out.shape[0] // n
        idx = torch.tensor(perm, device=out.device)
        out = out.view((n, L) + tuple(xm.shape[1:])).index_select(0, idx).view(out.shape)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter_impl(g: Tensor, dim: int, load_balance: bool, pg, dtype: torch.dtype) -> Tensor:
    world = dist.get_world_size(pg)
    gm = g.to(torch.float32).movedim(dim, 0)
    n = _nchunks(world, load_balance)
    perm = _rank_order_perm(world, load_balance)
    S = gm.shape[0]
    L = S // n
    if perm != list(range(n)):
        inv = [0] * n
        for c, p in enumerate(perm):
            inv[p] = c
        idx = torch.tensor(inv, device=gm.device)
        gm = gm.reshape((n, L) + tuple(gm.shape[1:])).index_select(0, idx).view((S,) + tuple(gm.shape[1:]))
    gm = gm.contiguous()
    out = gm.new_empty((S // world,) + tuple(gm.shape[1:]))
    dist.reduce_scatter_tensor(out, gm, op=dist.ReduceOp.SUM, group=pg)
    return out.to(dtype).movedim(0, dim).contiguous()


@torch.library.custom_op("spattn::cp_gather_seq", mutates_args=())
def cp_gather_seq(x: Tensor, dim: int, load_balance: bool, group_name: str) -> Tensor:
    """All-gather of the sequence dimension `dim` into global order."""
    return _gather_impl(x, dim, load_balance, _pg(group_name))


@cp_gather_seq.register_fake
def _(x, dim, load_balance, group_name):
    world = dist.get_world_size(_pg(group_name))
    shape = list(x.shape)
    shape[dim] *= world
    return x.new_empty(shape)


@torch.library.custom_op("spattn::cp_reduce_scatter_seq", mutates_args=())
def cp_reduce_scatter_seq(g: Tensor, dim: int, load_balance: bool, group_name: str,
                          like: Tensor) -> Tensor:
    """Sum over ranks (in fp32) of a global-order tensor, scattered back to the shards; the
    result has the dtype of `like` (only its dtype is used)."""
    return _reduce_scatter_impl(g, dim, load_balance, _pg(group_name), like.dtype)


@cp_reduce_scatter_seq.register_fake
def _(g, dim, load_balance, group_name, like):
    world = dist.get_world_size(_pg(group_name))
    shape = list(g.shape)
    shape[dim] //= world
    return g.new_empty(shape, dtype=like.dtype)


def _gather_setup(ctx, inputs, output):
    x, dim, load_balance, group_name = inputs
    ctx.dim, ctx.lb, ctx.name = dim, load_balance, group_name
    ctx.save_for_backward(x.new_empty(0))


def _gather_backward(ctx, grad):
    (like,) = ctx.saved_tensors
    return cp_reduce_scatter_seq(grad.contiguous(), ctx.dim, ctx.lb, ctx.name, like), None, None, None


cp_gather_seq.register_autograd(_gather_backward, setup_context=_gather_setup)


# ----------------------------------------------------------------------------------------------
# sfa
# ----------------------------------------------------------------------------------------------
def sparse_flash_attention(q: Tensor, k: Tensor, indices: Tensor, v: Optional[Tensor] = None,
                           q_rope: Optional[Tensor] = None, k_rope: Optional[Tensor] = None,
                           sparse_block_size: int = 1, causal: bool = True, scale: Optional[float] = None,
                           return_lse: bool = False, *, group=None, load_balance: bool = True,
                           deterministic: Optional[bool] = None):
    """Context-parallel ``spattn.sparse_flash_attention`` (BSND).

    q [B, Sl, N1, D], q_rope [B, Sl, N1, Dr], indices [B, Sl, N2, K]: this rank's query shard,
    indices holding GLOBAL key (block) positions; k [B, Sl, N2, D], k_rope, v: this rank's
    key shard (same sharding).  ``causal`` is the global right-down causal mask of the
    self-attention (key j allowed for query i iff j <= i, positions global).  Returns the local
    o [B, Sl, N1, D] (and lse [B, Sl, N1]).  Gradients flow to the local q, k, v, rope shards.
    ``deterministic``: spattn_options.deterministic of this rank's library backward calls, as in
    spattn.sparse_flash_attention (None: torch.are_deterministic_algorithms_enabled() at this call).
    """
    if (q_rope is None) != (k_rope is None):
        raise ValueError("q_rope and k_rope must be given together")
    name = _group_name(group)
    rank, world = _rank_world(group)
    Sl = q.shape[1]
    if k.shape[1] != Sl:
        raise ValueError(f"k: local sequence length {k.shape[1]} differs from q's {Sl} (self-attention shards)")
    S = Sl * world
    n = _nchunks(world, load_balance)
    if S % n:
        raise ValueError(f"global sequence {S} must be a multiple of {n} chunks")
    L = S // n
    sbs = int(sparse_block_size)
    scale_arg = _lib.scale_arg(scale)
    det = _ops.resolve_deterministic(deterministic)
    idx = _ops.as_indices(indices)
    # one all-gather for the whole key side: [k | k_rope | v] along the last dimension (the sfa
    # op takes the column views of the gathered buffer without copies)
    parts = [x for x in (k, k_rope, v) if x is not None]
    cols = [x.shape[-1] for x in parts]
    kall = cp_gather_seq(parts[0] if len(parts) == 1 else torch.cat(parts, -1), 1, load_balance, name)
    views = list(torch.split(kall, cols, -1))
    kf = views.pop(0)
    kr = views.pop(0) if k_rope is not None else None
    vf = views.pop(0) if v is not None else None
    if not causal:
        o, lse = torch.ops.spattn.sfa_fwd(q, kf, idx, vf, q_rope, kr, sbs, _lib.SFA_MODE_NONE, scale_arg, det)
    else:
        os_, ls_ = [], []
        for j, c in enumerate(_chunks(rank, world, load_balance)):
            end = (c + 1) * L  # keys [0, end) hold every allowed key of this chunk
            nb = (end + sbs - 1) // sbs
            ic = idx[:, j * L:(j + 1) * L]
            # blocks at or past nb are past every row's causal limit: padding is equivalent
            ic = torch.where(ic >= nb, torch.full_like(ic, -1), ic)
            # right-down causal on (S1' = L, S2' = end): j <= end - L + i = global position of row i
            oc, lc = torch.ops.spattn.sfa_fwd(
                q[:, j * L:(j + 1) * L], kf[:, :end], ic, vf[:, :end] if vf is not None else None,
                q_rope[:, j * L:(j + 1) * L] if q_rope is not None else None,
                kr[:, :end] if kr is not None else None, sbs, _lib.SFA_MODE_CAUSAL, scale_arg, det)
            os_.append(oc)
            ls_.append(lc)
        o, lse = (os_[0], ls_[0]) if len(os_) == 1 else (torch.cat(os_, 1), torch.cat(ls_, 1))
    return (o, lse) if return_lse else o


# ----------------------------------------------------------------------------------------------
# bsa
# ----------------------------------------------------------------------------------------------
def _pair(block_size) -> Tuple[int, int]:
    if isinstance(block_size, int):
        return block_size, block_size
    return int(block_size[0]), int(block_size[1])


def _bsa_layout(q: Tensor, k: Tensor, mask: Tensor, bx: int, by: int, world: int, load_balance: bool):
    Sl = q.shape[2]
    if k.shape[2] != Sl:
        raise ValueError(f"k: local sequence length {k.shape[2]} differs from q's {Sl} (self-attention shards)")
    S = Sl * world
    n = _nchunks(world, load_balance)
    if S % n or (S // n) % bx or (S // n) % by:
        raise ValueError(f"the chunk length S/{n} = {S / n:g} (S = {S}) must be a multiple of bx={bx} and "
                         f"by={by}")
    L = S // n
    want = (q.shape[0], q.shape[1], S // bx, S // by)
    if tuple(mask.shape) != want:
        raise ValueError(f"block_mask: expected the global mask {list(want)} [B, N, S/bx, S/by], got "
                         f"{list(mask.shape)}")
    return S, L, n


def _local_mask_rows(mask: Tensor, chunks: Sequence[int], Lx: int) -> Tensor:
    rows = [mask[:, :, c * Lx:(c + 1) * Lx] for c in chunks]
    return rows[0] if len(rows) == 1 else torch.cat(rows, 2)


def block_sparse_attention(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor,
                           block_size: Union[int, Sequence[int]] = (64, 64), scale: Optional[float] = None,
                           return_lse: bool = False, *, group=None, mode: str = "ring",
                           load_balance: bool = True, deterministic: Optional[bool] = None):
    """Context-parallel ``spattn.block_sparse_attention`` (BNSD).

    q [B, N, Sl, D], k, v [B, Nkv, Sl, D]: this rank's shards; block_mask: the GLOBAL mask
    [B, N, S/bx, S/by] (S = W * Sl; the same on every rank; stride-0 expanded views are fine),
    or a :class:`RingMask` of it (:func:`create_ring_mask`: the ring's work map and plans built
    once, reused by every call).  ``mode``: "ring" (overlapped ring, skips empty steps),
    "allgather", or "ring_v1" (the previous ring schedule, kept for comparison: a kernel and a
    merge per chunk pair, buffers allocated per step).  Returns the local o (and lse).
    ``deterministic``: spattn_options.deterministic of this rank's library backward calls, as in
    spattn.block_sparse_attention (None: torch.are_deterministic_algorithms_enabled() at this call).
    """
    bx, by = _pair(block_size)
    name = _group_name(group)
    rank, world = _rank_world(group)
    rmask = block_mask if isinstance(block_mask, RingMask) else None
    m = rmask.mask if rmask is not None else _ops.as_mask(block_mask)
    S, L, n = _bsa_layout(q, k, m, bx, by, world, load_balance)
    scale_arg = _lib.scale_arg(scale)
    det = _ops.resolve_deterministic(deterministic)
    if mode == "ring":
        if rmask is None and not _ops._compiling():
            # built here (one host sync) so that the forward and the backward share it; while
            # torch.compile traces, the op builds it when it runs
            rmask = RingMask(m, bx, by, k.shape[1], load_balance, name, plans=False)
        pid = rmask.id if rmask is not None else 0
        o, lse = torch.ops.spattn.cp_bsa_ring_fwd(q, k, v, m, bx, by, scale_arg, load_balance, name, pid, det)
    elif mode == "ring_v1":
        o, lse = torch.ops.spattn.cp_bsa_ring_v1_fwd(q, k, v, m, bx, by, scale_arg, load_balance, name, det)
    elif mode == "allgather":
        kf = cp_gather_seq(k, 2, load_balance, name)
        vf = cp_gather_seq(v, 2, load_balance, name)
        ml = _local_mask_rows(m, _chunks(rank, world, load_balance), L // bx)
        o, lse = torch.ops.spattn.bsa_fwd(q, kf, vf, ml, bx, by, scale_arg, det)
    else:
        raise ValueError(f"mode: 'ring', 'allgather' or 'ring_v1', got {mode!r}")
    return (o, lse) if return_lse else o


class _Ring:
    """Shard layout and the work map of one ring call.

    Chunks are L tokens (Lx block rows, Ly block columns).  For query chunk a and key chunk c,
    [lo[a][c], hi[a][c]) is the range of block columns of c that some block row of a attends
    (hi = 0: none).  A transfer from src to dst carries, per key chunk of src, only the union of
    these ranges over dst's query chunks, packed back to back along the sequence."""

    def __init__(self, q: Tensor, k: Tensor, mask: Tensor, bx: int, by: int, load_balance: bool, group_name: str):
        self.pg = _pg(group_name)
        self.rank, self.world = dist.get_rank(self.pg), dist.get_world_size(self.pg)
        S, L, n = _bsa_layout(q, k, mask, bx, by, self.world, load_balance)
        self.L, self.Lx, self.Ly, self.by, self.lb = L, L // bx, L // by, by, load_balance
        nz = mask.ne(0).any(0).any(0)                                   # [S/bx, S/by]
        cols = nz.view(n, self.Lx, n, self.Ly).any(1)                   # [a, c, Ly]
        ar = torch.arange(self.Ly, device=cols.device)
        lo = torch.where(cols, ar, self.Ly).amin(-1)
        hi = torch.where(cols, ar + 1, 0).amax(-1)
        lohi = torch.stack([lo, hi]).cpu().tolist()                     # one sync
        self.lo, self.hi = lohi

    def chunks(self, r: int) -> List[int]:
        return _chunks(r, self.world, self.lb)

    def ranges(self, dst: int, src: int) -> List[Tuple[int, int, int, int, int]]:
        """(local chunk i of src, global chunk c, lo, hi, offset in tokens in the packed buffer)."""
        out, off = [], 0
        for i, c in enumerate(self.chunks(src)):
            live = [a for a in self.chunks(dst) if self.hi[a][c] > 0]
            if not live:
                continue
            lo, hi = min(self.lo[a][c] for a in live), max(self.hi[a][c] for a in live)
            out.append((i, c, lo, hi, off))
            off += (hi - lo) * self.by
        return out

    def full_ranges(self, r: int) -> List[Tuple[int, int, int, int, int]]:
        """The local shard itself seen as a packed buffer (step 0)."""
        return [(i, c, 0, self.Ly, i * self.L) for i, c in enumerate(self.chunks(r))]

    def pairs(self, dst: int, rngs) -> List[Tuple[slice, slice, slice, int, int]]:
        """Work of dst on a packed buffer: (query rows, packed key tokens, mask cols, a, c)."""
        out = []
        for j, a in enumerate(self.chunks(dst)):
            for i, c, lo, hi, off in rngs:
                if self.hi[a][c] == 0:
                    continue
                l0, h0 = self.lo[a][c], self.hi[a][c]  # tighter than the packed range
                ks = slice(off + (l0 - lo) * self.by, off + (h0 - lo) * self.by)
                out.append((slice(j * self.L, (j + 1) * self.L), ks,
                            slice(c * self.Ly + l0, c * self.Ly + h0), a, c))
        return out

    def peer(self, r: int) -> int:
        return dist.get_global_rank(self.pg, r)

    def exchange(self, send: List[Tensor], to: Optional[int], recv: List[Tensor], frm: Optional[int], tag: int):
        ops = []
        if to is not None:
            ops += [dist.P2POp(dist.isend, t, self.peer(to), self.pg, tag + i) for i, t in enumerate(send)]
        if frm is not None:
            ops += [dist.P2POp(dist.irecv, t, self.peer(frm), self.pg, tag + i) for i, t in enumerate(recv)]
        return dist.batch_isend_irecv(ops) if ops else []


def _pack(x: Tensor, rngs, L: int, by: int) -> Tensor:
    parts = [x[:, :, i * L + lo * by:i * L + hi * by] for i, c, lo, hi, off in rngs]
    return (parts[0] if len(parts) == 1 else torch.cat(parts, 2)).contiguous()


def _packed_len(rngs, by: int) -> int:
    return sum((hi - lo) * by for i, c, lo, hi, off in rngs)


def _kv_step(ring: _Ring, t: int, k: Tensor, v: Tensor):
    """Posts step t of the key/value exchange: the needed part of our shard to rank r+t, that of
    rank r-t in.  Returns (requests, [k, v] buffers or [] when nothing comes, their ranges)."""
    r, W, L, by = ring.rank, ring.world, ring.L, ring.by
    dst, src = (r + t) % W, (r - t) % W
    out_r, in_r = ring.ranges(dst, r), ring.ranges(r, src)
    send = [_pack(k, out_r, L, by), _pack(v, out_r, L, by)] if out_r else []
    n = _packed_len(in_r, by)
    bufs = [k.new_empty(k.shape[:2] + (n,) + k.shape[3:]),
            v.new_empty(v.shape[:2] + (n,) + v.shape[3:])] if in_r else []
    reqs = ring.exchange(send, dst if send else None, bufs, src if bufs else None, 4 * t)
    return reqs, bufs, in_r


def _ring_v1_fwd_impl(q, k, v, mask, bx, by, scale, load_balance, group_name):
    ring = _Ring(q, k, mask, bx, by, load_balance, group_name)
    r, W, Lx = ring.rank, ring.world, ring.Lx
    k, v = k.contiguous(), v.contiguous()
    acc_o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    acc_l = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    pending = {0: ([], [k, v], ring.full_ranges(r))}
    for t in range(W):
        if t + 1 < W:
            pending[t + 1] = _kv_step(ring, t + 1, k, v)
        reqs, bufs, rngs = pending.pop(t)
        for req in reqs:
            req.wait()
        if not bufs:
            continue  # nothing attended in this step: skipped (no transfer, no kernel)
        kt, vt = bufs
        for qs, ks, ms, a, c in ring.pairs(r, rngs):
            mp = mask[:, :, a * Lx:(a + 1) * Lx, ms]
            op, lp = torch.ops.spattn.bsa_fwd(q[:, :, qs], kt[:, :, ks], vt[:, :, ks], mp, bx, by, scale)
            ao, al = acc_o[:, :, qs], acc_l[:, :, qs]
            merge_into(ao, al, op, lp, ao, al)
    return acc_o.to(q.dtype), acc_l


@torch.library.custom_op("spattn::cp_bsa_ring_v1_fwd", mutates_args=())
def cp_bsa_ring_v1_fwd(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, bx: int, by: int, scale: float,
                       load_balance: bool, group_name: str, deterministic: int = -1) -> Tuple[Tensor, Tensor]:
    _ops.check_deterministic(deterministic)  # (used by the backward only)
    return _ring_v1_fwd_impl(q, k, v, block_mask, bx, by, scale, load_balance, group_name)


@cp_bsa_ring_v1_fwd.register_fake
def _(q, k, v, block_mask, bx, by, scale, load_balance, group_name, deterministic=-1):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _ring_v1_bwd_impl(q, k, v, mask, o, dout, lse, bx, by, scale, load_balance, group_name, deterministic=-1):
    ring = _Ring(q, k, mask, bx, by, load_balance, group_name)
    r, W, L, Lx = ring.rank, ring.world, ring.L, ring.Lx
    k, v = k.contiguous(), v.contiguous()
    f32 = torch.float32
    dq = torch.zeros(q.shape, dtype=f32, device=q.device)
    dk = torch.zeros(k.shape, dtype=f32, device=k.device)
    dv = torch.zeros(v.shape, dtype=f32, device=v.device)
    pending = {0: ([], [k, v], ring.full_ranges(r))}
    in_flight = None  # (requests, received packed dK/dV, their ranges) of the previous step

    def settle(g):
        if g is None:
            return
        reqs, got, rngs = g
        for req in reqs:
            req.wait()
        for i, c, lo, hi, off in rngs:
            n = (hi - lo) * by
            dk[:, :, i * L + lo * by:i * L + hi * by] += got[0][:, :, off:off + n]
            dv[:, :, i * L + lo * by:i * L + hi * by] += got[1][:, :, off:off + n]

    for t in range(W):
        if t + 1 < W:
            pending[t + 1] = _kv_step(ring, t + 1, k, v)
        reqs, bufs, rngs = pending.pop(t)
        for req in reqs:
            req.wait()
        src, dst = (r - t) % W, (r + t) % W
        if bufs:
            kt, vt = bufs
            pdk, pdv = (dk, dv) if t == 0 else (torch.zeros(kt.shape, dtype=f32, device=kt.device),
                                                torch.zeros(vt.shape, dtype=f32, device=vt.device))
            for qs, ks, ms, a, c in ring.pairs(r, rngs):
                mp = mask[:, :, a * Lx:(a + 1) * Lx, ms]
                gq, gk, gv = torch.ops.spattn.bsa_bwd(q[:, :, qs], kt[:, :, ks], vt[:, :, ks], mp, o[:, :, qs],
                                                      dout[:, :, qs], lse[:, :, qs], bx, by, scale,
                                                      deterministic)
                dq[:, :, qs] += gq
                pdk[:, :, ks] += gk
                pdv[:, :, ks] += gv
        if t > 0:
            # partial dK/dV (fp32, packed like the keys we got) go home to rank r-t; those of
            # our own keys come back from rank r+t
            back = ring.ranges(dst, r)
            n = _packed_len(back, by)
            got = [torch.empty(k.shape[:2] + (n,) + k.shape[3:], dtype=f32, device=k.device),
                   torch.empty(v.shape[:2] + (n,) + v.shape[3:], dtype=f32, device=v.device)] if back else []
            greqs = ring.exchange([pdk, pdv] if bufs else [], src if bufs else None, got, dst if got else None,
                                  4 * t + 2)
            settle(in_flight)
            in_flight = (greqs, got, back)
    settle(in_flight)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@torch.library.custom_op("spattn::cp_bsa_ring_v1_bwd", mutates_args=())
def cp_bsa_ring_v1_bwd(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, o: Tensor, dout: Tensor, lse: Tensor,
                       bx: int, by: int, scale: float, load_balance: bool,
                       group_name: str, deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor]:
    return _ring_v1_bwd_impl(q, k, v, block_mask, o, dout, lse, bx, by, scale, load_balance, group_name,
                             _ops.check_deterministic(deterministic))


@cp_bsa_ring_v1_bwd.register_fake
def _(q, k, v, block_mask, o, dout, lse, bx, by, scale, load_balance, group_name, deterministic=-1):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _ring_v1_setup(ctx, inputs, output):
    q, k, v, block_mask, bx, by, scale, load_balance, group_name, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, block_mask, o, lse)
    ctx.args = (bx, by, scale, load_balance, group_name, deterministic)
    ctx.mark_non_differentiable(lse)


def _ring_v1_backward(ctx, grad_o, grad_lse):
    q, k, v, block_mask, o, lse = ctx.saved_tensors
    dq, dk, dv = cp_bsa_ring_v1_bwd(q, k, v, block_mask, o, grad_o.contiguous(), lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


cp_bsa_ring_v1_fwd.register_autograd(_ring_v1_backward, setup_context=_ring_v1_setup)


# ----------------------------------------------------------------------------------------------
# bsa ring, overlapped schedule (mode="ring"): a work map and one library plan per step, built
# once; double-buffered asynchronous point-to-point; one kernel call and one in-place merge per
# step; buffers reused across steps
# ----------------------------------------------------------------------------------------------
_RING_LIVE: "weakref.WeakValueDictionary[int, RingMask]" = weakref.WeakValueDictionary()
_RING_IDS = itertools.count(1)


class _Step:
    """Step t of the ring on this rank: keys of rank src come in (packed ranges `recv`, `nrecv`
    tokens), ours go to rank dst (`send`, `nsend` tokens; the partial dK/dV of the backward
    come back from dst in the same layout).  `mask`: the step's block mask (local query rows
    [r0, r1) x the packed key columns; step 0: all local rows), None when this rank has no work
    in the step; `plan`: its library plan (RingMask made with plans, else None: plain calls)."""

    __slots__ = ("t", "src", "dst", "recv", "nrecv", "send", "nsend", "mask", "mdesc", "plan", "r0", "r1")

    def __init__(self, t, src, dst, recv, nrecv, send, nsend):
        self.t, self.src, self.dst, self.recv, self.nrecv = t, src, dst, recv, nrecv
        self.send, self.nsend = send, nsend
        self.mask = self.mdesc = self.plan = None
        self.r0 = self.r1 = 0  # query rows (local tokens) of the step's kernel

    @property
    def work(self) -> bool:
        return self.mask is not None


class RingMask:
    """A global bsa block mask prepared for the ring schedule of this rank (make one with
    :func:`create_ring_mask`; reuse it for every call with the same mask, layout and group).

    Holds the work map (which block-column range of which key chunk and which query rows each
    step needs: one host synchronisation when it is built, none afterwards), each step's mask
    and, with ``plans=True`` (what :func:`create_ring_mask` makes), one reusable library plan
    (``spattn.BlockMask``) per ring step with work: the calls then launch only the attention
    kernels (on CUDA building a plan allocates and synchronises, which is why a mask prepared
    per call uses the plain calls instead).  ``close()`` frees the plans (also on garbage
    collection; a pending backward keeps the object alive)."""

    def __init__(self, mask: Tensor, bx: int, by: int, num_kv_heads: int, load_balance: bool, group_name: str,
                 plans: bool = True):
        from .block_mask import create_block_mask
        m = _ops.as_mask(mask)
        if m.dim() != 4:
            raise ValueError(f"block_mask: expected [B, N, S/bx, S/by], got {list(m.shape)}")
        self.pg = _pg(group_name)
        self.group_name, self.bx, self.by, self.lb = group_name, int(bx), int(by), bool(load_balance)
        self.rank, self.world = dist.get_rank(self.pg), dist.get_world_size(self.pg)
        W, r = self.world, self.rank
        B, N, nbx, nby = (int(s) for s in m.shape)
        S = nbx * bx
        if nby * by != S:
            raise ValueError(f"block_mask: {nbx} x {bx} query tokens but {nby} x {by} key tokens (self-attention)")
        n = _nchunks(W, self.lb)
        if S % n or (S // n) % bx or (S // n) % by:
            raise ValueError(f"the chunk length S/{n} = {S / n:g} (S = {S}) must be a multiple of bx={bx} and "
                             f"by={by}")
        self.mask, self.B, self.N, self.Nkv, self.S = m, B, N, int(num_kv_heads), S
        self.L, self.Lx, self.Ly = S // n, S // n // bx, S // n // by
        self.Sl = S // W
        self.device = m.device
        L, Lx, Ly = self.L, self.Lx, self.Ly
        nz = m.ne(0).any(0).any(0)                                      # [S/bx, S/by]
        cols = nz.view(n, Lx, n, Ly).any(1)                             # [a, c, Ly]
        rowc = nz.view(n * Lx, n, Ly).any(2)                            # [block row, c]
        ar = torch.arange(Ly, device=cols.device)
        lo = torch.where(cols, ar, Ly).amin(-1)
        hi = torch.where(cols, ar + 1, 0).amax(-1)
        host = torch.cat([lo.flatten(), hi.flatten(), rowc.flatten().long()]).cpu().tolist()  # the one sync
        self.lo = [host[a * n:(a + 1) * n] for a in range(n)]
        self.hi = [host[n * n + a * n:n * n + (a + 1) * n] for a in range(n)]
        rowc = host[2 * n * n:]                                         # rowc[row * n + c]
        mine = _chunks(r, W, self.lb)
        rows = [m[:, :, a * Lx:(a + 1) * Lx] for a in mine]
        self.steps: List[_Step] = []
        sms = {}
        for t in range(W):
            src, dst = (r - t) % W, (r + t) % W
            if t == 0:  # our own keys, in place: the whole local shard
                recv = [(i, c, 0, Ly, i * L) for i, c in enumerate(mine)
                        if any(self.hi[a][c] > 0 for a in mine)]
                send, nsend, nrecv = [], 0, self.Sl
            else:
                recv, send = self._ranges(r, src), self._ranges(dst, r)
                nrecv, nsend = _packed_len(recv, by), _packed_len(send, by)
            if recv:
                if t == 0:
                    recv = [(i, c, 0, Ly, i * L) for i, c in enumerate(mine)]
                # the step's mask: local rows x the packed columns, built on the mask's device
                sms[t] = torch.cat([torch.cat([x[..., c * Ly + lo_:c * Ly + hi_] for i, c, lo_, hi_, off in recv],
                                              3) for x in rows], 2)
            self.steps.append(_Step(t, src, dst, recv, nrecv, send, nsend))
        for t, sm in sms.items():
            st = self.steps[t]
            a0, a1 = 0, sm.shape[2]
            if t > 0:
                # the block rows that attend keys of src: later steps' kernels and merges cover
                # only those rows (a window mask touches a few rows per step)
                srcc = _chunks(st.src, W, self.lb)
                live = [j * Lx + i for j, a in enumerate(mine) for i in range(Lx)
                        if any(rowc[(a * Lx + i) * n + c] for c in srcc)]
                a0, a1 = live[0], live[-1] + 1
            st.r0, st.r1 = a0 * bx, a1 * bx
            st.mask = sm[:, :, a0:a1].contiguous()
            st.mdesc = _ops._desc("block_mask", st.mask)
            if plans:
                st.plan = create_block_mask(st.mask, (bx, by), seq_lens=(st.r1 - st.r0, st.nrecv),
                                            num_kv_heads=self.Nkv)
        self.plans = bool(plans)
        self.max_tokens = max([s.nrecv for s in self.steps[1:]] + [s.nsend for s in self.steps[1:]] + [0])
        work = [s for s in self.steps[1:] if s.work]
        # rows merged in fp32 (query rows of later steps) and keys whose gradient sums partials
        # of other ranks: everything else is written once, by the step-0 kernel
        self.max_rows = max([s.r1 - s.r0 for s in work] + [0])
        self.rows = (min(s.r0 for s in work), max(s.r1 for s in work)) if work else (0, 0)
        spans = [(i * L + lo_ * by, i * L + hi_ * by) for s in self.steps[1:] for i, c, lo_, hi_, off in s.send]
        self.keys = (min(a for a, b in spans), max(b for a, b in spans)) if spans else (0, 0)
        self.id = next(_RING_IDS)
        _RING_LIVE[self.id] = self

    def _ranges(self, dst: int, src: int) -> List[Tuple[int, int, int, int, int]]:
        """(local chunk i of src, global chunk c, lo, hi, token offset in the packed buffer): per
        key chunk of src, the union of the block-column ranges dst's query chunks attend."""
        out, off = [], 0
        for i, c in enumerate(_chunks(src, self.world, self.lb)):
            live = [a for a in _chunks(dst, self.world, self.lb) if self.hi[a][c] > 0]
            if not live:
                continue
            lo, hi = min(self.lo[a][c] for a in live), max(self.hi[a][c] for a in live)
            out.append((i, c, lo, hi, off))
            off += (hi - lo) * self.by
        return out

    def check(self, q: Tensor, k: Tensor, bx: int, by: int, load_balance: bool, group_name: str) -> None:
        want = (self.B, self.N, self.Sl)
        if tuple(q.shape[:3]) != want or k.shape[0] != self.B or k.shape[1] != self.Nkv or k.shape[2] != self.Sl:
            raise ValueError(f"RingMask: made for q [B, N, Sl] = {list(want)} and Nkv = {self.Nkv}, got q "
                             f"{list(q.shape)}, k {list(k.shape)}")
        if (bx, by) != (self.bx, self.by) or bool(load_balance) != self.lb or group_name != self.group_name:
            raise ValueError(f"RingMask: made for block_size {(self.bx, self.by)}, load_balance={self.lb}, "
                             f"group {self.group_name!r}; called with {(bx, by)}, {bool(load_balance)}, "
                             f"{group_name!r}")
        if q.device != self.device:
            raise ValueError(f"RingMask: made on {self.device}, q on {q.device}")

    def close(self) -> None:
        """Free the library plans now (idempotent)."""
        _RING_LIVE.pop(self.id, None)
        for s in self.steps:
            if s.plan is not None:
                s.plan.close()
                s.plan = None

    def __repr__(self) -> str:
        work = [s.t for s in self.steps if s.work]
        return (f"RingMask(rank={self.rank}/{self.world}, S={self.S}, block_size={(self.bx, self.by)}, "
                f"load_balance={self.lb}, steps with work={work})")


def create_ring_mask(block_mask: Tensor, block_size: Union[int, Sequence[int]] = (64, 64),
                     num_kv_heads: Optional[int] = None, *, group=None, load_balance: bool = True) -> RingMask:
    """Prepare the GLOBAL block mask [B, N, S/bx, S/by] once for ``block_sparse_attention(...,
    mode="ring")``: the ring's work map and one library plan per step.  Pass the result in
    place of the mask to every call with the same mask, block size, Nkv (default N), group and
    load_balance; a raw mask rebuilds this on every call (forward and backward share it)."""
    bx, by = _pair(block_size)
    m = _ops.as_mask(block_mask)
    nkv = int(num_kv_heads) if num_kv_heads is not None else int(m.shape[1])
    return RingMask(m, bx, by, nkv, load_balance, _group_name(group))


def _ring_mask(plan_id: int, q, k, mask, bx, by, load_balance, group_name) -> RingMask:
    if plan_id:
        rm = _RING_LIVE.get(int(plan_id))
        if rm is None:
            raise ValueError("RingMask: this ring mask was closed")
    else:
        rm = RingMask(mask, bx, by, k.shape[1], load_balance, group_name, plans=False)
    rm.check(q, k, bx, by, load_balance, group_name)
    return rm


class _Exchange:
    """Double-buffered asynchronous point-to-point of one ring call.  Step t's transfer is posted
    at the start of step t-1 (right after step t-1's own transfer completed) into the receive
    slot t % 2, so it runs while step t-1 computes; the only waits are on the transfer whose
    buffer is about to be used.  K and V travel as one [2, B, Nkv, n, D] message.

    Deadlock freedom: every rank derives the same work map from the same global mask, and
    rank r sends to r+t in step t exactly when rank r+t receives from r in step t (both test
    ``_ranges(r+t, r)`` non-empty); gradients go back exactly where keys came from.  Every rank
    runs the same loop, posting in iteration t the key transfer of step t+1, then (backward) the
    gradient transfer of step t.  Between a sender X and a receiver Y each kind of transfer sits
    in an iteration that depends only on Y - X (keys: step Y - X, gradients: step X - Y, mod W),
    the same on both ends, so every pair of ranks matches its sends and receives one to one, in
    order (what NCCL needs), whatever the skipped steps are (a skipped transfer is skipped on
    both of its ends); tags (4t + kind) keep the steps apart for gloo."""

    def __init__(self, rm: RingMask, shape: Tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.rm = rm
        self.shape = shape  # (B, Nkv, D)
        n = 2 * shape[0] * shape[1] * rm.max_tokens * shape[2]
        self.slots = [torch.empty(n, dtype=dtype, device=device) for _ in range(2 if n else 0)]
        self.sendbuf = torch.empty(n, dtype=dtype, device=device) if n else None
        self.reqs: List = []

    def view(self, flat: Tensor, tokens: int) -> Tensor:
        B, H, D = self.shape
        return flat[:2 * B * H * tokens * D].view(2, B, H, tokens, D)

    def post(self, send: Optional[Tensor], to: Optional[int], recv: Optional[Tensor], frm: Optional[int], tag: int):
        rm = self.rm
        ops = []
        if send is not None and to is not None:
            ops.append(dist.P2POp(dist.isend, send, dist.get_global_rank(rm.pg, to), rm.pg, tag))
        if recv is not None and frm is not None:
            ops.append(dist.P2POp(dist.irecv, recv, dist.get_global_rank(rm.pg, frm), rm.pg, tag))
        return dist.batch_isend_irecv(ops) if ops else []

    def post_kv(self, t: int, k: Tensor, v: Tensor) -> None:
        """Step t's keys: pack ours for rank r+t into the send buffer, receive rank r-t's."""
        st, rm = self.rm.steps[t], self.rm
        send = None
        if st.send:
            send = self.view(self.sendbuf, st.nsend)
            for i, c, lo, hi, off in st.send:
                a, b = i * rm.L + lo * rm.by, i * rm.L + hi * rm.by
                send[0, :, :, off:off + b - a].copy_(k[:, :, a:b])
                send[1, :, :, off:off + b - a].copy_(v[:, :, a:b])
        recv = self.view(self.slots[t % 2], st.nrecv) if st.recv else None
        self.reqs = self.post(send, st.dst, recv, st.src, 4 * t)

    def wait(self) -> None:
        for req in self.reqs:
            req.wait()
        self.reqs = []

    def keys(self, t: int, k: Tensor, v: Tensor) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """Waits for step t's transfer, posts step t+1's, returns step t's (k, v) or (None, None)."""
        self.wait()
        if t + 1 < self.rm.world:
            self.post_kv(t + 1, k, v)
        st = self.rm.steps[t]
        if not st.work:
            return None, None
        if t == 0:
            return k, v
        kv = self.view(self.slots[t % 2], st.nrecv)
        return kv[0], kv[1]


def _workspace(rm: RingMask, descs, backward: bool, dev: torch.device, deterministic: int = -1):
    """(options, workspace tensor): one caller workspace for all steps on CUDA (the largest)."""
    from . import block_mask as _bm
    opt = _ops._opts(dev, deterministic)
    if dev.type != "cuda" or not rm.plans:
        return opt, None
    n = 0
    for st, (qd, kd, vd) in descs:
        n = max(n, _bm.workspace_size(st.plan, qd, kd, vd, backward, opt))
    ws = torch.empty(max(n, 1), dtype=torch.uint8, device=dev)
    if n:
        opt.workspace, opt.workspace_size = ws.data_ptr(), n
    return opt, ws


def _flat_view(flat: Tensor, shape: Sequence[int]) -> Tensor:
    n = 1
    for x in shape:
        n *= x
    return flat[:n].view(tuple(shape))


def _ring_fwd_impl(q, k, v, mask, bx, by, scale, load_balance, group_name, plan_id):
    """Step 0 (our own keys) writes o and lse directly for all local rows; the rows later steps
    attend (rm.rows) are then merged in fp32: an accumulator over those rows only, initialised
    from step 0's result, one kernel (on the step's rows) and one in-place merge per step, in
    step order; the rows are written back once at the end."""
    from . import block_mask as _bm
    rm = _ring_mask(plan_id, q, k, mask, bx, by, load_balance, group_name)
    W, dev, f32, d = rm.world, q.device, torch.float32, _ops._desc
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, N, D = q.shape[0], q.shape[1], q.shape[3]
    ex = _Exchange(rm, (k.shape[0], k.shape[1], k.shape[3]), k.dtype, dev)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=f32, device=dev)
    R0, R1 = rm.rows
    opf = torch.empty(B * N * rm.max_rows * D, dtype=q.dtype, device=dev)   # step results, reused
    lpf = torch.empty(B * N * rm.max_rows, dtype=f32, device=dev)
    calls = {}
    for st in rm.steps:  # every kernel's descriptors up front (the receive slots are fixed)
        if not st.work:
            continue
        kt, vt = (k, v) if st.t == 0 else ex.view(ex.slots[st.t % 2], st.nrecv)
        if st.t == 0:
            out = (o, lse)
        else:
            n = st.r1 - st.r0
            out = (_flat_view(opf, (B, N, n, D)), _flat_view(lpf, (B, N, n)))
        calls[st.t] = (d("q", q[:, :, st.r0:st.r1]), d("k", kt), d("v", vt), d("o", out[0]), d("lse", out[1]),
                       out)
    opt, ws = _workspace(rm, [(rm.steps[t], c[:3]) for t, c in calls.items()], False, dev)
    acc_o = acc_l = None
    for t in range(W):
        kt, vt = ex.keys(t, k, v)
        if kt is None:
            if t == 0:  # no local key attended: start from empty rows
                o.zero_()
                lse.fill_(float("-inf"))
            continue  # nothing attended in this step: skipped (its transfer was skipped too)
        st, (qd, kd, vd, od, ld, out) = rm.steps[t], calls[t]
        if st.plan is not None:
            _bm.fwd(st.plan, qd, kd, vd, scale, od, ld, opt)
        else:  # (bitwise the same as the plan call)
            _lib.bsa_fwd(qd, kd, vd, st.mdesc, bx, by, scale, od, ld, opt)
        if t == 0:
            continue
        if acc_o is None:  # fp32 accumulator of the merged rows (fp32 q: o itself, in place)
            ov = o[:, :, R0:R1]
            acc_o, acc_l = (ov if o.dtype == f32 else ov.float()), lse[:, :, R0:R1]
        a_o, a_l = acc_o[:, :, st.r0 - R0:st.r1 - R0], acc_l[:, :, st.r0 - R0:st.r1 - R0]
        merge_into(a_o, a_l, out[0], out[1], a_o, a_l)
    ex.wait()
    del ws
    if acc_o is not None and o.dtype != f32:
        o[:, :, R0:R1].copy_(acc_o)
    return o, lse


def _ring_bwd_impl(q, k, v, mask, o, dout, lse, bx, by, scale, load_balance, group_name, plan_id,
                   deterministic=-1):
    """Step 0 writes dq, dk, dv directly; dq rows of later steps and the keys whose partial
    gradients come back from other ranks are summed in fp32 (step order, then returned
    partials in step order) over those rows / keys only, and written back once."""
    from . import block_mask as _bm
    rm = _ring_mask(plan_id, q, k, mask, bx, by, load_balance, group_name)
    W, dev, f32, d = rm.world, q.device, torch.float32, _ops._desc
    q, k, v, o, dout, lse = (x.contiguous() for x in (q, k, v, o, dout, lse))
    B, N, D = q.shape[0], q.shape[1], q.shape[3]
    H = k.shape[1]
    ex = _Exchange(rm, (B, H, D), k.dtype, dev)           # keys, as in the forward
    n = 2 * B * H * rm.max_tokens * D
    gsend = [torch.empty(n, dtype=f32, device=dev) for _ in range(2 if n else 0)]  # partial dK/dV out
    grecv = [torch.empty(n, dtype=f32, device=dev) for _ in range(2 if n else 0)]  # ours coming home
    gkf = torch.empty(n, dtype=k.dtype, device=dev)
    gqf = torch.empty(B * N * rm.max_rows * D, dtype=q.dtype, device=dev)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    R0, R1 = rm.rows
    K0, K1 = rm.keys
    calls = {}
    for st in rm.steps:
        if not st.work:
            continue
        r0, r1 = st.r0, st.r1
        ins = (d("q", q[:, :, r0:r1]),) + ((d("k", k), d("v", v)) if st.t == 0 else tuple(
            d(nm, x) for nm, x in zip("kv", ex.view(ex.slots[st.t % 2], st.nrecv))))
        if st.t == 0:
            g, gq = None, dq
            outs = (d("dq", dq), d("dk", dk), d("dv", dv))
        else:
            # fp32: the partial dK/dV are written straight into the send slot
            g = ex.view(gsend[st.t % 2] if k.dtype == f32 else gkf, st.nrecv)
            gq = _flat_view(gqf, (B, N, r1 - r0, D))
            outs = (d("dq", gq), d("dk", g[0]), d("dv", g[1]))
        calls[st.t] = ins + (d("o", o[:, :, r0:r1]), d("dout", dout[:, :, r0:r1]), d("lse", lse[:, :, r0:r1])) \
            + outs + (g, gq)
    opt, ws = _workspace(rm, [(rm.steps[t], c[:3]) for t, c in calls.items()], True, dev, deterministic)
    acc = {}

    def acc_q():
        if "q" not in acc:
            v_ = dq[:, :, R0:R1]
            acc["q"] = v_ if dq.dtype == f32 else v_.float()
        return acc["q"]

    def acc_kv():
        if "kv" not in acc:
            a_kv = torch.empty((2,) + tuple(dk[:, :, K0:K1].shape), dtype=f32, device=dev)
            a_kv[0].copy_(dk[:, :, K0:K1])
            a_kv[1].copy_(dv[:, :, K0:K1])
            acc["kv"] = a_kv
        return acc["kv"]

    def settle(p):
        if p is None:
            return
        reqs, back, st = p
        for req in reqs:
            req.wait()
        if back is not None:
            a_kv = acc_kv()
            for i, c, lo, hi, off in st.send:
                a, b = i * rm.L + lo * rm.by - K0, i * rm.L + hi * rm.by - K0
                a_kv[:, :, :, a:b] += back[:, :, :, off:off + b - a]

    pending = None  # the previous step's gradient transfer: settled after this step's compute
    for t in range(W):
        kt, vt = ex.keys(t, k, v)
        st = rm.steps[t]
        out = None
        if kt is None:
            if t == 0:  # no local key attended: start from zero gradients
                dq.zero_()
                dk.zero_()
                dv.zero_()
        else:
            c = calls[t]
            if st.plan is not None:
                _bm.bwd(st.plan, c[0], c[1], c[2], c[3], c[4], c[5], scale, c[6], c[7], c[8], opt)
            else:
                _lib.bsa_bwd(c[0], c[1], c[2], st.mdesc, bx, by, scale, c[3], c[4], c[5], c[6], c[7], c[8], opt)
            if t > 0:
                g, gq = c[9], c[10]
                acc_q()[:, :, st.r0 - R0:st.r1 - R0] += gq
                if k.dtype == f32:
                    out = g
                else:
                    out = ex.view(gsend[t % 2], st.nrecv)
                    out.copy_(g)
        if t > 0:
            # partial dK/dV (fp32, packed like the keys we got) go home to rank r-t; those of our
            # own keys come back from rank r+t (in the layout we sent them)
            back = ex.view(grecv[t % 2], st.nsend) if st.send else None
            reqs = ex.post(out, st.src, back, st.dst, 4 * t + 2)
            settle(pending)
            pending = (reqs, back, st)
    settle(pending)
    ex.wait()
    del ws
    if "q" in acc and dq.dtype != f32:
        dq[:, :, R0:R1].copy_(acc["q"])
    if "kv" in acc:
        dk[:, :, K0:K1].copy_(acc["kv"][0])
        dv[:, :, K0:K1].copy_(acc["kv"][1])
    return dq, dk, dv


@torch.library.custom_op("spattn::cp_bsa_ring_fwd", mutates_args=())
def cp_bsa_ring_fwd(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, bx: int, by: int, scale: float,
                    load_balance: bool, group_name: str, plan_id: int,
                    deterministic: int = -1) -> Tuple[Tensor, Tensor]:
    """Ring forward; plan_id: a live RingMask's id (0: build one for this call); deterministic:
    for the backward (as in _ops)."""
    _ops.check_deterministic(deterministic)
    return _ring_fwd_impl(q, k, v, block_mask, bx, by, scale, load_balance, group_name, plan_id)


@cp_bsa_ring_fwd.register_fake
def _(q, k, v, block_mask, bx, by, scale, load_balance, group_name, plan_id, deterministic=-1):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("spattn::cp_bsa_ring_bwd", mutates_args=())
def cp_bsa_ring_bwd(q: Tensor, k: Tensor, v: Tensor, block_mask: Tensor, o: Tensor, dout: Tensor, lse: Tensor,
                    bx: int, by: int, scale: float, load_balance: bool, group_name: str,
                    plan_id: int, deterministic: int = -1) -> Tuple[Tensor, Tensor, Tensor]:
    return _ring_bwd_impl(q, k, v, block_mask, o, dout, lse, bx, by, scale, load_balance, group_name, plan_id,
                          _ops.check_deterministic(deterministic))


@cp_bsa_ring_bwd.register_fake
def _(q, k, v, block_mask, o, dout, lse, bx, by, scale, load_balance, group_name, plan_id, deterministic=-1):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _ring_setup(ctx, inputs, output):
    q, k, v, block_mask, bx, by, scale, load_balance, group_name, plan_id, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, block_mask, o, lse)
    ctx.args = (bx, by, scale, load_balance, group_name, plan_id, deterministic)
    ctx.ring = _RING_LIVE.get(int(plan_id)) if plan_id else None  # alive until the backward
    ctx.mark_non_differentiable(lse)


def _ring_backward(ctx, grad_o, grad_lse):
    q, k, v, block_mask, o, lse = ctx.saved_tensors
    dq, dk, dv = cp_bsa_ring_bwd(q, k, v, block_mask, o, grad_o.contiguous(), lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None, None


cp_bsa_ring_fwd.register_autograd(_ring_backward, setup_context=_ring_setup)
