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

#define BSA_COL_ALIGN 16 /* floats: multiple of every ISA's vector width, 64 bytes */

static inline int64_t bsa_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static inline int64_t bsa_min64(int64_t a, int64_t b) { return a < b ? a : b; }

typedef struct bsa_tiles {
    int64_t dp;         /* D rounded up to 16 (zero padded in every packed tile) */
    int64_t bq, bk;     /* query and key tile of this pass */
} bsa_tiles;

/* Forward: one work item = (b, n, query tile); each visited key tile costs a pack of K and V
 * (bk x D) reused by all bq queries, and the score tile is bk x bq floats kept in L1/L2.
 * bq = bk = 64 measured best on the reference machine (see the runbook). */
static inline bsa_tiles bsa_tiles_fwd(const spattn_bsa_problem *p) {
    bsa_tiles t;
    t.dp = bsa_round_up(p->D, BSA_COL_ALIGN);
    t.bq = bsa_min64(64, bsa_round_up(p->Sq, BSA_COL_ALIGN));
    t.bk = bsa_min64(64, bsa_round_up(p->Skv, BSA_COL_ALIGN));
    return t;
}

/* Backward dQ pass: like the forward (work item = (b, n, query tile)). */
static inline bsa_tiles bsa_tiles_bwd_dq(const spattn_bsa_problem *p) {
    bsa_tiles t = bsa_tiles_fwd(p);
    return t;
}

/* Backward dK/dV pass: one work item = (b, kv head, key tile); the key tile is the vectorized
 * column dimension of the score tile. */
static inline bsa_tiles bsa_tiles_bwd_dkv(const spattn_bsa_problem *p) {
    bsa_tiles t;
    t.dp = bsa_round_up(p->D, BSA_COL_ALIGN);
    t.bq = bsa_min64(64, bsa_round_up(p->Sq, BSA_COL_ALIGN));
    t.bk = bsa_min64(64, bsa_round_up(p->Skv, BSA_COL_ALIGN));
    return t;
}

static inline size_t bsa_al(int64_t n) { return (size_t)bsa_round_up(n, BSA_COL_ALIGN); }

/* Per-thread scratch of each pass in floats; the kernels carve it in the same order. */
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
/* The Delta pre-pass needs two fp32 rows per thread. */
static inline size_t bsa_bwd_thread_floats(const spattn_bsa_problem *p) {
    size_t a = bsa_dq_thread_floats(bsa_tiles_bwd_dq(p));
    size_t b = bsa_dkv_thread_floats(bsa_tiles_bwd_dkv(p));
    size_t c = 2 * bsa_al(bsa_round_up(p->D, BSA_COL_ALIGN));
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}
/* Backward only: Delta = rowsum(dO * O) for all B*N*Sq rows, computed first. */
static inline size_t bsa_delta_floats(const spattn_bsa_problem *p) {
    return bsa_al(p->B * p->N * p->Sq);
}

/* Total bytes: 64 bytes of alignment slack (the caller's workspace may be unaligned), the
 * shared Delta array (backward) and one region per thread. */
static inline size_t bsa_workspace_bytes(const spattn_bsa_problem *p, int backward, int threads) {
    size_t per = backward ? bsa_bwd_thread_floats(p) : bsa_fwd_thread_floats(bsa_tiles_fwd(p));
    size_t shared = backward ? bsa_delta_floats(p) : 0;
    return 64 + sizeof(float) * (shared + (size_t)threads * per);
}

#endif
