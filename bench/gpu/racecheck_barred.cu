// Does compute-sanitizer's racecheck order shared-memory accesses across a named barrier that
// follows `bar.red.or.pred` on other barrier ids?  (A tool probe, not a test: the per-token sfa
// forward's epilogue, an STS / BAR.SYNC 1, 256 / LDS exchange between its two consumer
// warpgroups, is reported racy since the voted softmax added bar.red on barriers 2 / 3.)
// Two warpgroups each vote a number of times (different between them and between the 64 CTAs)
// on their own barrier (2 + wg, 128 threads; bar.red, or
// bar.sync in mode 1, plus an extra bar.sync on the same id after a true vote, as the full
// softmax step does), then exchange through shared memory across bar.sync 1, 256.  The
// exchange is race-free by construction in every mode; hazards reported by racecheck are the
// tool's.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc/cuda -o racecheck_barred bench/gpu/racecheck_barred.cu
//   compute-sanitizer --tool racecheck ./racecheck_barred MODE   (0 bar.red, 1 bar.sync only)
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "hopper/hopper.cuh"  // the kernels' own bar_sync / bar_red_or

using hop::bar_red_or;
using hop::bar_sync;

__global__ void probe(int *out, const int *reps, int mode) {
    __shared__ float buf[256];
    __shared__ float red[2][128];
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0), t = threadIdx.x & 127;
    const int n = (reps[wg] + (int)blockIdx.x * (wg ? 3 : 1)) % 13;  // differs between the warpgroups and the CTAs
    int acc = 0;
    for (int r = 0; r < n; r++) {
        const bool c = ((t * 7 + r * 3 + (int)blockIdx.x) % 11) == 0 && (r + (int)blockIdx.x) % 3 == wg;
        bool v;
        if (mode == 0) {
            v = bar_red_or(c, 2 + wg, 128);
        } else {
            red[wg][t] = c;
            bar_sync(2 + wg, 128);
            v = false;  // the same answer in all 128 threads, as bar.red gives
            for (int k = 0; k < 128; k++) v |= red[wg][k] != 0.f;
            bar_sync(2 + wg, 128);
        }
        if (v) {  // the full step: an exchange through shared memory on the same barrier
            red[wg][t] = (float)r;
            bar_sync(2 + wg, 128);
            acc += (int)red[wg][(t + 5) & 127];
            bar_sync(2 + wg, 128);
        }
    }
    buf[threadIdx.x] = (float)(acc + t);
    bar_sync(1, 256);
    out[threadIdx.x] = (int)buf[255 - threadIdx.x];
}

int main(int argc, char **argv) {
    const int mode = argc > 1 ? atoi(argv[1]) : 0;
    int *out, *reps;
    cudaMalloc(&out, 256 * sizeof(int));
    cudaMalloc(&reps, 2 * sizeof(int));
    const int h[2] = {5, 9};
    cudaMemcpy(reps, h, sizeof h, cudaMemcpyHostToDevice);
    probe<<<64, 256>>>(out, reps, mode);
    const cudaError_t e = cudaDeviceSynchronize();
    int o[256];
    cudaMemcpy(o, out, sizeof o, cudaMemcpyDeviceToHost);
    printf("mode %d (%s): %s, out[0] %d out[255] %d\n", mode, mode ? "bar.sync" : "bar.red", cudaGetErrorString(e), o[0], o[255]);
    return e != cudaSuccess;
}
