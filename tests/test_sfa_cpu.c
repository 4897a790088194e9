/*
 * CPU sfa forward + backward against the fp64 reference on small random problems: causal with
 * S1 > S2 and S1 < S2, K beyond the allowed keys, padding anywhere, all-padding rows,
 * duplicates, sbs 1 / 4 / 64 with a partial last block, N2 = 2, with and without rope,
 * concatenated vs split rope (bitwise identical), shared and separate v, fp16 / bf16 / fp32,
 * strided views, S1 = 1, and every SIMD variant.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "sfa_testutil.h"

static const char *const kIsa[] = {"avx512", "avx2", "generic"};

/* Bitwise comparison of two views of one dtype. */
static int same_bits(const spattn_tensor *a, const spattn_tensor *b) {
    size_t es = st_esize(a->dtype);
    int64_t n = a->ndim == 4 ? a->shape[3] : 1;
    for (int64_t i = 0; i < a->shape[0]; i++)
        for (int64_t j = 0; j < a->shape[1]; j++)
            for (int64_t c = 0; c < a->shape[2]; c++)
                for (int64_t d = 0; d < n; d++) {
                    int64_t oa = i * a->strides[0] + j * a->strides[1] + c * a->strides[2] +
                                 (a->ndim == 4 ? d * a->strides[3] : 0);
                    int64_t ob = i * b->strides[0] + j * b->strides[1] + c * b->strides[2] +
                                 (b->ndim == 4 ? d * b->strides[3] : 0);
                    if (memcmp((char *)a->data + oa * (int64_t)es, (char *)b->data + ob * (int64_t)es, es))
                        return 0;
                }
    return 1;
}

static void run_case(int ci, const st_shape *s, uint64_t seed) {
    setenv("SPATTN_CPU_ISA", kIsa[ci % 3], 1);
    char name[256];
    snprintf(name, sizeof name,
             "case %d [%s] B%lld S1=%lld S2=%lld N1=%lld N2=%lld D=%lld Dr=%lld K=%lld sbs=%lld "
             "mode=%d shared=%d %s concat=%d layout=%d",
             ci, kIsa[ci % 3], (long long)s->B, (long long)s->S1, (long long)s->S2,
             (long long)s->N1, (long long)s->N2, (long long)s->D, (long long)s->Dr,
             (long long)s->K, (long long)s->sbs, s->mode, s->shared_kv,
             spattn_dtype_name((spattn_dtype)s->dtype), s->concat, s->layout);
    tu_rng r;
    tu_seed(&r, seed);
    st_problem P;
    st_make(&P, s, &r);
    st_golden g;
    st_golden_make(&g, s, &P);

    spattn_status st = st_run_fwd(&P, 0);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: fwd status %d (%s)", name, st, spattn_last_error());
    TU_CHECK(st_check_fwd(&P, s, &g), "%s: forward vs reference", name);

    st = st_run_bwd(&P, 0);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: bwd status %d (%s)", name, st, spattn_last_error());
    int ok = st_check_bwd(&P, s, &g);
    TU_CHECK(ok, "%s: backward vs reference", name);

    /* the same data as split buffers must give bitwise the same outputs */
    if (s->concat && s->Dr) {
        st_shape s2 = *s;
        s2.concat = 0;
        tu_rng r2;
        tu_seed(&r2, seed);
        st_problem Q;
        st_make(&Q, &s2, &r2);
        int okf = st_run_fwd(&Q, 0) == SPATTN_STATUS_SUCCESS && st_run_bwd(&Q, 0) == SPATTN_STATUS_SUCCESS;
        okf = okf && same_bits(&P.o, &Q.o) && same_bits(&P.lse, &Q.lse) &&
              same_bits(&P.dq, &Q.dq) && same_bits(&P.dqr, &Q.dqr) && same_bits(&P.dk, &Q.dk) &&
              same_bits(&P.dkr, &Q.dkr) && (s->shared_kv || same_bits(&P.dv, &Q.dv));
        TU_CHECK(okf, "%s: concatenated and split rope differ", name);
        st_free(&Q);
    }
    st_golden_free(&g);
    st_free(&P);
}

int main(void) {
    uint64_t seed = tu_test_seed(20261130);
    const int F32 = SPATTN_DTYPE_F32, F16 = SPATTN_DTYPE_F16, BF = SPATTN_DTYPE_BF16;
    /* B S1 S2 N1 N2 D Dr K sbs mode shared dtype concat layout dup pad empty */
    const st_shape fixed[] = {
        {1, 40, 24, 4, 1, 32, 16, 16, 1, 3, 1, F32, 1, 0, 0.1, 0.2, 0.1},   /* S1 > S2 */
        {1, 16, 48, 4, 1, 32, 16, 12, 1, 3, 1, BF, 1, 1, 0.1, 0.2, 0.1},    /* S1 < S2 */
        {1, 20, 20, 3, 1, 24, 8, 40, 1, 3, 0, F16, 0, 2, 0.0, 0.0, 0.0},    /* K > keys */
        {2, 12, 37, 4, 2, 16, 16, 6, 4, 3, 1, F32, 1, 0, 0.2, 0.3, 0.2},    /* sbs 4, partial */
        {1, 9, 150, 2, 1, 32, 0, 3, 64, 0, 0, BF, 0, 1, 0.2, 0.2, 0.0},     /* sbs 64, partial */
        {1, 9, 150, 2, 1, 32, 8, 3, 64, 3, 1, F16, 0, 3, 0.2, 0.2, 0.0},    /* sbs 64, causal */
        {1, 1, 33, 8, 2, 40, 8, 20, 1, 3, 1, BF, 1, 0, 0.1, 0.1, 0.0},      /* S1 = 1 */
        {1, 24, 30, 34, 2, 32, 16, 10, 1, 3, 0, F32, 1, 2, 0.2, 0.2, 0.1},  /* G = 17 */
        {1, 16, 16, 32, 1, 64, 32, 16, 1, 0, 1, BF, 1, 0, 0.0, 0.0, 0.0},   /* G = 32 */
        {1, 8, 64, 64, 1, 48, 16, 24, 2, 3, 0, F16, 0, 1, 0.1, 0.1, 0.0},   /* G = 64 */
        {1, 16, 16, 2, 1, 8, 0, 16, 1, 3, 1, F32, 0, 3, 0.5, 0.3, 0.3},     /* heavy dups */
        {1, 33, 31, 16, 1, 64, 64, 70, 1, 3, 1, F32, 1, 0, 0.05, 0.1, 0.0}, /* > 1 chunk */
        {1, 12, 40, 2, 2, 8, 128, 10, 1, 3, 1, BF, 1, 0, 0.1, 0.1, 0.0},   /* G*D << Dr */
    };
    int nfixed = (int)(sizeof(fixed) / sizeof(fixed[0]));
    int ci = 0;
    for (int c = 0; c < nfixed; c++, ci++) run_case(ci, &fixed[c], seed + (uint64_t)ci);
    /* random shapes */
    tu_rng r;
    tu_seed(&r, seed ^ 0xabcdefull);
    int nrand = st_quick() ? 12 : 40;
    const int dts[] = {F32, F16, BF}, sbss[] = {1, 1, 2, 4, 8, 64};
    for (int c = 0; c < nrand; c++, ci++) {
        st_shape s;
        memset(&s, 0, sizeof s);
        s.B = tu_range(&r, 1, 2);
        s.S1 = tu_range(&r, 1, 40);
        s.S2 = tu_range(&r, 1, 70);
        s.N2 = tu_range(&r, 1, 2);
        s.N1 = s.N2 * tu_range(&r, 1, 20);
        s.D = 8 * tu_range(&r, 1, 8);
        s.Dr = 8 * tu_range(&r, 0, 3);
        s.sbs = sbss[tu_range(&r, 0, 5)];
        s.K = tu_range(&r, 1, 2 + (s.S2 + s.sbs - 1) / s.sbs);
        s.mode = tu_range(&r, 0, 3) ? 3 : 0;
        s.shared_kv = (int32_t)tu_range(&r, 0, 1);
        s.dtype = dts[tu_range(&r, 0, 2)];
        s.concat = (int)tu_range(&r, 0, 1);
        /* inner stride 2 interleaves the concatenated views' address ranges, which the
         * (conservative) overlap check of the outputs rejects */
        s.layout = (int)tu_range(&r, 0, s.concat ? 2 : 3);
        s.dup_p = tu_uniform(&r) * 0.2;
        s.pad_p = tu_uniform(&r) * 0.3;
        s.empty_p = tu_uniform(&r) * 0.2;
        run_case(ci, &s, seed + (uint64_t)ci);
    }
    unsetenv("SPATTN_CPU_ISA");
    return tu_summary("test_sfa_cpu");
}
