#include "eco.h"

#include <math.h>
#include <string.h>
#include <stdlib.h>

#include "spattn.h"

sp_tol sp_tol_for(int32_t dtype) {
    sp_tol t;
    switch (dtype) {
    case SPATTN_DTYPE_F16: t.atol = t.rtol = 0x1p-9; t.limit = 0.1; break;
    case SPATTN_DTYPE_BF16: t.atol = t.rtol = 0x1p-6; t.limit = 1.0; break;
    default: t.atol = 0x1p-16; t.rtol = 0x1p-10; t.limit = 0.01; break;
    }
    return t;
}

int sp_eco_element_ok(double a, double g, sp_tol tol) {
    if (isnan(g) || isnan(a)) return isnan(g) && isnan(a);
    if (isinf(g) || isinf(a)) return a == g; /* same sign infinity only */
    /* Both operands are exact doubles of fp32/fp64 values; the boundary is inclusive. */
    return fabs(a - g) <= tol.atol + tol.rtol * fabs(g);
}

/* Figures of one chunk of elements. */
typedef struct part {
    int64_t matched, bad_nf, worst;
    double max_abs, num, den;
} part;

static void scan(const float *actual, const double *golden, int64_t lo, int64_t hi, sp_tol tol,
                 part *p) {
    p->matched = p->bad_nf = 0;
    p->worst = -1;
    p->max_abs = p->num = p->den = 0.0;
    for (int64_t i = lo; i < hi; i++) {
        double a = (double)actual[i], g = golden[i];
        int ok = sp_eco_element_ok(a, g, tol);
        p->matched += ok;
        double e;
        if (isfinite(a) && isfinite(g)) {
            e = fabs(a - g);
            p->num += e * e;
            p->den += g * g;
        } else {
            e = ok ? 0.0 : INFINITY; /* a matching NaN / Inf pair has no error */
            p->bad_nf += !ok;
        }
        if (e > p->max_abs) { /* first element of the largest error */
            p->max_abs = e;
            p->worst = i;
        }
    }
}

/* Fixed chunks combined in order: the figures do not depend on the thread count. */
#define ECO_CHUNK ((int64_t)1 << 16)

void sp_eco_compare(const float *actual, const double *golden, int64_t n, sp_tol tol, sp_eco *r) {
    const int64_t nchunk = (n + ECO_CHUNK - 1) / ECO_CHUNK;
    part one, *parts = nchunk > 1 ? malloc((size_t)nchunk * sizeof *parts) : NULL;
    if (!parts) { /* one chunk, or no memory for the partials: a single sequential scan */
        scan(actual, golden, 0, n, tol, &one);
        parts = &one;
    } else {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t c = 0; c < nchunk; c++)
            scan(actual, golden, c * ECO_CHUNK, c + 1 < nchunk ? (c + 1) * ECO_CHUNK : n, tol,
                 &parts[c]);
    }
    const int64_t np = parts == &one ? 1 : nchunk;
    part t = parts[0];
    memset(r, 0, sizeof *r); /* padding too: callers may compare results bytewise */
    for (int64_t c = 1; c < np; c++) {
        t.matched += parts[c].matched;
        t.bad_nf += parts[c].bad_nf;
        t.num += parts[c].num;
        t.den += parts[c].den;
        if (parts[c].max_abs > t.max_abs) {
            t.max_abs = parts[c].max_abs;
            t.worst = parts[c].worst;
        }
    }
    if (parts != &one) free(parts);
    r->total = n;
    r->matched = t.matched;
    r->matched_ratio = n ? (double)t.matched / (double)n : 1.0;
    r->max_abs = t.max_abs;
    r->rel_l2 = t.den > 0.0 ? sqrt(t.num / t.den) : (t.num > 0.0 ? INFINITY : 0.0);
    r->nonfinite_mismatch = t.bad_nf;
    r->worst = t.worst;
    /* matched / total >= 0.99 in integers: exact at the boundary for any total. */
    r->pass = t.matched * 100 >= n * 99 && t.max_abs <= tol.limit;
}
