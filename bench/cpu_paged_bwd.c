/*
 * Paged against packed keys in the CPU bsa varlen backward, calls interleaved in one process
 * (the shared 2-core VM is too noisy for back-to-back `spattn bench` runs): packed k/v, pages
 * of 16 and of 64 (shuffled tables), and pages of 64 whose first two pages (128 keys) are
 * shared by all 32 sequences (a common prompt: the fp32 sums and the rounds of bsa_pages.h).
 * PB_CPU=1 times process CPU time instead of wall time (less sensitive to other load).
 * Not built by CMake; from the repository root after a CPU build in build-c:
 *   gcc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -Isrc/ref -Itests \
 *       bench/cpu_paged_bwd.c -o /tmp/cpu_paged_bwd -Lbuild-c -lspattn -Wl,-rpath,$PWD/build-c -lm
 *   PB_CPU=1 OMP_NUM_THREADS=1 /tmp/cpu_paged_bwd [f|b]      (fp32 | bf16)
 */
#include <time.h>

#include "varlen_testkit.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(getenv("PB_CPU") ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { B = 32, N = 8, NKV = 2, D = 128, BX = 64, BY = 64, CTX = 128, REPS = 7, RUNS = 4 };

int main(int argc, char **argv) {
    const int32_t dt = argc > 1 && argv[1][0] == 'b' ? SPATTN_DTYPE_BF16 : SPATTN_DTYPE_F32;
    tu_rng r;
    tu_seed(&r, 5);
    int32_t cuq[B + 1], cuk[B + 1];
    cuq[0] = cuk[0] = 0;
    for (int b = 0; b < B; b++) {
        int64_t L = tu_range(&r, 64, 512);
        cuq[b + 1] = cuq[b] + (int32_t)L;
        cuk[b + 1] = cuk[b] + (int32_t)(L + CTX);
    }
    const int64_t mq = vt_maxlen(cuq, B), mk = vt_maxlen(cuk, B), Tq = cuq[B], Tk = cuk[B];
    const int64_t nbx = (mq + BX - 1) / BX, nby = (mk + BY - 1) / BY;
    int64_t sq[3] = {Tq, N, D}, sk[3] = {Tk, NKV, D}, sm[4] = {B, N, nbx, nby};
    vt_buf q = vt_alloc(dt, 3, sq, 0), k = vt_alloc(dt, 3, sk, 0), v = vt_alloc(dt, 3, sk, 0);
    vt_buf g = vt_alloc(dt, 3, sq, 0), m = vt_alloc(SPATTN_DTYPE_U8, 4, sm, 0);
    vt_randn(&r, &q, NULL);
    vt_randn(&r, &k, NULL);
    vt_randn(&r, &v, NULL);
    vt_randn(&r, &g, NULL);
    uint8_t *md = m.mem; /* causal per sequence (keys = queries + CTX) */
    for (int b = 0; b < B; b++) {
        int64_t lq = cuq[b + 1] - cuq[b], lk = cuk[b + 1] - cuk[b];
        for (int n = 0; n < N; n++)
            for (int64_t i = 0; i < nbx; i++)
                for (int64_t j = 0; j < nby; j++)
                    md[((b * N + n) * nbx + i) * nby + j] =
                        i * BX < lq && j * BY < lk && j * BY <= (i + 1) * BX - 1 + (lk - lq);
    }
    spattn_tensor cq = spattn_tensor_make(cuq, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    spattn_tensor ck = spattn_tensor_make(cuk, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &cq;
    vl.cu_seqlens_kv = &ck;
    vl.max_seqlen_q = mq;
    vl.max_seqlen_kv = mk;
    vt_buf o = vt_alloc(dt, 3, sq, 0), lse = vt_alloc(SPATTN_DTYPE_F32, 2, (int64_t[]){Tq, N}, 0);
    vt_buf dq = vt_alloc(dt, 3, sq, 0), dk = vt_alloc(dt, 3, sk, 0), dv = vt_alloc(dt, 3, sk, 0);
    if (spattn_bsa_fwd_varlen(&q.t, &k.t, &v.t, &m.t, BX, BY, 0, &vl, &o.t, &lse.t, NULL)) {
        printf("forward: %s\n", spattn_last_error());
        return 1;
    }
    /* paged copies: page sizes 16, 64, and 64 with a shared two-page prefix */
    vt_buf kp[3], vp[3], dkp[3], dvp[3];
    spattn_tensor tt[3];
    spattn_varlen pv[3];
    int32_t *tab[3];
    double *kd = malloc(sizeof(double) * Tk * NKV * D), *vd = malloc(sizeof(double) * Tk * NKV * D);
    vt_read(&k, kd);
    vt_read(&v, vd);
    for (int c = 0; c < 3; c++) {
        int64_t ps = c == 0 ? 16 : 64, maxp = (mk + ps - 1) / ps, P;
        tab[c] = vt_table(&r, cuk, B, ps, maxp, &P);
        if (c == 2) /* every sequence's first two pages are sequence 0's (the others unused) */
            for (int b = 1; b < B; b++) {
                tab[c][b * maxp] = tab[c][0];
                tab[c][b * maxp + 1] = tab[c][1];
            }
        int64_t sp[4] = {P, ps, NKV, D};
        kp[c] = vt_alloc(dt, 4, sp, 0);
        vp[c] = vt_alloc(dt, 4, sp, 0);
        dkp[c] = vt_alloc(dt, 4, sp, 0);
        dvp[c] = vt_alloc(dt, 4, sp, 0);
        double *pg = malloc(sizeof(double) * P * ps * NKV * D);
        vt_to_pages(kd, cuk, B, tab[c], maxp, ps, NKV, D, pg, P);
        vt_write(&kp[c], pg);
        vt_to_pages(vd, cuk, B, tab[c], maxp, ps, NKV, D, pg, P);
        vt_write(&vp[c], pg);
        free(pg);
        tt[c] = spattn_tensor_make(tab[c], SPATTN_DTYPE_I32, 2, (int64_t[]){B, maxp}, NULL);
        pv[c] = vl;
        pv[c].block_table = &tt[c];
    }
    double t[RUNS][REPS];
    for (int it = 0; it <= REPS; it++) /* the first round warms up */
        for (int c = 0; c < RUNS; c++) {
            double t0 = now_ms();
            spattn_status st =
                c == 0 ? spattn_bsa_bwd_varlen(&q.t, &k.t, &v.t, &o.t, &g.t, &lse.t, &m.t, BX, BY, 0,
                                               &vl, &dq.t, &dk.t, &dv.t, NULL)
                       : spattn_bsa_bwd_varlen(&q.t, &kp[c - 1].t, &vp[c - 1].t, &o.t, &g.t, &lse.t,
                                               &m.t, BX, BY, 0, &pv[c - 1], &dq.t, &dkp[c - 1].t,
                                               &dvp[c - 1].t, NULL);
            if (st) {
                printf("backward: %s\n", spattn_last_error());
                return 1;
            }
            if (it) t[c][it - 1] = now_ms() - t0;
        }
    static const char *const name[RUNS] = {"packed", "paged P=16", "paged P=64",
                                           "paged P=64, 2-page prefix shared by all"};
    printf("bsa bwd varlen %s, B=%d Tq=%lld Tkv=%lld N=%d Nkv=%d D=%d causal 64x64, %s, %d reps\n",
           spattn_dtype_name((spattn_dtype)dt), B, (long long)Tq, (long long)Tk, N, NKV, D,
           getenv("PB_CPU") ? "process CPU time" : "wall time", REPS);
    for (int c = 0; c < RUNS; c++) {
        qsort(t[c], REPS, sizeof(double), cmpd);
        printf("  %-40s min %8.1f ms  median %8.1f ms\n", name[c], t[c][0], t[c][REPS / 2]);
    }
    return 0;
}
