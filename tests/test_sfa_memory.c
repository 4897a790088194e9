/*
 * The CPU sfa backward's memory is bounded independently of K * sbs: the tile holds one chunk
 * of each row's selected keys at a time.
 *   1. spattn_sfa_workspace_size(backward) for sbs = 128, K = 8192, N1 = 128, D = 512, Dr = 64,
 *      S1 = S2 = 4096 (shapes only) stays under 256 MB plus the dK accumulator.
 *   2. Rows spanning several chunks (sbs 1 / 4 / 64 / 128, duplicates across chunks, padding,
 *      causal, N2 = 2, shared and separate v, every SIMD variant) against the fp64 reference,
 *      with a lowered tile budget, and bitwise the same for 1, 2 and 3 threads.
 *   3. (full mode) the default budget: a row of K * sbs = 38400 keys over 64 heads in several
 *      chunks against the reference.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "cpu/sfa_cpu.h"
#include "sfa_testutil.h"

static const char *const kIsa[] = {"avx512", "avx2", "generic"};

static spattn_tensor dummy4(int64_t a, int64_t b, int64_t c, int64_t d, int32_t dt) {
    static char mem[64];
    int64_t shp[4] = {a, b, c, d}, st[4] = {b * c * d, c * d, d, 1};
    return spattn_tensor_make(mem, dt, 4, shp, st);
}

static void check_workspace(void) {
    const int64_t B = 1, S1 = 4096, S2 = 4096, N1 = 128, N2 = 1, D = 512, Dr = 64, K = 8192;
    const int32_t BF = SPATTN_DTYPE_BF16;
    spattn_tensor q = dummy4(B, S1, N1, D, BF), qr = dummy4(B, S1, N1, Dr, BF);
    spattn_tensor k = dummy4(B, S2, N2, D, BF), kr = dummy4(B, S2, N2, Dr, BF);
    spattn_tensor idx = dummy4(B, S1, N2, K, SPATTN_DTYPE_I32);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CPU;
    opt.num_threads = 8;
    size_t bytes = 0;
    spattn_status st = spattn_sfa_workspace_size(&q, &qr, &k, &kr, NULL, &idx, 128,
                                                 SPATTN_SFA_MODE_CAUSAL, 1, &opt, &bytes);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "workspace query: %s", spattn_last_error());
    size_t dkacc = (size_t)(B * S2 * N2 * (D + Dr)) * sizeof(float);
    size_t limit = ((size_t)256 << 20) + dkacc;
    printf("sfa bwd workspace, sbs 128 K 8192 N1 128 D 512+64 S 4096, 8 threads: %.1f MB "
           "(limit %.1f MB)\n", bytes / 1048576.0, limit / 1048576.0);
    TU_CHECK(bytes > dkacc && bytes < limit, "backward workspace %zu bytes, limit %zu", bytes, limit);
    /* the same shape with sbs = 1 (the suite's kind of row) */
    st = spattn_sfa_workspace_size(&q, &qr, &k, &kr, NULL, &idx, 1, SPATTN_SFA_MODE_CAUSAL, 1,
                                   &opt, &bytes);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS && bytes < limit, "sbs 1: %zu bytes", bytes);
}

/* Snapshot of every output buffer. */
static void snap(const st_problem *P, void **out, size_t *n) {
    const st_buf *bs[] = {&P->bdq, &P->bdqr, &P->bdk, &P->bdkr, &P->bdv};
    for (int i = 0; i < 5; i++) {
        n[i] = bs[i]->mem ? bs[i]->bytes : 0;
        out[i] = malloc(n[i] + 1);
        if (n[i]) memcpy(out[i], bs[i]->mem, n[i]);
    }
}

/* Runs case s (min_chunks: the plan must split the rows at least this much). */
static void run_case(int ci, const st_shape *s, uint64_t seed, int64_t min_chunks, int threads_check) {
    setenv("SPATTN_CPU_ISA", kIsa[ci % 3], 1);
    char name[256];
    snprintf(name, sizeof name,
             "case %d [%s] S1=%lld S2=%lld N1=%lld N2=%lld D=%lld Dr=%lld K=%lld sbs=%lld mode=%d "
             "shared=%d %s budget=%zu",
             ci, kIsa[ci % 3], (long long)s->S1, (long long)s->S2, (long long)s->N1,
             (long long)s->N2, (long long)s->D, (long long)s->Dr, (long long)s->K,
             (long long)s->sbs, s->mode, s->shared_kv, spattn_dtype_name((spattn_dtype)s->dtype),
             sfa_tile_bytes);
    tu_rng r;
    tu_seed(&r, seed);
    st_problem P;
    st_make(&P, s, &r);

    /* the plan really chunks these rows */
    spattn_sfa_problem pp;
    memset(&pp, 0, sizeof pp);
    pp.B = s->B, pp.S1 = s->S1, pp.S2 = s->S2, pp.N1 = s->N1, pp.N2 = s->N2, pp.D = s->D;
    pp.Dr = s->Dr, pp.K = s->K, pp.sbs = s->sbs, pp.shared_kv = s->shared_kv;
    sfa_plan pl;
    sfa_plan_init(&pl, &pp, 1, 1);
    TU_CHECK(pl.nch >= min_chunks, "%s: %lld chunks (E = %lld), want >= %lld", name,
             (long long)pl.nch, (long long)pl.E, (long long)min_chunks);

    st_golden g;
    st_golden_make(&g, s, &P);
    spattn_status st = st_run_fwd(&P, 0);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: fwd status %d (%s)", name, st, spattn_last_error());
    st = st_run_bwd(&P, 0);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: bwd status %d (%s)", name, st, spattn_last_error());
    int ok = st_check_bwd(&P, s, &g);
    TU_CHECK(ok, "%s: backward vs reference", name);

    if (threads_check) { /* bitwise the same for any thread count */
        void *ref[5], *cur[5];
        size_t nref[5], ncur[5];
        const int threads[] = {1, 2, 3};
        for (int ti = 0; ti < 3; ti++) {
            st = st_run_bwd(&P, threads[ti]);
            TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: bwd threads %d", name, threads[ti]);
            if (ti == 0) {
                snap(&P, ref, nref);
                continue;
            }
            snap(&P, cur, ncur);
            for (int i = 0; i < 5; i++) {
                TU_CHECK(ncur[i] == nref[i] && memcmp(cur[i], ref[i], nref[i]) == 0,
                         "%s: output %d with %d threads differs from 1 thread", name, i,
                         threads[ti]);
                free(cur[i]);
            }
        }
        for (int i = 0; i < 5; i++) free(ref[i]);
    }
    st_golden_free(&g);
    st_free(&P);
}

int main(void) {
    uint64_t seed = tu_test_seed(20261201);
    const int F32 = SPATTN_DTYPE_F32, F16 = SPATTN_DTYPE_F16, BF = SPATTN_DTYPE_BF16;
    check_workspace();

    /* lowered budget: chunks of a few entries on small problems */
    const size_t budget0 = sfa_tile_bytes;
    sfa_tile_bytes = 4096;
    /* B S1 S2 N1 N2 D Dr K sbs mode shared dtype concat layout dup pad empty */
    const st_shape small[] = {
        {1, 11, 40, 4, 1, 32, 16, 30, 1, 3, 1, F32, 1, 0, 0.1, 0.2, 0.1},    /* sbs 1 */
        {2, 9, 37, 4, 2, 16, 16, 24, 4, 3, 1, F32, 0, 0, 0.3, 0.2, 0.1},     /* sbs 4, N2 = 2 */
        {1, 7, 300, 2, 1, 32, 0, 12, 64, 0, 0, BF, 0, 1, 0.3, 0.2, 0.0},     /* sbs 64 */
        {1, 6, 520, 4, 2, 16, 8, 10, 128, 3, 1, F16, 0, 0, 0.5, 0.1, 0.0},   /* sbs 128, dups */
        {1, 10, 64, 34, 2, 24, 8, 20, 2, 3, 0, F32, 1, 2, 0.2, 0.2, 0.1},    /* G = 17 */
        {1, 5, 48, 64, 1, 16, 16, 16, 1, 0, 1, BF, 0, 0, 0.1, 0.1, 0.0},     /* G = 64 */
    };
    int ci = 0;
    for (size_t c = 0; c < sizeof(small) / sizeof(small[0]); c++, ci++)
        run_case(ci, &small[c], seed + (uint64_t)ci, 2, 1);
    sfa_tile_bytes = budget0;

    /* the default budget: K * sbs = 600 * 64 keys over 2 x 32 heads -> several chunks */
    if (!st_quick()) {
        const st_shape big = {1, 2, 2048, 64, 2, 16, 0, 600, 64, 0, 1, F32, 0, 0, 0.9, 0.0, 0.0};
        run_case(ci++, &big, seed + 99, 2, 0);
    }
    unsetenv("SPATTN_CPU_ISA");
    return tu_summary("test_sfa_memory");
}
