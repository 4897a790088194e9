/*
 * Tile sizes and per-thread workspace layout of the CPU bsa kernels: pure functions of the
 * problem's shape only (never of the thread count or the ISA), so the summation order, and
 * therefore every output bit, is the same for any number of threads.
 *
 * Constraints the kernels rely on: every tile dimension that is a vectorized GEMM column
 * count (forward/dQ: the query tile; dK/dV: the key tile) and the padded head dim dp are
 * multiples of 16, the widest SIMD vector, so no kernel needs a column tail.
 */
#ifndef SPATTN_CPU_BSA_TILES_H
#define SPATTN_CPU_BSA_TILES_H

#include <stddef.h>
#include <stdint.h>

#include "../core/internal.h"
#include "../core/seqs.h"
#include "bsa_pages.h"

#define BSA_COL_ALIGN 16 /* floats: multiple of every ISA's vector width, 64 bytes */

static inline int64_t bsa_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static inline int64_t bsa_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* How one sequence dimension (queries for the forward/dQ passes, keys for dK/dV) is cut into
 * the tiles of work items: a tile never straddles a group of g whole mask blocks, and a group
 * is split into nsub tiles of at most `rows` tokens.  With g = 1 every tile lies inside one
 * mask block row (column), so every token of the other dimension that the tile visits is
 * attended by all of its rows and needs no token mask at all. */
typedef struct bsa_split {
    int64_t g, nsub, rows;
} bsa_split;

/* Block size from which a tile holds one block row (column): below it, g = 64 / blk blocks
 * are grouped into a 64-token tile (a tile of fewer than 16 rows wastes most of the vector). */
#ifndef BSA_SOLO_MIN
#define BSA_SOLO_MIN 16
#endif
#define BSA_MAX_ROWS 96 /* longest tile inside one block; longer blocks are split evenly */

static inline bsa_split bsa_split_of(int64_t blk, int64_t S) {
    bsa_split s;
    if (blk < BSA_SOLO_MIN) {
        s.g = 64 / blk;
        s.nsub = 1;
        s.rows = s.g * blk;
    } else {
        s.g = 1;
        s.nsub = (blk + BSA_MAX_ROWS - 1) / BSA_MAX_ROWS;
        s.rows = (blk + s.nsub - 1) / s.nsub;
    }
    if (s.rows > S) s.rows = S; /* a short sequence: one tile of S tokens */
    return s;
}
static inline int64_t bsa_split_tiles(bsa_split s, int64_t blk, int64_t S) {
    return (S + s.g * blk - 1) / (s.g * blk) * s.nsub;
}
/* Tokens [*t0, *t0 + *n) of tile `it`; returns 0 for an empty tile (the split of a last,
 * partial group can leave sub-tiles past the end of the sequence). */
static inline int bsa_split_range(bsa_split s, int64_t blk, int64_t S, int64_t it, int64_t *t0,
                                  int64_t *n) {
    int64_t grp = it / s.nsub, sub = it % s.nsub, base = grp * s.g * blk;
    int64_t a = base + sub * s.rows, e = base + s.g * blk;
    if (e > S) e = S;
    if (e > a + s.rows) e = a + s.rows;
    *t0 = a;
    *n = e - a;
    return e > a;
}

typedef struct bsa_tiles {
    int64_t dp;         /* D rounded up to 16 (zero padded in every packed tile) */
    int64_t bq, bk;     /* buffer widths: query tile / key chunk (fwd, dQ), query chunk / key
                           tile (dK/dV); the tile's width is a multiple of 16 */
    bsa_split sp;       /* how the tiled dimension is cut (queries: fwd, dQ; keys: dK/dV) */
} bsa_tiles;

/* Forward: one work item = (b, n, query tile); the keys the tile attends (the union of the
 * active key blocks of its block rows) are gathered in chunks of at most bk = 64 tokens, each
 * packed once (K and V, bk x D) and reused by all queries of the tile; the score tile is
 * bk x bq floats kept in L1/L2.  64 x 64 measured best for 64-blocks (see the runbook). */
static inline bsa_tiles bsa_tiles_fwd(const spattn_bsa_problem *p) {
    bsa_tiles t;
    t.dp = bsa_round_up(p->D, BSA_COL_ALIGN);
    t.sp = bsa_split_of(p->bx, p->Sq);
    t.bq = bsa_round_up(t.sp.rows, BSA_COL_ALIGN);
    /* min first: a varlen Skv (max_seqlen_kv) may be near INT64_MAX */
    t.bk = bsa_round_up(bsa_min64(64, p->Skv), BSA_COL_ALIGN);
    return t;
}

/* Backward dQ pass: like the forward (work item = (b, n, query tile)). */
static inline bsa_tiles bsa_tiles_bwd_dq(const spattn_bsa_problem *p) {
    bsa_tiles t = bsa_tiles_fwd(p);
    return t;
}

/* Backward dK/dV pass: one work item = (b, kv head, key tile); the key tile is the vectorized
 * column dimension of the score tile, the attending queries are gathered in chunks of bq. */
static inline bsa_tiles bsa_tiles_bwd_dkv(const spattn_bsa_problem *p) {
    bsa_tiles t;
    t.dp = bsa_round_up(p->D, BSA_COL_ALIGN);
    t.sp = bsa_split_of(p->by, p->Skv);
    t.bk = bsa_round_up(t.sp.rows, BSA_COL_ALIGN);
    t.bq = bsa_round_up(bsa_min64(64, p->Sq), BSA_COL_ALIGN); /* min first, as bk above */
    return t;
}

/* The tiles that size the per-thread regions of p: its own, or for a whole varlen batch
 * (Sq / Skv = max_seqlen) widened for any sequence's.  Each sequence clamps bx / by to its own
 * lengths (spattn_seq_blk), so one shorter than the block is a single tile of up to
 * BSA_MAX_ROWS rows, wider than max_seqlen's tiles (bx = 128, max_seqlen 100: 50-row tiles,
 * a 90-token sequence one of 90); longer ones tile as max_seqlen's (bsa_split_of's rows grow
 * with S).  keys: the tiled dimension is the keys' (dK/dV), else the queries'. */
static inline bsa_tiles bsa_tiles_region(const spattn_bsa_problem *p, bsa_tiles t, int keys) {
    if (!p->seqs) return t;
    const int64_t blk = keys ? p->by : p->bx, S = keys ? p->Skv : p->Sq;
    const int64_t w = bsa_round_up(bsa_min64(bsa_min64(blk - 1, S), BSA_MAX_ROWS), BSA_COL_ALIGN);
    int64_t *tw = keys ? &t.bk : &t.bq;
    if (w > *tw) *tw = w;
    return t;
}

static inline size_t bsa_al(int64_t n) { return (size_t)bsa_round_up(n, BSA_COL_ALIGN); }

/* Per-thread scratch of each pass in floats; the kernels carve it in the same order, and each
 * count grows with bq and bk (a region for wider tiles holds narrower ones). */
static inline size_t bsa_fwd_thread_floats(bsa_tiles t) {
    /* qt, kp, vp, st, o, m, l, alpha, tmp */
    return bsa_al(t.dp * t.bq) + 2 * bsa_al(t.bk * t.dp) + bsa_al(t.bk * t.bq) +
           bsa_al(t.bq * t.dp) + 3 * bsa_al(t.bq) + bsa_al(t.dp);
}
static inline size_t bsa_dq_thread_floats(bsa_tiles t) {
    /* qt, dot, kp, vp, st, dpt, dq, nl, delta, tmp */
    return 2 * bsa_al(t.dp * t.bq) + 2 * bsa_al(t.bk * t.dp) + 2 * bsa_al(t.bk * t.bq) +
           bsa_al(t.bq * t.dp) + 2 * bsa_al(t.bq) + bsa_al(t.dp);
}
static inline size_t bsa_dkv_thread_floats(bsa_tiles t) {
    /* kt, vt, qp, dop, s, dps, dk, dv, nl, delta, tmp */
    return 2 * bsa_al(t.dp * t.bk) + 2 * bsa_al(t.bq * t.dp) + 2 * bsa_al(t.bq * t.bk) +
           2 * bsa_al(t.bk * t.dp) + 2 * bsa_al(t.bq) + bsa_al(t.dp);
}
/* Per-thread region of the forward of p (any sequence's tiles, for a varlen batch). */
static inline size_t bsa_fwd_region_floats(const spattn_bsa_problem *p) {
    return bsa_fwd_thread_floats(bsa_tiles_region(p, bsa_tiles_fwd(p), 0));
}
/* Backward: as the forward; the Delta pre-pass needs two fp32 rows per thread. */
static inline size_t bsa_bwd_thread_floats(const spattn_bsa_problem *p) {
    size_t a = bsa_dq_thread_floats(bsa_tiles_region(p, bsa_tiles_bwd_dq(p), 0));
    size_t b = bsa_dkv_thread_floats(bsa_tiles_region(p, bsa_tiles_bwd_dkv(p), 1));
    size_t c = 2 * bsa_al(bsa_round_up(p->D, BSA_COL_ALIGN));
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}
/* Backward only: Delta = rowsum(dO * O) for all B*N*Sq rows, computed first. */
static inline size_t bsa_delta_floats(const spattn_bsa_problem *p) {
    return bsa_al(p->N * (p->seqs ? p->seqs->Tq : p->B * p->Sq)); /* varlen: [N][Tq] */
}

/* Total bytes: 64 bytes of alignment slack (the caller's workspace may be unaligned), the
 * shared Delta array (backward) and one region per thread. */
static inline size_t bsa_workspace_bytes(const spattn_bsa_problem *p, int backward, int threads) {
    /* Views far beyond any memory (stride-0 dimensions of billions) would overflow the sums
     * below: answer SIZE_MAX (size queries then report OUT_OF_MEMORY).  Under these bounds
     * every term stays below 2^60. */
    const spattn_seqs *sq = p->seqs;
    const double rows = sq ? (double)sq->Tq : (double)p->B * (double)p->Sq;
    const double prow = sq && sq->table ? (double)sq->num_pages * (double)sq->page_size : 0.0;
    if ((double)p->D > 1e9 || (double)p->N * rows > 1e15 || prow * (double)p->Nkv * (double)p->D > 1e15 ||
        (sq && (double)sq->B > 1e12))
        return SIZE_MAX;
    size_t per = backward ? bsa_bwd_thread_floats(p) : bsa_fwd_region_floats(p);
    size_t shared = backward ? bsa_delta_floats(p) : 0;
    /* varlen: work-item offsets of the sequences (queries, keys) after the thread regions */
    size_t offsets = p->seqs ? 2 * sizeof(int64_t) * (size_t)(p->seqs->B + 1) : 0;
    /* paged backward: the page schedule and fp32 rows for shared pages (bsa_pages.h) */
    size_t pages = backward ? bsa_pages_bytes(p) : 0;
    return 64 + sizeof(float) * (shared + (size_t)threads * per) + offsets + pages;
}

#endif
