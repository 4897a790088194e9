/*
 * Scalar fp16 / bf16 <-> fp32 conversions (round to nearest even), header-only so that every
 * backend file and the tools share one definition.  Vectorized conversions live in the SIMD
 * mapping header of the CPU backend.
 */
#ifndef SPATTN_DTYPE_H
#define SPATTN_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "spattn.h"

static inline float spattn_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t spattn_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float spattn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t spattn_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);     /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);    /* overflow -> inf */
    if (a < 0x38800000u) {                                      /* subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;             /* < half of min subnormal */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;                               /* 14 + (113 - e) - 1 ... */
        /* value = m * 2^(e-150); half subnormal unit = 2^-24 -> result = m >> (126 - e) */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 (in the shifted space) */
    uint32_t mant_round = (r >> 13) & 1u;
    r += 0xfffu + mant_round;
    return (uint16_t)(sign | (r >> 13));
}

/* Load element `i` (element offset) of a float tensor of dtype `dt` as fp32. */
static inline float spattn_load_f32(const void *base, int32_t dt, int64_t i) {
    switch (dt) {
    case SPATTN_DTYPE_F16: return spattn_f16_to_f32(((const uint16_t *)base)[i]);
    case SPATTN_DTYPE_BF16: return spattn_bf16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

/* Store fp32 value `x` as element `i` of a float tensor of dtype `dt` (rounded to nearest even). */
static inline void spattn_store_f32(void *base, int32_t dt, int64_t i, float x) {
    switch (dt) {
    case SPATTN_DTYPE_F16: ((uint16_t *)base)[i] = spattn_f32_to_f16(x); break;
    case SPATTN_DTYPE_BF16: ((uint16_t *)base)[i] = spattn_f32_to_bf16(x); break;
    default: ((float *)base)[i] = x; break;
    }
}

#endif
