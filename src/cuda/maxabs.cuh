// max |x| over the finite elements of a 4-d tensor, into a float stored as its bits (non-negative
// floats order as their bits: atomicMax on the uint).  The bound of the fixed-point (int64)
// accumulations of the sfa backward (dK / dQ, sfa_host.cu).
// Non-finite elements are left out: the sums they reach carry flags instead, and an infinite
// maximum would zero every finite contribution.  The caller zeroes *out first.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../core/internal.h"

namespace {

// row r of [n0, n1, n2] -> (a, b, c); narrow (r < 2^31): 32-bit divisions (64-bit ones cost
// ~100 instructions each; shared with sfa_host.cu's conversion kernels)
__device__ __forceinline__ void conv_row(int64_t r, int64_t n1, int64_t n2, bool narrow, int64_t &a, int64_t &b, int64_t &c) {
    if (narrow) {
        const unsigned t = (unsigned)r / (unsigned)n2;
        c = (int64_t)((unsigned)r - t * (unsigned)n2);
        const unsigned u = t / (unsigned)n1;
        b = (int64_t)(t - u * (unsigned)n1);
        a = u;
    } else {
        const int64_t t = r / n2;
        c = r - t * n2;
        a = t / n1;
        b = t - a * n1;
    }
}

__device__ __forceinline__ float maxabs_f(float x) { return fabsf(x); }
__device__ __forceinline__ float maxabs_f(__half x) { return fabsf(__half2float(x)); }
__device__ __forceinline__ float maxabs_f(__nv_bfloat16 x) { return fabsf(__bfloat162float(x)); }

// One warp per row of n3 elements; vec: unit last stride, rows 16-byte aligned and n3 % 8 == 0,
// so 16-byte loads (the scalar form ran at a third of the memory bandwidth: ncu, sfa07, 1.1 ms of
// a 25 ms backward).
template <typename T>
__global__ void maxabs_kernel(const T *x, int64_t n0, int64_t n1, int64_t n2, int64_t n3, int64_t s0, int64_t s1,
                              int64_t s2, int64_t s3, int vec, unsigned *out) {
    const int lane = threadIdx.x & 31;
    const int64_t rows = n0 * n1 * n2, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const bool narrow = rows < (1LL << 31);  // 32-bit divisions (four 64-bit ones per row and lane cost more than the row's loads)
    float m = 0.f;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        int64_t c, bb, a;
        conv_row(r, n1, n2, narrow, a, bb, c);
        const T *rowp = x + a * s0 + bb * s1 + c * s2;
        if (vec) {
            for (int64_t j = lane * 8; j < n3; j += 256) {
                const uint4 v = *reinterpret_cast<const uint4 *>(rowp + j);
                const T *e = reinterpret_cast<const T *>(&v);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const float f = maxabs_f(e[i]);
                    if (f <= 3.4e38f) m = fmaxf(m, f);
                }
            }
        } else {
            for (int64_t j = lane; j < n3; j += 32) {
                const float f = maxabs_f(rowp[j * s3]);
                if (f <= 3.4e38f) m = fmaxf(m, f);
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    // one atomic per CTA: with a warp's atomic each, tensors of few rows (k, v of a few key
    // heads: every warp one row, all at once) serialised on the one word (H200: 57 us for 16K rows)
    __shared__ float wm[32];
    if (lane == 0) wm[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, wm[w]);
        atomicMax(out, __float_as_uint(m));
    }
}

}  // namespace

template <typename T>
inline void spattn_launch_maxabs(const spattn_tensor *t, unsigned *out, cudaStream_t st) {
    const int vec = sizeof(T) == 2 && t->strides[3] == 1 && t->shape[3] % 8 == 0 && t->strides[0] % 8 == 0 &&
                    t->strides[1] % 8 == 0 && t->strides[2] % 8 == 0 && (uintptr_t)t->data % 16 == 0;
    int64_t g = (t->shape[0] * t->shape[1] * t->shape[2] * 32 + 255) / 256;  // a warp per row
    g = g < 1 ? 1 : g > 132 * 32 ? 132 * 32 : g;
    maxabs_kernel<T><<<(unsigned)g, 256, 0, st>>>((const T *)t->data, t->shape[0], t->shape[1], t->shape[2],
                                                  t->shape[3], t->strides[0], t->strides[1], t->strides[2],
                                                  t->strides[3], vec, out);
}
