/*
 * CPU sfa backward driver.  Per batch, token tiles of pl.T tokens; per tile, the rows' index
 * entries in pl.nch chunks of pl.E entries (T, E from shapes only; the tile holds one chunk, so
 * its memory does not grow with K * sbs).  Per (tile, chunk):
 *   1. query pass, parallel over (token, group): the chunk's dQ terms into the slot's fp32
 *      accumulators (written out after the last chunk), and dS / P per (key, head) into the tile;
 *   2. scatter pass, parallel over fixed column units of dK / dV: tokens and keys in
 *      ascending order add into fp32 accumulators.
 * Each accumulator element is owned by one unit and sees its additions in one fixed order, so
 * the result is bitwise the same for any thread count.  Finally the accumulators are rounded
 * into dk, dk_rope and dv.
 */
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "../core/dtype.h"
#include "../core/seqs.h"
#include "sfa_cpu.h"

static void store_row(const spattn_tensor *t, int64_t off, int64_t n, const float *src) {
    int64_t s = t->strides[3];
    for (int64_t d = 0; d < n; d++) spattn_store_f32(t->data, t->dtype, off + d * s, src[d]);
}

/* Packed variable-length batch: the sequences one after the other, each on its own dense
 * problem (spattn_sfa_seq_at) with the tiling of the max_seqlen plan; accumulators per key-side
 * row (packed token, or page row: bwd_query then hands the scatter page rows).  Every row of
 * dk / dk_rope / dv is written (0 where no sequence's key lies). */
static void bwd_varlen(const sfa_plan *pl, const sfa_kernels *kn, char *ws, size_t tbytes,
                       size_t slot, char *tile, float *dkacc) {
    const spattn_sfa_problem *p = pl->p;
    const spattn_seqs *s = p->seqs;
    const int64_t N2 = p->N2, T = pl->T, Dqp = pl->Dqp, Dp = pl->Dp, R = s->Tkv;
    float *dvacc = p->shared_kv ? NULL : dkacc + R * N2 * Dqp;
    const int64_t nacc = R * N2 * (Dqp + (p->shared_kv ? 0 : Dp));
    const int64_t nunit = N2 * pl->ncol;
    /* outputs as [1, R, N2, w] views (pages: [num_pages, page_size] rows are R rows too) */
    spattn_tensor dk = *p->dk, dkr = p->dk_rope ? *p->dk_rope : dk, dv = p->dv ? *p->dv : dk;
    if (!s->table) {
        dk = spattn_packed_view4(p->dk, 0, R, 0);
        if (p->dk_rope) dkr = spattn_packed_view4(p->dk_rope, 0, R, 0);
        if (p->dv) dv = spattn_packed_view4(p->dv, 0, R, 0);
    }
    const int64_t ps = s->table ? s->page_size : R;
#pragma omp parallel num_threads(pl->nt)
    {
        char *tb = ws + (size_t)omp_get_thread_num() * tbytes;
        memset(tb + sfa_thread_layout_of(pl, 1).mark, 0, (size_t)pl->nmark); /* duplicate marks */
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nacc; c += 4096)
            memset(dkacc + c, 0, (size_t)(nacc - c < 4096 ? nacc - c : 4096) * sizeof(float));
        spattn_sfa_seq sq;
        sfa_plan plb = *pl; /* T, E, kc, kmax of max_seqlen bound the sequence's */
        plb.p = &sq.p;
        for (int64_t b = 0; b < s->B; b++) {
            const int64_t S1 = spattn_seq_len_q(s, b);
            if (S1 == 0) continue;
            spattn_sfa_seq_at(p, b, &sq);
            const int64_t k0 = s->table ? 0 : spattn_seq_kv0(s, b);
            float *dk_b = dkacc + k0 * N2 * Dqp, *dv_b = dvacc ? dvacc + k0 * N2 * Dp : NULL;
            for (int64_t i0 = 0; i0 < S1; i0 += T) {
                int64_t ntok = S1 - i0 < T ? S1 - i0 : T;
                for (int64_t ch = 0; ch < pl->nch; ch++) {
#pragma omp for schedule(dynamic, 1)
                    for (int64_t w = 0; w < ntok * N2; w++)
                        kn->bwd_query(&plb, b, i0 + w / N2, w % N2, ch, tb,
                                      tile + (size_t)w * slot);
#pragma omp for schedule(dynamic, 1)
                    for (int64_t w = 0; w < nunit; w++)
                        kn->bwd_scatter(&plb, w / pl->ncol, w % pl->ncol, tile, slot, ntok, dk_b,
                                        dv_b);
                }
            }
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < R * N2; r++) {
            int64_t n2 = r % N2, row = r / N2, pg = row / ps, j = row % ps;
            const float *a = dkacc + r * Dqp;
            store_row(&dk, spattn_offset4(&dk, pg, j, n2, 0), p->D, a);
            if (p->Dr) store_row(&dkr, spattn_offset4(&dkr, pg, j, n2, 0), p->Dr, a + Dp);
            if (dvacc) store_row(&dv, spattn_offset4(&dv, pg, j, n2, 0), p->D, dvacc + r * Dp);
        }
    }
}

spattn_status spattn_cpu_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    sfa_plan pl;
    sfa_plan_init(&pl, p, 1, ex->num_threads);
    size_t off_tile, off_acc;
    size_t bytes = sfa_workspace_parts(&pl, 1, &off_tile, &off_acc);
    char *raw = ex->workspace ? (char *)ex->workspace : malloc(bytes);
    if (!raw)
        return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY,
                                "sfa cpu backward: cannot allocate %zu bytes of workspace", bytes);
    char *ws = raw + (SFA_ALIGN - (uintptr_t)raw % SFA_ALIGN) % SFA_ALIGN;
    const size_t tbytes = sfa_thread_layout_of(&pl, 1).total;
    const size_t slot = sfa_tile_layout_of(&pl).total;
    const sfa_kernels *kn = sfa_kernels_select();
    const int64_t S1 = p->S1, S2 = p->S2, N2 = p->N2, T = pl.T, Dqp = pl.Dqp, Dp = pl.Dp;
    char *tile = ws + off_tile;
    float *dkacc = (float *)(ws + off_acc);
    float *dvacc = p->shared_kv ? NULL : dkacc + p->B * S2 * N2 * Dqp;
    const int64_t krow = S2 * N2 * Dqp, vrow = S2 * N2 * Dp; /* per batch */
    const int64_t nacc = p->B * (krow + (p->shared_kv ? 0 : vrow));
    const int64_t nunit = N2 * pl.ncol;
    if (p->seqs) {
        bwd_varlen(&pl, kn, ws, tbytes, slot, tile, dkacc);
        if (!ex->workspace) free(raw);
        return SPATTN_STATUS_SUCCESS;
    }
#pragma omp parallel num_threads(pl.nt)
    {
        char *tb = ws + (size_t)omp_get_thread_num() * tbytes;
        memset(tb + sfa_thread_layout_of(&pl, 1).mark, 0, (size_t)pl.nmark); /* duplicate marks */
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nacc; c += 4096)
            memset(dkacc + c, 0, (size_t)(nacc - c < 4096 ? nacc - c : 4096) * sizeof(float));
        for (int64_t b = 0; b < p->B; b++) {
            float *dk_b = dkacc + b * krow, *dv_b = dvacc ? dvacc + b * vrow : NULL;
            for (int64_t i0 = 0; i0 < S1; i0 += T) {
                int64_t ntok = S1 - i0 < T ? S1 - i0 : T;
                for (int64_t ch = 0; ch < pl.nch; ch++) {
#pragma omp for schedule(dynamic, 1)
                    for (int64_t w = 0; w < ntok * N2; w++)
                        kn->bwd_query(&pl, b, i0 + w / N2, w % N2, ch, tb,
                                      tile + (size_t)w * slot);
#pragma omp for schedule(dynamic, 1)
                    for (int64_t w = 0; w < nunit; w++)
                        kn->bwd_scatter(&pl, w / pl.ncol, w % pl.ncol, tile, slot, ntok, dk_b,
                                        dv_b);
                }
            }
        }
        /* round the accumulators into the outputs */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < p->B * S2 * N2; r++) {
            int64_t n2 = r % N2, j = (r / N2) % S2, b = r / (N2 * S2);
            const float *a = dkacc + r * Dqp;
            store_row(p->dk, spattn_offset4(p->dk, b, j, n2, 0), p->D, a);
            if (p->Dr) store_row(p->dk_rope, spattn_offset4(p->dk_rope, b, j, n2, 0), p->Dr, a + Dp);
            if (dvacc) store_row(p->dv, spattn_offset4(p->dv, b, j, n2, 0), p->D, dvacc + r * Dp);
        }
    }
    if (!ex->workspace) free(raw);
    return SPATTN_STATUS_SUCCESS;
}
