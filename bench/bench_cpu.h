/*
 * Shared pieces of spattn_bench_cpu.  To add an operator family, write bench/bench_cpu_<x>.c
 * defining `void bench_cpu_<x>(const bench_env *env)` and list it in bench_cpu.c's
 * kFamilies[] (declared weak there, so the program links without it); print rows with
 * bench_row().
 */
#ifndef SPATTN_BENCH_CPU_H
#define SPATTN_BENCH_CPU_H

#include <stdint.h>

typedef struct bench_env {
    double peak_gflops;  /* measured fp32 FMA peak of all threads (wall time) */
    double peak_cpu_gflops; /* the same over CPU time (immune to other processes) */
    int threads;
    int reps;            /* timed repetitions per case (median reported) */
    const char *filter;  /* substring a case name must contain; NULL = all */
} bench_env;

/* Seconds, monotonic. */
double bench_now(void);
/* Median of env->reps timed calls of fn(ctx) after one warm-up call. */
double bench_median(const bench_env *env, void (*fn)(void *), void *ctx);
/* Same, also storing the fastest run's time in *tmin (when not NULL). */
double bench_median_min(const bench_env *env, void (*fn)(void *), void *ctx, double *tmin);
/* 1 when `name` passes env->filter. */
int bench_selected(const bench_env *env, const char *name);
/* One result line: name, pass ("fwd"/"bwd"), median seconds, FLOPs counted per README. */
void bench_row(const bench_env *env, const char *name, const char *pass, double sec, double flops);
/* Same plus the fastest run's percentage of peak (tmin > 0), a noise-free hint on a busy box. */
void bench_row_min(const bench_env *env, const char *name, const char *pass, double sec,
                   double tmin, double flops);
/* Measured peak (bench_peak.c): register-resident FMA loop of the given ISA on all threads. */
/* *cpu_gflops (may be NULL) gets the same rate over process CPU time instead of wall time. */
double bench_fma_peak_gflops(const char *isa, int threads, double *cpu_gflops);

#endif
