// Small pieces shared by the GPU check programs (tests/cuda/*_cuda_check.cu): a CUDA error check
// that exits, a seeded generator, and element conversions for fp32 / fp16 / bf16 buffers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "spattn.h"

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

// xorshift64 with uniform, normal and bounded draws (the inputs of the checks, not of the suites)
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
    uint64_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
    double u() { return (double)(next() >> 11) * 0x1.0p-53; }
    double n() {
        double u1 = u(), u2 = u();
        if (u1 < 1e-300) u1 = 1e-300;
        return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
    }
    int64_t below(int64_t m) { return (int64_t)(next() % (uint64_t)m); }
};

static inline size_t esz(int dt) { return dt == SPATTN_DTYPE_F32 ? 4 : 2; }
static inline float round_dt(double x, int dt) {
    if (dt == SPATTN_DTYPE_F16) return __half2float(__float2half_rn((float)x));
    if (dt == SPATTN_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn((float)x));
    return (float)x;
}
static inline void store_dt(void *buf, size_t i, float x, int dt) {
    if (dt == SPATTN_DTYPE_F16) ((__half *)buf)[i] = __float2half_rn(x);
    else if (dt == SPATTN_DTYPE_BF16) ((__nv_bfloat16 *)buf)[i] = __float2bfloat16_rn(x);
    else ((float *)buf)[i] = x;
}
static inline float load_dt(const void *buf, size_t i, int dt) {
    if (dt == SPATTN_DTYPE_F16) return __half2float(((const __half *)buf)[i]);
    if (dt == SPATTN_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)buf)[i]);
    return ((const float *)buf)[i];
}
static inline const char *dt_name(int dt) {
    return dt == SPATTN_DTYPE_F16 ? "fp16" : dt == SPATTN_DTYPE_BF16 ? "bf16" : "fp32";
}

// The eco criterion's tolerances (cases/README.md): an element passes when |a - g| <= atol +
// rtol |g|; a tensor when >= 99 % pass and the largest error is within lim.
struct EcoTol {
    double atol, rtol, lim;
};
static inline EcoTol eco_tol(int dt, bool is_lse) {
    if (is_lse) return {0x1p-16, 0x1p-10, 0.01};
    if (dt == SPATTN_DTYPE_F16) return {0x1p-9, 0x1p-9, 0.1};
    if (dt == SPATTN_DTYPE_BF16) return {0x1p-6, 0x1p-6, 1.0};
    return {0x1p-12, 0x1p-12, 0.01};
}
