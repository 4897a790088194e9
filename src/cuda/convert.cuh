// Conversions shared by the bsa and sfa hosts: the simple (reference) kernels write contiguous
// fp32 buffers in a tensor's logical order; these copy them into the caller's tensor (fp16, bf16
// or fp32, any strides).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../core/internal.h"

namespace cvt {

// dst[i0, i1, i2, i3] = src[((i0 * n1 + i1) * n2 + i2) * n3 + i3]
static __global__ void f32_to_tensor4(const float *src, void *dst, int dtype, long long s0, long long s1,
                                      long long s2, long long s3, long long n1, long long n2, long long n3,
                                      long long total) {
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < total; x += (long long)gridDim.x * blockDim.x) {
        long long r = x;
        const long long i3 = r % n3;
        r /= n3;
        const long long i2 = r % n2;
        r /= n2;
        const long long i1 = r % n1, i0 = r / n1;
        const long long off = i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3;
        const float v = src[x];
        if (dtype == SPATTN_DTYPE_F16) static_cast<__half *>(dst)[off] = __float2half_rn(v);
        else if (dtype == SPATTN_DTYPE_BF16) static_cast<__nv_bfloat16 *>(dst)[off] = __float2bfloat16_rn(v);
        else static_cast<float *>(dst)[off] = v;
    }
}

// dst[i0, i1, i2] (fp32, strided) = src[(i0 * n1 + i1) * n2 + i2]
static __global__ void f32_to_f32_3(const float *src, float *dst, long long s0, long long s1, long long s2,
                                    long long n1, long long n2, long long total) {
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < total; x += (long long)gridDim.x * blockDim.x) {
        const long long i2 = x % n2, i1 = (x / n2) % n1, i0 = x / (n2 * n1);
        dst[i0 * s0 + i1 * s1 + i2 * s2] = src[x];
    }
}

static inline unsigned grid_of(long long total) {
    const long long b = (total + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b < 65536 ? b : 65536);
}

// A 4-d tensor (fp16 / bf16 / fp32) from a contiguous fp32 buffer of its shape.
static inline cudaError_t to_tensor(const float *src, const spattn_tensor *t, cudaStream_t st) {
    const long long total = t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
    if (total == 0) return cudaSuccess;
    f32_to_tensor4<<<grid_of(total), 256, 0, st>>>(src, t->data, t->dtype, t->strides[0], t->strides[1], t->strides[2],
                                                   t->strides[3], t->shape[1], t->shape[2], t->shape[3], total);
    return cudaGetLastError();
}

// A 3-d fp32 tensor (LSE) from a contiguous fp32 buffer of its shape.
static inline cudaError_t to_tensor3(const float *src, const spattn_tensor *t, cudaStream_t st) {
    const long long total = t->shape[0] * t->shape[1] * t->shape[2];
    if (total == 0) return cudaSuccess;
    f32_to_f32_3<<<grid_of(total), 256, 0, st>>>(src, static_cast<float *>(t->data), t->strides[0], t->strides[1],
                                                 t->strides[2], t->shape[1], t->shape[2], total);
    return cudaGetLastError();
}

}  // namespace cvt
