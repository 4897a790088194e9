/*
 * fp64 reference of top-k sparse flash attention (sfa), straight from cases/README.md.
 * Every entry of an index row is one softmax term (duplicates count twice); entry e selects
 * keys [e*sbs, min((e+1)*sbs, S2)); -1 is padding; mode 3 masks keys j > S2 - S1 + i.
 * Forward: OpenMP over query rows; per (row, kv group) the index row is expanded once and each
 * key row is read once for all heads of the group.  Backward: dq per row; dk/dv accumulate
 * into per-thread fp64 partials (rows split statically) summed in thread order afterwards.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* The reference is the golden of `spattn verify` on full-size cases: its two inner loops get an
 * AVX2 clone (picked at load time by the ifunc resolver) next to the portable baseline one. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define REF_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define REF_CLONES
#endif

#define REF_DOT_ATTR REF_CLONES static
#include "ref_dot.h"

/* y += a * x */
REF_CLONES static void axpy(double *y, double a, const double *x, int64_t n) {
    for (int64_t d = 0; d < n; d++) y[d] += a * x[d];
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

/* Pointers of group (b, i, n2): its first query head's row, k and v at [b, 0, n2, 0]. */
typedef struct grp_ctx {
    const double *q;            /* q[b, i, n2*G, :]; head g of the group at q + g * Dq */
    const double *kb, *vb;
    int64_t kstride, vstride;   /* between consecutive keys */
    const int32_t *idx;         /* index row [b, i, n2, :] */
} grp_ctx;

static grp_ctx grp_at(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                      const double *v, const int32_t *idx, int64_t b, int64_t i, int64_t n2) {
    int64_t Dq = s->D + s->Dr, G = s->N1 / s->N2;
    grp_ctx r;
    r.q = q + ((b * s->S1 + i) * s->N1 + n2 * G) * Dq;
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

/* Scores of the group's G heads over its n keys into sc[g * n + t] (key-outer loop: each key
 * row is read once for all heads); lse[g] gets the LSE: -inf when n == 0 or every score is
 * -inf (the head then attends nothing), NaN when a score is NaN or +inf (IEEE on the dense
 * formula: exp(inf - inf)). */
static void grp_scores(const spattn_ref_sfa_shape *s, const grp_ctx *r, const int64_t *keys,
                       int64_t n, double scale, double *sc, double *lse) {
    int64_t Dq = s->D + s->Dr, G = s->N1 / s->N2;
    for (int64_t t = 0; t < n; t++) {
        const double *kr = r->kb + keys[t] * r->kstride;
        for (int64_t g = 0; g < G; g++) sc[g * n + t] = scale * dot(r->q + g * Dq, kr, Dq);
    }
    for (int64_t g = 0; g < G; g++) {
        if (n == 0) {
            lse[g] = -INFINITY;
            continue;
        }
        double m = -INFINITY, l = 0;
        int nan = 0;
        for (int64_t t = 0; t < n; t++) {
            if (isnan(sc[g * n + t])) nan = 1;
            if (sc[g * n + t] > m) m = sc[g * n + t];
        }
        if (m == -INFINITY && !nan) {
            lse[g] = -INFINITY;
            continue;
        }
        for (int64_t t = 0; t < n; t++) l += exp(sc[g * n + t] - m);
        lse[g] = m + log(l);
    }
}

void spattn_ref_sfa_fwd(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                        const double *v, const int32_t *idx, double scale, double *o,
                        double *lse) {
    int64_t rows = s->B * s->S1, G = s->N1 / s->N2;
    int64_t kmax = s->K * s->sbs;
#pragma omp parallel
    {
        int64_t *keys = malloc((size_t)kmax * sizeof(int64_t) + 1);
        double *sc = malloc((size_t)(kmax * G) * sizeof(double) + 1);
        double *L = malloc((size_t)G * sizeof(double));
#pragma omp for schedule(dynamic, 1)
        for (int64_t bi = 0; bi < rows; bi++) {
            int64_t b = bi / s->S1, i = bi % s->S1;
            for (int64_t n2 = 0; n2 < s->N2; n2++) {
                grp_ctx r = grp_at(s, q, k, v, idx, b, i, n2);
                int64_t n = expand_row(s, r.idx, i, keys);
                grp_scores(s, &r, keys, n, scale, sc, L);
                double *og = o + ((b * s->S1 + i) * s->N1 + n2 * G) * s->D;
                memset(og, 0, (size_t)(G * s->D) * sizeof(double));
                for (int64_t t = 0; t < n; t++) {
                    const double *vr = r.vb + keys[t] * r.vstride;
                    for (int64_t g = 0; g < G; g++) {
                        if (L[g] == -INFINITY) continue; /* attends nothing: O = 0 */
                        double p = exp(sc[g * n + t] - L[g]);
                        axpy(og + g * s->D, p, vr, s->D);
                    }
                }
                if (lse)
                    for (int64_t g = 0; g < G; g++) lse[(b * s->S1 + i) * s->N1 + n2 * G + g] = L[g];
            }
        }
        free(keys);
        free(sc);
        free(L);
    }
}

void spattn_ref_sfa_bwd(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                        const double *v, const int32_t *idx, double scale, const double *dout,
                        double *dq, double *dk, double *dv) {
    int64_t Dq = s->D + s->Dr, G = s->N1 / s->N2;
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
        double *sc = malloc((size_t)(kmax * G) * sizeof(double) + 1);
        double *L = malloc((size_t)G * sizeof(double));
        double *delta = malloc((size_t)G * sizeof(double));
        double *og = malloc((size_t)(G * s->D) * sizeof(double));
#pragma omp for schedule(static)
        for (int64_t bi = 0; bi < rows; bi++) {
            int64_t b = bi / s->S1, i = bi % s->S1;
            for (int64_t n2 = 0; n2 < s->N2; n2++) {
                grp_ctx r = grp_at(s, q, k, v, idx, b, i, n2);
                int64_t n = expand_row(s, r.idx, i, keys);
                if (n == 0) continue; /* no key: no gradient anywhere */
                grp_scores(s, &r, keys, n, scale, sc, L);
                const double *gg = dout + ((b * s->S1 + i) * s->N1 + n2 * G) * s->D;
                double *dqg = dq + ((b * s->S1 + i) * s->N1 + n2 * G) * Dq;
                /* P, and O recomputed in fp64 for Delta = dO . O */
                memset(og, 0, (size_t)(G * s->D) * sizeof(double));
                for (int64_t t = 0; t < n; t++) {
                    const double *vr = r.vb + keys[t] * r.vstride;
                    for (int64_t g = 0; g < G; g++) {
                        double p = L[g] == -INFINITY ? 0.0 : exp(sc[g * n + t] - L[g]);
                        sc[g * n + t] = p;
                        if (L[g] == -INFINITY) continue;
                        axpy(og + g * s->D, p, vr, s->D);
                    }
                }
                for (int64_t g = 0; g < G; g++)
                    delta[g] = L[g] == -INFINITY ? 0.0 : dot(gg + g * s->D, og + g * s->D, s->D);
                for (int64_t t = 0; t < n; t++) {
                    const double *kr = r.kb + keys[t] * r.kstride;
                    const double *vr = r.vb + keys[t] * r.vstride;
                    double *dkr = pk + ((b * s->S2 + keys[t]) * s->N2 + n2) * Dq;
                    double *dvr = s->shared_kv ? dkr : pv + ((b * s->S2 + keys[t]) * s->N2 + n2) * s->D;
                    for (int64_t g = 0; g < G; g++) {
                        if (L[g] == -INFINITY) continue; /* attends nothing: no gradient */
                        const double *qr = r.q + g * Dq, *gr = gg + g * s->D;
                        double p = sc[g * n + t];
                        double ds = p * (dot(gr, vr, s->D) - delta[g]);
                        axpy(dqg + g * Dq, scale * ds, kr, Dq);
                        axpy(dkr, scale * ds, qr, Dq);
                        axpy(dvr, p, gr, s->D);
                    }
                }
            }
        }
        free(keys);
        free(sc);
        free(L);
        free(delta);
        free(og);
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
