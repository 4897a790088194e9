// wgmma issue-rate microbenchmark: how fast do the shapes the bsa / sfa backward use run when
// nothing else happens?  Every CTA (one per SM) has 1 or 2 warpgroups issuing groups of 8
// k-steps (K = 128) into one accumulator, back to back (wait<1>: two groups in flight), operands
// in shared memory (128-byte swizzle, the layout the kernels use) or A from registers.  No loads,
// no softmax: the tensor pipe's own rate for the shape, against which a kernel's 40-55 % "tensor
// pipe active" can be read.
//   build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I src/cuda bench/gpu/wgmma_rate.cu -o wgmma_rate
//   run:   ./wgmma_rate [iters=4000]
// Variants: SS / RS (A from registers), N = 16 / 32 / 64 / 128 / 256, 1 or 2 issuing warpgroups
// (N = 16 also as four independent chains, the keys-as-rows forward's tokens); SS n64
// with both operands MN-major (transposed, as the bsa backward's dQ GEMM reads dS^T and K).  (A
// variant replaying the bsa backward's five GEMMs per step with its waits made ptxas serialise
// every wgmma here, C7511 / C7512, so it is not included.)
// Timing: CUDA events around the launch (one CTA per SM), median of 5 after a warm-up;
// TFLOP/s = 2 * 64 * N * 16 per k-step.
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "hopper/hopper.cuh"

typedef __nv_bfloat16 T;
using E = hop::elt<T>;

constexpr int SMEM = 2 * 64 * 128 * 2 + 2 * 256 * 128 * 2 + 1024;  // per WG: A 64 x 128, B 256 x 128

enum Kind { SS64 = 0, RS64, SS128, RS128, SS256, SS64T, SS16, RS16, SS16X4, RS16X4, SS32, RS32 };

template <int KIND>
__global__ void __launch_bounds__(256, 1) rate_kernel(int iters, int nwg, float *sink) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *sm = reinterpret_cast<unsigned char *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    // fill with small random-ish bf16 values (all threads)
    for (int i = threadIdx.x; i < (SMEM - 1024) / 2; i += blockDim.x)
        reinterpret_cast<T *>(sm)[i] = __float2bfloat16(((i * 2654435761u) >> 22) * (1.f / 1024.f) - 0.5f);
    __syncthreads();
    const int w = threadIdx.x >> 7;
    if (w >= nwg) return;
    unsigned char *a = sm + w * 64 * 128 * 2, *b = sm + 2 * 64 * 128 * 2 + w * 256 * 128 * 2;
    const uint64_t dA = hop::desc_sw128(a, 16, 1024), dB = hop::desc_sw128(b, 16, 1024);
    auto kA = [&](int kk) { return hop::desc_add(dA, (kk >> 2) * 64 * 128 + (kk & 3) * 32); };
    auto kB = [&](int rows, int kk) { return hop::desc_add(dB, (kk >> 2) * rows * 128 + (kk & 3) * 32); };
    const uint64_t dBn = hop::desc_sw128(b, 64 * 128, 1024);  // MN-major view (B of the RS n128 GEMMs)
    uint32_t ra[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int j = 0; j < 4; j++) ra[k][j] = 0x3c003c00u ^ (threadIdx.x * 77u + k * 13u + j);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;
    float(&a32)[32] = *reinterpret_cast<float(*)[32]>(acc);
    float(&a64)[64] = *reinterpret_cast<float(*)[64]>(acc);
    for (int it = 0; it < iters; it++) {
        hop::wgmma_fence();
        if constexpr (KIND == SS64) {
#pragma unroll
            for (int kk = 0; kk < 8; kk++) E::ss64<0, 0>(a32, kA(kk), kB(64, kk), 1);
        } else if constexpr (KIND == RS64) {
#pragma unroll
            for (int kk = 0; kk < 8; kk++) E::rs64<1>(a32, ra[kk & 3], hop::desc_add(dBn, (kk & 3) * 2048), 1);
        } else if constexpr (KIND == SS128) {
#pragma unroll
            for (int kk = 0; kk < 8; kk++) E::ss128<0, 0>(a64, kA(kk), kB(128, kk), 1);
        } else if constexpr (KIND == RS128) {
#pragma unroll
            for (int kk = 0; kk < 8; kk++) E::rs128<1>(a64, ra[kk & 3], hop::desc_add(dBn, (kk & 3) * 2048), 1);
        } else if constexpr (KIND == SS64T) {  // both operands MN-major (the bsa backward's dQ = dS K)
            const uint64_t dAt = hop::desc_sw128(a, 8192, 1024), dBt = hop::desc_sw128(b, 8192, 1024);
#pragma unroll
            for (int kk = 0; kk < 8; kk++) E::ss64<1, 1>(a32, hop::desc_add(dAt, (kk & 3) * 2048), hop::desc_add(dBt, kk * 2048), 1);
        } else if constexpr (KIND == SS16 || KIND == RS16 || KIND == SS32 || KIND == RS32) {
            // the narrow N of the keys-as-rows forward (S^T = K Q^T, one token's 16 or 32 heads):
            // A 2 KB a k-step against B 0.5 / 1 KB, so SS is bounded by shared-memory operand reads
            // if those run at ~128 B a clock; RS reads only B
            constexpr int N = (KIND == SS16 || KIND == RS16) ? 16 : 32;
            float(&an)[N / 2] = *reinterpret_cast<float(*)[N / 2]>(acc);
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                if constexpr (KIND == SS16 || KIND == SS32) E::ssn<N, 0, 0>(an, kA(kk), kB(N, kk), 1);
                else if constexpr (N == 16) wgmma_rs_m64n16k16_bf16<0>(an, ra[kk & 3], kB(N, kk), 1);
                else wgmma_rs_m64n32k16_bf16<0>(an, ra[kk & 3], kB(N, kk), 1);
            }
        } else if constexpr (KIND == SS16X4 || KIND == RS16X4) {
            // four independent m64n16 chains (four tokens' S^T against one key block), interleaved
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    float(&an)[8] = *reinterpret_cast<float(*)[8]>(acc + 8 * t);
                    const uint64_t b = hop::desc_add(kB(64, kk), t * 16 * 128);
                    if constexpr (KIND == SS16X4) E::ssn<16, 0, 0>(an, kA(kk), b, 1);
                    else wgmma_rs_m64n16k16_bf16<0>(an, ra[kk & 3], b, 1);
                }
        } else if constexpr (KIND == SS256) {
#pragma unroll
            for (int kk = 0; kk < 8; kk++) E::ss256<0, 0>(acc, kA(kk), kB(256, kk), 1);
        }
        hop::wgmma_commit();
        hop::wgmma_wait<1>();
        hop::reg_fence(acc);
    }
    hop::wgmma_wait<0>();
    hop::reg_fence(acc);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 128; i++) s += acc[i];
    if (s == 12345.f) sink[threadIdx.x] = s;  // keep the GEMMs
}

template <int KIND>
static float run(int iters, int nwg, float *sink, int sms) {
    cudaFuncSetAttribute(rate_kernel<KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ms;
    for (int r = 0; r < 6; r++) {
        cudaEventRecord(e0);
        rate_kernel<KIND><<<sms, 256, SMEM>>>(iters, nwg, sink);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (r) ms.push_back(t);  // first run: warm-up
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "kernel %d: %s\n", KIND, cudaGetErrorString(e));
        exit(1);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 4000;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    const int sms = prop.multiProcessorCount;
    float *sink;
    cudaMalloc(&sink, 256 * sizeof(float));  // one per thread of a CTA
    printf("%s, %d SMs, one CTA per SM, %d groups of K = 128 per warpgroup\n", prop.name, sms, iters);
    printf("%-28s %3s %9s %9s\n", "variant", "WGs", "ms", "TFLOP/s");
    struct V {
        const char *name;
        int kind;
        double flop_group;  // per warpgroup and group
    } vs[] = {{"SS m64n64k16 (x8)", SS64, 8 * 2.0 * 64 * 64 * 16},    {"RS m64n64k16 (x8)", RS64, 8 * 2.0 * 64 * 64 * 16},
              {"SS m64n128k16 (x8)", SS128, 8 * 2.0 * 64 * 128 * 16}, {"RS m64n128k16 (x8)", RS128, 8 * 2.0 * 64 * 128 * 16},
              {"SS m64n256k16 (x8)", SS256, 8 * 2.0 * 64 * 256 * 16},
              {"SS m64n64k16 MN-major A, B", SS64T, 8 * 2.0 * 64 * 64 * 16},
              {"SS m64n16k16 (x8)", SS16, 8 * 2.0 * 64 * 16 * 16},    {"RS m64n16k16 (x8)", RS16, 8 * 2.0 * 64 * 16 * 16},
              {"SS m64n16k16 (4 x8)", SS16X4, 32 * 2.0 * 64 * 16 * 16}, {"RS m64n16k16 (4 x8)", RS16X4, 32 * 2.0 * 64 * 16 * 16},
              {"SS m64n32k16 (x8)", SS32, 8 * 2.0 * 64 * 32 * 16},    {"RS m64n32k16 (x8)", RS32, 8 * 2.0 * 64 * 32 * 16}};
    for (const V &v : vs)
        for (int nwg = 1; nwg <= 2; nwg++) {
            float ms = 0.f;
            switch (v.kind) {
            case SS64: ms = run<SS64>(iters, nwg, sink, sms); break;
            case RS64: ms = run<RS64>(iters, nwg, sink, sms); break;
            case SS128: ms = run<SS128>(iters, nwg, sink, sms); break;
            case RS128: ms = run<RS128>(iters, nwg, sink, sms); break;
            case SS256: ms = run<SS256>(iters, nwg, sink, sms); break;
            case SS64T: ms = run<SS64T>(iters, nwg, sink, sms); break;
            case SS16: ms = run<SS16>(iters, nwg, sink, sms); break;
            case RS16: ms = run<RS16>(iters, nwg, sink, sms); break;
            case SS16X4: ms = run<SS16X4>(iters, nwg, sink, sms); break;
            case RS16X4: ms = run<RS16X4>(iters, nwg, sink, sms); break;
            case SS32: ms = run<SS32>(iters, nwg, sink, sms); break;
            default: ms = run<RS32>(iters, nwg, sink, sms); break;
            }
            const double flop = v.flop_group * iters * nwg * sms;
            printf("%-28s %3d %9.3f %9.1f\n", v.name, nwg, ms, flop / (ms * 1e-3) / 1e12);
        }
    cudaFree(sink);
    return 0;
}
