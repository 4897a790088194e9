#include "eco.h"

#include <math.h>

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

void sp_eco_compare(const float *actual, const double *golden, int64_t n, sp_tol tol, sp_eco *r) {
    int64_t matched = 0, bad_nf = 0, worst = -1;
    double max_abs = 0.0, num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double a = (double)actual[i], g = golden[i];
        int ok = sp_eco_element_ok(a, g, tol);
        matched += ok;
        double e;
        if (isfinite(a) && isfinite(g)) {
            e = fabs(a - g);
            num += e * e;
            den += g * g;
        } else {
            e = ok ? 0.0 : INFINITY; /* a matching NaN / Inf pair has no error */
            bad_nf += !ok;
        }
        if (e > max_abs || (worst < 0 && !ok)) {
            max_abs = e > max_abs ? e : max_abs;
            worst = i;
        }
    }
    r->total = n;
    r->matched = matched;
    r->matched_ratio = n ? (double)matched / (double)n : 1.0;
    r->max_abs = max_abs;
    r->rel_l2 = den > 0.0 ? sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
    r->nonfinite_mismatch = bad_nf;
    r->worst = worst;
    /* matched / total >= 0.99 in integers: exact at the boundary for any total. */
    r->pass = matched * 100 >= n * 99 && max_abs <= tol.limit;
}
