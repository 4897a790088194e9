/*
 * Inputs of varlen / paged cases, as cases/README.md "Varlen and paged cases" defines them:
 * packed TND tensors from the same per-tensor streams as the dense cases (row-major over the
 * packed shape), prefix sums of the case's lengths, and for paged keys a shuffled block table
 * with k / v scattered into the pages.  Page rows no sequence uses are NaN, so a kernel that
 * lets keys past a sequence's end (or a spare page) into its sums, even as 0 * NaN, shows up
 * as NaN in the comparison.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "gen.h"
#include "rng.h"
#include "spattn.h"

void sp_varlen_rows(const sp_case *c, int64_t *Tq, int64_t *Tkv, int64_t *kv_rows) {
    int64_t tq = 0, tkv = 0, pages = 0;
    for (int64_t b = 0; b < c->nseq; b++) {
        tq += c->lens[b];
        tkv += c->kvlens[b];
        if (c->page) pages += (c->kvlens[b] + c->page - 1) / c->page;
    }
    *Tq = tq;
    *Tkv = tkv;
    *kv_rows = c->page ? (pages + 1) * c->page : tkv;
}

int64_t sp_max_pages(const sp_case *c) {
    int64_t m = 1;
    for (int64_t b = 0; b < c->nseq; b++) {
        int64_t p = (c->kvlens[b] + c->page - 1) / c->page;
        if (p > m) m = p;
    }
    return m;
}

int64_t sp_gen_pages(const sp_case *c, int32_t *table, int64_t max_pages) {
    int64_t tq, tkv, rows;
    sp_varlen_rows(c, &tq, &tkv, &rows);
    const int64_t num_pages = rows / c->page;
    int32_t *perm = malloc((size_t)num_pages * sizeof *perm);
    if (!perm) return 0;
    /* A uniformly shuffled list of page ids (Fisher-Yates from the top), dealt out to the
     * sequences in order; the last id of the list is the spare page. */
    for (int64_t p = 0; p < num_pages; p++) perm[p] = (int32_t)p;
    sp_rng r;
    sp_rng_init(&r, c->seed, SP_STREAM_PAGES);
    for (int64_t t = num_pages - 1; t > 0; t--) {
        int64_t u = sp_rng_below(&r, t + 1);
        int32_t tmp = perm[t];
        perm[t] = perm[u];
        perm[u] = tmp;
    }
    int64_t next = 0;
    for (int64_t b = 0; b < c->nseq; b++) {
        const int64_t used = (c->kvlens[b] + c->page - 1) / c->page;
        for (int64_t s = 0; s < max_pages; s++)
            table[b * max_pages + s] = s < used ? perm[next++] : -1; /* -1: slot not read */
    }
    free(perm);
    return num_pages;
}

/* Scatters packed key-side rows [Tkv, width] (width = heads * columns) into pages: key j of
 * sequence b goes to page table[b, j / page], row j % page.  Every other row becomes NaN. */
static void scatter_pages(const sp_case *c, const sp_inputs *in, const void *packed, void *pages,
                          int64_t width) {
    const int64_t rows = in->num_pages * c->page;
    const float qnan = nanf("");
    for (int64_t i = 0; i < rows * width; i++) spattn_store_f32(pages, in->dtype, i, qnan);
    for (int64_t b = 0; b < c->nseq; b++)
        for (int64_t j = 0; j < c->kvlens[b]; j++) {
            const int64_t page = in->table[b * in->max_pages + j / c->page];
            const int64_t dst = page * c->page + j % c->page, src = in->cu_kv[b] + j;
            memcpy((char *)pages + (size_t)(dst * width) * in->esize,
                   (const char *)packed + (size_t)(src * width) * in->esize,
                   (size_t)width * in->esize);
        }
}

int sp_inputs_make_varlen(const sp_case *c, sp_inputs *in, char *err, size_t errlen) {
    memset(in, 0, sizeof *in);
    in->dtype = c->dtype;
    in->esize = spattn_dtype_size((spattn_dtype)c->dtype);
    int64_t rows;
    sp_varlen_rows(c, &in->Tq, &in->Tkv, &rows);
    const int bsa = c->op == SP_OP_BSA;
    const int64_t hq = bsa ? c->N : c->N1, hk = bsa ? c->Nkv : c->N2;
    const int64_t W = bsa ? c->D : c->D + c->Dr;
    in->nq = in->Tq * hq * W;
    in->nk = in->Tkv * hk * W;
    in->nv = bsa || !c->shared_kv ? in->Tkv * hk * c->D : 0;
    in->ndout = in->Tq * hq * c->D;
    if (bsa) {
        in->nbx = (c->Sq + c->bx - 1) / c->bx;
        in->nby = (c->Skv + c->by - 1) / c->by;
        in->nmask = c->B * c->N * in->nbx * in->nby;
    } else {
        in->nidx = in->Tq * c->N2 * c->K;
    }
    in->q = malloc((size_t)in->nq * in->esize);
    in->k = malloc((size_t)in->nk * in->esize);
    in->v = in->nv ? malloc((size_t)in->nv * in->esize) : NULL;
    in->dout = malloc((size_t)in->ndout * in->esize);
    in->mask = in->nmask ? malloc((size_t)in->nmask) : NULL;
    in->idx = in->nidx ? malloc((size_t)in->nidx * sizeof(int32_t)) : NULL;
    in->cu_q = malloc((size_t)(c->B + 1) * sizeof(int32_t));
    in->cu_kv = malloc((size_t)(c->B + 1) * sizeof(int32_t));
    int ok = in->q && in->k && (!in->nv || in->v) && in->dout && (!in->nmask || in->mask) &&
             (!in->nidx || in->idx) && in->cu_q && in->cu_kv;
    if (ok && c->page) {
        in->max_pages = sp_max_pages(c);
        in->num_pages = rows / c->page;
        in->nkpage = rows * hk * W;
        in->nvpage = in->nv ? rows * hk * c->D : 0;
        in->table = malloc((size_t)(c->B * in->max_pages) * sizeof(int32_t));
        in->kpage = malloc((size_t)in->nkpage * in->esize);
        in->vpage = in->nvpage ? malloc((size_t)in->nvpage * in->esize) : NULL;
        ok = in->table && in->kpage && (!in->nvpage || in->vpage) &&
             sp_gen_pages(c, in->table, in->max_pages) == in->num_pages;
    }
    if (!ok) {
        snprintf(err, errlen, "out of memory generating the inputs of case %s", c->name);
        sp_inputs_free(in);
        return -1;
    }
    in->cu_q[0] = in->cu_kv[0] = 0;
    for (int64_t b = 0; b < c->B; b++) {
        in->cu_q[b + 1] = in->cu_q[b] + c->lens[b];
        in->cu_kv[b + 1] = in->cu_kv[b] + c->kvlens[b];
    }
    sp_gen_normal(c->seed, SP_STREAM_Q, c->dtype, in->q, in->nq);
    sp_gen_normal(c->seed, SP_STREAM_K, c->dtype, in->k, in->nk);
    if (in->v) sp_gen_normal(c->seed, SP_STREAM_V, c->dtype, in->v, in->nv);
    sp_gen_normal(c->seed, SP_STREAM_DOUT, c->dtype, in->dout, in->ndout);
    if (bsa) {
        sp_gen_mask_varlen(c, in->mask);
    } else if (sp_gen_indices_varlen(c, in->idx)) {
        snprintf(err, errlen, "out of memory generating the indices of case %s", c->name);
        sp_inputs_free(in);
        return -1;
    }
    if (c->page) {
        scatter_pages(c, in, in->k, in->kpage, hk * W);
        if (in->vpage) scatter_pages(c, in, in->v, in->vpage, hk * c->D);
    }
    return 0;
}

int64_t sp_block_len(int64_t blk, int64_t bs, int64_t L) {
    int64_t lo = blk * bs, hi = lo + bs < L ? lo + bs : L;
    return hi > lo ? hi - lo : 0;
}

double sp_pairs_varlen(const sp_case *c, const sp_inputs *in) {  /* sfa (bsa: sp_pairs) */
    double pairs = 0.0;
    const int64_t heads = c->N1 / c->N2;
    int64_t tok = 0;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t S1 = c->lens[b], S2 = c->kvlens[b];
        for (int64_t s = 0; s < S1; s++, tok++) {
            const int64_t lim = c->mode == SPATTN_SFA_MODE_CAUSAL ? S2 - S1 + s : S2 - 1;
            for (int64_t n = 0; n < c->N2; n++) {
                const int32_t *row = in->idx + (tok * c->N2 + n) * c->K;
                int64_t keys = 0;
                for (int64_t t = 0; t < c->K; t++) {
                    if (row[t] < 0) continue;
                    int64_t lo = (int64_t)row[t] * c->sbs, hi = lo + c->sbs - 1;
                    if (hi > S2 - 1) hi = S2 - 1;
                    if (hi > lim) hi = lim;
                    if (hi >= lo) keys += hi - lo + 1;
                }
                pairs += (double)(keys * heads);
            }
        }
    }
    return pairs;
}

double sp_pairs_estimate_varlen(const sp_case *c) {
    /* sfa only (bsa counts its generated mask in sp_pairs_estimate): each query selects
     * min(K, allowed blocks) blocks of sbs keys, as the dense estimate. */
    double pairs = 0.0;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t S1 = c->lens[b], S2 = c->kvlens[b];
        for (int64_t s = 0; s < S1; s++) {
            int64_t lim = c->mode == SPATTN_SFA_MODE_CAUSAL ? S2 - S1 + s : S2 - 1;
            if (lim < 0) continue;
            int64_t nb = lim / c->sbs + 1;
            pairs += (double)((c->K < nb ? c->K : nb) * c->sbs);
        }
    }
    return pairs * (double)c->N1;
}
