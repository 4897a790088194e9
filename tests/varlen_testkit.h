/*
 * Helpers of the packed variable-length / paged tests (test_*_varlen.c): random lengths with
 * empty and one-token sequences, packed buffers with padded token strides and poisoned tails,
 * block tables over shuffled pages, and the comparison with the fp64 reference.  Header-only.
 */
#ifndef SPATTN_VARLEN_TESTKIT_H
#define SPATTN_VARLEN_TESTKIT_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "ref_varlen.h"
#include "spattn.h"
#include "testutil.h"

static inline int vt_quick(void) { return getenv("SPATTN_TEST_QUICK") != NULL; }

/* A tensor over its own buffer: contiguous except an optional padded outermost stride. */
typedef struct vt_buf {
    spattn_tensor t;
    void *mem;
    int64_t nbytes;
} vt_buf;

static inline vt_buf vt_alloc(int32_t dt, int nd, const int64_t *shape, int64_t pad0) {
    vt_buf b;
    int64_t st[SPATTN_MAX_DIMS], s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        st[i] = s;
        s *= shape[i];
    }
    if (nd > 1) {
        st[0] = st[0] + pad0;
        s = st[0] * shape[0];
    }
    size_t es = spattn_dtype_size((spattn_dtype)dt);
    b.nbytes = (int64_t)(s * (int64_t)es) + 64;
    b.mem = malloc((size_t)b.nbytes);
    memset(b.mem, 0xA5, (size_t)b.nbytes); /* poison: NaN-ish for floats */
    b.t = spattn_tensor_make(b.mem, (spattn_dtype)dt, nd, shape, st);
    return b;
}
static inline void vt_free(vt_buf *b) { free(b->mem); b->mem = NULL; }

/* Offset of the multi-index of linear logical element e (row-major over shape). */
static inline int64_t vt_off(const spattn_tensor *t, int64_t e) {
    int64_t off = 0;
    for (int i = t->ndim - 1; i >= 0; i--) {
        off += (e % t->shape[i]) * t->strides[i];
        e /= t->shape[i];
    }
    return off;
}
static inline int64_t vt_numel(const spattn_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
/* Random normal values rounded to the dtype; x gets them as doubles (logical order). */
static inline void vt_randn(tu_rng *r, vt_buf *b, double *x) {
    int64_t n = vt_numel(&b->t);
    for (int64_t e = 0; e < n; e++) {
        float v = (float)tu_normal(r);
        spattn_store_f32(b->t.data, b->t.dtype, vt_off(&b->t, e), v);
        double g = spattn_load_f32(b->t.data, b->t.dtype, vt_off(&b->t, e));
        if (x) x[e] = g;
    }
}
static inline void vt_read(const vt_buf *b, double *x) {
    int64_t n = vt_numel(&b->t);
    for (int64_t e = 0; e < n; e++) x[e] = spattn_load_f32(b->t.data, b->t.dtype, vt_off(&b->t, e));
}
static inline void vt_write(vt_buf *b, const double *x) {
    int64_t n = vt_numel(&b->t);
    for (int64_t e = 0; e < n; e++) spattn_store_f32(b->t.data, b->t.dtype, vt_off(&b->t, e), (float)x[e]);
}
static inline int vt_same_bytes(const vt_buf *a, const vt_buf *b) {
    return a->nbytes == b->nbytes && memcmp(a->mem, b->mem, (size_t)a->nbytes) == 0;
}

/* Random lengths in [0, maxl] with the awkward ones forced in: 0, 1 and maxl. */
static inline void vt_lengths(tu_rng *r, int64_t B, int64_t maxl, int32_t *cu) {
    cu[0] = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t L = tu_range(r, 0, maxl), u = tu_range(r, 0, 9);
        if (u == 0) L = 0;
        else if (u == 1) L = 1;
        else if (u == 2) L = maxl;
        cu[b + 1] = cu[b] + (int32_t)L;
    }
}
static inline int64_t vt_maxlen(const int32_t *cu, int64_t B) {
    int64_t m = 0;
    for (int64_t b = 0; b < B; b++)
        if (cu[b + 1] - cu[b] > m) m = cu[b + 1] - cu[b];
    return m;
}

/* Block table over shuffled pages: sequence b's used slots get distinct ids of a random
 * permutation of num_pages >= needed pages (+ spare); unused slots are -1 (never read). */
static inline int32_t *vt_table(tu_rng *r, const int32_t *cu_kv, int64_t B, int64_t ps,
                                int64_t max_pages, int64_t *num_pages) {
    int64_t need = 0;
    for (int64_t b = 0; b < B; b++) need += (cu_kv[b + 1] - cu_kv[b] + ps - 1) / ps;
    int64_t P = need + tu_range(r, 1, 3);
    int32_t *perm = malloc((size_t)P * sizeof(int32_t));
    for (int64_t i = 0; i < P; i++) perm[i] = (int32_t)i;
    for (int64_t i = P - 1; i > 0; i--) {
        int64_t j = tu_range(r, 0, i);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *tab = malloc((size_t)(B * max_pages) * sizeof(int32_t));
    int64_t u = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t n = (cu_kv[b + 1] - cu_kv[b] + ps - 1) / ps;
        for (int64_t j = 0; j < max_pages; j++) tab[b * max_pages + j] = j < n ? perm[u++] : -1;
    }
    free(perm);
    *num_pages = P;
    return tab;
}

/* Paged copy [P, ps, H, W] of the packed rows x [T, H, W] of the key side (doubles). */
static inline void vt_to_pages(const double *x, const int32_t *cu_kv, int64_t B,
                               const int32_t *tab, int64_t max_pages, int64_t ps, int64_t H,
                               int64_t W, double *pages, int64_t P) {
    for (int64_t i = 0; i < P * ps * H * W; i++) pages[i] = 0.5; /* unused rows: harmless */
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < cu_kv[b + 1] - cu_kv[b]; j++) {
            int64_t row = (int64_t)tab[b * max_pages + j / ps] * ps + j % ps;
            memcpy(pages + row * H * W, x + (cu_kv[b] + j) * H * W, (size_t)(H * W) * sizeof(double));
        }
}

/* max |a - g| over n values, relative to max(1, max |g|); infinities must match exactly and
 * NaN never passes. */
static inline double vt_err(const double *a, const double *g, int64_t n) {
    double e = 0, m = 1;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(g[i]) || isinf(a[i])) {
            if (a[i] != g[i]) return INFINITY;
            continue;
        }
        double d = fabs(a[i] - g[i]);
        if (!(d <= e)) e = isnan(d) ? INFINITY : d;
        if (fabs(g[i]) > m) m = fabs(g[i]);
    }
    return e / m;
}
/* Same with infinities (LSE = -inf) required to match exactly. */
static inline double vt_err_lse(const double *a, const double *g, int64_t n) {
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(g[i]) || isinf(a[i])) {
            if (a[i] != g[i]) return INFINITY;
            continue;
        }
        double d = fabs(a[i] - g[i]) / (1 + fabs(g[i]));
        if (!(d <= e)) e = d;
    }
    return e;
}
static inline double vt_tol(int32_t dt) {
    return dt == SPATTN_DTYPE_F32 ? 1e-4 : dt == SPATTN_DTYPE_F16 ? 8e-3 : 6e-2;
}
static inline int32_t vt_dtype(tu_rng *r) {
    static const int32_t d[3] = {SPATTN_DTYPE_F32, SPATTN_DTYPE_F16, SPATTN_DTYPE_BF16};
    return d[tu_range(r, 0, 2)];
}
#endif
