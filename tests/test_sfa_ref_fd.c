/*
 * The fp64 sfa reference backward against central finite differences of its forward:
 * L = sum(dO * O), every element of dq (nope and rope columns), dk (nope and rope) and dv,
 * with shared and separate v, causal and plain masks, sbs > 1, duplicates, padding and rows
 * with no key at all.
 */
#include "sfa_testutil.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static double loss(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                   const double *v, const int32_t *idx, double scale, const double *g, double *o) {
    spattn_ref_sfa_fwd(s, q, k, v, idx, scale, o, NULL);
    double L = 0;
    for (int64_t e = 0; e < s->B * s->S1 * s->N1 * s->D; e++) L += g[e] * o[e];
    return L;
}

/* Max |analytic - numeric| / (1 + |numeric|) over the elements of x (perturbed in place). */
static double fd_check(const spattn_ref_sfa_shape *s, double *x, int64_t n, const double *grad,
                       double *q, double *k, double *v, const int32_t *idx, double scale,
                       const double *g, double *o) {
    const double h = 1e-5;
    double worst = 0;
    for (int64_t e = 0; e < n; e++) {
        double x0 = x[e];
        x[e] = x0 + h;
        double lp = loss(s, q, k, v, idx, scale, g, o);
        x[e] = x0 - h;
        double lm = loss(s, q, k, v, idx, scale, g, o);
        x[e] = x0;
        double num = (lp - lm) / (2 * h);
        double err = fabs(grad[e] - num) / (1 + fabs(num));
        if (err > worst) worst = err;
    }
    return worst;
}

static void run(const st_shape *sh, uint64_t seed) {
    tu_rng r;
    tu_seed(&r, seed);
    spattn_ref_sfa_shape s = st_ref_shape(sh);
    int64_t Dq = s.D + s.Dr;
    size_t nq = (size_t)(s.B * s.S1 * s.N1), nk = (size_t)(s.B * s.S2 * s.N2);
    double *q = malloc(nq * Dq * sizeof(double)), *k = malloc(nk * Dq * sizeof(double));
    double *v = malloc(nk * s.D * sizeof(double)), *g = malloc(nq * s.D * sizeof(double));
    double *o = malloc(nq * s.D * sizeof(double));
    double *dq = malloc(nq * Dq * sizeof(double)), *dk = malloc(nk * Dq * sizeof(double));
    double *dv = malloc(nk * s.D * sizeof(double));
    int32_t *idx = malloc((size_t)(s.B * s.S1 * s.N2 * s.K) * sizeof(int32_t));
    for (size_t e = 0; e < nq * Dq; e++) q[e] = tu_normal(&r);
    for (size_t e = 0; e < nk * Dq; e++) k[e] = tu_normal(&r);
    for (size_t e = 0; e < nk * s.D; e++) v[e] = tu_normal(&r);
    for (size_t e = 0; e < nq * s.D; e++) g[e] = tu_normal(&r);
    st_fill_indices(&r, sh, idx);
    double scale = 1.0 / sqrt((double)Dq);
    spattn_ref_sfa_bwd(&s, q, k, v, idx, scale, g, dq, dk, s.shared_kv ? NULL : dv);
    const double tol = 1e-6;
    char name[160];
    snprintf(name, sizeof name, "S1=%lld S2=%lld N1=%lld N2=%lld D=%lld Dr=%lld K=%lld sbs=%lld mode=%d shared=%d",
             (long long)s.S1, (long long)s.S2, (long long)s.N1, (long long)s.N2, (long long)s.D,
             (long long)s.Dr, (long long)s.K, (long long)s.sbs, s.mode, s.shared_kv);
    /* dq and dq_rope are the nope / rope columns of one [.., D+Dr] array: checking all of q
     * covers both (and likewise dk / dk_rope) */
    double eq = fd_check(&s, q, (int64_t)(nq * Dq), dq, q, k, v, idx, scale, g, o);
    TU_CHECK(eq < tol, "%s: dq / dq_rope vs finite differences: %g", name, eq);
    double ek = fd_check(&s, k, (int64_t)(nk * Dq), dk, q, k, v, idx, scale, g, o);
    TU_CHECK(ek < tol, "%s: dk / dk_rope (+ dv when shared) vs finite differences: %g", name, ek);
    if (!s.shared_kv) {
        double ev = fd_check(&s, v, (int64_t)(nk * s.D), dv, q, k, v, idx, scale, g, o);
        TU_CHECK(ev < tol, "%s: dv vs finite differences: %g", name, ev);
    }
    /* rows without any attended key: O = 0, LSE = -inf, dq = 0 */
    double *lse = malloc(nq * sizeof(double));
    spattn_ref_sfa_fwd(&s, q, k, v, idx, scale, o, lse);
    int empty_ok = 1, nempty = 0;
    for (size_t row = 0; row < nq; row++) {
        if (lse[row] != -INFINITY) continue;
        nempty++;
        for (int64_t d = 0; d < s.D; d++) empty_ok &= o[row * s.D + d] == 0.0;
        for (int64_t d = 0; d < Dq; d++) empty_ok &= dq[row * Dq + d] == 0.0;
    }
    TU_CHECK(empty_ok, "%s: %d rows without keys must have O = 0 and dq = 0", name, nempty);
    free(q);
    free(k);
    free(v);
    free(g);
    free(o);
    free(dq);
    free(dk);
    free(dv);
    free(idx);
    free(lse);
}

int main(void) {
    uint64_t seed = tu_test_seed(7);
#ifdef _OPENMP
    /* thousands of tiny forward calls: threads would only add fork/join overhead */
    omp_set_num_threads(1);
#endif
    const int F = SPATTN_DTYPE_F32;
    /* B S1 S2 N1 N2 D Dr K sbs mode shared dtype concat layout dup pad empty */
    const st_shape cases[] = {
        {1, 6, 5, 4, 2, 8, 8, 6, 1, 3, 1, F, 0, 0, 0.2, 0.2, 0.2},
        {1, 6, 5, 4, 2, 8, 8, 6, 1, 3, 0, F, 0, 0, 0.2, 0.2, 0.2},
        {1, 4, 9, 2, 1, 8, 8, 3, 4, 0, 0, F, 0, 0, 0.3, 0.2, 0.0},
        {2, 5, 9, 3, 1, 16, 0, 3, 2, 3, 1, F, 0, 0, 0.3, 0.2, 0.1},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) run(&cases[c], seed + c);
    return tu_summary("test_sfa_ref_fd");
}
