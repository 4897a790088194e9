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

/* Scratch of the bigbird pattern's random columns (floyd's membership marks). */
typedef struct mask_scratch {
    int64_t *mark;
    int32_t *pick;
    int64_t tag;
} mask_scratch;

/* Block row i (nby entries) of one (b, n) mask of a problem with Sq x Skv tokens.  Entries
 * past the problem's own blocks (varlen: the padded mask of max_seqlen) are 0; the random
 * pattern still draws one uniform per entry, in range or not, so that a generator elsewhere
 * only needs the padded shape to stay in step. */
static void mask_row(const sp_case *c, int64_t Sq, int64_t Skv, int64_t i, int64_t nby,
                     sp_rng *r, mask_scratch *ms, uint8_t *row) {
    const int64_t nbx_s = (Sq + c->bx - 1) / c->bx, nby_s = (Skv + c->by - 1) / c->by;
    const int64_t off = Skv - Sq;
    const int row_in = i < nbx_s;
    const int64_t qs = i * c->bx;
    const int64_t qe = (i + 1) * c->bx < Sq ? (i + 1) * c->bx - 1 : Sq - 1;
    for (int64_t j = 0; j < nby; j++) {
        const int64_t ks = j * c->by;
        const int64_t ke = (j + 1) * c->by < Skv ? (j + 1) * c->by - 1 : Skv - 1;
        int on = 0;
        switch (c->pattern) {
        case SP_PAT_DENSE: on = 1; break;
        case SP_PAT_CAUSAL: on = ks <= qe + off; break;
        case SP_PAT_WINDOW: on = ks <= qe + off && ke >= qs + off - c->window; break;
        case SP_PAT_BIGBIRD:
            on = j < c->glob || i < c->glob ||
                 (ks <= qe + c->win * c->by && ke >= qs - c->win * c->by);
            break;
        case SP_PAT_RANDOM: on = sp_rng_uniform(r) < c->density; break;
        }
        row[j] = (uint8_t)(row_in && j < nby_s && on);
    }
    if (c->pattern == SP_PAT_BIGBIRD && c->rnd > 0 && row_in && nby_s > 0) {
        int64_t m = c->rnd < nby_s ? c->rnd : nby_s;
        if (ms->mark && ms->pick) {
            floyd(r, nby_s, m, ms->pick, ms->mark, ms->tag++);
            for (int64_t t = 0; t < m; t++) row[ms->pick[t]] = 1;
        }
    }
}

/* The [B, N, nbx, nby] mask, block row by block row in generation order; sequence b has
 * Sq(b) x Skv(b) tokens (dense: all equal).  mask != NULL: the rows go there; NULL: into one
 * reused row buffer (the mask is never held whole).  Each row is passed to fn (if any) once
 * written.  Returns -1 when the row buffer cannot be allocated. */
typedef void (*mask_row_fn)(void *ctx, int64_t b, int64_t i, const uint8_t *row, int64_t nby);
static int gen_mask_rows(const sp_case *c, uint8_t *mask, mask_row_fn fn, void *ctx) {
    const int64_t nbx = (c->Sq + c->bx - 1) / c->bx, nby = (c->Skv + c->by - 1) / c->by;
    uint8_t *one = mask ? NULL : malloc(nby > 0 ? (size_t)nby : 1);
    if (!mask && !one) return -1;
    sp_rng r;
    sp_rng_init(&r, c->seed, SP_STREAM_MASK);
    mask_scratch ms = {NULL, NULL, 0};
    if (c->pattern == SP_PAT_BIGBIRD) {
        ms.mark = malloc((size_t)nby * sizeof *ms.mark);
        ms.pick = malloc((size_t)nby * sizeof *ms.pick);
        if (ms.mark) for (int64_t j = 0; j < nby; j++) ms.mark[j] = -1;
    }
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t Sq = c->varlen ? c->lens[b] : c->Sq;
        const int64_t Skv = c->varlen ? c->kvlens[b] : c->Skv;
        for (int64_t n = 0; n < c->N; n++)
            for (int64_t i = 0; i < nbx; i++) {
                uint8_t *row = mask ? mask + ((b * c->N + n) * nbx + i) * nby : one;
                mask_row(c, Sq, Skv, i, nby, &r, &ms, row);
                if (fn) fn(ctx, b, i, row, nby);
            }
    }
    free(ms.mark);
    free(ms.pick);
    free(one);
    return 0;
}
static void gen_mask(const sp_case *c, uint8_t *mask) { (void)gen_mask_rows(c, mask, NULL, NULL); }

/* Attended (query, key) pairs of block row i of sequence b's mask (varlen: its own lengths). */
static double row_pairs(const sp_case *c, int64_t b, int64_t i, const uint8_t *row, int64_t nby) {
    const int64_t Sq = c->varlen ? c->lens[b] : c->Sq, Skv = c->varlen ? c->kvlens[b] : c->Skv;
    int64_t cols = 0;
    for (int64_t j = 0; j < nby; j++)
        if (row[j]) cols += sp_block_len(j, c->by, Skv);
    return (double)sp_block_len(i, c->bx, Sq) * (double)cols;
}
/* The same sum as the mask's rows are generated (sp_pairs_estimate): sp_pairs' order, so
 * bitwise the same double. */
typedef struct pair_count {
    const sp_case *c;
    double pairs;
} pair_count;
static void count_row(void *ctx, int64_t b, int64_t i, const uint8_t *row, int64_t nby) {
    pair_count *pc = (pair_count *)ctx;
    pc->pairs += row_pairs(pc->c, b, i, row, nby);
}

void sp_gen_mask(const sp_case *c, uint8_t *mask) { gen_mask(c, mask); }
void sp_gen_mask_varlen(const sp_case *c, uint8_t *mask) { gen_mask(c, mask); }

/* Index rows of one sequence of S1 queries over S2 keys: S1 * N2 rows of K entries. */
static void index_rows(const sp_case *c, int64_t S1, int64_t S2, sp_rng *r, int64_t *mark,
                       int64_t *tag, int32_t *idx) {
    for (int64_t s = 0; s < S1; s++) {
        /* Newest allowed key of query s, and the block holding it. */
        const int64_t lim = c->mode == SPATTN_SFA_MODE_CAUSAL ? S2 - S1 + s : S2 - 1;
        for (int64_t n = 0; n < c->N2; n++) {
            int32_t *row = idx + (s * c->N2 + n) * c->K;
            int64_t count = 0;
            if (lim >= 0) {
                const int64_t lb = lim / c->sbs;
                count = c->K < lb + 1 ? c->K : lb + 1;
                floyd(r, lb, count - 1, row, mark, (*tag)++);
                row[count - 1] = (int32_t)lb;
                for (int64_t t = count - 1; t > 0; t--) { /* Fisher-Yates: random order */
                    int64_t u = sp_rng_below(r, t + 1);
                    int32_t tmp = row[t];
                    row[t] = row[u];
                    row[u] = tmp;
                }
            }
            for (int64_t t = count; t < c->K; t++) row[t] = -1;
        }
    }
}

/* Dense: [B, S1, N2, K]; varlen: [Tq, N2, K], sequence by sequence with its own lengths (one
 * generator for the whole batch, so a one-sequence varlen case equals the dense B=1 case). */
static int gen_indices(const sp_case *c, int32_t *idx) {
    const int64_t nblk = (c->S2 + c->sbs - 1) / c->sbs;
    int64_t *mark = malloc((size_t)nblk * sizeof *mark);
    if (!mark) return -1;
    for (int64_t j = 0; j < nblk; j++) mark[j] = -1;
    sp_rng r;
    sp_rng_init(&r, c->seed, SP_STREAM_IDX);
    int64_t tag = 0, tok = 0;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t S1 = c->varlen ? c->lens[b] : c->S1;
        const int64_t S2 = c->varlen ? c->kvlens[b] : c->S2;
        index_rows(c, S1, S2, &r, mark, &tag, idx + tok * c->N2 * c->K);
        tok += S1;
    }
    free(mark);
    return 0;
}

int sp_gen_indices(const sp_case *c, int32_t *idx) { return gen_indices(c, idx); }
int sp_gen_indices_varlen(const sp_case *c, int32_t *idx) { return gen_indices(c, idx); }

void sp_output_sizes(const sp_case *c, int64_t *no, int64_t *nlse, int64_t *ndq, int64_t *ndk,
                     int64_t *ndv) {
    if (c->varlen) {
        int64_t tq, tkv, rows;
        sp_varlen_rows(c, &tq, &tkv, &rows);
        const int64_t nq = c->op == SP_OP_BSA ? c->N : c->N1, nk = c->op == SP_OP_BSA ? c->Nkv : c->N2;
        const int64_t W = c->op == SP_OP_BSA ? c->D : c->D + c->Dr;
        *no = tq * nq * c->D;
        *nlse = tq * nq;
        *ndq = tq * nq * W;
        *ndk = rows * nk * W;
        *ndv = c->op == SP_OP_SFA && c->shared_kv ? 0 : rows * nk * c->D;
        return;
    }
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
    free(in->cu_q);
    free(in->cu_kv);
    free(in->table);
    free(in->kpage);
    free(in->vpage);
    memset(in, 0, sizeof *in);
}

int sp_inputs_make(const sp_case *c, sp_inputs *in, char *err, size_t errlen) {
    if (c->varlen) return sp_inputs_make_varlen(c, in, err, errlen);
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
    if (c->op == SP_OP_BSA) {  /* dense and varlen */
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t n = 0; n < c->N; n++)
                for (int64_t i = 0; i < in->nbx; i++)
                    pairs += row_pairs(c, b, i, in->mask + ((b * c->N + n) * in->nbx + i) * in->nby, in->nby);
        return pairs;
    }
    if (c->varlen) return sp_pairs_varlen(c, in);
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
    if (c->op == SP_OP_BSA) {  /* the generated mask, counted row by row (never held whole) */
        pair_count pc = {c, 0.0};
        if (gen_mask_rows(c, NULL, count_row, &pc)) return (double)c->B * c->N * c->Sq * c->Skv;
        return pc.pairs;
    }
    if (c->varlen) return sp_pairs_estimate_varlen(c);
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
