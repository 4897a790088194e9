/*
 * CPU sfa: resolved problem, workspace layout and index-row expansion (shared by the forward
 * and backward drivers and by every ISA variant of the kernels).
 */
#include <string.h>

#include <omp.h>

#include "../core/seqs.h"
#include "cpu_isa.h"
#include "sfa_cpu.h"

/* Sizes saturate at SIZE_MAX instead of wrapping: a size query over huge (stride-0) views
 * answers "more than any memory", and a call then fails to allocate with OUT_OF_MEMORY. */
static size_t sat_add(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
static size_t sat_mul(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}
/* bytes of a * b elements of `es` bytes (a, b >= 0) */
static size_t sat_bytes(int64_t a, int64_t b, size_t es) {
    return sat_mul(sat_mul((size_t)a, (size_t)b), es);
}
static size_t align_up(size_t x) {
    return x > SIZE_MAX - SFA_ALIGN ? SIZE_MAX : (x + SFA_ALIGN - 1) / SFA_ALIGN * SFA_ALIGN;
}
/* The same for the plan's int64 extents (a >= 0, m >= 1): a size query may pass any int64 shape
 * that validates (no memory behind it), and the sizes built from them saturate above. */
static int64_t i64_add(int64_t a, int64_t b) {
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}
static int64_t i64_rup(int64_t a, int64_t m) { return a % m ? i64_add(a - a % m, m) : a; }
static int64_t i64_cdiv(int64_t a, int64_t m) { return a / m + (a % m != 0); }

/* Budget of the backward tile buffers: big enough to amortize the two parallel phases per
 * tile, small enough to stay near the last-level cache. */
#define SFA_TILE_BYTES ((size_t)32 << 20)
size_t sfa_tile_bytes = SFA_TILE_BYTES;
#define SFA_TMIN 4 /* fewest tokens per tile */

void sfa_plan_init(sfa_plan *pl, const spattn_sfa_problem *p, int backward, int num_threads) {
    memset(pl, 0, sizeof(*pl));
    pl->p = p;
    pl->G = p->N1 / p->N2;
    pl->Gp = i64_rup(pl->G, SFA_VW);
    pl->Dq = i64_add(p->D, p->Dr);
    pl->Dp = i64_rup(p->D, SFA_VW);
    pl->Drp = i64_rup(p->Dr, SFA_VW);
    pl->Dqp = i64_add(pl->Dp, pl->Drp);
    /* keys one index entry expands to: a varlen sequence's keys are < its length <= Tkv (see
     * nmark), so a generous max_seqlen_kv does not grow the buffers */
    int64_t kb = p->sbs < p->S2 ? p->sbs : p->S2;
    if (p->seqs && p->seqs->Tkv < kb) kb = p->seqs->Tkv;
    if (__builtin_mul_overflow(p->K, kb, &pl->kmax)) pl->kmax = INT64_MAX;
    pl->nt = num_threads > 0 ? num_threads : omp_get_max_threads();
    if (pl->nt < 1) pl->nt = 1;
    if (backward) {
        /* Chunks of E index entries (at most kc expanded keys): the per-key tile buffers of a
         * minimal tile (SFA_TMIN tokens, all groups) stay within the budget, so the tile
         * no longer grows with K * sbs.  E and T depend on shapes only, never on the thread
         * count (determinism).  Every suite case (sbs = 1, K * G <= 8192 * 64) is one chunk. */
        size_t per_key = sat_mul(sat_bytes(i64_add(i64_add(pl->G, pl->G), 1), p->N2, 4), SFA_TMIN);
        int64_t ck = (int64_t)(sfa_tile_bytes / per_key);
        int64_t E = kb > 0 ? ck / kb : p->K;
        if (E > p->K) E = p->K;
        if (E < 1) E = 1;
        pl->E = E;
        pl->nch = i64_cdiv(p->K, E);
        if (pl->nch < 1) pl->nch = 1;
        pl->kc = E * kb;
        size_t slot = sat_mul(sfa_tile_layout_of(pl).total, (size_t)p->N2);
        int64_t T = (int64_t)(sfa_tile_bytes / (slot ? slot : 1));
        if (T > 64) T = 64;
        if (T < SFA_TMIN) T = SFA_TMIN;
        if (T > p->S1) T = p->S1;
        pl->T = T;
        pl->nmark = p->seqs && p->seqs->Tkv < p->S2 ? p->seqs->Tkv : p->S2;
        pl->ncol = i64_cdiv(pl->Dp, SFA_CW) + i64_cdiv(pl->Drp, SFA_CW) + (p->shared_kv ? 0 : i64_cdiv(pl->Dp, SFA_CW));
    }
    /* No more threads than work items: every tile of the backward ends in barriers, and a
     * thread count far above the items (e.g. 1024 on a small problem) made a call ~100x slower
     * (7 ms -> 0.5-1 s, 2-core VM).  Items: query rows x kv groups (forward), the larger of a
     * tile's rows x groups and its scatter units, and 64K floats of accumulators to zero and
     * round (backward).  Results do not depend on the count (see above). */
    double work;
    if (!backward) {
        work = (p->seqs ? (double)p->seqs->Tq : (double)p->B * (double)p->S1) * (double)p->N2;
    } else {
        double rows = p->seqs ? (double)p->seqs->Tkv : (double)p->B * (double)p->S2;
        work = (double)pl->T * (double)p->N2;
        if ((double)p->N2 * (double)pl->ncol > work) work = (double)p->N2 * (double)pl->ncol;
        double acc = rows * (double)p->N2 * (double)(pl->Dqp + pl->Dp) / 65536.0;
        if (acc > work) work = acc;
    }
    if (work < 1.0) work = 1.0;
    if ((double)pl->nt > work) pl->nt = (int)work;
}

sfa_thread_layout sfa_thread_layout_of(const sfa_plan *pl, int backward) {
    const spattn_sfa_problem *p = pl->p;
    size_t f = sizeof(float), off = 0;
    sfa_thread_layout L;
    memset(&L, 0, sizeof(L));
#define TAKE(field, bytes) (L.field = off, off = align_up(sat_add(off, (bytes))))
    TAKE(qt, sat_bytes(pl->Dqp, pl->Gp, f));
    if (backward) TAKE(dot, sat_bytes(pl->Dp, pl->Gp, f));
    TAKE(kc, sat_bytes(SFA_NC, pl->Dqp, f));
    if (!p->shared_kv) TAKE(vc, sat_bytes(SFA_NC, pl->Dp, f));
    TAKE(st, sat_bytes(SFA_NC, pl->Gp, f));
    if (backward) TAKE(dpt, sat_bytes(SFA_NC, pl->Gp, f));
    /* O accumulators (forward) / dQ accumulators of a one-chunk row and O row scratch
     * (backward) */
    TAKE(acc, sat_bytes(pl->G, backward ? pl->Dqp : pl->Dp, f));
    if (!backward) TAKE(row, sat_bytes(pl->Dqp, 1, f)); /* one q row before it is transposed */
    if (!backward) TAKE(ml, sat_bytes(4, pl->Gp, f));
    if (!backward) TAKE(keys, sat_bytes(pl->kmax, 1, sizeof(int64_t)));
    if (backward) TAKE(mark, (size_t)pl->nmark);
#undef TAKE
    L.total = off;
    return L;
}

sfa_tile_layout sfa_tile_layout_of(const sfa_plan *pl) {
    size_t off = 0, f = sizeof(float);
    sfa_tile_layout L;
    L.x = off;
    off = align_up(sat_mul(sat_bytes(pl->G, pl->Dqp, f), 2));
    L.dq = off; /* only when a row takes several chunks (else in the thread buffer) */
    if (pl->nch > 1) off = align_up(sat_add(off, sat_bytes(pl->G, pl->Dqp, f)));
    L.ld = off;
    off = align_up(sat_add(off, sat_bytes(2, pl->Gp, f)));
    L.dsp = off;
    off = align_up(sat_add(off, sat_mul(sat_bytes(pl->kc, pl->G, f), 2)));
    L.keys = off;
    off = align_up(sat_add(off, sat_bytes(pl->kc, 1, sizeof(int64_t))));
    L.meta = off;
    off = align_up(sat_add(off, 2 * sizeof(int64_t)));
    L.total = off;
    return L;
}

size_t sfa_workspace_parts(const sfa_plan *pl, int backward, size_t *off_tile, size_t *off_acc) {
    const spattn_sfa_problem *p = pl->p;
    size_t total = sat_mul((size_t)pl->nt, sfa_thread_layout_of(pl, backward).total);
    size_t tile = 0, acc = 0;
    if (backward) {
        tile = total;
        total = sat_add(total, sat_mul(sat_bytes(pl->T, p->N2, 1), sfa_tile_layout_of(pl).total));
        acc = total;
        /* varlen: one accumulator row per key-side row (packed token or page row) */
        size_t rows = p->seqs ? sat_bytes(p->seqs->Tkv, 1, 1) : sat_bytes(p->B, p->S2, 1);
        size_t n = sat_mul(sat_bytes(p->N2, i64_add(pl->Dqp, p->shared_kv ? 0 : pl->Dp), sizeof(float)), rows);
        total = sat_add(total, align_up(n));
    }
    if (off_tile) *off_tile = tile;
    if (off_acc) *off_acc = acc;
    return sat_add(total, SFA_ALIGN); /* slack to align a caller's workspace */
}

size_t spattn_cpu_sfa_workspace(const spattn_sfa_problem *p, int backward, int num_threads) {
    sfa_plan pl;
    sfa_plan_init(&pl, p, backward, num_threads);
    return sfa_workspace_parts(&pl, backward, NULL, NULL);
}

int64_t sfa_expand_range(const sfa_plan *pl, int64_t b, int64_t i, int64_t n2, int64_t e0,
                         int64_t e1, int64_t *keys) {
    const spattn_sfa_problem *p = pl->p;
    const spattn_tensor *t = p->idx;
    const int32_t *row = (const int32_t *)t->data + spattn_offset4(t, b, i, n2, 0);
    int64_t lim = p->mode == SPATTN_SFA_MODE_CAUSAL ? p->S2 - p->S1 + i : p->S2 - 1;
    int64_t n = 0, sbs = p->sbs, s3 = t->strides[3];
    if (lim < 0) return 0;
    if (e1 > p->K) e1 = p->K;
    for (int64_t e = e0; e < e1; e++) {
        int32_t v = row[e * s3];
        if (v < 0) continue;
        int64_t j0 = (int64_t)v * sbs, j1 = j0 + sbs;
        if (j1 > lim + 1) j1 = lim + 1; /* also clips the partial last block (lim < S2) */
        for (int64_t j = j0; j < j1; j++) keys[n++] = j; /* int64: S2 may exceed 2^31 */
    }
    return n;
}

int64_t sfa_expand_row(const sfa_plan *pl, int64_t b, int64_t i, int64_t n2, int64_t *keys) {
    return sfa_expand_range(pl, b, i, n2, 0, pl->p->K, keys);
}

const sfa_kernels *sfa_kernels_select(void) {
#if defined(__x86_64__) || defined(__i386__)
    switch (spattn_cpu_isa_select()) {
    case SPATTN_CPU_ISA_AVX512: return sfa_kernels_avx512();
    case SPATTN_CPU_ISA_AVX2: return sfa_kernels_avx2();
    default: break;
    }
#endif
    return sfa_kernels_generic();
}
