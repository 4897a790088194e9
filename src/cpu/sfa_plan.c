/*
 * CPU sfa: resolved problem, workspace layout and index-row expansion (shared by the forward
 * and backward drivers and by every ISA variant of the kernels).
 */
#include <string.h>

#include <omp.h>

#include "../core/seqs.h"
#include "cpu_isa.h"
#include "sfa_cpu.h"

static size_t align_up(size_t x) { return (x + SFA_ALIGN - 1) / SFA_ALIGN * SFA_ALIGN; }

/* Budget of the backward tile buffers: big enough to amortize the two parallel phases per
 * tile, small enough to stay near the last-level cache. */
#define SFA_TILE_BYTES ((size_t)32 << 20)
size_t sfa_tile_bytes = SFA_TILE_BYTES;
#define SFA_TMIN 4 /* fewest tokens per tile */

void sfa_plan_init(sfa_plan *pl, const spattn_sfa_problem *p, int backward, int num_threads) {
    memset(pl, 0, sizeof(*pl));
    pl->p = p;
    pl->G = p->N1 / p->N2;
    pl->Gp = (pl->G + SFA_VW - 1) / SFA_VW * SFA_VW;
    pl->Dq = p->D + p->Dr;
    pl->Dp = (p->D + SFA_VW - 1) / SFA_VW * SFA_VW;
    pl->Drp = (p->Dr + SFA_VW - 1) / SFA_VW * SFA_VW;
    pl->Dqp = pl->Dp + pl->Drp;
    pl->kmax = p->K * (p->sbs < p->S2 ? p->sbs : p->S2);
    pl->nt = num_threads > 0 ? num_threads : omp_get_max_threads();
    if (pl->nt < 1) pl->nt = 1;
    if (backward) {
        /* Chunks of E index entries (at most kc expanded keys): the per-key tile buffers of a
         * minimal tile (SFA_TMIN tokens, all groups) stay within the budget, so the tile
         * no longer grows with K * sbs.  E and T depend on shapes only, never on the thread
         * count (determinism).  Every suite case (sbs = 1, K * G <= 8192 * 64) is one chunk. */
        const int64_t kb = p->sbs < p->S2 ? p->sbs : p->S2;
        size_t per_key = (size_t)(2 * pl->G + 1) * 4 * (size_t)p->N2 * SFA_TMIN;
        int64_t ck = (int64_t)(sfa_tile_bytes / per_key);
        int64_t E = kb > 0 ? ck / kb : p->K;
        if (E > p->K) E = p->K;
        if (E < 1) E = 1;
        pl->E = E;
        pl->nch = (p->K + E - 1) / E;
        if (pl->nch < 1) pl->nch = 1;
        pl->kc = E * kb;
        size_t slot = sfa_tile_layout_of(pl).total * (size_t)p->N2;
        int64_t T = (int64_t)(sfa_tile_bytes / (slot ? slot : 1));
        if (T > 64) T = 64;
        if (T < SFA_TMIN) T = SFA_TMIN;
        if (T > p->S1) T = p->S1;
        pl->T = T;
        pl->nmark = p->seqs && p->seqs->Tkv < p->S2 ? p->seqs->Tkv : p->S2;
        pl->ncol = (pl->Dp + SFA_CW - 1) / SFA_CW + (pl->Drp + SFA_CW - 1) / SFA_CW +
                   (p->shared_kv ? 0 : (pl->Dp + SFA_CW - 1) / SFA_CW);
    }
}

sfa_thread_layout sfa_thread_layout_of(const sfa_plan *pl, int backward) {
    const spattn_sfa_problem *p = pl->p;
    size_t f = sizeof(float), off = 0;
    sfa_thread_layout L;
    memset(&L, 0, sizeof(L));
#define TAKE(field, bytes) (L.field = off, off = align_up(off + (size_t)(bytes)))
    TAKE(qt, (size_t)(pl->Dqp * pl->Gp) * f);
    if (backward) TAKE(dot, (size_t)(pl->Dp * pl->Gp) * f);
    TAKE(kc, (size_t)(SFA_NC * pl->Dqp) * f);
    if (!p->shared_kv) TAKE(vc, (size_t)(SFA_NC * pl->Dp) * f);
    TAKE(st, (size_t)(SFA_NC * pl->Gp) * f);
    if (backward) TAKE(dpt, (size_t)(SFA_NC * pl->Gp) * f);
    /* O accumulators (forward) / dQ accumulators of a one-chunk row and O row scratch
     * (backward) */
    TAKE(acc, (size_t)(pl->G * (backward ? pl->Dqp : pl->Dp)) * f);
    if (!backward) TAKE(row, (size_t)pl->Dqp * f); /* one q row before it is transposed */
    if (!backward) TAKE(ml, (size_t)(4 * pl->Gp) * f);
    if (!backward) TAKE(keys, (size_t)pl->kmax * sizeof(int64_t));
    if (backward) TAKE(mark, (size_t)pl->nmark);
#undef TAKE
    L.total = off;
    return L;
}

sfa_tile_layout sfa_tile_layout_of(const sfa_plan *pl) {
    size_t off = 0, f = sizeof(float);
    sfa_tile_layout L;
    L.x = off;
    off = align_up(off + (size_t)(2 * pl->G * pl->Dqp) * f);
    L.dq = off; /* only when a row takes several chunks (else in the thread buffer) */
    if (pl->nch > 1) off = align_up(off + (size_t)(pl->G * pl->Dqp) * f);
    L.ld = off;
    off = align_up(off + (size_t)(2 * pl->Gp) * f);
    L.dsp = off;
    off = align_up(off + (size_t)(pl->kc * 2 * pl->G) * f);
    L.keys = off;
    off = align_up(off + (size_t)pl->kc * sizeof(int64_t));
    L.meta = off;
    off = align_up(off + 2 * sizeof(int64_t));
    L.total = off;
    return L;
}

size_t sfa_workspace_parts(const sfa_plan *pl, int backward, size_t *off_tile, size_t *off_acc) {
    const spattn_sfa_problem *p = pl->p;
    size_t total = (size_t)pl->nt * sfa_thread_layout_of(pl, backward).total;
    size_t tile = 0, acc = 0;
    if (backward) {
        tile = total;
        total += (size_t)(pl->T * p->N2) * sfa_tile_layout_of(pl).total;
        acc = total;
        /* varlen: one accumulator row per key-side row (packed token or page row) */
        int64_t rows = p->seqs ? p->seqs->Tkv : p->B * p->S2;
        size_t n = (size_t)(rows * p->N2) * (size_t)(pl->Dqp + (p->shared_kv ? 0 : pl->Dp));
        total += align_up(n * sizeof(float));
    }
    if (off_tile) *off_tile = tile;
    if (off_acc) *off_acc = acc;
    return total + SFA_ALIGN; /* slack to align a caller's workspace */
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
