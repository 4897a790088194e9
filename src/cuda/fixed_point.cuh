// int64 fixed point of the deterministic sfa backward (dK / dQ, sfa_adds.cuh and its conversion
// kernels in sfa_host.cu): a finite value v is added as round(v * 2^F); an integer cannot hold NaN or Inf, so
// a non-finite v sets a bit in its element's flag byte instead (1: +inf, 2: -inf, 4: NaN), and the
// conversion gives NaN for NaN or +inf with -inf, else the infinity (IEEE on the sum).
#pragma once
#include <stdint.h>

// Flags byte i (4 to a 32-bit word) for the non-finite v.
__device__ __forceinline__ void fix_flag(uint32_t *flags, int64_t i, float v) {
    const uint32_t code = v != v ? 4u : v > 0.f ? 1u : 2u;
    atomicOr(flags + (i >> 2), code << (8 * (int)(i & 3)));
}

// The value of a fixed-point accumulator element: sum * inv (inv = 2^-F, times a scale), or what
// its flags say.
__device__ __forceinline__ float fix_value(long long sum, uint8_t flag, float inv) {
    if (flag) return (flag & 4) || (flag & 3) == 3 ? __int_as_float(0x7fc00000) : (flag & 1) ? INFINITY : -INFINITY;
    return (float)((double)sum * (double)inv);
}
