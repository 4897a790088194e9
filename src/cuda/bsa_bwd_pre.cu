// Preprocess of the block-sparse attention backward (bsa_bwd.cu):
//   bsa_delta_kernel  Delta = rowsum(dO * O), lse2 = LSE * log2(e) (+inf on empty rows); also
//                     zeroes the backward's dQ accumulator and semaphores
//   VL (packed variable-length backward): rows (head n, packed token t) of [1, N, T, D] views,
//   Delta / lse2 [N][Tq]; tokens past cu_q[B] (= seq[B-1].x + .y) are not read, nor is anything
//   when the prefix sums are bad (*p.vl.err != ~0: the backward kernel then reads none of it).
#include <math.h>

#include "bsa_common.cuh"
#include "bsa_launch.h"
#include "hopper/hopper.cuh"

template <typename T, bool VL>
__global__ void bsa_delta_kernel(const bsa_params p, float *delta, float *lse2, uint4 *zero, long long zero16) {
    // the backward kernel (its programmatic dependent) may be scheduled once every CTA of this one
    // has started: it loads K / V meanwhile and waits for this kernel's end before reading its output
    hop::griddep_launch();
    // the backward's dQ accumulator and semaphores are zeroed here (no separate memset launches)
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < zero16; x += (long long)gridDim.x * blockDim.x)
        zero[x] = make_uint4(0, 0, 0, 0);
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int i, b, n;
    if constexpr (VL) {  // row = n * Tq + t; batch index 0, token t
        if (row >= (long long)p.N * p.vl.Tq || *p.vl.err != ~0ull) return;
        const int4 last = p.vl.seq[p.B - 1];
        const long long t = row % p.vl.Tq;
        if (t >= (long long)last.x + last.y) return;  // past cu_q[B] (< 2^31)
        i = (int)t;
        n = (int)(row / p.vl.Tq);
        b = 0;
    } else {
        if (row >= (long long)p.B * p.N * p.Sq) return;
        const int bn = (int)(row / p.Sq);
        i = (int)(row % p.Sq);
        b = bn / p.N;
        n = bn % p.N;
    }
    const T *o = reinterpret_cast<const T *>(p.o.p) + b * p.o.s0 + n * p.o.s1 + i * p.o.s2;
    const T *d = reinterpret_cast<const T *>(p.dout.p) + b * p.dout.s0 + n * p.dout.s1 + i * p.dout.s2;
    float acc = 0.f;
    if (p.o.s3 == 1 && p.dout.s3 == 1 && !(p.D & 3) && !((reinterpret_cast<uintptr_t>(o) | reinterpret_cast<uintptr_t>(d)) & 7)) {
        for (int x = 4 * lane; x < p.D; x += 128) {  // 8-byte loads: 4 elements of each
            const uint2 a = *reinterpret_cast<const uint2 *>(o + x), c = *reinterpret_cast<const uint2 *>(d + x);
            const T *ae = reinterpret_cast<const T *>(&a), *ce = reinterpret_cast<const T *>(&c);
#pragma unroll
            for (int k = 0; k < 4; k++) acc += bsa_t<T>::tof(ae[k]) * bsa_t<T>::tof(ce[k]);
        }
    } else {
        for (int x = lane; x < p.D; x += 32) acc += bsa_t<T>::tof(o[x * p.o.s3]) * bsa_t<T>::tof(d[x * p.dout.s3]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        const float l = p.lse[(long long)b * p.lse_s0 + (long long)n * p.lse_s1 + (long long)i * p.lse_s2];
        delta[row] = acc;
        lse2[row] = l == -INFINITY ? INFINITY : l * BSA_LOG2E;
    }
}

extern "C" cudaError_t spattn_bsa_launch_delta(const bsa_params *p, int bf16, float *delta, float *lse2, void *zero,
                                               size_t zero_bytes, cudaStream_t st) {
    uint4 *z = static_cast<uint4 *>(zero);
    const long long z16 = (long long)(zero_bytes / 16);
    if (zero_bytes % 16) {  // never with the workspace layouts (16-byte multiples); kept exact anyway
        cudaError_t e = cudaMemsetAsync(static_cast<char *>(zero) + z16 * 16, 0, zero_bytes % 16, st);
        if (e != cudaSuccess) return e;
    }
    const bool vl = p->vl.seq != nullptr;
    const long long rows = vl ? (long long)p->N * p->vl.Tq : (long long)p->B * p->N * p->Sq;
    const unsigned blocks = (unsigned)((rows + 7) / 8);
    if (vl) {
        if (bf16)
            bsa_delta_kernel<__nv_bfloat16, true><<<blocks, 256, 0, st>>>(*p, delta, lse2, z, z16);
        else
            bsa_delta_kernel<__half, true><<<blocks, 256, 0, st>>>(*p, delta, lse2, z, z16);
    } else if (bf16) {
        bsa_delta_kernel<__nv_bfloat16, false><<<blocks, 256, 0, st>>>(*p, delta, lse2, z, z16);
    } else {
        bsa_delta_kernel<__half, false><<<blocks, 256, 0, st>>>(*p, delta, lse2, z, z16);
    }
    return cudaGetLastError();
}
