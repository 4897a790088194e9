// Does compute-sanitizer's racecheck order shared-memory accesses across a named barrier shared
// by two warpgroups that have passed different numbers of barriers on their own ids before it?
// (A tool probe, not a test.)  Two kernels are reported racy on such an exchange, ordered by
// construction in both: the per-token sfa forward's epilogue (STS / BAR.SYNC 1, 256 / LDS between
// its consumer warpgroups) since its voted softmax, where a warpgroup takes the full step's
// barriers on its own id 2 / 3 only when its vote says so; and the key-major backward's end
// (`red +=` / bar.sync 3, 256 / add_rows' reads), whose warpgroups take alternate steps with two
// barriers each on ids 1 / 2, one step more for warpgroup 0 when the step count is odd.
// The probe: two warpgroups vote r times on their own barrier (2 + wg, 128 threads) and take an
// extra exchange on it after a true vote, then exchange through shared memory across
// bar.sync 1, 256.  The exchange is race-free by construction in every mode; hazards are the
// tool's.  MODE bits:
//   1: vote by bar.sync + shared words (else bar.red.or.pred)
//   2: equal barrier counts in both warpgroups (same rounds, no extra exchange; else different
//      rounds between the warpgroups and the 64 CTAs, and the extra exchanges)
//   4: a third warpgroup, as the kernels' producer: it only arrives on a 384-thread barrier
//      (bar.arrive 4, 384) and exits; the two others bar.sync 4, 384 before the exchange
//   8: before the exchange each warpgroup pads its own id's barrier count to the other's (the
//      counts passed through global memory, which racecheck does not track, across bar.sync 5,
//      256): a remedy for the kernels if the counts are what confuses the tool
// Reading: hazards in modes 0 / 1 (+4) but not 2 / 3 -> unequal counts confuse the tool (a vote
// without bar.red does not help; then 8 / 9 clean -> padding the counts is a remedy); in 0 / 2
// but not 1 / 3 -> bar.red does; none -> the kernels' reports come from something the probe lacks.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc/cuda -o racecheck_barred bench/gpu/racecheck_barred.cu
//   for m in 0 1 2 3 4 5 8 9; do compute-sanitizer --tool racecheck ./racecheck_barred $m | grep 'mode\|SUMMARY'; done
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "hopper/hopper.cuh"  // the kernels' own bar_sync / bar_red_or

using hop::bar_red_or;
using hop::bar_sync;

__global__ void probe(int *out, int *cnt, const int *reps, int mode) {
    __shared__ float buf[256];
    __shared__ float red[2][128];
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0), t = threadIdx.x & 127;
    const bool sync_vote = mode & 1, equal = mode & 2, producer = mode & 4, pad = mode & 8;
    if (wg == 2) {  // the producer: arrive and leave
        asm volatile("bar.arrive 4, 384;\n" ::: "memory");
        return;
    }
    const int n = equal ? reps[0] % 13 : (reps[wg] + (int)blockIdx.x * (wg ? 3 : 1)) % 13;  // rounds
    int acc = 0, nb = 0;  // barriers on this warpgroup's own id
    for (int r = 0; r < n; r++) {
        const bool c = ((t * 7 + r * 3 + (int)blockIdx.x) % 11) == 0 && (r + (int)blockIdx.x) % 3 == wg;
        bool v;
        if (!sync_vote) {
            v = bar_red_or(c, 2 + wg, 128);
            nb += 1;
        } else {
            red[wg][t] = c;
            bar_sync(2 + wg, 128);
            v = false;  // the same answer in all 128 threads, as bar.red gives
            for (int k = 0; k < 128; k++) v |= red[wg][k] != 0.f;
            bar_sync(2 + wg, 128);
            nb += 2;
        }
        if (v && !equal) {  // the full step: an exchange through shared memory on the same barrier
            red[wg][t] = (float)r;
            bar_sync(2 + wg, 128);
            acc += (int)red[wg][(t + 5) & 127];
            bar_sync(2 + wg, 128);
            nb += 2;
        }
        acc += v;
    }
    if (pad) {
        volatile int *cc = cnt + 2 * blockIdx.x;
        if (t == 0) cc[wg] = nb;
        bar_sync(5, 256);
        for (int k = nb; k < cc[1 - wg]; k++) bar_sync(2 + wg, 128);
    }
    if (producer) asm volatile("bar.sync 4, 384;\n" ::: "memory");
    buf[threadIdx.x] = (float)(acc + t);
    bar_sync(1, 256);
    out[threadIdx.x] = (int)buf[255 - threadIdx.x];
}

int main(int argc, char **argv) {
    const int mode = argc > 1 ? atoi(argv[1]) : 0;
    int *out, *reps, *cnt;
    cudaMalloc(&out, 256 * sizeof(int));
    cudaMalloc(&cnt, 2 * 64 * sizeof(int));
    cudaMalloc(&reps, 2 * sizeof(int));
    const int h[2] = {5, 9};
    cudaMemcpy(reps, h, sizeof h, cudaMemcpyHostToDevice);
    probe<<<64, mode & 4 ? 384 : 256>>>(out, cnt, reps, mode);
    const cudaError_t e = cudaDeviceSynchronize();
    int o[256];
    cudaMemcpy(o, out, sizeof o, cudaMemcpyDeviceToHost);
    printf("mode %d (%s vote, %s counts%s%s): %s, out[0] %d out[255] %d\n", mode, mode & 1 ? "bar.sync" : "bar.red",
           mode & 2 ? "equal" : "unequal", mode & 4 ? ", producer warpgroup" : "", mode & 8 ? ", padded" : "",
           cudaGetErrorString(e), o[0], o[255]);
    return e != cudaSuccess;
}
