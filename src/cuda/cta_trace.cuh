// Per-CTA timestamps for a debugging build (cmake -DSPATTN_CTA_TRACE=ON; never in a release):
// one thread per CTA records globaltimer at four points of a kernel, its loop count and SM id,
// and the launcher appends the records to the file named by TRACE_FILE as
//   "K <grid>" then one line per CTA: "<block> <t0> <t1> <t2> <t3> <n> <smid>"
// (bench/gpu/cta_trace.py reads them).  Kernels mark points with SPATTN_TRACE(...), which is
// empty in every other build.  Records cost a few global stores per CTA; the launcher
// synchronises the stream after the kernel, so only the kernel's own span is meaningful.
#pragma once
#ifdef SPATTN_CTA_TRACE
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

namespace cta_trace {

struct Rec {
    unsigned long long t[4];
    int n, sm;
};

static __device__ Rec *g_rec;  // one record per CTA of the traced launch, or NULL (one per translation unit)

__device__ __forceinline__ unsigned long long now() {
    unsigned long long x;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(x));
    return x;
}
__device__ __forceinline__ int smid() {
    int x;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(x));
    return x;
}
__device__ __forceinline__ long long block() {
    return blockIdx.x + ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x;
}

// Host: records for a grid of n CTAs when TRACE_FILE is set (else tracing stays off).
inline Rec *begin(long long n, cudaStream_t st) {
    Rec *d = nullptr;
    if (getenv("TRACE_FILE") && cudaMalloc(&d, n * sizeof(Rec)) == cudaSuccess)
        cudaMemsetAsync(d, 0, n * sizeof(Rec), st);
    cudaMemcpyToSymbolAsync(g_rec, &d, sizeof d, 0, cudaMemcpyHostToDevice, st);
    return d;
}
// Host, after the launch: wait, append the records, free them.
inline void end(Rec *d, long long n, cudaStream_t st) {
    if (!d) return;
    Rec *h = static_cast<Rec *>(malloc(n * sizeof(Rec)));
    FILE *f = fopen(getenv("TRACE_FILE"), "a");
    if (h && f && cudaStreamSynchronize(st) == cudaSuccess &&
        cudaMemcpy(h, d, n * sizeof(Rec), cudaMemcpyDeviceToHost) == cudaSuccess) {
        fprintf(f, "K %lld\n", n);
        for (long long i = 0; i < n; i++)
            fprintf(f, "%lld %llu %llu %llu %llu %d %d\n", i, h[i].t[0], h[i].t[1], h[i].t[2], h[i].t[3], h[i].n,
                    h[i].sm);
    }
    if (f) fclose(f);
    free(h);
    cudaFree(d);
}

// Per-step timeline (bench/gpu/step_trace.py): with STEP_FILE set, a kernel's marks record the SM
// clock of one thread per warpgroup (up to STEP_WG of them: two consumers and a producer) at up
// to STEP_MARKS points of each of its first STEP_MAX steps.
constexpr int STEP_MAX = 64, STEP_MARKS = 16, STEP_WG = 3;
static __device__ unsigned *g_step;  // [CTA][warpgroup][STEP_MAX][STEP_MARKS], or NULL

// A kernel reads its CTA's records once at its start (step_base) and marks through them
// (step_at; 0 = not reached): reading g_step at every mark reloaded it after each barrier's memory
// clobber, an L1 / L2 trip of ~100-300 cycles that the trace counted as the kernel's own time.
__device__ __forceinline__ unsigned *step_base() { return g_step ? g_step + block() * STEP_WG * STEP_MAX * STEP_MARKS : nullptr; }
__device__ __forceinline__ void step_at(unsigned *base, int wg, int it, int m) {
    if (base && it < STEP_MAX) base[(wg * STEP_MAX + it) * STEP_MARKS + m] = (unsigned)clock64() | 1u;
}
inline unsigned *step_begin(long long n, cudaStream_t st) {
    unsigned *d = nullptr;
    const size_t bytes = (size_t)n * STEP_WG * STEP_MAX * STEP_MARKS * sizeof(unsigned);
    if (getenv("STEP_FILE") && cudaMalloc(&d, bytes) == cudaSuccess) cudaMemsetAsync(d, 0, bytes, st);
    cudaMemcpyToSymbolAsync(g_step, &d, sizeof d, 0, cudaMemcpyHostToDevice, st);
    return d;
}
inline void step_end(unsigned *d, long long n, cudaStream_t st) {
    if (!d) return;
    const size_t cnt = (size_t)n * STEP_WG * STEP_MAX * STEP_MARKS;
    unsigned *h = static_cast<unsigned *>(malloc(cnt * sizeof(unsigned)));
    FILE *f = fopen(getenv("STEP_FILE"), "a");
    if (h && f && cudaStreamSynchronize(st) == cudaSuccess &&
        cudaMemcpy(h, d, cnt * sizeof(unsigned), cudaMemcpyDeviceToHost) == cudaSuccess) {
        fprintf(f, "S %lld %d %d\n", n, STEP_MAX, STEP_MARKS);
        for (size_t r = 0; r < cnt / STEP_MARKS; r++) {
            const unsigned *v = h + r * STEP_MARKS;
            if (!v[0]) continue;
            fprintf(f, "%lld %d %d", (long long)(r / (STEP_WG * STEP_MAX)), (int)(r / STEP_MAX % STEP_WG), (int)(r % STEP_MAX));
            for (int m = 0; m < STEP_MARKS; m++) fprintf(f, " %u", v[m]);
            fprintf(f, "\n");
        }
    }
    if (f) fclose(f);
    free(h);
    cudaFree(d);
}

}  // namespace cta_trace
#define SPATTN_TRACE(...) __VA_ARGS__
#else
#define SPATTN_TRACE(...)
#endif
