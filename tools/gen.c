/*
 * Case inputs.  Every tensor draws from its own stream (rng.h), in row-major order of its
 * logical shape, so one tensor's values do not depend on the size of another.
 */
#include "gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "rng.h"
#include "spattn.h"

float sp_load(const void *buf, int32_t dtype, int64_t i) { return spattn_load_f32(buf, dtype, i); }

/* Values come in chunks of 2^16 with a generator each (docs/cli.md), so that large tensors
 * are filled in parallel and still identically for any thread count. */
#define GEN_CHUNK ((int64_t)1 << 16)

void sp_gen_normal(uint64_t seed, int stream, int32_t dtype, void *dst, int64_t n) {
    const int64_t nchunk = (n + GEN_CHUNK - 1) / GEN_CHUNK;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunk; c++) {
        sp_rng r;
        sp_rng_init_chunk(&r, seed, (uint64_t)stream, (uint64_t)c);
        const int64_t end = c + 1 < nchunk ? (c + 1) * GEN_CHUNK : n;
        /* double -> fp32 -> dtype, round to nearest even at each step. */
        for (int64_t i = c * GEN_CHUNK; i < end; i++)
            spattn_store_f32(dst, dtype, i, (float)sp_rng_normal(&r));
    }
}

/* Picks m distinct values of [0, n) (Floyd's algorithm: O(m) draws, uniform subsets) into
 * out[0..m), using mark[] (size n) with the stamp `tag` as the membership set. */
static void floyd(sp_rng *r, int64_t n, int64_t m, int32_t *out, int64_t *mark, int64_t tag) {
    int64_t k = 0;
    for (int64_t j = n - m; j < n; j++) {
        int64_t t = sp_rng_below(r, j + 1);
        int64_t pick = mark[t] == tag ? j : t;
        mark[pick] = tag;
        out[k++] = (int32_t)pick;
    }
}

void sp_gen_mask(const sp_case *c, uint8_t *mask) {
    const int64_t nbx = (c->Sq + c->bx - 1) / c->bx, nby = (c->Skv + c->by - 1) / c->by;
    const int64_t off = c->Skv - c->Sq;
    sp_rng r;
    sp_rng_init(&r, c->seed, SP_STREAM_MASK);
    int64_t *mark = NULL;
    int32_t *pick = NULL;
    if (c->pattern == SP_PAT_BIGBIRD) {
        mark = malloc((size_t)nby * sizeof *mark);
        pick = malloc((size_t)nby * sizeof *pick);
        if (mark) for (int64_t j = 0; j < nby; j++) mark[j] = -1;
    }
    int64_t tag = 0;
    for (int64_t bn = 0; bn < c->B * c->N; bn++) {
        for (int64_t i = 0; i < nbx; i++) {
            uint8_t *row = mask + (bn * nbx + i) * nby;
            const int64_t qs = i * c->bx;
            const int64_t qe = (i + 1) * c->bx < c->Sq ? (i + 1) * c->bx - 1 : c->Sq - 1;
            for (int64_t j = 0; j < nby; j++) {
                const int64_t ks = j * c->by;
                const int64_t ke = (j + 1) * c->by < c->Skv ? (j + 1) * c->by - 1 : c->Skv - 1;
                int on = 0;
                switch (c->pattern) {
                case SP_PAT_DENSE: on = 1; break;
                case SP_PAT_CAUSAL: on = ks <= qe + off; break;
                case SP_PAT_WINDOW: on = ks <= qe + off && ke >= qs + off - c->window; break;
                case SP_PAT_BIGBIRD:
                    on = j < c->glob || i < c->glob ||
                         (ks <= qe + c->win * c->by && ke >= qs - c->win * c->by);
                    break;
                case SP_PAT_RANDOM: on = sp_rng_uniform(&r) < c->density; break;
                }
                row[j] = (uint8_t)on;
            }
            if (c->pattern == SP_PAT_BIGBIRD && c->rnd > 0) {
                int64_t m = c->rnd < nby ? c->rnd : nby;
                if (mark && pick) {
                    floyd(&r, nby, m, pick, mark, tag++);
                    for (int64_t t = 0; t < m; t++) row[pick[t]] = 1;
                }
            }
        }
    }
    free(mark);
    free(pick);
}

int sp_gen_indices(const sp_case *c, int32_t *idx) {
    const int64_t nblk = (c->S2 + c->sbs - 1) / c->sbs;
    int64_t *mark = malloc((size_t)nblk * sizeof *mark);
    if (!mark) return -1;
    for (int64_t j = 0; j < nblk; j++) mark[j] = -1;
    sp_rng r;
    sp_rng_init(&r, c->seed, SP_STREAM_IDX);
    int64_t tag = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < c->S1; s++) {
            /* Newest allowed key of query s, and the block holding it. */
            const int64_t lim = c->mode == SPATTN_SFA_MODE_CAUSAL ? c->S2 - c->S1 + s : c->S2 - 1;
            for (int64_t n = 0; n < c->N2; n++) {
                int32_t *row = idx + ((b * c->S1 + s) * c->N2 + n) * c->K;
                int64_t count = 0;
                if (lim >= 0) {
                    const int64_t lb = lim / c->sbs;
                    count = c->K < lb + 1 ? c->K : lb + 1;
                    floyd(&r, lb, count - 1, row, mark, tag++);
                    row[count - 1] = (int32_t)lb;
                    for (int64_t t = count - 1; t > 0; t--) { /* Fisher-Yates: random order */
                        int64_t u = sp_rng_below(&r, t + 1);
                        int32_t tmp = row[t];
                        row[t] = row[u];
                        row[u] = tmp;
                    }
                }
                for (int64_t t = count; t < c->K; t++) row[t] = -1;
            }
        }
    free(mark);
    return 0;
}

void sp_output_sizes(const sp_case *c, int64_t *no, int64_t *nlse, int64_t *ndq, int64_t *ndk,
                     int64_t *ndv) {
    if (c->op == SP_OP_BSA) {
        *no = c->B * c->N * c->Sq * c->D;
        *nlse = c->B * c->N * c->Sq;
        *ndq = *no;
        *ndk = c->B * c->Nkv * c->Skv * c->D;
        *ndv = *ndk;
    } else {
        *no = c->B * c->S1 * c->N1 * c->D;
        *nlse = c->B * c->S1 * c->N1;
        *ndq = c->B * c->S1 * c->N1 * (c->D + c->Dr);
        *ndk = c->B * c->S2 * c->N2 * (c->D + c->Dr);
        *ndv = c->shared_kv ? 0 : c->B * c->S2 * c->N2 * c->D;
    }
}

void sp_inputs_free(sp_inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->dout);
    free(in->mask);
    free(in->idx);
    memset(in, 0, sizeof *in);
}

int sp_inputs_make(const sp_case *c, sp_inputs *in, char *err, size_t errlen) {
    memset(in, 0, sizeof *in);
    in->dtype = c->dtype;
    in->esize = spattn_dtype_size((spattn_dtype)c->dtype);
    if (c->op == SP_OP_BSA) {
        in->nq = c->B * c->N * c->Sq * c->D;
        in->nk = in->nv = c->B * c->Nkv * c->Skv * c->D;
        in->ndout = in->nq;
        in->nbx = (c->Sq + c->bx - 1) / c->bx;
        in->nby = (c->Skv + c->by - 1) / c->by;
        in->nmask = c->B * c->N * in->nbx * in->nby;
    } else {
        in->nq = c->B * c->S1 * c->N1 * (c->D + c->Dr);
        in->nk = c->B * c->S2 * c->N2 * (c->D + c->Dr);
        in->nv = c->shared_kv ? 0 : c->B * c->S2 * c->N2 * c->D;
        in->ndout = c->B * c->S1 * c->N1 * c->D;
        in->nidx = c->B * c->S1 * c->N2 * c->K;
    }
    in->q = malloc((size_t)in->nq * in->esize);
    in->k = malloc((size_t)in->nk * in->esize);
    in->v = in->nv ? malloc((size_t)in->nv * in->esize) : NULL;
    in->dout = malloc((size_t)in->ndout * in->esize);
    in->mask = in->nmask ? malloc((size_t)in->nmask) : NULL;
    in->idx = in->nidx ? malloc((size_t)in->nidx * sizeof(int32_t)) : NULL;
    if (!in->q || !in->k || (in->nv && !in->v) || !in->dout || (in->nmask && !in->mask) ||
        (in->nidx && !in->idx)) {
        snprintf(err, errlen, "out of memory generating the inputs of case %s", c->name);
        sp_inputs_free(in);
        return -1;
    }
    sp_gen_normal(c->seed, SP_STREAM_Q, c->dtype, in->q, in->nq);
    sp_gen_normal(c->seed, SP_STREAM_K, c->dtype, in->k, in->nk);
    if (in->v) sp_gen_normal(c->seed, SP_STREAM_V, c->dtype, in->v, in->nv);
    sp_gen_normal(c->seed, SP_STREAM_DOUT, c->dtype, in->dout, in->ndout);
    if (c->op == SP_OP_BSA) {
        sp_gen_mask(c, in->mask);
    } else if (sp_gen_indices(c, in->idx)) {
        snprintf(err, errlen, "out of memory generating the indices of case %s", c->name);
        sp_inputs_free(in);
        return -1;
    }
    return 0;
}

double sp_pairs(const sp_case *c, const sp_inputs *in) {
    double pairs = 0.0;
    if (c->op == SP_OP_BSA) {
        for (int64_t bn = 0; bn < c->B * c->N; bn++)
            for (int64_t i = 0; i < in->nbx; i++) {
                int64_t rows = (i + 1) * c->bx < c->Sq ? c->bx : c->Sq - i * c->bx;
                const uint8_t *row = in->mask + (bn * in->nbx + i) * in->nby;
                int64_t cols = 0;
                for (int64_t j = 0; j < in->nby; j++)
                    if (row[j]) cols += (j + 1) * c->by < c->Skv ? c->by : c->Skv - j * c->by;
                pairs += (double)rows * (double)cols;
            }
        return pairs;
    }
    const int64_t heads = c->N1 / c->N2;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < c->S1; s++) {
            const int64_t lim = c->mode == SPATTN_SFA_MODE_CAUSAL ? c->S2 - c->S1 + s : c->S2 - 1;
            for (int64_t n = 0; n < c->N2; n++) {
                const int32_t *row = in->idx + ((b * c->S1 + s) * c->N2 + n) * c->K;
                int64_t keys = 0;
                for (int64_t t = 0; t < c->K; t++) {
                    if (row[t] < 0) continue;
                    int64_t lo = (int64_t)row[t] * c->sbs, hi = lo + c->sbs - 1;
                    if (hi > c->S2 - 1) hi = c->S2 - 1;
                    if (hi > lim) hi = lim;
                    if (hi >= lo) keys += hi - lo + 1;
                }
                pairs += (double)(keys * heads);
            }
        }
    return pairs;
}

double sp_pairs_estimate(const sp_case *c) {
    if (c->op == SP_OP_BSA) {
        sp_inputs in;
        memset(&in, 0, sizeof in);
        in.nbx = (c->Sq + c->bx - 1) / c->bx;
        in.nby = (c->Skv + c->by - 1) / c->by;
        in.mask = malloc((size_t)(c->B * c->N * in.nbx * in.nby));
        if (!in.mask) return (double)c->B * c->N * c->Sq * c->Skv;
        sp_gen_mask(c, in.mask);
        double p = sp_pairs(c, &in);
        free(in.mask);
        return p;
    }
    double pairs = 0.0;
    for (int64_t s = 0; s < c->S1; s++) {
        int64_t lim = c->mode == SPATTN_SFA_MODE_CAUSAL ? c->S2 - c->S1 + s : c->S2 - 1;
        if (lim < 0) continue;
        int64_t nb = lim / c->sbs + 1;
        pairs += (double)((c->K < nb ? c->K : nb) * c->sbs);
    }
    return pairs * (double)(c->B * c->N1);
}

double sp_flops(const sp_case *c, double pairs, int backward) {
    if (c->op == SP_OP_BSA) return (backward ? 10.0 : 4.0) * (double)c->D * pairs;
    double dqk = (double)(c->D + c->Dr), dv = (double)c->D;
    return backward ? 2.0 * (3.0 * dqk + 2.0 * dv) * pairs : 2.0 * (dqk + dv) * pairs;
}
