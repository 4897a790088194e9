/*
 * NaN / Inf semantics (include/spattn.h, cases/README.md; issue 16 defect 5): the CPU kernels
 * (bsa, sfa; forward and backward) against the fp64 references, which implement IEEE
 * arithmetic on the dense formula over the attended keys.  One non-finite value is planted
 * per case (q, k, v, dO; NaN, +inf, -inf; an all-NaN k), then every output element must be
 * NaN where the reference is NaN, the same infinity where it is infinite, and finite and close
 * where it is finite.  Rows that attend nothing stay O = 0, LSE = -inf, whatever their q holds.
 * Blocks of 8 tokens put several mask blocks into one kernel tile (pairs a row does not attend
 * are packed too): a non-finite value there must not leak into rows that do not attend it.
 */
#include "ref.h"
#include "testutil.h"

enum { WHERE_Q, WHERE_K, WHERE_V, WHERE_DO, WHERE_K_ALL, WHERE_COUNT };
static const char *const where_name[WHERE_COUNT] = {"q", "k", "v", "dO", "all of k"};

/* Compares n values; returns 1 when every element matches in kind (and value when finite).
 * lenient: a finite reference value may come out NaN. */
static int same_kind(const char *what, const float *got, const double *want, int64_t n,
                     double atol, double rtol, int lenient) {
    int64_t bad = 0, first = -1;
    for (int64_t e = 0; e < n; e++) {
        double g = got[e], w = want[e];
        int ok;
        if (isnan(w)) ok = isnan(g);
        else if (isinf(w)) ok = g == w;
        else ok = (isfinite(g) && fabs(g - w) <= atol + rtol * fabs(w)) || (lenient && isnan(g));
        if (!ok && bad++ == 0) first = e;
    }
    TU_CHECK(bad == 0, "%s: %lld of %lld elements differ, first [%lld] got %g want %g", what,
             (long long)bad, (long long)n, (long long)first, first >= 0 ? got[first] : 0.0,
             first >= 0 ? want[first] : 0.0);
    return bad == 0;
}

static void rnd(tu_rng *r, float *x, int64_t n) {
    for (int64_t e = 0; e < n; e++) x[e] = (float)(tu_uniform(r) * 2 - 1);
}
static void to_f64(const float *x, double *y, int64_t n) {
    for (int64_t e = 0; e < n; e++) y[e] = x[e];
}

/* Plants `val` in q, k, v or dO (element e of the tensor; the whole k for WHERE_K_ALL). */
static void plant(int where, float val, int64_t e, float *q, float *k, float *v, float *dout,
                  int64_t nk) {
    if (where == WHERE_Q) q[e] = val;
    if (where == WHERE_K) k[e] = val;
    if (where == WHERE_V) v[e] = val;
    if (where == WHERE_DO) dout[e] = val;
    if (where == WHERE_K_ALL)
        for (int64_t t = 0; t < nk; t++) k[t] = val;
}

/* ---- bsa --------------------------------------------------------------------------------- */
static void bsa_case(int where, float val, int64_t blk, uint64_t seed) {
    enum { B = 1, N = 2, NKV = 1, SQ = 40, SKV = 72, D = 16 };
    const int64_t nbx = (SQ + blk - 1) / blk, nby = (SKV + blk - 1) / blk;
    const int64_t nq = B * N * SQ * D, nk = B * NKV * SKV * D, nl = B * N * SQ, nm = B * N * nbx * nby;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *o = malloc(nq * 4), *lse = malloc(nl * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4),
          *dv = malloc(nk * 4);
    double *Q = malloc(nq * 8), *K = malloc(nk * 8), *V = malloc(nk * 8), *DO = malloc(nq * 8);
    double *O = malloc(nq * 8), *L = malloc(nl * 8), *DQ = malloc(nq * 8), *DK = malloc(nk * 8),
           *DV = malloc(nk * 8);
    uint8_t *mask = malloc(nm);
    tu_rng r;
    tu_seed(&r, seed);
    rnd(&r, q, nq);
    rnd(&r, k, nk);
    rnd(&r, v, nk);
    rnd(&r, dout, nq);
    for (int64_t e = 0; e < nm; e++) mask[e] = tu_uniform(&r) < 0.6;
    for (int64_t j = 0; j < nby; j++) mask[1 * nby + j] = 0; /* head 0, block row 1: no key */
    /* the planted element: a row of the empty block row for q (it must stay empty), else
     * anywhere */
    int64_t e = where == WHERE_Q && seed % 2 ? (blk + 1) * D + 3 : tu_range(&r, 0, (where == WHERE_Q || where == WHERE_DO ? nq : nk) - 1);
    plant(where, val, e, q, k, v, dout, nk);
    to_f64(q, Q, nq);
    to_f64(k, K, nk);
    to_f64(v, V, nk);
    to_f64(dout, DO, nq);

    int64_t s4[4] = {B, N, SQ, D}, k4[4] = {B, NKV, SKV, D}, m4[4] = {B, N, nbx, nby}, l3[3] = {B, N, SQ};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, k4, NULL);
    spattn_tensor tv = spattn_tensor_make(v, SPATTN_DTYPE_F32, 4, k4, NULL);
    spattn_tensor tdo = spattn_tensor_make(dout, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tm = spattn_tensor_make(mask, SPATTN_DTYPE_U8, 4, m4, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, l3, NULL);
    spattn_tensor tdq = spattn_tensor_make(dq, SPATTN_DTYPE_F32, 4, s4, NULL);
    spattn_tensor tdk = spattn_tensor_make(dk, SPATTN_DTYPE_F32, 4, k4, NULL);
    spattn_tensor tdv = spattn_tensor_make(dv, SPATTN_DTYPE_F32, 4, k4, NULL);
    const double scale = 0.25;
    spattn_status st = spattn_bsa_fwd(&tq, &tk, &tv, &tm, blk, blk, scale, &to, &tl);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa fwd: %s", spattn_last_error());
    st = spattn_bsa_bwd(&tq, &tk, &tv, &to, &tdo, &tl, &tm, blk, blk, scale, &tdq, &tdk, &tdv);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bsa bwd: %s", spattn_last_error());
    spattn_ref_bsa_shape sh = {B, N, NKV, SQ, SKV, D, blk, blk};
    spattn_ref_bsa_fwd(&sh, Q, K, V, mask, scale, O, L);
    spattn_ref_bsa_bwd(&sh, Q, K, V, mask, scale, DO, DQ, DK, DV);

    char what[128];
    int len = 0; /* exact in kind for every block size */
    const char *vn = isnan(val) ? "NaN" : val > 0 ? "+inf" : "-inf";
#define CMP(name, got, want, n, tol)                                                       \
    snprintf(what, sizeof what, "bsa blk=%lld %s in %s: %s", (long long)blk, vn,         \
             where_name[where], name);                                                  \
    same_kind(what, got, want, n, tol, 1e-3, len)
    CMP("o", o, O, nq, 1e-4);
    CMP("lse", lse, L, nl, 1e-4);
    CMP("dq", dq, DQ, nq, 1e-3);
    CMP("dk", dk, DK, nk, 1e-3);
    CMP("dv", dv, DV, nk, 1e-3);
#undef CMP
    /* head 0, block row 1 attends nothing: O = 0, LSE = -inf, dQ = 0, even when q is NaN */
    int empty_ok = 1;
    for (int64_t i = blk; i < 2 * blk && i < SQ; i++) {
        empty_ok &= lse[i] == -INFINITY;
        for (int64_t d = 0; d < D; d++)
            empty_ok &= o[i * D + d] == 0.0f && (dq[i * D + d] == 0.0f || (len && isnan(dq[i * D + d])));
    }
    TU_CHECK(empty_ok, "bsa blk=%lld %s in %s: a row without keys must give O = 0, LSE = -inf, dQ = 0",
             (long long)blk, vn, where_name[where]);
    free(q); free(k); free(v); free(dout); free(o); free(lse); free(dq); free(dk); free(dv);
    free(Q); free(K); free(V); free(DO); free(O); free(L); free(DQ); free(DK); free(DV);
    free(mask);
}

/* ---- sfa --------------------------------------------------------------------------------- */
/* q / k hold [nope | rope] in one buffer (Dq = D + Dr columns); v NULL (shared) or separate. */
static void sfa_case(int where, float val, int shared, uint64_t seed) {
    enum { B = 1, S1 = 8, S2 = 40, N1 = 4, N2 = 1, D = 16, DR = 8, DQ = D + DR, KK = 12, SBS = 2 };
    const int64_t nq = B * S1 * N1 * DQ, nk = B * S2 * N2 * DQ, nv = B * S2 * N2 * D;
    const int64_t no = B * S1 * N1 * D, nl = B * S1 * N1, ni = B * S1 * N2 * KK;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nv * 4), *dout = malloc(no * 4);
    float *o = malloc(no * 4), *lse = malloc(nl * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4),
          *dv = malloc(nv * 4), *dkf = malloc(nk * 4);
    double *Q = malloc(nq * 8), *K = malloc(nk * 8), *V = malloc(nv * 8), *DOd = malloc(no * 8);
    double *O = malloc(no * 8), *L = malloc(nl * 8), *DQd = malloc(nq * 8), *DK = malloc(nk * 8),
           *DV = malloc(nv * 8);
    int32_t *idx = malloc(ni * 4);
    tu_rng r;
    tu_seed(&r, seed);
    rnd(&r, q, nq);
    rnd(&r, k, nk);
    rnd(&r, v, nv);
    rnd(&r, dout, no);
    for (int64_t e = 0; e < ni; e++) idx[e] = tu_uniform(&r) < 0.2 ? -1 : (int32_t)tu_range(&r, 0, S2 / SBS - 1);
    for (int64_t t = 0; t < KK; t++) idx[2 * KK + t] = -1; /* token 2: no key */
    int64_t e;
    if (where == WHERE_Q) e = seed % 2 ? 2 * N1 * DQ + 5 : tu_range(&r, 0, nq - 1);
    else if (where == WHERE_DO) e = tu_range(&r, 0, no - 1);
    else if (where == WHERE_V && !shared) e = tu_range(&r, 0, nv - 1);
    else e = tu_range(&r, 0, nk - 1);
    if (where == WHERE_V && shared) where = WHERE_K; /* v is k */
    plant(where, val, e, q, k, v, dout, nk);
    to_f64(q, Q, nq);
    to_f64(k, K, nk);
    to_f64(v, V, nv);
    to_f64(dout, DOd, no);

    int64_t qs[4] = {B, S1, N1, D}, qrs[4] = {B, S1, N1, DR}, qst[4] = {S1 * N1 * DQ, N1 * DQ, DQ, 1};
    int64_t ks[4] = {B, S2, N2, D}, krs[4] = {B, S2, N2, DR}, kst[4] = {S2 * N2 * DQ, N2 * DQ, DQ, 1};
    int64_t is[4] = {B, S1, N2, KK}, ls[3] = {B, S1, N1};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, qs, qst);
    spattn_tensor tqr = spattn_tensor_make(q + D, SPATTN_DTYPE_F32, 4, qrs, qst);
    spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, ks, kst);
    spattn_tensor tkr = spattn_tensor_make(k + D, SPATTN_DTYPE_F32, 4, krs, kst);
    spattn_tensor tv = spattn_tensor_make(v, SPATTN_DTYPE_F32, 4, ks, NULL);
    spattn_tensor ti = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 4, is, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, ls, NULL);
    spattn_tensor tdo = spattn_tensor_make(dout, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tdq = spattn_tensor_make(dq, SPATTN_DTYPE_F32, 4, qs, qst);
    spattn_tensor tdqr = spattn_tensor_make(dq + D, SPATTN_DTYPE_F32, 4, qrs, qst);
    spattn_tensor tdk = spattn_tensor_make(dk, SPATTN_DTYPE_F32, 4, ks, kst);
    spattn_tensor tdkr = spattn_tensor_make(dk + D, SPATTN_DTYPE_F32, 4, krs, kst);
    spattn_tensor tdv = spattn_tensor_make(dv, SPATTN_DTYPE_F32, 4, ks, NULL);
    const double scale = 0.3;
    const spattn_tensor *pv = shared ? NULL : &tv, *pdv = shared ? NULL : &tdv;
    spattn_status st = spattn_sfa_fwd(&tq, &tqr, &tk, &tkr, pv, &ti, SBS, 3, scale, &to, &tl);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "sfa fwd: %s", spattn_last_error());
    st = spattn_sfa_bwd(&tq, &tqr, &tk, &tkr, pv, &to, &tdo, &tl, &ti, SBS, 3, scale, &tdq, &tdqr,
                        &tdk, &tdkr, pdv);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "sfa bwd: %s", spattn_last_error());
    spattn_ref_sfa_shape sh = {B, S1, S2, N1, N2, D, DR, KK, SBS, 3, shared};
    spattn_ref_sfa_fwd(&sh, Q, K, V, idx, scale, O, L);
    spattn_ref_sfa_bwd(&sh, Q, K, V, idx, scale, DOd, DQd, DK, shared ? NULL : DV);
    memcpy(dkf, dk, nk * 4);

    char what[128];
    const char *vn = isnan(val) ? "NaN" : val > 0 ? "+inf" : "-inf";
#define CMP(name, got, want, n, tol)                                                       \
    snprintf(what, sizeof what, "sfa %s %s in %s: %s", shared ? "shared-kv" : "v", vn,    \
             where_name[where], name);                                                  \
    same_kind(what, got, want, n, tol, 1e-3, 0)
    CMP("o", o, O, no, 1e-4);
    CMP("lse", lse, L, nl, 1e-4);
    CMP("dq", dq, DQd, nq, 1e-3);
    CMP("dk", dkf, DK, nk, 1e-3);
    if (!shared) {
        CMP("dv", dv, DV, nv, 1e-3);
    }
#undef CMP
    int empty_ok = 1;
    for (int64_t h = 0; h < N1; h++) {
        empty_ok &= lse[2 * N1 + h] == -INFINITY;
        for (int64_t d = 0; d < D; d++) empty_ok &= o[(2 * N1 + h) * D + d] == 0.0f;
        for (int64_t d = 0; d < DQ; d++) empty_ok &= dq[(2 * N1 + h) * DQ + d] == 0.0f;
    }
    TU_CHECK(empty_ok, "sfa %s in %s: a row without keys must give O = 0, LSE = -inf, dQ = 0", vn,
             where_name[where]);
    free(q); free(k); free(v); free(dout); free(o); free(lse); free(dq); free(dk); free(dv); free(dkf);
    free(Q); free(K); free(V); free(DOd); free(O); free(L); free(DQd); free(DK); free(DV);
    free(idx);
}

int main(void) {
    const float vals[3] = {NAN, INFINITY, -INFINITY};
    uint64_t seed = 1;
    const int reps = getenv("SPATTN_TEST_QUICK") ? 1 : 2; /* quick: fewer seeds, every case kind */
    for (int w = 0; w < WHERE_COUNT; w++)
        for (int c = 0; c < 3; c++) {
            for (int rep = 0; rep < reps; rep++, seed++) {
                bsa_case(w, vals[c], 16, seed);
                bsa_case(w, vals[c], 32, seed);
                bsa_case(w, vals[c], 8, seed); /* small blocks: several mask blocks per tile */
                sfa_case(w, vals[c], 1, seed);
                sfa_case(w, vals[c], 0, seed);
            }
        }
    return tu_summary("test_nonfinite");
}
