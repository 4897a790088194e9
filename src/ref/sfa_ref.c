/*
 * fp64 reference of top-k sparse flash attention (sfa), straight from cases/README.md.
 * Every entry of an index row is one softmax term (duplicates count twice); entry e selects
 * keys [e*sbs, min((e+1)*sbs, S2)); -1 is padding; mode 3 masks keys j > S2 - S1 + i.
 * Forward: OpenMP over query rows.  Backward: dq per row; dk/dv accumulate into per-thread
 * fp64 partials (rows split statically) that are summed in thread order afterwards.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Dot product with four partial sums: lets the compiler vectorize without reassociation
 * licence, and is still an fp64 sum (far more precise than anything under test). */
static double dot(const double *a, const double *b, int64_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t d = 0;
    for (; d + 4 <= n; d += 4) {
        s0 += a[d] * b[d];
        s1 += a[d + 1] * b[d + 1];
        s2 += a[d + 2] * b[d + 2];
        s3 += a[d + 3] * b[d + 3];
    }
    for (; d < n; d++) s0 += a[d] * b[d];
    return (s0 + s1) + (s2 + s3);
}

/* Expands one index row into the list of attended key positions (one per softmax term);
 * returns how many.  `keys` holds at least K * sbs entries. */
static int64_t expand_row(const spattn_ref_sfa_shape *s, const int32_t *row, int64_t i,
                          int64_t *keys) {
    int64_t lim = s->mode == 3 ? s->S2 - s->S1 + i : s->S2 - 1;
    int64_t n = 0;
    for (int64_t t = 0; t < s->K; t++) {
        if (row[t] < 0) continue;
        int64_t j0 = (int64_t)row[t] * s->sbs;
        int64_t j1 = j0 + s->sbs < s->S2 ? j0 + s->sbs : s->S2;
        for (int64_t j = j0; j < j1; j++)
            if (j <= lim) keys[n++] = j;
    }
    return n;
}

/* Pointers for row (b, i, h): query, its key/value head's k and v bases. */
typedef struct row_ctx {
    const double *q, *kb, *vb;  /* q row; k and v at [b, 0, n2, 0] */
    int64_t kstride, vstride;   /* between consecutive keys */
    const int32_t *idx;         /* index row [b, i, n2, :] */
} row_ctx;

static row_ctx row_at(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                      const double *v, const int32_t *idx, int64_t b, int64_t i, int64_t h) {
    int64_t Dq = s->D + s->Dr, n2 = h / (s->N1 / s->N2);
    row_ctx r;
    r.q = q + ((b * s->S1 + i) * s->N1 + h) * Dq;
    r.kb = k + (b * s->S2 * s->N2 + n2) * Dq;
    r.kstride = s->N2 * Dq;
    if (s->shared_kv) {
        r.vb = r.kb;
        r.vstride = r.kstride;
    } else {
        r.vb = v + (b * s->S2 * s->N2 + n2) * s->D;
        r.vstride = s->N2 * s->D;
    }
    r.idx = idx + ((b * s->S1 + i) * s->N2 + n2) * s->K;
    return r;
}

/* Scores of one row into sc[0..n); returns the LSE (-inf when n == 0). */
static double row_scores(const spattn_ref_sfa_shape *s, const row_ctx *r, const int64_t *keys,
                         int64_t n, double scale, double *sc) {
    int64_t Dq = s->D + s->Dr;
    double m = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        sc[t] = scale * dot(r->q, r->kb + keys[t] * r->kstride, Dq);
        if (sc[t] > m) m = sc[t];
    }
    if (n == 0) return -INFINITY;
    double l = 0;
    for (int64_t t = 0; t < n; t++) l += exp(sc[t] - m);
    return m + log(l);
}

void spattn_ref_sfa_fwd(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                        const double *v, const int32_t *idx, double scale, double *o,
                        double *lse) {
    int64_t rows = s->B * s->S1;
    int64_t kmax = s->K * s->sbs;
#pragma omp parallel
    {
        int64_t *keys = malloc((size_t)kmax * sizeof(int64_t) + 1);
        double *sc = malloc((size_t)kmax * sizeof(double) + 1);
#pragma omp for schedule(dynamic, 1)
        for (int64_t bi = 0; bi < rows; bi++) {
            int64_t b = bi / s->S1, i = bi % s->S1;
            for (int64_t h = 0; h < s->N1; h++) {
                row_ctx r = row_at(s, q, k, v, idx, b, i, h);
                int64_t n = expand_row(s, r.idx, i, keys);
                double L = row_scores(s, &r, keys, n, scale, sc);
                double *orow = o + ((b * s->S1 + i) * s->N1 + h) * s->D;
                memset(orow, 0, (size_t)s->D * sizeof(double));
                for (int64_t t = 0; t < n; t++) {
                    double p = exp(sc[t] - L);
                    const double *vr = r.vb + keys[t] * r.vstride;
                    for (int64_t d = 0; d < s->D; d++) orow[d] += p * vr[d];
                }
                if (lse) lse[(b * s->S1 + i) * s->N1 + h] = L;
            }
        }
        free(keys);
        free(sc);
    }
}

void spattn_ref_sfa_bwd(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                        const double *v, const int32_t *idx, double scale, const double *dout,
                        double *dq, double *dk, double *dv) {
    int64_t Dq = s->D + s->Dr;
    int64_t rows = s->B * s->S1;
    int64_t kmax = s->K * s->sbs;
    size_t nk = (size_t)(s->B * s->S2 * s->N2 * Dq), nv = (size_t)(s->B * s->S2 * s->N2 * s->D);
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    /* Per-thread partial gradients of k and v (v's part unused when shared_kv). */
    double *part = calloc((size_t)nt * (nk + nv) + 1, sizeof(double));
    memset(dq, 0, (size_t)(rows * s->N1 * Dq) * sizeof(double));
#pragma omp parallel num_threads(nt)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        double *pk = part + (size_t)tid * (nk + nv), *pv = pk + nk;
        int64_t *keys = malloc((size_t)kmax * sizeof(int64_t) + 1);
        double *sc = malloc((size_t)kmax * sizeof(double) + 1);
        double *orow = malloc((size_t)s->D * sizeof(double));
#pragma omp for schedule(static)
        for (int64_t bi = 0; bi < rows; bi++) {
            int64_t b = bi / s->S1, i = bi % s->S1;
            for (int64_t h = 0; h < s->N1; h++) {
                row_ctx r = row_at(s, q, k, v, idx, b, i, h);
                int64_t n = expand_row(s, r.idx, i, keys);
                if (n == 0) continue; /* no key: no gradient anywhere */
                double L = row_scores(s, &r, keys, n, scale, sc);
                const double *g = dout + ((b * s->S1 + i) * s->N1 + h) * s->D;
                /* O recomputed in fp64 for Delta = dO . O */
                memset(orow, 0, (size_t)s->D * sizeof(double));
                for (int64_t t = 0; t < n; t++) {
                    sc[t] = exp(sc[t] - L); /* now P */
                    const double *vr = r.vb + keys[t] * r.vstride;
                    for (int64_t d = 0; d < s->D; d++) orow[d] += sc[t] * vr[d];
                }
                double delta = dot(g, orow, s->D);
                double *dqr = dq + ((b * s->S1 + i) * s->N1 + h) * Dq;
                int64_t n2 = h / (s->N1 / s->N2);
                for (int64_t t = 0; t < n; t++) {
                    double p = sc[t];
                    const double *kr = r.kb + keys[t] * r.kstride;
                    const double *vr = r.vb + keys[t] * r.vstride;
                    double ds = p * (dot(g, vr, s->D) - delta);
                    for (int64_t d = 0; d < Dq; d++) dqr[d] += scale * ds * kr[d];
                    double *dkr = pk + ((b * s->S2 + keys[t]) * s->N2 + n2) * Dq;
                    for (int64_t d = 0; d < Dq; d++) dkr[d] += scale * ds * r.q[d];
                    double *dvr = s->shared_kv ? dkr : pv + ((b * s->S2 + keys[t]) * s->N2 + n2) * s->D;
                    for (int64_t d = 0; d < s->D; d++) dvr[d] += p * g[d];
                }
            }
        }
        free(keys);
        free(sc);
        free(orow);
    }
    /* Fixed-order reduction of the partials (thread 0 first). */
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < (int64_t)nk; e++) {
        double acc = 0;
        for (int t = 0; t < nt; t++) acc += part[(size_t)t * (nk + nv) + (size_t)e];
        dk[e] = acc;
    }
    if (!s->shared_kv) {
#pragma omp parallel for schedule(static)
        for (int64_t e = 0; e < (int64_t)nv; e++) {
            double acc = 0;
            for (int t = 0; t < nt; t++) acc += part[(size_t)t * (nk + nv) + nk + (size_t)e];
            dv[e] = acc;
        }
    }
    free(part);
}
