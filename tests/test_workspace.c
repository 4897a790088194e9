/* Workspace queries: spattn_bsa_workspace_size / spattn_sfa_workspace_size give exactly what the
 * calls need: an exact-size caller workspace gives bitwise the library-allocated result, one
 * byte less is SPATTN_STATUS_WORKSPACE_TOO_SMALL with outputs untouched. */
#include "testutil.h"

static void fill(float *x, int64_t n, tu_rng *r) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)tu_normal(r);
}

static void test_bsa(tu_rng *r) {
    enum { B = 1, N = 2, Sq = 37, Skv = 53, D = 16, bx = 5, by = 7 };
    const int64_t nbx = (Sq + bx - 1) / bx, nby = (Skv + by - 1) / by;
    static float q[B * N * Sq * D], k[B * N * Skv * D], v[B * N * Skv * D], o[B * N * Sq * D], dout[B * N * Sq * D];
    static float lse[B * N * Sq], dq[2][B * N * Sq * D], dk[2][B * N * Skv * D], dv[2][B * N * Skv * D];
    static uint8_t m[B * N * 8 * 8];
    fill(q, B * N * Sq * D, r);
    fill(k, B * N * Skv * D, r);
    fill(v, B * N * Skv * D, r);
    fill(dout, B * N * Sq * D, r);
    for (int64_t i = 0; i < B * N * nbx * nby; i++) m[i] = (uint8_t)(tu_uniform(r) < 0.6);
    int64_t qs[4] = {B, N, Sq, D}, ks[4] = {B, N, Skv, D}, ms[4] = {B, N, nbx, nby}, ls[3] = {B, N, Sq};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, ks, NULL);
    spattn_tensor tv = spattn_tensor_make(v, SPATTN_DTYPE_F32, 4, ks, NULL);
    spattn_tensor tm = spattn_tensor_make(m, SPATTN_DTYPE_U8, 4, ms, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, ls, NULL);
    spattn_tensor tdo = spattn_tensor_make(dout, SPATTN_DTYPE_F32, 4, qs, NULL);
    TU_CHECK(spattn_bsa_fwd(&tq, &tk, &tv, &tm, bx, by, 0.0, &to, &tl) == SPATTN_STATUS_SUCCESS, "bsa fwd: %s", spattn_last_error());
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = 2;
    size_t need = 0;
    TU_CHECK(spattn_bsa_workspace_size(&tq, &tk, &tv, &tm, bx, by, 1, &opt, &need) == SPATTN_STATUS_SUCCESS && need > 0,
             "bsa workspace query: %zu %s", need, spattn_last_error());
    unsigned char *ws = malloc(need + 1);
    for (int pass = 0; pass < 2; pass++) {
        spattn_tensor tdq = spattn_tensor_make(dq[pass], SPATTN_DTYPE_F32, 4, qs, NULL);
        spattn_tensor tdk = spattn_tensor_make(dk[pass], SPATTN_DTYPE_F32, 4, ks, NULL);
        spattn_tensor tdv = spattn_tensor_make(dv[pass], SPATTN_DTYPE_F32, 4, ks, NULL);
        spattn_options o2 = opt;
        if (pass == 1) { /* exact size at an odd address */
            o2.workspace = ws + 1;
            o2.workspace_size = need;
        }
        TU_CHECK(spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, bx, by, 0.0, &tdq, &tdk, &tdv, &o2) ==
                     SPATTN_STATUS_SUCCESS, "bsa bwd pass %d: %s", pass, spattn_last_error());
    }
    TU_CHECK(!memcmp(dq[0], dq[1], sizeof dq[0]) && !memcmp(dk[0], dk[1], sizeof dk[0]) && !memcmp(dv[0], dv[1], sizeof dv[0]),
             "bsa: caller workspace changes the result");
    memset(dq[1], 0x5a, sizeof dq[1]);
    spattn_tensor tdq = spattn_tensor_make(dq[1], SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tdk = spattn_tensor_make(dk[1], SPATTN_DTYPE_F32, 4, ks, NULL);
    spattn_tensor tdv = spattn_tensor_make(dv[1], SPATTN_DTYPE_F32, 4, ks, NULL);
    opt.workspace = ws;
    opt.workspace_size = need - 1;
    TU_CHECK(spattn_bsa_bwd_ex(&tq, &tk, &tv, &to, &tdo, &tl, &tm, bx, by, 0.0, &tdq, &tdk, &tdv, &opt) ==
                 SPATTN_STATUS_WORKSPACE_TOO_SMALL && ((unsigned char *)dq[1])[0] == 0x5a,
             "bsa: workspace one byte short must be refused before any write");
    free(ws);
}

static void test_sfa(tu_rng *r) {
    enum { B = 1, S1 = 9, S2 = 21, N1 = 4, N2 = 1, D = 16, Dr = 8, K = 6, sbs = 4 };
    const int nblk = (S2 + sbs - 1) / sbs;
    static float q[B * S1 * N1 * (D + Dr)], k[B * S2 * N2 * (D + Dr)], o[B * S1 * N1 * D], dout[B * S1 * N1 * D];
    static float lse[B * S1 * N1], dq[2][B * S1 * N1 * (D + Dr)], dk[2][B * S2 * N2 * (D + Dr)];
    static int32_t idx[B * S1 * N2 * K];
    fill(q, B * S1 * N1 * (D + Dr), r);
    fill(k, B * S2 * N2 * (D + Dr), r);
    fill(dout, B * S1 * N1 * D, r);
    for (int i = 0; i < B * S1 * N2 * K; i++) idx[i] = (int32_t)tu_range(r, -1, nblk - 1);
    /* concatenated [.., D+Dr] buffers passed as nope/rope views */
    int64_t qs[4] = {B, S1, N1, D}, qrs[4] = {B, S1, N1, Dr}, qst[4] = {S1 * N1 * (D + Dr), N1 * (D + Dr), D + Dr, 1};
    int64_t ks[4] = {B, S2, N2, D}, krs[4] = {B, S2, N2, Dr}, kst[4] = {S2 * N2 * (D + Dr), N2 * (D + Dr), D + Dr, 1};
    int64_t is[4] = {B, S1, N2, K}, ls[3] = {B, S1, N1};
    spattn_tensor tq = spattn_tensor_make(q, SPATTN_DTYPE_F32, 4, qs, qst);
    spattn_tensor tqr = spattn_tensor_make(q + D, SPATTN_DTYPE_F32, 4, qrs, qst);
    spattn_tensor tk = spattn_tensor_make(k, SPATTN_DTYPE_F32, 4, ks, kst);
    spattn_tensor tkr = spattn_tensor_make(k + D, SPATTN_DTYPE_F32, 4, krs, kst);
    spattn_tensor ti = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 4, is, NULL);
    spattn_tensor to = spattn_tensor_make(o, SPATTN_DTYPE_F32, 4, qs, NULL);
    spattn_tensor tl = spattn_tensor_make(lse, SPATTN_DTYPE_F32, 3, ls, NULL);
    spattn_tensor tdo = spattn_tensor_make(dout, SPATTN_DTYPE_F32, 4, qs, NULL);
    TU_CHECK(spattn_sfa_fwd(&tq, &tqr, &tk, &tkr, NULL, &ti, sbs, 3, 0.0, &to, &tl) == SPATTN_STATUS_SUCCESS,
             "sfa fwd: %s", spattn_last_error());
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = 2;
    size_t need = 0;
    TU_CHECK(spattn_sfa_workspace_size(&tq, &tqr, &tk, &tkr, NULL, &ti, sbs, 3, 1, &opt, &need) == SPATTN_STATUS_SUCCESS,
             "sfa workspace query: %s", spattn_last_error());
    TU_CHECK(spattn_sfa_workspace_size(&tq, &tqr, &tk, &tkr, NULL, &ti, sbs, 3, 1, &opt, NULL) == SPATTN_STATUS_NULL_POINTER,
             "sfa workspace query: NULL out-pointer");
    unsigned char *ws = malloc(need + 1);
    for (int pass = 0; pass < 2; pass++) {
        spattn_tensor tdq = spattn_tensor_make(dq[pass], SPATTN_DTYPE_F32, 4, qs, qst);
        spattn_tensor tdqr = spattn_tensor_make(dq[pass] + D, SPATTN_DTYPE_F32, 4, qrs, qst);
        spattn_tensor tdk = spattn_tensor_make(dk[pass], SPATTN_DTYPE_F32, 4, ks, kst);
        spattn_tensor tdkr = spattn_tensor_make(dk[pass] + D, SPATTN_DTYPE_F32, 4, krs, kst);
        spattn_options o2 = opt;
        if (pass == 1) {
            o2.workspace = ws + 1;
            o2.workspace_size = need;
        }
        TU_CHECK(spattn_sfa_bwd_ex(&tq, &tqr, &tk, &tkr, NULL, &to, &tdo, &tl, &ti, sbs, 3, 0.0, &tdq, &tdqr, &tdk,
                                   &tdkr, NULL, &o2) == SPATTN_STATUS_SUCCESS,
                 "sfa bwd pass %d: %s", pass, spattn_last_error());
    }
    TU_CHECK(!memcmp(dq[0], dq[1], sizeof dq[0]) && !memcmp(dk[0], dk[1], sizeof dk[0]),
             "sfa: caller workspace changes the result");
    if (need > 0) {
        memset(dq[1], 0x5a, sizeof dq[1]);
        spattn_tensor tdq = spattn_tensor_make(dq[1], SPATTN_DTYPE_F32, 4, qs, qst);
        spattn_tensor tdqr = spattn_tensor_make(dq[1] + D, SPATTN_DTYPE_F32, 4, qrs, qst);
        spattn_tensor tdk = spattn_tensor_make(dk[1], SPATTN_DTYPE_F32, 4, ks, kst);
        spattn_tensor tdkr = spattn_tensor_make(dk[1] + D, SPATTN_DTYPE_F32, 4, krs, kst);
        opt.workspace = ws;
        opt.workspace_size = need - 1;
        TU_CHECK(spattn_sfa_bwd_ex(&tq, &tqr, &tk, &tkr, NULL, &to, &tdo, &tl, &ti, sbs, 3, 0.0, &tdq, &tdqr, &tdk,
                                   &tdkr, NULL, &opt) == SPATTN_STATUS_WORKSPACE_TOO_SMALL &&
                     ((unsigned char *)dq[1])[0] == 0x5a,
                 "sfa: workspace one byte short must be refused before any write");
    }
    free(ws);
}

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(11));
    test_bsa(&r);
    test_sfa(&r);
    return tu_summary("test_workspace");
}
