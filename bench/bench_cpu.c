/*
 * spattn_bench_cpu: CPU benchmark (not a test).  Prints the measured fp32 FMA peak, then per
 * case the median time, GFLOP/s (work counted as in cases/README.md) and % of that peak.
 *   spattn_bench_cpu [filter-substring] [--reps N] [--threads T]
 * Environment: SPATTN_CPU_ISA=avx512|avx2|generic picks the kernel variant (and the peak loop).
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cpu.h"
#include "spattn.h"

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process: unaffected by other processes taking the cores, so on a
 * shared machine it shows the kernels' own efficiency (reported as "cpu"). */
static double bench_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double bench_last_cpu_min;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(const bench_env *env, void (*fn)(void *), void *ctx) {
    return bench_median_min(env, fn, ctx, NULL);
}

double bench_median_min(const bench_env *env, void (*fn)(void *), void *ctx, double *tmin) {
    double t[64];
    int n = env->reps < 1 ? 1 : env->reps > 64 ? 64 : env->reps;
    fn(ctx);
    for (int i = 0; i < n; i++) {
        double t0 = bench_now(), c0 = bench_cpu_now();
        fn(ctx);
        t[i] = bench_now() - t0;
        double c = (bench_cpu_now() - c0) / env->threads;
        if (i == 0 || c < bench_last_cpu_min) bench_last_cpu_min = c;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    if (tmin) *tmin = t[0];
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

int bench_selected(const bench_env *env, const char *name) {
    return !env->filter || strstr(name, env->filter) != NULL;
}

void bench_row(const bench_env *env, const char *name, const char *pass, double sec, double flops) {
    bench_row_min(env, name, pass, sec, 0.0, flops);
}

void bench_row_min(const bench_env *env, const char *name, const char *pass, double sec,
                   double tmin, double flops) {
    double g = flops / sec * 1e-9;
    printf("%-40s %-4s %10.2f ms %9.1f GFLOP/s %6.1f %%", name, pass, sec * 1e3, g,
           100.0 * g / env->peak_gflops);
    if (tmin > 0)
        printf("   best %5.1f %%  cpu %5.1f %%", 100.0 * flops / tmin * 1e-9 / env->peak_cpu_gflops,
               100.0 * flops / bench_last_cpu_min * 1e-9 / env->peak_cpu_gflops);
    printf("\n");
    fflush(stdout);
}

/* ---- bsa ---------------------------------------------------------------------------------- */
typedef struct bsa_bench {
    const char *name;
    int64_t B, N, S, D, bx, by;
    const char *pattern; /* dense | causal | random | window | bigbird */
    double param;        /* random: density; window: W; bigbird: unused */
    spattn_dtype dtype;
} bsa_bench;

static const bsa_bench kBsa[] = {
    {"bsa dense S1024 D128 fp32", 1, 4, 1024, 128, 64, 64, "dense", 0, SPATTN_DTYPE_F32},
    {"bsa causal S1024 D128 fp32", 1, 4, 1024, 128, 64, 64, "causal", 0, SPATTN_DTYPE_F32},
    {"bsa dense S2048 D128 fp32", 1, 4, 2048, 128, 64, 64, "dense", 0, SPATTN_DTYPE_F32},
    {"bsa causal S2048 D128 fp32", 1, 4, 2048, 128, 64, 64, "causal", 0, SPATTN_DTYPE_F32},
    {"bsa dense S1024 D128 bf16", 1, 4, 1024, 128, 64, 64, "dense", 0, SPATTN_DTYPE_BF16},
    {"bsa causal S1024 D128 bf16", 1, 4, 1024, 128, 64, 64, "causal", 0, SPATTN_DTYPE_BF16},
    {"bsa dense S2048 D128 bf16", 1, 4, 2048, 128, 64, 64, "dense", 0, SPATTN_DTYPE_BF16},
    {"bsa causal S2048 D128 bf16", 1, 4, 2048, 128, 64, 64, "causal", 0, SPATTN_DTYPE_BF16},
    {"bsa causal S2048 D64 fp16 bx48 by80", 1, 4, 2048, 64, 48, 80, "causal", 0, SPATTN_DTYPE_F16},
    {"bsa random0.3 S2048 D128 bf16 b64", 1, 4, 2048, 128, 64, 64, "random", 0.3, SPATTN_DTYPE_BF16},
    {"bsa window512 S2048 D128 bf16 b32", 1, 4, 2048, 128, 32, 32, "window", 512, SPATTN_DTYPE_BF16},
    {"bsa bigbird S2048 D128 bf16 b64", 1, 4, 2048, 128, 64, 64, "bigbird", 0, SPATTN_DTYPE_BF16},
    /* fine-grained masks (the shapes of the public cases bsa12, bsa06, bsa15, fewer heads) */
    {"bsa random0.2 S1024 D128 fp16 b16", 1, 4, 1024, 128, 16, 16, "random", 0.2, SPATTN_DTYPE_F16},
    {"bsa random0.3 S2048 D128 fp16 b32", 1, 4, 2048, 128, 32, 32, "random", 0.3, SPATTN_DTYPE_F16},
    {"bsa random0.25 S2048 D128 fp16 bx128 by16", 1, 4, 2048, 128, 128, 16, "random", 0.25, SPATTN_DTYPE_F16},
};

typedef struct bsa_run {
    spattn_tensor q, k, v, m, o, lse, dout, dq, dk, dv;
    int64_t bx, by;
    spattn_options opt;
} bsa_run;

static void run_fwd(void *ctx) {
    bsa_run *r = ctx;
    spattn_status st = spattn_bsa_fwd_ex(&r->q, &r->k, &r->v, &r->m, r->bx, r->by, 0.0, &r->o,
                                         &r->lse, &r->opt);
    if (st) { fprintf(stderr, "bsa fwd failed: %s\n", spattn_last_error()); exit(1); }
}
static void run_bwd(void *ctx) {
    bsa_run *r = ctx;
    spattn_status st = spattn_bsa_bwd_ex(&r->q, &r->k, &r->v, &r->o, &r->dout, &r->lse, &r->m,
                                         r->bx, r->by, 0.0, &r->dq, &r->dk, &r->dv, &r->opt);
    if (st) { fprintf(stderr, "bsa bwd failed: %s\n", spattn_last_error()); exit(1); }
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Mask per cases/README.md (Sq = Skv here); returns the exact number of attended pairs. */
static double make_mask(const bsa_bench *c, uint8_t *m, int64_t nbx, int64_t nby) {
    uint64_t seed = 88172645463325252ull;
    double pairs = 0;
    for (int64_t bn = 0; bn < c->B * c->N; bn++)
        for (int64_t i = 0; i < nbx; i++) {
            int64_t qs = i * c->bx, qe = (i + 1) * c->bx < c->S ? (i + 1) * c->bx - 1 : c->S - 1;
            for (int64_t j = 0; j < nby; j++) {
                int64_t ks = j * c->by, ke = (j + 1) * c->by < c->S ? (j + 1) * c->by - 1 : c->S - 1;
                int on = 1;
                if (!strcmp(c->pattern, "causal")) on = ks <= qe;
                else if (!strcmp(c->pattern, "window")) on = ks <= qe && ke >= qs - (int64_t)c->param;
                else if (!strcmp(c->pattern, "random"))
                    on = (double)(rng_next(&seed) >> 11) * 0x1.0p-53 < c->param;
                else if (!strcmp(c->pattern, "bigbird"))
                    on = j < 1 || i < 1 || (ke >= qs - c->by && ks <= qe + c->by) ||
                         rng_next(&seed) % (uint64_t)nby < 3;
                m[(bn * nbx + i) * nby + j] = (uint8_t)on;
            }
        }
    /* exact pairs: causal blocks on the diagonal are attended whole (block granularity) */
    for (int64_t bn = 0; bn < c->B * c->N; bn++)
        for (int64_t i = 0; i < nbx; i++)
            for (int64_t j = 0; j < nby; j++)
                if (m[(bn * nbx + i) * nby + j]) {
                    int64_t rows = (i + 1) * c->bx < c->S ? c->bx : c->S - i * c->bx;
                    int64_t cols = (j + 1) * c->by < c->S ? c->by : c->S - j * c->by;
                    pairs += (double)rows * (double)cols;
                }
    return pairs;
}

static void fill(spattn_tensor *t, uint64_t seed) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    for (int64_t i = 0; i < n; i++) {
        float x = (float)((double)(rng_next(&seed) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * 1.7f;
        if (t->dtype == SPATTN_DTYPE_F32) ((float *)t->data)[i] = x;
        else { /* fp16/bf16: any representable value is fine for timing; keep it simple */
            uint32_t u;
            memcpy(&u, &x, 4);
            ((uint16_t *)t->data)[i] = t->dtype == SPATTN_DTYPE_BF16 ? (uint16_t)(u >> 16)
                                                                      : (uint16_t)(0x3800 | (u >> 13 & 0x3ff));
        }
    }
}

static spattn_tensor alloc_t(spattn_dtype dt, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    void *p = aligned_alloc(64, ((size_t)n * spattn_dtype_size(dt) + 63) / 64 * 64);
    return spattn_tensor_make(p, dt, ndim, shape, NULL);
}

static void bench_bsa(const bench_env *env) {
    for (size_t ci = 0; ci < sizeof kBsa / sizeof kBsa[0]; ci++) {
        const bsa_bench *c = &kBsa[ci];
        if (!bench_selected(env, c->name)) continue;
        int64_t nbx = (c->S + c->bx - 1) / c->bx, nby = (c->S + c->by - 1) / c->by;
        int64_t sq[4] = {c->B, c->N, c->S, c->D}, sm[4] = {c->B, c->N, nbx, nby}, sl[3] = {c->B, c->N, c->S};
        bsa_run r;
        r.q = alloc_t(c->dtype, 4, sq);
        r.k = alloc_t(c->dtype, 4, sq);
        r.v = alloc_t(c->dtype, 4, sq);
        r.dout = alloc_t(c->dtype, 4, sq);
        r.o = alloc_t(c->dtype, 4, sq);
        r.dq = alloc_t(c->dtype, 4, sq);
        r.dk = alloc_t(c->dtype, 4, sq);
        r.dv = alloc_t(c->dtype, 4, sq);
        r.lse = alloc_t(SPATTN_DTYPE_F32, 3, sl);
        r.m = alloc_t(SPATTN_DTYPE_U8, 4, sm);
        fill(&r.q, 1);
        fill(&r.k, 2);
        fill(&r.v, 3);
        fill(&r.dout, 4);
        double pairs = make_mask(c, r.m.data, nbx, nby);
        r.bx = c->bx;
        r.by = c->by;
        spattn_options_init(&r.opt);
        r.opt.backend = SPATTN_BACKEND_CPU;
        r.opt.num_threads = env->threads;
        /* Caller workspace: timing then excludes malloc, as an application reusing it would. */
        size_t ws = 0, wsb = 0;
        spattn_bsa_workspace_size(&r.q, &r.k, &r.v, &r.m, c->bx, c->by, 0, &r.opt, &ws);
        spattn_bsa_workspace_size(&r.q, &r.k, &r.v, &r.m, c->bx, c->by, 1, &r.opt, &wsb);
        if (wsb > ws) ws = wsb;
        r.opt.workspace = malloc(ws);
        r.opt.workspace_size = ws;
        double mf, mb;
        double tf = bench_median_min(env, run_fwd, &r, &mf);
        bench_row_min(env, c->name, "fwd", tf, mf, 4.0 * (double)c->D * pairs);
        double tb = bench_median_min(env, run_bwd, &r, &mb);
        bench_row_min(env, c->name, "bwd", tb, mb, 10.0 * (double)c->D * pairs);
        free(r.opt.workspace);
        spattn_tensor *all[] = {&r.q, &r.k, &r.v, &r.dout, &r.o, &r.dq, &r.dk, &r.dv, &r.lse, &r.m};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->data);
    }
}

/* Other families (bench_cpu_<x>.c), optional at link time. */
void bench_cpu_sfa(const bench_env *env) __attribute__((weak));

int main(int argc, char **argv) {
    bench_env env = {0, 0, omp_get_max_threads(), 5, NULL};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) env.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) env.threads = atoi(argv[++i]);
        else env.filter = argv[i];
    }
    const char *isa = spattn_cpu_isa();
    env.peak_gflops = bench_fma_peak_gflops(isa, env.threads, &env.peak_cpu_gflops);
    printf("spattn %s  isa %s  threads %d  fp32 FMA peak %.1f GFLOP/s (over CPU time %.1f)  "
           "median of %d runs\n",
           spattn_version(NULL, NULL, NULL), isa, env.threads, env.peak_gflops,
           env.peak_cpu_gflops, env.reps);
    printf("(%% = median rate / wall peak; best = fastest run / CPU-time peak; cpu = rate over "
           "process CPU time / CPU-time peak: both less sensitive to other load on the machine)\n");
    printf("%-40s %-4s %13s %17s %8s\n", "case", "pass", "time", "rate", "of peak");
    bench_bsa(&env);
    if (bench_cpu_sfa) bench_cpu_sfa(&env);
    return 0;
}
