/*
 * fp32 FMA peak: each thread runs a loop of independent FMA chains held in registers (more
 * chains than FMA latency x ports, so the FMA units never wait), with the widest ISA the
 * library itself uses; GFLOP/s = 2 * lanes * chains * iterations / time, summed over threads.
 */
#include <omp.h>
#include <time.h>

#include "bench_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define CHAINS 16
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

/* Generic: 32 scalar chains, which the compiler turns into 8 independent SSE vectors of
 * multiply + add (no FMA in baseline x86-64), enough to cover their latency. */
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

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_fma_peak_gflops(const char *isa, int threads, double *cpu_gflops) {
    int lanes = SCALAR_CHAINS; /* generic */
    float (*fn)(int64_t, float) = loop_scalar;
#if defined(__x86_64__)
    if (isa[0] == 'a' && isa[3] == '5') { fn = loop_avx512; lanes = 16 * CHAINS; }
    else if (isa[0] == 'a') { fn = loop_avx2; lanes = 8 * CHAINS; }
#endif
    const int64_t iters = 20000000;
    double best = 0, best_cpu = 0;
    for (int rep = 0; rep < 3; rep++) {
        volatile float sink = 0;
        double t0 = bench_now(), c0 = cpu_now();
#pragma omp parallel num_threads(threads)
        {
            float r = fn(iters, (float)omp_get_thread_num());
#pragma omp atomic
            sink += r;
        }
        double t = bench_now() - t0, c = (cpu_now() - c0) / threads;
        double g = 2.0 * lanes * (double)iters * threads / t * 1e-9;
        double gc = 2.0 * lanes * (double)iters * threads / c * 1e-9;
        if (g > best) best = g;
        if (gc > best_cpu) best_cpu = gc;
    }
    if (cpu_gflops) *cpu_gflops = best_cpu;
    return best;
}
