/*
 * Bitwise reproducibility of the CPU sfa forward and backward across thread counts 1, 2, 3, 5
 * (dK / dV collect contributions of many queries: their summation order must not depend on
 * the threads).  Problems span several backward tiles and key chunks, with duplicates,
 * padding, sbs > 1, N2 = 2, shared and separate v.
 */
#include "sfa_testutil.h"

static void snapshot(const st_problem *P, void **out, size_t *n) {
    const st_buf *bs[] = {&P->bo, &P->blse, &P->bdq, &P->bdqr, &P->bdk, &P->bdkr, &P->bdv};
    for (int i = 0; i < 7; i++) {
        n[i] = bs[i]->mem ? bs[i]->bytes : 0;
        out[i] = malloc(n[i] + 1);
        if (n[i]) memcpy(out[i], bs[i]->mem, n[i]);
    }
}

static void run(const st_shape *s, uint64_t seed) {
    tu_rng r;
    tu_seed(&r, seed);
    st_problem P;
    st_make(&P, s, &r);
    static const char *const names[] = {"o", "lse", "dq", "dq_rope", "dk", "dk_rope", "dv"};
    const int threads[] = {1, 2, 3, 5};
    void *ref[7];
    size_t nref[7];
    for (int ti = 0; ti < 4; ti++) {
        spattn_status a = st_run_fwd(&P, threads[ti]);
        spattn_status b = st_run_bwd(&P, threads[ti]);
        TU_CHECK(a == SPATTN_STATUS_SUCCESS && b == SPATTN_STATUS_SUCCESS, "threads %d: %s",
                 threads[ti], spattn_last_error());
        if (ti == 0) {
            snapshot(&P, ref, nref);
            continue;
        }
        void *cur[7];
        size_t ncur[7];
        snapshot(&P, cur, ncur);
        for (int i = 0; i < 7; i++) {
            TU_CHECK(ncur[i] == nref[i] && memcmp(cur[i], ref[i], nref[i]) == 0,
                     "S1=%lld K=%lld sbs=%lld shared=%d dtype %d: %s with %d threads differs "
                     "from 1 thread",
                     (long long)s->S1, (long long)s->K, (long long)s->sbs, s->shared_kv, s->dtype,
                     names[i], threads[ti]);
            free(cur[i]);
        }
    }
    for (int i = 0; i < 7; i++) free(ref[i]);
    st_free(&P);
}

int main(void) {
    uint64_t seed = tu_test_seed(5);
    int quick = st_quick();
    const int F32 = SPATTN_DTYPE_F32, BF = SPATTN_DTYPE_BF16, F16 = SPATTN_DTYPE_F16;
    /* B S1 S2 N1 N2 D Dr K sbs mode shared dtype concat layout dup pad empty */
    const st_shape cases[] = {
        {1, quick ? 70 : 150, 160, 8, 1, 64, 16, 96, 1, 3, 1, BF, 1, 0, 0.05, 0.1, 0.05},
        {2, quick ? 40 : 90, 70, 8, 2, 32, 8, 20, 4, 3, 0, F32, 0, 0, 0.1, 0.1, 0.05},
        {1, quick ? 40 : 100, 100, 20, 1, 40, 0, 3, 64, 0, 1, F16, 0, 1, 0.3, 0.1, 0.0},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) run(&cases[c], seed + c);
    return tu_summary("test_sfa_determinism");
}
