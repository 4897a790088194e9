/*
 * `spattn bench --peak` (cpu backend): the measured fp32 FMA peak of this machine, so that the
 * CPU kernels' rates read as a fraction of what the cores can do (the figure the CPU runbooks
 * quote).  Each thread runs independent FMA chains held in registers (more chains than FMA
 * latency x ports, so the units never wait) with the widest ISA the library itself uses
 * (spattn_cpu_isa); GFLOP/s = 2 * lanes * chains * iterations / wall time, summed over the
 * threads, best of 5.
 */
#include <stdint.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "spattn.h"

#define CHAINS 16
#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx512f,fma"))) static float loop_avx512(int64_t iters, float seed) {
    __m512 acc[CHAINS];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps(seed + (float)c);
    for (int64_t i = 0; i < iters; i++)
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx2,fma"))) static float loop_avx2(int64_t iters, float seed) {
    __m256 acc[CHAINS];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_set1_ps(seed + (float)c);
    for (int64_t i = 0; i < iters; i++)
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    __m256 s = acc[0];
    for (int c = 1; c < CHAINS; c++) s = _mm256_add_ps(s, acc[c]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}
#endif

/* Generic: 32 scalar chains, which the compiler turns into independent SSE / NEON vectors of
 * multiply + add, enough to cover their latency. */
#define SCALAR_CHAINS 32
static float loop_scalar(int64_t iters, float seed) {
    float acc[SCALAR_CHAINS];
    for (int c = 0; c < SCALAR_CHAINS; c++) acc[c] = seed + (float)c;
    for (int64_t i = 0; i < iters; i++)
        for (int c = 0; c < SCALAR_CHAINS; c++) acc[c] = acc[c] * 0.999999f + 1e-7f;
    float s = 0;
    for (int c = 0; c < SCALAR_CHAINS; c++) s += acc[c];
    return s;
}

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double sp_fma_peak_gflops(int threads, double *cpu_gflops) {
    const char *isa = spattn_cpu_isa();
    int lanes = SCALAR_CHAINS;
    float (*fn)(int64_t, float) = loop_scalar;
#if defined(__x86_64__)
    if (isa[0] == 'a' && isa[3] == '5') { /* "avx512" */
        fn = loop_avx512;
        lanes = 16 * CHAINS;
    } else if (isa[0] == 'a') { /* "avx2" */
        fn = loop_avx2;
        lanes = 8 * CHAINS;
    }
#else
    (void)isa;
#endif
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_max_threads();
#else
    threads = 1;
#endif
    const int64_t iters = 10000000; /* ~0.1 s a round; best of 5 rounds: a busy machine */
    double best = 0, best_cpu = 0;
    for (int rep = 0; rep < 5; rep++) {
        volatile float sink = 0;
        double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
#pragma omp parallel num_threads(threads)
        {
            float r = fn(iters, (float)rep);
#pragma omp atomic
            sink += r;
        }
        double work = 2.0 * lanes * (double)iters * threads;
        double g = work / (clock_s(CLOCK_MONOTONIC) - t0) * 1e-9;
        double gc = work / ((clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / threads) * 1e-9;
        if (g > best) best = g;
        if (gc > best_cpu) best_cpu = gc;
    }
    if (cpu_gflops) *cpu_gflops = best_cpu;
    return best;
}
