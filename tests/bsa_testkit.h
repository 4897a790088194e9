/*
 * Helpers shared by the bsa tests: mask patterns, strided tensor views over poisoned buffers,
 * and the comparison against the fp64 reference.  Header-only (tests are single files).
 */
#ifndef SPATTN_BSA_TESTKIT_H
#define SPATTN_BSA_TESTKIT_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ref.h"
#include "spattn.h"
#include "testutil.h"

enum { PAT_DENSE, PAT_CAUSAL, PAT_WINDOW, PAT_BIGBIRD, PAT_RANDOM, PAT_EMPTY_ROWS, PAT_ZERO, PAT_COUNT };
static const char *const pat_name[PAT_COUNT] = {"dense",  "causal",     "window", "bigbird",
                                                "random", "empty_rows", "zero"};

/* Mask [B, N, nbx, nby] following cases/README.md (block-level formulas). */
static inline void bk_make_mask(tu_rng *r, int pat, int64_t B, int64_t N, int64_t Sq, int64_t Skv,
                         int64_t bx, int64_t by, uint8_t *m) {
    int64_t nbx = (Sq + bx - 1) / bx, nby = (Skv + by - 1) / by, off = Skv - Sq;
    int64_t W = 1 + tu_range(r, 0, 2 * (bx > by ? bx : by)), g = 1, w = 1, nr = 1;
    for (int64_t bn = 0; bn < B * N; bn++)
        for (int64_t i = 0; i < nbx; i++) {
            int64_t qs = i * bx, qe = (i + 1) * bx < Sq ? (i + 1) * bx - 1 : Sq - 1;
            for (int64_t j = 0; j < nby; j++) {
                int64_t ks = j * by, ke = (j + 1) * by < Skv ? (j + 1) * by - 1 : Skv - 1;
                int v = 1;
                switch (pat) {
                case PAT_CAUSAL: v = ks <= qe + off; break;
                case PAT_WINDOW: v = ks <= qe + off && ke >= qs + off - W; break;
                case PAT_BIGBIRD:
                    v = j < g || i < g || (ke >= qs - w * by && ks <= qe + w * by);
                    break;
                case PAT_RANDOM: v = tu_uniform(r) < 0.4; break;
                case PAT_EMPTY_ROWS: v = (i % 3 != 1) && tu_uniform(r) < 0.6; break;
                case PAT_ZERO: v = 0; break;
                default: break;
                }
                m[(bn * nbx + i) * nby + j] = (uint8_t)v;
            }
            if (pat == PAT_BIGBIRD)
                for (int64_t t = 0; t < nr; t++) m[(bn * nbx + i) * nby + tu_range(r, 0, nby - 1)] = 1;
        }
}

/* Memory layouts of a 4-d [A0, A1, A2, A3] view (3-d tensors use the first three dims' rule). */
enum { LAY_CONTIG, LAY_PERMUTED, LAY_PADDED, LAY_INNER2, LAY_REVERSED, LAY_COUNT };
static const char *const lay_name[LAY_COUNT] = {"contig", "permuted", "padded", "inner-stride2",
                                                "reversed-seq"};

/* Strides for `shape` under `lay`; returns the number of elements the buffer needs. */
static inline int64_t bk_strides(int ndim, const int64_t *shape, int lay, int64_t *st) {
    int64_t ext[4] = {shape[0], shape[1], shape[2], ndim > 3 ? shape[3] : 1};
    int order[4] = {0, 1, 2, 3}; /* outermost first */
    int64_t pad[4] = {0, 0, 0, 0}, inner = 1;
    if (lay == LAY_PERMUTED) { order[1] = 2; order[2] = 1; } /* BNSD shape in BSND memory */
    if (lay == LAY_PADDED) { pad[1] = 1; pad[2] = 3; pad[3] = 5; }
    if (lay == LAY_INNER2) inner = 2;
    int nd = ndim > 3 ? 4 : 3;
    int64_t s = inner;
    for (int k = nd - 1; k >= 0; k--) {
        int d = order[k];
        st[d] = s;
        s *= ext[d] + pad[d];
    }
    return s;
}

typedef struct bk_tensor {
    spattn_tensor t;
    void *buf;
    int64_t nbuf; /* elements in buf */
    int64_t base; /* element offset of t.data in buf (nonzero with negative strides) */
} bk_tensor;

static inline void bk_poison(bk_tensor *x) {
    size_t es = spattn_dtype_size((spattn_dtype)x->t.dtype);
    if (x->t.dtype == SPATTN_DTYPE_U8) { memset(x->buf, 0xA5, (size_t)x->nbuf); return; }
    for (int64_t i = 0; i < x->nbuf; i++) {
        if (es == 4) { float f = NAN; memcpy((char *)x->buf + 4 * i, &f, 4); }
        else { uint16_t h = x->t.dtype == SPATTN_DTYPE_F16 ? 0x7e00 : 0x7fc0; memcpy((char *)x->buf + 2 * i, &h, 2); }
    }
}

static inline bk_tensor bk_alloc(int32_t dtype, int ndim, const int64_t *shape, int lay) {
    bk_tensor x;
    int64_t st[4];
    x.nbuf = bk_strides(ndim, shape, lay, st);
    x.base = 0;
    if (lay == LAY_REVERSED) { /* dimension 2 (the sequence) runs backwards in memory */
        x.base = (shape[2] - 1) * st[2];
        st[2] = -st[2];
    }
    size_t es = spattn_dtype_size((spattn_dtype)dtype);
    x.buf = malloc((size_t)x.nbuf * es + 64);
    x.t = spattn_tensor_make((char *)x.buf + x.base * (int64_t)es, (spattn_dtype)dtype, ndim, shape, st);
    bk_poison(&x);
    return x;
}
static inline void bk_free(bk_tensor *x) { free(x->buf); x->buf = NULL; }

static inline int64_t bk_off(const spattn_tensor *t, const int64_t *idx) {
    int64_t o = 0;
    for (int d = 0; d < t->ndim; d++) o += idx[d] * t->strides[d];
    return o;
}
static inline int64_t bk_numel(const spattn_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}
static inline void bk_next(const spattn_tensor *t, int64_t *idx);
/* Visit every element of a <=4-d tensor in row-major logical order. */
#define BK_FOREACH(t, lin, off)                                                          \
    for (int64_t lin = 0, idx_[4] = {0, 0, 0, 0}, off = 0; lin < bk_numel(t);         \
         lin++, bk_next(t, idx_), off = bk_off(t, idx_))
static inline void bk_next(const spattn_tensor *t, int64_t *idx) {
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (++idx[d] < t->shape[d]) return;
        idx[d] = 0;
    }
}

/* Logical row-major doubles <-> the view. */
static inline void bk_store(bk_tensor *x, const double *v) {
    BK_FOREACH(&x->t, lin, off) spattn_store_f32(x->t.data, x->t.dtype, off, (float)v[lin]);
}
static inline void bk_store_u8(bk_tensor *x, const uint8_t *v) {
    BK_FOREACH(&x->t, lin, off)((uint8_t *)x->t.data)[off] = v[lin];
}
static inline void bk_load(const bk_tensor *x, double *v) {
    BK_FOREACH(&x->t, lin, off) v[lin] = spattn_load_f32(x->t.data, x->t.dtype, off);
}
/* 1 when every buffer element outside the view still holds the poison pattern. */
static inline int bk_gaps_untouched(const bk_tensor *x) {
    size_t es = spattn_dtype_size((spattn_dtype)x->t.dtype);
    uint8_t *inview = calloc((size_t)x->nbuf, 1);
    BK_FOREACH(&x->t, lin, off) inview[x->base + off] = 1;
    bk_tensor ref = *x;
    ref.buf = malloc((size_t)x->nbuf * es);
    bk_poison(&ref);
    int ok = 1;
    for (int64_t i = 0; i < x->nbuf && ok; i++)
        if (!inview[i] && memcmp((char *)x->buf + i * es, (char *)ref.buf + i * es, es)) ok = 0;
    free(ref.buf);
    free(inview);
    return ok;
}

/* Standard normal values rounded to `dtype` (the inputs of a case). */
static inline void bk_randn(tu_rng *r, double *v, int64_t n, int32_t dtype) {
    for (int64_t i = 0; i < n; i++) {
        float f = (float)tu_normal(r);
        uint16_t h;
        if (dtype == SPATTN_DTYPE_F16) { h = spattn_f32_to_f16(f); f = spattn_f16_to_f32(h); }
        if (dtype == SPATTN_DTYPE_BF16) { h = spattn_f32_to_bf16(f); f = spattn_bf16_to_f32(h); }
        v[i] = f;
    }
}

/* Comparison: every element within tol * (|golden| + norm), norm = rms(golden) (or max|golden|
 * when use_max), NaN nowhere, +-inf only where the golden has the same infinity.  Returns the
 * worst ratio err / allowed (<= 1 passes). */
static int bk_norm_max; /* set by a test to normalize by max|golden| instead of the rms */
static inline double bk_compare(const double *a, const double *g, int64_t n, double tol, int64_t *bad_at) {
    double ss = 0, mx = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(g[i])) { ss += g[i] * g[i]; cnt++; if (fabs(g[i]) > mx) mx = fabs(g[i]); }
    double rms = bk_norm_max ? mx : cnt ? sqrt(ss / (double)cnt) : 0.0;
    if (rms == 0.0) rms = 1.0;
    double worst = 0;
    *bad_at = -1;
    for (int64_t i = 0; i < n; i++) {
        double q;
        if (isnan(a[i])) q = INFINITY;
        else if (isinf(g[i]) || isinf(a[i])) q = (a[i] == g[i]) ? 0.0 : INFINITY;
        else q = fabs(a[i] - g[i]) / (tol * (fabs(g[i]) + rms));
        if (q > worst) { worst = q; *bad_at = i; }
    }
    return worst;
}

static inline double bk_dtype_tol(int32_t dt) {
    return dt == SPATTN_DTYPE_F32 ? 1e-5 : dt == SPATTN_DTYPE_F16 ? 4e-3 : 3e-2;
}
static inline const char *bk_dt_name(int32_t dt) { return spattn_dtype_name((spattn_dtype)dt); }

/* ---- one complete case: inputs, reference, library run, comparison ---------------------- */
typedef struct bk_case {
    int64_t B, N, Nkv, Sq, Skv, D, bx, by;
    int pat, lay, lay_out;
    int32_t dtype;
    double scale; /* 0 = default */
    int threads;  /* options.num_threads */
} bk_case;

typedef struct bk_data {
    bk_case c;
    int64_t nq, nkv, nl, nm;
    double *q, *k, *v, *dout, *o_ref, *lse_ref, *dq_ref, *dk_ref, *dv_ref;
    uint8_t *mask;
    bk_tensor tq, tk, tv, tm, tdo;
} bk_data;

static inline double bk_scale(const bk_case *c) { return c->scale != 0 ? c->scale : 1.0 / sqrt((double)c->D); }

static inline void bk_setup(bk_data *d, const bk_case *c, tu_rng *r, int with_ref_bwd) {
    memset(d, 0, sizeof *d);
    d->c = *c;
    int64_t nbx = (c->Sq + c->bx - 1) / c->bx, nby = (c->Skv + c->by - 1) / c->by;
    d->nq = c->B * c->N * c->Sq * c->D;
    d->nkv = c->B * c->Nkv * c->Skv * c->D;
    d->nl = c->B * c->N * c->Sq;
    d->nm = c->B * c->N * nbx * nby;
    d->q = malloc(sizeof(double) * (size_t)d->nq);
    d->dout = malloc(sizeof(double) * (size_t)d->nq);
    d->k = malloc(sizeof(double) * (size_t)d->nkv);
    d->v = malloc(sizeof(double) * (size_t)d->nkv);
    d->mask = malloc((size_t)d->nm);
    bk_randn(r, d->q, d->nq, c->dtype);
    bk_randn(r, d->k, d->nkv, c->dtype);
    bk_randn(r, d->v, d->nkv, c->dtype);
    bk_randn(r, d->dout, d->nq, c->dtype);
    bk_make_mask(r, c->pat, c->B, c->N, c->Sq, c->Skv, c->bx, c->by, d->mask);
    spattn_ref_bsa_shape s = {c->B, c->N, c->Nkv, c->Sq, c->Skv, c->D, c->bx, c->by};
    d->o_ref = malloc(sizeof(double) * (size_t)d->nq);
    d->lse_ref = malloc(sizeof(double) * (size_t)d->nl);
    spattn_ref_bsa_fwd(&s, d->q, d->k, d->v, d->mask, bk_scale(c), d->o_ref, d->lse_ref);
    if (with_ref_bwd) {
        d->dq_ref = malloc(sizeof(double) * (size_t)d->nq);
        d->dk_ref = malloc(sizeof(double) * (size_t)d->nkv);
        d->dv_ref = malloc(sizeof(double) * (size_t)d->nkv);
        spattn_ref_bsa_bwd(&s, d->q, d->k, d->v, d->mask, bk_scale(c), d->dout, d->dq_ref, d->dk_ref,
                           d->dv_ref);
    }
    int64_t sq[4] = {c->B, c->N, c->Sq, c->D}, skv[4] = {c->B, c->Nkv, c->Skv, c->D};
    int64_t sm[4] = {c->B, c->N, nbx, nby};
    d->tq = bk_alloc(c->dtype, 4, sq, c->lay);
    d->tk = bk_alloc(c->dtype, 4, skv, (c->lay + 1) % LAY_COUNT); /* vary layouts per tensor */
    d->tv = bk_alloc(c->dtype, 4, skv, (c->lay + 2) % LAY_COUNT);
    d->tdo = bk_alloc(c->dtype, 4, sq, (c->lay + 3) % LAY_COUNT);
    d->tm = bk_alloc(SPATTN_DTYPE_U8, 4, sm, c->lay);
    bk_store(&d->tq, d->q);
    bk_store(&d->tk, d->k);
    bk_store(&d->tv, d->v);
    bk_store(&d->tdo, d->dout);
    bk_store_u8(&d->tm, d->mask);
}

static inline void bk_teardown(bk_data *d) {
    free(d->q); free(d->k); free(d->v); free(d->dout); free(d->mask);
    free(d->o_ref); free(d->lse_ref); free(d->dq_ref); free(d->dk_ref); free(d->dv_ref);
    bk_free(&d->tq); bk_free(&d->tk); bk_free(&d->tv); bk_free(&d->tdo); bk_free(&d->tm);
}

/* Outputs of one library run. */
typedef struct bk_out {
    bk_tensor o, lse, dq, dk, dv;
} bk_out;

static inline spattn_status bk_run_fwd(bk_data *d, bk_out *out, int lay) {
    const bk_case *c = &d->c;
    int64_t sq[4] = {c->B, c->N, c->Sq, c->D}, sl[3] = {c->B, c->N, c->Sq};
    out->o = bk_alloc(c->dtype, 4, sq, lay);
    out->lse = bk_alloc(SPATTN_DTYPE_F32, 3, sl, (lay + 1) % LAY_COUNT);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CPU;
    opt.num_threads = c->threads;
    return spattn_bsa_fwd_ex(&d->tq.t, &d->tk.t, &d->tv.t, &d->tm.t, c->bx, c->by, c->scale,
                             &out->o.t, &out->lse.t, &opt);
}

/* Backward on the library's own forward outputs (o, lse). */
static inline spattn_status bk_run_bwd(bk_data *d, bk_out *out, int lay) {
    const bk_case *c = &d->c;
    int64_t sq[4] = {c->B, c->N, c->Sq, c->D}, skv[4] = {c->B, c->Nkv, c->Skv, c->D};
    out->dq = bk_alloc(c->dtype, 4, sq, lay);
    out->dk = bk_alloc(c->dtype, 4, skv, (lay + 1) % LAY_COUNT);
    out->dv = bk_alloc(c->dtype, 4, skv, (lay + 2) % LAY_COUNT);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CPU;
    opt.num_threads = c->threads;
    return spattn_bsa_bwd_ex(&d->tq.t, &d->tk.t, &d->tv.t, &out->o.t, &d->tdo.t, &out->lse.t,
                             &d->tm.t, c->bx, c->by, c->scale, &out->dq.t, &out->dk.t, &out->dv.t,
                             &opt);
}

static inline void bk_out_free(bk_out *o) {
    bk_free(&o->o); bk_free(&o->lse); bk_free(&o->dq); bk_free(&o->dk); bk_free(&o->dv);
}

/* 1 when two runs' outputs (same layouts) are bitwise identical. */
static inline int bk_same_bits(const bk_tensor *a, const bk_tensor *b) {
    if (!a->buf || !b->buf) return a->buf == b->buf;
    return a->nbuf == b->nbuf &&
           !memcmp(a->buf, b->buf, (size_t)a->nbuf * spattn_dtype_size((spattn_dtype)a->t.dtype));
}

static inline void bk_describe(const bk_case *c, char *buf, size_t n) {
    snprintf(buf, n, "B%lld N%lld Nkv%lld Sq%lld Skv%lld D%lld bx%lld by%lld %s %s %s scale%g thr%d",
             (long long)c->B, (long long)c->N, (long long)c->Nkv, (long long)c->Sq,
             (long long)c->Skv, (long long)c->D, (long long)c->bx, (long long)c->by,
             pat_name[c->pat], bk_dt_name(c->dtype), lay_name[c->lay], c->scale, c->threads);
}

/* Compares one output view against a golden (logical row-major doubles). */
static inline int bk_check_tensor(const char *what, const bk_tensor *x, const double *g, int64_t n,
                           double tol, const char *desc) {
    double *a = malloc(sizeof(double) * (size_t)n);
    bk_load(x, a);
    int64_t at;
    double w = bk_compare(a, g, n, tol, &at);
    int gaps = bk_gaps_untouched(x);
    TU_CHECK(w <= 1.0, "%s: %s worst err/tol %.3g at %lld (got %.9g want %.9g)", desc, what, w,
             (long long)at, at >= 0 ? a[at] : 0.0, at >= 0 ? g[at] : 0.0);
    TU_CHECK(gaps, "%s: %s wrote outside its view", desc, what);
    free(a);
    return w <= 1.0 && gaps;
}

#endif
