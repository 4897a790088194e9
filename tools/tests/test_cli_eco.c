/* The eco criterion at its exact boundaries (cases/README.md, "Verifying a case"). */
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "eco.h"
#include "testutil.h"

static sp_eco run(const float *a, const double *g, int64_t n, int32_t dtype) {
    sp_eco r;
    sp_eco_compare(a, g, n, sp_tol_for(dtype), &r);
    return r;
}

/* n zero elements, of which `bad` have actual = golden + err. */
static sp_eco ratio_case(int64_t n, int64_t bad, double err, int32_t dtype) {
    float *a = malloc((size_t)n * sizeof *a);
    double *g = malloc((size_t)n * sizeof *g);
    for (int64_t i = 0; i < n; i++) {
        g[i] = 0.0;
        a[i] = i < bad ? (float)err : 0.0f;
    }
    sp_eco r = run(a, g, n, dtype);
    free(a);
    free(g);
    return r;
}

int main(void) {
    /* Tolerances as tabled. */
    sp_tol t16 = sp_tol_for(SPATTN_DTYPE_F16), tb = sp_tol_for(SPATTN_DTYPE_BF16);
    sp_tol t32 = sp_tol_for(SPATTN_DTYPE_F32);
    TU_CHECK(t16.atol == 0x1p-9 && t16.rtol == 0x1p-9 && t16.limit == 0.1, "fp16 tolerances");
    TU_CHECK(tb.atol == 0x1p-6 && tb.rtol == 0x1p-6 && tb.limit == 1.0, "bf16 tolerances");
    TU_CHECK(t32.atol == 0x1p-16 && t32.rtol == 0x1p-10 && t32.limit == 0.01, "fp32 tolerances");

    /* Element boundary: |a - g| == atol + rtol*|g| passes, one float ulp more fails. */
    {
        float edge = 1.0f + 0x1p-8f; /* g = 1: 2^-9 + 2^-9 */
        TU_CHECK(sp_eco_element_ok(edge, 1.0, t16), "fp16 edge passes");
        TU_CHECK(!sp_eco_element_ok(nextafterf(edge, 2.0f), 1.0, t16), "fp16 edge + 1 ulp fails");
        TU_CHECK(sp_eco_element_ok(-edge, -1.0, t16), "fp16 negative edge passes");
        TU_CHECK(!sp_eco_element_ok(nextafterf(-edge, -2.0f), -1.0, t16), "negative edge + ulp fails");
        float lo = 1.0f - 0x1p-8f;
        TU_CHECK(sp_eco_element_ok(lo, 1.0, t16), "fp16 lower edge passes");
        TU_CHECK(!sp_eco_element_ok(nextafterf(lo, 0.0f), 1.0, t16), "fp16 lower edge - ulp fails");
    }
    {
        float edge = 2.0f + 3.0f * 0x1p-6f; /* g = 2: 2^-6 + 2*2^-6 */
        TU_CHECK(sp_eco_element_ok(edge, 2.0, tb), "bf16 edge passes");
        TU_CHECK(!sp_eco_element_ok(nextafterf(edge, 4.0f), 2.0, tb), "bf16 edge + 1 ulp fails");
    }
    {
        float edge = 1.0f + 0x1p-10f + 0x1p-16f; /* LSE row: g = 1 */
        TU_CHECK(sp_eco_element_ok(edge, 1.0, t32), "fp32 edge passes");
        TU_CHECK(!sp_eco_element_ok(nextafterf(edge, 2.0f), 1.0, t32), "fp32 edge + 1 ulp fails");
        /* Near zero only atol counts. */
        TU_CHECK(sp_eco_element_ok(0x1p-16f, 0.0, t32), "fp32 atol edge at 0 passes");
        TU_CHECK(!sp_eco_element_ok(nextafterf(0x1p-16f, 1.0f), 0.0, t32), "fp32 atol + ulp fails");
    }

    /* Matched ratio: exactly 0.99 passes, just below fails (mismatches within the limit). */
    {
        sp_eco r = ratio_case(100, 1, 0.05, SPATTN_DTYPE_F16);
        TU_CHECK(r.pass && r.matched == 99 && r.matched_ratio == 0.99, "99/100 passes (%f)", r.matched_ratio);
        r = ratio_case(100, 2, 0.05, SPATTN_DTYPE_F16);
        TU_CHECK(!r.pass && r.matched == 98, "98/100 fails");
        r = ratio_case(1000, 10, 0.05, SPATTN_DTYPE_F16);
        TU_CHECK(r.pass, "990/1000 passes");
        r = ratio_case(1000, 11, 0.05, SPATTN_DTYPE_F16);
        TU_CHECK(!r.pass, "989/1000 fails");
        r = ratio_case(100000, 1000, 0.5, SPATTN_DTYPE_BF16);
        TU_CHECK(r.pass, "99000/100000 passes (bf16)");
        r = ratio_case(100000, 1001, 0.5, SPATTN_DTYPE_BF16);
        TU_CHECK(!r.pass, "98999/100000 fails (bf16)");
    }

    /* Max-error limit: one outlier of exactly the limit passes, one just above fails. */
    {
        static const int32_t dts[3] = {SPATTN_DTYPE_F16, SPATTN_DTYPE_BF16, SPATTN_DTYPE_F32};
        for (int d = 0; d < 3; d++) {
            sp_tol t = sp_tol_for(dts[d]);
            float a[1000] = {0};
            double g[1000] = {0};
            g[7] = t.limit; /* actual 0, golden = limit: |a - g| == limit */
            sp_eco r = run(a, g, 1000, dts[d]);
            TU_CHECK(r.pass && r.max_abs == t.limit && r.matched == 999, "error == limit passes (%d)", d);
            TU_CHECK(r.worst == 7, "worst element index");
            g[7] = nextafter(t.limit, 10.0);
            r = run(a, g, 1000, dts[d]);
            TU_CHECK(!r.pass && r.matched == 999, "error just above the limit fails (%d)", d);
        }
    }

    /* NaN: must sit exactly where the golden has NaN. */
    {
        TU_CHECK(sp_eco_element_ok(NAN, NAN, t16), "NaN vs NaN matches");
        TU_CHECK(!sp_eco_element_ok(0.0, NAN, t16), "finite vs NaN golden fails");
        TU_CHECK(!sp_eco_element_ok(NAN, 0.0, t16), "NaN vs finite golden fails");
        float a[1000] = {0};
        double g[1000] = {0};
        a[3] = NAN;
        sp_eco r = run(a, g, 1000, SPATTN_DTYPE_F16);
        TU_CHECK(!r.pass && r.matched == 999 && isinf(r.max_abs) && r.nonfinite_mismatch == 1,
                 "one stray NaN fails the tensor despite 99.9%% matched");
        g[3] = NAN;
        r = run(a, g, 1000, SPATTN_DTYPE_F16);
        TU_CHECK(r.pass && r.max_abs == 0.0 && r.rel_l2 == 0.0, "NaN where the golden has NaN passes");
    }

    /* Inf: only an Inf of the same sign (LSE of rows with no key is -inf). */
    {
        TU_CHECK(sp_eco_element_ok(-INFINITY, -INFINITY, t32), "-inf vs -inf matches");
        TU_CHECK(sp_eco_element_ok(INFINITY, INFINITY, t32), "+inf vs +inf matches");
        TU_CHECK(!sp_eco_element_ok(INFINITY, -INFINITY, t32), "+inf vs -inf fails");
        TU_CHECK(!sp_eco_element_ok(-3.0e38f, -INFINITY, t32), "finite vs -inf fails");
        TU_CHECK(!sp_eco_element_ok(-INFINITY, -3.0e38, t32), "-inf vs finite fails");
        TU_CHECK(!sp_eco_element_ok(NAN, -INFINITY, t32), "NaN vs -inf fails");
        float a[4] = {1.0f, -INFINITY, 2.0f, -INFINITY};
        double g[4] = {1.0, -INFINITY, 2.0, -INFINITY};
        sp_eco r = run(a, g, 4, SPATTN_DTYPE_F32);
        TU_CHECK(r.pass && r.max_abs == 0.0 && r.rel_l2 == 0.0, "LSE with -inf rows passes");
        a[3] = 0.0f;
        r = run(a, g, 4, SPATTN_DTYPE_F32);
        TU_CHECK(!r.pass && isinf(r.max_abs), "LSE with a missing -inf fails");
    }

    /* Relative L2 error and the empty tensor. */
    {
        float a[2] = {3.0f, 4.5f};
        double g[2] = {3.0, 4.0};
        sp_eco r = run(a, g, 2, SPATTN_DTYPE_BF16);
        TU_CHECK(fabs(r.rel_l2 - 0.1) < 1e-15, "rel_l2 = 0.5 / 5 (%g)", r.rel_l2);
        TU_CHECK(r.max_abs == 0.5, "max_abs 0.5");
        r = run(a, g, 0, SPATTN_DTYPE_F16);
        TU_CHECK(r.pass && r.matched_ratio == 1.0 && r.total == 0, "empty tensor passes");
        double z[2] = {0.0, 0.0};
        float az[2] = {0.0f, 0.0f};
        r = run(az, z, 2, SPATTN_DTYPE_F16);
        TU_CHECK(r.pass && r.rel_l2 == 0.0, "all-zero golden, exact: rel_l2 0");
    }
    /* Many chunks: the figures do not depend on the thread count, and the worst element is
     * the first one with the largest error. */
    {
        int64_t n = 300000;
        float *a = malloc((size_t)n * sizeof *a);
        double *g = malloc((size_t)n * sizeof *g);
        for (int64_t i = 0; i < n; i++) {
            g[i] = sin((double)i);
            a[i] = (float)(g[i] + 1e-3 * cos(3.0 * (double)i));
        }
        a[200001] = (float)(g[200001] + 0.07);
        a[250000] = (float)(g[250000] + 0.07); /* same error (within fp32 rounding) later */
        sp_eco r1, r2;
#ifdef _OPENMP
        omp_set_num_threads(1);
#endif
        sp_eco_compare(a, g, n, sp_tol_for(SPATTN_DTYPE_F16), &r1);
#ifdef _OPENMP
        omp_set_num_threads(4);
#endif
        sp_eco_compare(a, g, n, sp_tol_for(SPATTN_DTYPE_F16), &r2);
        TU_CHECK(!memcmp(&r1, &r2, sizeof r1), "eco figures independent of the thread count");
        TU_CHECK(r1.worst == 200001 || r1.worst == 250000, "worst element found (%lld)", (long long)r1.worst);
        TU_CHECK(r1.pass && r1.matched < n, "a few mismatches, still passing");
        free(a);
        free(g);
    }
    return tu_summary("test_cli_eco");
}
