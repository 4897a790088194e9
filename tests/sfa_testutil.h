/*
 * Helpers of the sfa tests: a random problem (inputs rounded to the dtype, index rows with
 * padding, duplicates, masked and all-padding rows), tensors in several layouts (split,
 * concatenated [.., D+Dr] views, padded and permuted strides), NaN poisoning, running the
 * library and comparing against the fp64 reference with the eco tolerances.  Header-only.
 */
#ifndef SPATTN_SFA_TESTUTIL_H
#define SPATTN_SFA_TESTUTIL_H

#include "core/dtype.h"
#include "core/internal.h"
#include "ref/ref.h"
#include "testutil.h"

typedef struct st_shape {
    int64_t B, S1, S2, N1, N2, D, Dr, K, sbs;
    int32_t mode, shared_kv, dtype;
    int concat;  /* q/q_rope, k/k_rope, dq/dq_rope, dk/dk_rope as views of [.., D+Dr] buffers */
    int layout;  /* 0 contiguous, 1 padded rows, 2 S and N swapped in memory, 3 inner stride 2 */
    double dup_p, pad_p, empty_p; /* per entry duplicate / padding, per row all-padding */
} st_shape;

/* A 4-d tensor over its own buffer (or a view at column `col0` of a wider row). */
typedef struct st_buf {
    void *mem;
    size_t bytes;
} st_buf;

static inline size_t st_esize(int32_t dt) { return dt == SPATTN_DTYPE_F32 || dt == SPATTN_DTYPE_I32 ? 4 : 2; }

/* Allocates a [d0, d1, d2, cols] buffer in `layout`, returns the descriptor of columns
 * [col0, col0 + ncol). */
static inline spattn_tensor st_alloc(st_buf *buf, int32_t dt, const int64_t *shape4, int64_t cols,
                                     int64_t col0, int64_t ncol, int layout) {
    int64_t d0 = shape4[0], d1 = shape4[1], d2 = shape4[2];
    int64_t inner = layout == 3 ? 2 : 1;
    int64_t rowlen = (layout == 1 ? cols + 8 : cols) * inner;
    int64_t st[4];
    st[3] = inner;
    if (layout == 2) { /* memory order d0, d2, d1, cols */
        st[1] = rowlen;
        st[2] = rowlen * d1;
        st[0] = rowlen * d1 * d2;
    } else {
        st[2] = rowlen;
        st[1] = rowlen * d2;
        st[0] = rowlen * d2 * d1;
    }
    buf->bytes = (size_t)(d0 * d1 * d2 * rowlen) * st_esize(dt);
    buf->mem = malloc(buf->bytes);
    memset(buf->mem, 0x55, buf->bytes);
    int64_t shp[4] = {d0, d1, d2, ncol};
    spattn_tensor t = spattn_tensor_make((char *)buf->mem + (size_t)(col0 * inner) * st_esize(dt),
                                         dt, 4, shp, st);
    return t;
}

static inline void st_set(const spattn_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d, double x) {
    spattn_store_f32(t->data, t->dtype, spattn_offset4(t, a, b, c, d), (float)x);
}
static inline double st_get(const spattn_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
    return spattn_load_f32(t->data, t->dtype, spattn_offset4(t, a, b, c, d));
}

/* Every element of the view becomes NaN (so an unwritten output shows up). */
static inline void st_poison(const spattn_tensor *t) {
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < (t->ndim == 4 ? t->shape[3] : 1); d++) {
                    int64_t off = a * t->strides[0] + b * t->strides[1] + c * t->strides[2] +
                                  (t->ndim == 4 ? d * t->strides[3] : 0);
                    spattn_store_f32(t->data, t->dtype, off, NAN);
                }
}

/* Index rows: blocks drawn from the allowed range (and sometimes beyond the causal limit),
 * with padding anywhere, duplicates and all-padding rows as the shape asks. */
static inline void st_fill_indices(tu_rng *r, const st_shape *s, int32_t *idx) {
    int64_t nblk = (s->S2 + s->sbs - 1) / s->sbs;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t i = 0; i < s->S1; i++)
            for (int64_t n = 0; n < s->N2; n++) {
                int32_t *row = idx + ((b * s->S1 + i) * s->N2 + n) * s->K;
                int64_t lim = s->mode == 3 ? s->S2 - s->S1 + i : s->S2 - 1;
                int64_t ab = lim < 0 ? 0 : lim / s->sbs + 1; /* blocks holding an allowed key */
                int empty = tu_uniform(r) < s->empty_p;
                for (int64_t t = 0; t < s->K; t++) {
                    if (empty || tu_uniform(r) < s->pad_p) { row[t] = -1; continue; }
                    if (t > 0 && tu_uniform(r) < s->dup_p) {
                        row[t] = row[tu_range(r, 0, t - 1)];
                        continue;
                    }
                    /* mostly allowed blocks; 1 in 5 anywhere (masked keys in mode 3) */
                    if (ab == 0 || tu_uniform(r) < 0.2) row[t] = (int32_t)tu_range(r, 0, nblk - 1);
                    else row[t] = (int32_t)tu_range(r, 0, ab - 1);
                }
            }
}

/* The tensors of one problem. */
typedef struct st_problem {
    st_shape s;
    st_buf bq, bqr, bk, bkr, bv, bidx, bo, blse, bdo, bdq, bdqr, bdk, bdkr, bdv;
    spattn_tensor q, qr, k, kr, v, idx, o, lse, dout, dq, dqr, dk, dkr, dv;
    /* fp64 copies of the rounded inputs, reference layout */
    double *rq, *rk, *rv, *rdo;
    int32_t *ridx;
} st_problem;

/* Builds the tensors of `s` (rope / v per the shape) in its layout; values from rng. */
static inline void st_make(st_problem *P, const st_shape *s, tu_rng *r) {
    memset(P, 0, sizeof(*P));
    P->s = *s;
    int64_t Dq = s->D + s->Dr, dt = s->dtype;
    int64_t sq[4] = {s->B, s->S1, s->N1, 0}, sk[4] = {s->B, s->S2, s->N2, 0};
    int64_t si[4] = {s->B, s->S1, s->N2, s->K};
    int L = s->layout;
    if (s->concat && s->Dr) {
        P->q = st_alloc(&P->bq, (int32_t)dt, sq, Dq, 0, s->D, L);
        P->qr = P->q;
        P->qr.data = (char *)P->q.data + (size_t)(s->D * P->q.strides[3]) * st_esize((int32_t)dt);
        P->qr.shape[3] = s->Dr;
        P->k = st_alloc(&P->bk, (int32_t)dt, sk, Dq, 0, s->D, L);
        P->kr = P->k;
        P->kr.data = (char *)P->k.data + (size_t)(s->D * P->k.strides[3]) * st_esize((int32_t)dt);
        P->kr.shape[3] = s->Dr;
        P->dq = st_alloc(&P->bdq, (int32_t)dt, sq, Dq, 0, s->D, L);
        P->dqr = P->dq;
        P->dqr.data = (char *)P->dq.data + (size_t)(s->D * P->dq.strides[3]) * st_esize((int32_t)dt);
        P->dqr.shape[3] = s->Dr;
        P->dk = st_alloc(&P->bdk, (int32_t)dt, sk, Dq, 0, s->D, L);
        P->dkr = P->dk;
        P->dkr.data = (char *)P->dk.data + (size_t)(s->D * P->dk.strides[3]) * st_esize((int32_t)dt);
        P->dkr.shape[3] = s->Dr;
    } else {
        P->q = st_alloc(&P->bq, (int32_t)dt, sq, s->D, 0, s->D, L);
        P->k = st_alloc(&P->bk, (int32_t)dt, sk, s->D, 0, s->D, L);
        P->dq = st_alloc(&P->bdq, (int32_t)dt, sq, s->D, 0, s->D, L);
        P->dk = st_alloc(&P->bdk, (int32_t)dt, sk, s->D, 0, s->D, L);
        if (s->Dr) {
            P->qr = st_alloc(&P->bqr, (int32_t)dt, sq, s->Dr, 0, s->Dr, L);
            P->kr = st_alloc(&P->bkr, (int32_t)dt, sk, s->Dr, 0, s->Dr, L);
            P->dqr = st_alloc(&P->bdqr, (int32_t)dt, sq, s->Dr, 0, s->Dr, L);
            P->dkr = st_alloc(&P->bdkr, (int32_t)dt, sk, s->Dr, 0, s->Dr, L);
        }
    }
    if (!s->shared_kv) {
        P->v = st_alloc(&P->bv, (int32_t)dt, sk, s->D, 0, s->D, L);
        P->dv = st_alloc(&P->bdv, (int32_t)dt, sk, s->D, 0, s->D, L);
    }
    P->o = st_alloc(&P->bo, (int32_t)dt, sq, s->D, 0, s->D, L);
    P->dout = st_alloc(&P->bdo, (int32_t)dt, sq, s->D, 0, s->D, L);
    P->idx = st_alloc(&P->bidx, SPATTN_DTYPE_I32, si, s->K, 0, s->K, L == 3 ? 0 : L);
    int64_t sl[3] = {s->B, s->S1, s->N1};
    P->blse.bytes = (size_t)(s->B * s->S1 * s->N1) * 4;
    P->blse.mem = malloc(P->blse.bytes);
    P->lse = spattn_tensor_make(P->blse.mem, SPATTN_DTYPE_F32, 3, sl, NULL);

    size_t nq = (size_t)(s->B * s->S1 * s->N1), nk = (size_t)(s->B * s->S2 * s->N2);
    P->rq = malloc(nq * (size_t)Dq * sizeof(double));
    P->rk = malloc(nk * (size_t)Dq * sizeof(double));
    P->rv = malloc(nk * (size_t)s->D * sizeof(double));
    P->rdo = malloc(nq * (size_t)s->D * sizeof(double));
    P->ridx = malloc((size_t)(s->B * s->S1 * s->N2 * s->K) * sizeof(int32_t));
    /* values: standard normal rounded to the dtype; the reference sees the rounded values */
    for (int64_t a = 0; a < s->B; a++)
        for (int64_t i = 0; i < s->S1; i++)
            for (int64_t h = 0; h < s->N1; h++) {
                int64_t row = (a * s->S1 + i) * s->N1 + h;
                for (int64_t d = 0; d < Dq; d++) {
                    const spattn_tensor *t = d < s->D ? &P->q : &P->qr;
                    int64_t dd = d < s->D ? d : d - s->D;
                    st_set(t, a, i, h, dd, tu_normal(r));
                    P->rq[row * Dq + d] = st_get(t, a, i, h, dd);
                }
                for (int64_t d = 0; d < s->D; d++) {
                    st_set(&P->dout, a, i, h, d, tu_normal(r));
                    P->rdo[row * s->D + d] = st_get(&P->dout, a, i, h, d);
                }
            }
    for (int64_t a = 0; a < s->B; a++)
        for (int64_t j = 0; j < s->S2; j++)
            for (int64_t n = 0; n < s->N2; n++) {
                int64_t row = (a * s->S2 + j) * s->N2 + n;
                for (int64_t d = 0; d < Dq; d++) {
                    const spattn_tensor *t = d < s->D ? &P->k : &P->kr;
                    int64_t dd = d < s->D ? d : d - s->D;
                    st_set(t, a, j, n, dd, tu_normal(r));
                    P->rk[row * Dq + d] = st_get(t, a, j, n, dd);
                }
                if (!s->shared_kv)
                    for (int64_t d = 0; d < s->D; d++) {
                        st_set(&P->v, a, j, n, d, tu_normal(r));
                        P->rv[row * s->D + d] = st_get(&P->v, a, j, n, d);
                    }
            }
    st_fill_indices(r, s, P->ridx);
    for (int64_t a = 0; a < s->B; a++)
        for (int64_t i = 0; i < s->S1; i++)
            for (int64_t n = 0; n < s->N2; n++)
                for (int64_t t = 0; t < s->K; t++)
                    ((int32_t *)P->idx.data)[spattn_offset4(&P->idx, a, i, n, t)] =
                        P->ridx[((a * s->S1 + i) * s->N2 + n) * s->K + t];
}

static inline void st_free(st_problem *P) {
    st_buf *bs[] = {&P->bq, &P->bqr, &P->bk, &P->bkr, &P->bv, &P->bidx, &P->bo, &P->blse,
                    &P->bdo, &P->bdq, &P->bdqr, &P->bdk, &P->bdkr, &P->bdv};
    for (size_t i = 0; i < sizeof(bs) / sizeof(bs[0]); i++) free(bs[i]->mem);
    free(P->rq);
    free(P->rk);
    free(P->rv);
    free(P->rdo);
    free(P->ridx);
}

static inline spattn_status st_run_fwd(st_problem *P, int threads) {
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = threads;
    st_poison(&P->o);
    st_poison(&P->lse);
    const st_shape *s = &P->s;
    return spattn_sfa_fwd_ex(&P->q, s->Dr ? &P->qr : NULL, &P->k, s->Dr ? &P->kr : NULL,
                             s->shared_kv ? NULL : &P->v, &P->idx, s->sbs, s->mode, 0.0, &P->o,
                             &P->lse, &opt);
}

static inline spattn_status st_run_bwd(st_problem *P, int threads) {
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = threads;
    const st_shape *s = &P->s;
    st_poison(&P->dq);
    st_poison(&P->dk);
    if (s->Dr) {
        st_poison(&P->dqr);
        st_poison(&P->dkr);
    }
    if (!s->shared_kv) st_poison(&P->dv);
    return spattn_sfa_bwd_ex(&P->q, s->Dr ? &P->qr : NULL, &P->k, s->Dr ? &P->kr : NULL,
                             s->shared_kv ? NULL : &P->v, &P->o, &P->dout, &P->lse, &P->idx,
                             s->sbs, s->mode, 0.0, &P->dq, s->Dr ? &P->dqr : NULL, &P->dk,
                             s->Dr ? &P->dkr : NULL, s->shared_kv ? NULL : &P->dv, &opt);
}

/* Eco comparison of columns [c0, c0+n) of a reference row-major [rows, rc] array against the
 * tensor view. */
static inline int st_compare(const char *what, const spattn_tensor *t, const double *ref, int64_t rc,
                             int64_t c0, double atol, double rtol) {
    int64_t bad = 0, total = 0;
    double worst = 0;
    int64_t d0 = t->shape[0], d1 = t->shape[1], d2 = t->shape[2], n = t->ndim == 4 ? t->shape[3] : 1;
    for (int64_t a = 0; a < d0; a++)
        for (int64_t b = 0; b < d1; b++)
            for (int64_t c = 0; c < d2; c++)
                for (int64_t d = 0; d < n; d++) {
                    int64_t off = a * t->strides[0] + b * t->strides[1] + c * t->strides[2] +
                                  (t->ndim == 4 ? d * t->strides[3] : 0);
                    double x = spattn_load_f32(t->data, t->dtype, off);
                    double g = ref[((a * d1 + b) * d2 + c) * rc + c0 + d];
                    total++;
                    int ok;
                    if (isinf(g)) ok = x == g;
                    else ok = isfinite(x) && fabs(x - g) <= atol + rtol * fabs(g);
                    if (!ok) {
                        if (bad < 3)
                            fprintf(stderr, "  %s[%lld,%lld,%lld,%lld]: got %g want %g\n", what,
                                    (long long)a, (long long)b, (long long)c, (long long)d, x, g);
                        bad++;
                    }
                    if (isfinite(g) && fabs(x - g) > worst) worst = fabs(x - g);
                }
    /* fp16/bf16: the eco criterion (99% within tolerance, max error under its limit): the
     * golden recomputes O in fp64 while the backward reads the rounded O for Delta.
     * fp32: every element. */
    int ok = t->dtype == SPATTN_DTYPE_F32 ? bad == 0
                                          : bad * 100 <= total && worst <= (t->dtype == SPATTN_DTYPE_F16 ? 0.1 : 1.0);
    if (bad)
        fprintf(stderr, "  %s: %lld of %lld elements off (max abs err %g)%s\n", what,
                (long long)bad, (long long)total, worst, ok ? " - within the eco criterion" : "");
    return ok;
}

static inline void st_tol(int32_t dt, double *atol, double *rtol) {
    if (dt == SPATTN_DTYPE_F16) *atol = *rtol = 1.0 / 512;
    else if (dt == SPATTN_DTYPE_BF16) *atol = *rtol = 1.0 / 64;
    else *atol = *rtol = 1.0 / 8192; /* fp32 sums of many terms with cancellation */
}

static inline spattn_ref_sfa_shape st_ref_shape(const st_shape *s) {
    spattn_ref_sfa_shape r = {s->B, s->S1, s->S2, s->N1, s->N2, s->D, s->Dr, s->K, s->sbs,
                              s->mode, s->shared_kv};
    return r;
}

/* fp64 golden of a problem: forward o/lse and backward dq/dk (dv when v is separate). */
typedef struct st_golden {
    double *o, *lse, *dq, *dk, *dv;
} st_golden;

static inline void st_golden_make(st_golden *g, const st_shape *s, const st_problem *P) {
    spattn_ref_sfa_shape rs = st_ref_shape(s);
    int64_t Dq = s->D + s->Dr;
    size_t nq = (size_t)(s->B * s->S1 * s->N1), nk = (size_t)(s->B * s->S2 * s->N2);
    double scale = 1.0 / sqrt((double)Dq);
    g->o = malloc(nq * (size_t)s->D * sizeof(double));
    g->lse = malloc(nq * sizeof(double));
    g->dq = malloc(nq * (size_t)Dq * sizeof(double));
    g->dk = malloc(nk * (size_t)Dq * sizeof(double));
    g->dv = malloc(nk * (size_t)s->D * sizeof(double));
    spattn_ref_sfa_fwd(&rs, P->rq, P->rk, P->rv, P->ridx, scale, g->o, g->lse);
    spattn_ref_sfa_bwd(&rs, P->rq, P->rk, P->rv, P->ridx, scale, P->rdo, g->dq, g->dk,
                       s->shared_kv ? NULL : g->dv);
}

static inline void st_golden_free(st_golden *g) {
    free(g->o);
    free(g->lse);
    free(g->dq);
    free(g->dk);
    free(g->dv);
}

/* Forward outputs of P vs the golden (dtype tolerances; LSE at fp32's). */
static inline int st_check_fwd(const st_problem *P, const st_shape *s, const st_golden *g) {
    double at, rt;
    st_tol(s->dtype, &at, &rt);
    int ok = st_compare("o", &P->o, g->o, s->D, 0, at, rt);
    return ok & st_compare("lse", &P->lse, g->lse, 1, 0, 1.0 / 65536, 1.0 / 1024);
}

/* Backward outputs of P vs the golden: dq, dk, their rope parts and dv when separate. */
static inline int st_check_bwd(const st_problem *P, const st_shape *s, const st_golden *g) {
    double at, rt;
    st_tol(s->dtype, &at, &rt);
    int64_t Dq = s->D + s->Dr;
    int ok = st_compare("dq", &P->dq, g->dq, Dq, 0, at, rt);
    ok &= st_compare("dk", &P->dk, g->dk, Dq, 0, at, rt);
    if (s->Dr) {
        ok &= st_compare("dq_rope", &P->dqr, g->dq, Dq, s->D, at, rt);
        ok &= st_compare("dk_rope", &P->dkr, g->dk, Dq, s->D, at, rt);
    }
    if (!s->shared_kv) ok &= st_compare("dv", &P->dv, g->dv, s->D, 0, at, rt);
    return ok;
}

static inline int st_quick(void) {
    const char *e = getenv("SPATTN_TEST_QUICK");
    return e && *e && *e != '0';
}
#endif
