/*
 * Finite-difference check of the fp64 bsa reference itself: with L = sum(dout * O), the
 * reference backward must match central differences of the reference forward (relative error
 * < 1e-6) for q, k and v, on tiny shapes with GQA, partial blocks and an empty query row.
 */
#include "bsa_testkit.h"

static double loss(const spattn_ref_bsa_shape *s, const double *q, const double *k,
                   const double *v, const uint8_t *m, double scale, const double *dout, double *o) {
    spattn_ref_bsa_fwd(s, q, k, v, m, scale, o, NULL);
    double l = 0;
    for (int64_t i = 0; i < s->B * s->N * s->Sq * s->D; i++) l += dout[i] * o[i];
    return l;
}

/* Central differences of L with respect to every element of x (perturbed in place). */
static void fd_grad(const spattn_ref_bsa_shape *s, double *q, double *k, double *v,
                    const uint8_t *m, double scale, const double *dout, double *x, int64_t n,
                    double *g, double *o) {
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(s, q, k, v, m, scale, dout, o);
        x[i] = x0 - h;
        double lm = loss(s, q, k, v, m, scale, dout, o);
        x[i] = x0;
        g[i] = (lp - lm) / (2 * h);
    }
}

static void check(const char *what, const double *an, const double *fd, int64_t n, const char *desc) {
    double num = 0, den = 0, mx = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (an[i] - fd[i]) * (an[i] - fd[i]);
        den += fd[i] * fd[i];
        if (fabs(fd[i]) > mx) mx = fabs(fd[i]);
    }
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(an[i] - fd[i]) / (fabs(fd[i]) + 1e-3 * mx);
        if (e > worst) worst = e;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    TU_CHECK(rel < 1e-6 && worst < 1e-6, "%s %s: relative L2 %.3g, worst element %.3g", desc, what, rel, worst);
}

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(7));
    /* {B, N, Nkv, Sq, Skv, D, bx, by}, pattern */
    struct { spattn_ref_bsa_shape s; int pat; double scale; } cases[] = {
        {{1, 2, 1, 5, 7, 8, 2, 3}, PAT_RANDOM, 0.7},
        {{2, 2, 2, 4, 6, 8, 3, 2}, PAT_CAUSAL, 0.0},
        {{1, 3, 1, 6, 5, 16, 1, 1}, PAT_EMPTY_ROWS, -0.4},
        {{1, 1, 1, 7, 3, 8, 4, 2}, PAT_BIGBIRD, 1.3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const spattn_ref_bsa_shape *s = &cases[c].s;
        char desc[64];
        snprintf(desc, sizeof desc, "case %zu (%s)", c, pat_name[cases[c].pat]);
        int64_t nq = s->B * s->N * s->Sq * s->D, nkv = s->B * s->Nkv * s->Skv * s->D;
        int64_t nm = s->B * s->N * ((s->Sq + s->bx - 1) / s->bx) * ((s->Skv + s->by - 1) / s->by);
        double scale = cases[c].scale != 0 ? cases[c].scale : 1.0 / sqrt((double)s->D);
        double *q = malloc(sizeof(double) * (size_t)nq), *dout = malloc(sizeof(double) * (size_t)nq);
        double *o = malloc(sizeof(double) * (size_t)nq), *dq = malloc(sizeof(double) * (size_t)nq);
        double *fq = malloc(sizeof(double) * (size_t)nq);
        double *k = malloc(sizeof(double) * (size_t)nkv), *v = malloc(sizeof(double) * (size_t)nkv);
        double *dk = malloc(sizeof(double) * (size_t)nkv), *dv = malloc(sizeof(double) * (size_t)nkv);
        double *fk = malloc(sizeof(double) * (size_t)nkv), *fv = malloc(sizeof(double) * (size_t)nkv);
        uint8_t *m = malloc((size_t)nm);
        bk_randn(&r, q, nq, SPATTN_DTYPE_F32);
        bk_randn(&r, dout, nq, SPATTN_DTYPE_F32);
        bk_randn(&r, k, nkv, SPATTN_DTYPE_F32);
        bk_randn(&r, v, nkv, SPATTN_DTYPE_F32);
        bk_make_mask(&r, cases[c].pat, s->B, s->N, s->Sq, s->Skv, s->bx, s->by, m);
        spattn_ref_bsa_bwd(s, q, k, v, m, scale, dout, dq, dk, dv);
        fd_grad(s, q, k, v, m, scale, dout, q, nq, fq, o);
        fd_grad(s, q, k, v, m, scale, dout, k, nkv, fk, o);
        fd_grad(s, q, k, v, m, scale, dout, v, nkv, fv, o);
        check("dq", dq, fq, nq, desc);
        check("dk", dk, fk, nkv, desc);
        check("dv", dv, fv, nkv, desc);
        /* Rows with no key: O = 0, LSE = -inf, dQ = 0, and no NaN anywhere. */
        double *lse = malloc(sizeof(double) * (size_t)(s->B * s->N * s->Sq));
        spattn_ref_bsa_fwd(s, q, k, v, m, scale, o, lse);
        int ok = 1;
        for (int64_t row = 0; row < s->B * s->N * s->Sq; row++)
            for (int64_t d = 0; d < s->D; d++) {
                int64_t i = row * s->D + d;
                if (isnan(o[i]) || isnan(dq[i])) ok = 0;
                if (lse[row] == -INFINITY && (o[i] != 0.0 || dq[i] != 0.0)) ok = 0;
            }
        for (int64_t i = 0; i < nkv; i++)
            if (isnan(dk[i]) || isnan(dv[i])) ok = 0;
        TU_CHECK(ok, "%s: empty rows must give O = 0, dQ = 0 and no NaN", desc);
        free(lse);
        free(q); free(dout); free(o); free(dq); free(fq);
        free(k); free(v); free(dk); free(dv); free(fk); free(fv); free(m);
    }
    return tu_summary("test_bsa_ref_fd");
}
