/*
 * The one SIMD mapping header of the CPU backend.
 *
 * A kernel file defines exactly one ISA macro, then includes this header (and usually a
 * shared kernel body, e.g. bsa_kernels.inc), so every ISA variant is generated from one source:
 *
 *   SPATTN_ISA_AVX512   16 fp32 lanes, __m512 (file must be named *_avx512.c: CMake adds
 *                       -mavx512f/bw/vl/dq -mfma -mf16c)
 *   SPATTN_ISA_AVX2     8 lanes, __m256 (file *_avx2.c: -mavx2 -mfma -mf16c)
 *   SPATTN_ISA_GENERIC  8 lanes, portable C (a struct of floats; the compiler auto-vectorizes)
 *
 * Provided (all static inline, so each variant's file gets its own copy):
 *   SPATTN_VW                  lanes per vector;  SPATTN_ISA_FN(name) -> name_<isa>
 *   SPATTN_ISA_NAME            "avx512" | "avx2" | "generic"
 *   spv_t                      the vector type
 *   spv_load/spv_store         unaligned load/store of SPATTN_VW floats
 *   spv_set1, spv_zero         broadcast
 *   spv_add/sub/mul/max/min    lane-wise
 *   spv_fma(a, b, c)           a * b + c (fused where the ISA has it)
 *   spv_lt_select(a, b, x, y)  lane-wise (a < b) ? x : y   (false for NaN)
 *   spv_exp(x)                 e^x, relative error ~1e-7 for x in [-87.3, 88.3]; 0 below
 *                              (exp(-inf) = 0), never NaN for finite or -inf input;
 *                              NaN for NaN (so a NaN score reaches the row sum)
 *   spv_hsum, spv_hmax         horizontal sum / max (fixed order: deterministic)
 *   spv_cvt_{f16,bf16}_f32(src, dst, n) and spv_cvt_f32_{f16,bf16}(src, dst, n):
 *                              contiguous row converters (round to nearest even; F16C /
 *                              AVX-512 where available, the scalar code of core/dtype.h
 *                              otherwise and for the tails)
 */
#ifndef SPATTN_CPU_SIMD_H
#define SPATTN_CPU_SIMD_H

#include <float.h>
#include <stdint.h>
#include <string.h>

#include "../core/dtype.h"

#if (defined(SPATTN_ISA_AVX512) + defined(SPATTN_ISA_AVX2) + defined(SPATTN_ISA_GENERIC)) != 1
#error "define exactly one of SPATTN_ISA_AVX512, SPATTN_ISA_AVX2, SPATTN_ISA_GENERIC before simd.h"
#endif

#define SPATTN_ISA_CAT_(a, b) a##b
#define SPATTN_ISA_CAT(a, b) SPATTN_ISA_CAT_(a, b)

/* ======================================================================================== */
#if defined(SPATTN_ISA_AVX512)
#include <immintrin.h>
#define SPATTN_VW 16
#define SPATTN_ISA_NAME "avx512"
#define SPATTN_ISA_FN(name) SPATTN_ISA_CAT(name, _avx512)
typedef __m512 spv_t;

static inline spv_t spv_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void spv_store(float *p, spv_t v) { _mm512_storeu_ps(p, v); }
static inline spv_t spv_set1(float x) { return _mm512_set1_ps(x); }
static inline spv_t spv_zero(void) { return _mm512_setzero_ps(); }
static inline spv_t spv_add(spv_t a, spv_t b) { return _mm512_add_ps(a, b); }
static inline spv_t spv_sub(spv_t a, spv_t b) { return _mm512_sub_ps(a, b); }
static inline spv_t spv_mul(spv_t a, spv_t b) { return _mm512_mul_ps(a, b); }
static inline spv_t spv_max(spv_t a, spv_t b) { return _mm512_max_ps(a, b); }
static inline spv_t spv_min(spv_t a, spv_t b) { return _mm512_min_ps(a, b); }
static inline spv_t spv_fma(spv_t a, spv_t b, spv_t c) { return _mm512_fmadd_ps(a, b, c); }
static inline spv_t spv_lt_select(spv_t a, spv_t b, spv_t x, spv_t y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
}
static inline spv_t spv_round_(spv_t x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* p * 2^n for integral n in [-126, 127] */
static inline spv_t spv_ldexp_(spv_t p, spv_t n) { return _mm512_scalef_ps(p, n); }
static inline float spv_hsum(spv_t v) { return _mm512_reduce_add_ps(v); }
static inline float spv_hmax(spv_t v) { return _mm512_reduce_max_ps(v); }

static inline void spv_cvt_f16_f32(const uint16_t *s, float *d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    for (; i < n; i++) d[i] = spattn_f16_to_f32(s[i]);
}
static inline void spv_cvt_f32_f16(const float *s, uint16_t *d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = spattn_f32_to_f16(s[i]);
}
static inline void spv_cvt_bf16_f32(const uint16_t *s, float *d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
        _mm512_storeu_ps(d + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
    for (; i < n; i++) d[i] = spattn_bf16_to_f32(s[i]);
}
static inline void spv_cvt_f32_bf16(const float *s, uint16_t *d, int64_t n) {
    int64_t i = 0;
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    for (; i + 16 <= n; i += 16) {
        __m512 f = _mm512_loadu_ps(s + i);
        __m512i u = _mm512_castps_si512(f);
        __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        r = _mm512_srli_epi32(r, 16);
        /* NaN: keep it a quiet NaN instead of rounding into Inf */
        __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) d[i] = spattn_f32_to_bf16(s[i]);
}

/* ======================================================================================== */
#elif defined(SPATTN_ISA_AVX2)
#include <immintrin.h>
#define SPATTN_VW 8
#define SPATTN_ISA_NAME "avx2"
#define SPATTN_ISA_FN(name) SPATTN_ISA_CAT(name, _avx2)
typedef __m256 spv_t;

static inline spv_t spv_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void spv_store(float *p, spv_t v) { _mm256_storeu_ps(p, v); }
static inline spv_t spv_set1(float x) { return _mm256_set1_ps(x); }
static inline spv_t spv_zero(void) { return _mm256_setzero_ps(); }
static inline spv_t spv_add(spv_t a, spv_t b) { return _mm256_add_ps(a, b); }
static inline spv_t spv_sub(spv_t a, spv_t b) { return _mm256_sub_ps(a, b); }
static inline spv_t spv_mul(spv_t a, spv_t b) { return _mm256_mul_ps(a, b); }
static inline spv_t spv_max(spv_t a, spv_t b) { return _mm256_max_ps(a, b); }
static inline spv_t spv_min(spv_t a, spv_t b) { return _mm256_min_ps(a, b); }
static inline spv_t spv_fma(spv_t a, spv_t b, spv_t c) { return _mm256_fmadd_ps(a, b, c); }
static inline spv_t spv_lt_select(spv_t a, spv_t b, spv_t x, spv_t y) {
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
static inline spv_t spv_round_(spv_t x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline spv_t spv_ldexp_(spv_t p, spv_t n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline float spv_hsum(spv_t v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float spv_hmax(spv_t v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline void spv_cvt_f16_f32(const uint16_t *s, float *d, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = spattn_f16_to_f32(s[i]);
}
static inline void spv_cvt_f32_f16(const float *s, uint16_t *d, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = spattn_f32_to_f16(s[i]);
}
static inline void spv_cvt_bf16_f32(const uint16_t *s, float *d, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) d[i] = spattn_bf16_to_f32(s[i]);
}
static inline void spv_cvt_f32_bf16(const float *s, uint16_t *d, int64_t n) {
    /* Stores are O(S*D) per call, far below the O(S^2*D) compute: scalar is fine here. */
    for (int64_t i = 0; i < n; i++) d[i] = spattn_f32_to_bf16(s[i]);
}

/* ======================================================================================== */
#else /* SPATTN_ISA_GENERIC */
#define SPATTN_VW 8
#define SPATTN_ISA_NAME "generic"
#define SPATTN_ISA_FN(name) SPATTN_ISA_CAT(name, _generic)
typedef struct spv_t { float v[SPATTN_VW]; } spv_t;

#define SPV_MAP1(expr)                                                                   \
    spv_t r_;                                                                            \
    for (int l_ = 0; l_ < SPATTN_VW; l_++) r_.v[l_] = (expr);                            \
    return r_

static inline spv_t spv_load(const float *p) { spv_t r; memcpy(r.v, p, sizeof r.v); return r; }
static inline void spv_store(float *p, spv_t v) { memcpy(p, v.v, sizeof v.v); }
static inline spv_t spv_set1(float x) { SPV_MAP1(x); }
static inline spv_t spv_zero(void) { SPV_MAP1(0.0f); }
static inline spv_t spv_add(spv_t a, spv_t b) { SPV_MAP1(a.v[l_] + b.v[l_]); }
static inline spv_t spv_sub(spv_t a, spv_t b) { SPV_MAP1(a.v[l_] - b.v[l_]); }
static inline spv_t spv_mul(spv_t a, spv_t b) { SPV_MAP1(a.v[l_] * b.v[l_]); }
static inline spv_t spv_max(spv_t a, spv_t b) { SPV_MAP1(a.v[l_] > b.v[l_] ? a.v[l_] : b.v[l_]); }
static inline spv_t spv_min(spv_t a, spv_t b) { SPV_MAP1(a.v[l_] < b.v[l_] ? a.v[l_] : b.v[l_]); }
/* Not fused on purpose: a libm fmaf call per lane would be far slower than mul + add. */
static inline spv_t spv_fma(spv_t a, spv_t b, spv_t c) { SPV_MAP1(a.v[l_] * b.v[l_] + c.v[l_]); }
static inline spv_t spv_lt_select(spv_t a, spv_t b, spv_t x, spv_t y) {
    SPV_MAP1(a.v[l_] < b.v[l_] ? x.v[l_] : y.v[l_]);
}
/* Round to nearest even with the 1.5*2^23 trick (valid for |x| < 2^22, which exp ensures). */
static inline spv_t spv_round_(spv_t x) {
    SPV_MAP1((x.v[l_] + 12582912.0f) - 12582912.0f);
}
static inline spv_t spv_ldexp_(spv_t p, spv_t n) {
    spv_t r;
    for (int l = 0; l < SPATTN_VW; l++) {
        float nl = n.v[l] == n.v[l] ? n.v[l] : 0.0f; /* NaN: p is NaN anyway; no UB cast */
        uint32_t e = (uint32_t)((int32_t)nl + 127) << 23;
        float f;
        memcpy(&f, &e, 4);
        r.v[l] = p.v[l] * f;
    }
    return r;
}
static inline float spv_hsum(spv_t v) {
    /* pairwise, same tree shape as the SIMD variants' reductions */
    float a[SPATTN_VW];
    memcpy(a, v.v, sizeof a);
    for (int w = SPATTN_VW / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) a[l] += a[l + w];
    return a[0];
}
static inline float spv_hmax(spv_t v) {
    float m = v.v[0];
    for (int l = 1; l < SPATTN_VW; l++) m = v.v[l] > m ? v.v[l] : m;
    return m;
}
static inline void spv_cvt_f16_f32(const uint16_t *s, float *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = spattn_f16_to_f32(s[i]);
}
static inline void spv_cvt_f32_f16(const float *s, uint16_t *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = spattn_f32_to_f16(s[i]);
}
static inline void spv_cvt_bf16_f32(const uint16_t *s, float *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = spattn_bf16_to_f32(s[i]);
}
static inline void spv_cvt_f32_bf16(const float *s, uint16_t *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = spattn_f32_to_bf16(s[i]);
}
#undef SPV_MAP1
#endif

/* ======================================================================================== */
/* ISA-independent code built on the primitives above.                                      */

/* e^x = 2^n * e^r with n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2] (ln2 split in a
 * hi and a lo part so r is exact to ~1 ulp), e^r by its degree-7 Taylor polynomial (truncation
 * error < 1e-8 on that interval).  Inputs are clamped so 2^n stays a normal number; below
 * -87.33 (where e^x is subnormal) the result is 0, which also maps -inf to 0 without NaN.
 * x is the SECOND operand of max and min: x86 max/min return their second operand when one is
 * NaN (and the generic a > b ? a : b does the same), so NaN passes through the clamp. */
static inline spv_t spv_exp(spv_t x) {
    const spv_t lo = spv_set1(-87.33654f);
    spv_t xc = spv_min(spv_set1(88.3f), spv_max(lo, x));
    spv_t n = spv_round_(spv_mul(xc, spv_set1(1.44269504088896341f)));
    spv_t r = spv_fma(n, spv_set1(-0.693145751953125f), xc);
    r = spv_fma(n, spv_set1(-1.428606765330187045e-06f), r);
    spv_t p = spv_set1(1.0f / 5040.0f);
    p = spv_fma(p, r, spv_set1(1.0f / 720.0f));
    p = spv_fma(p, r, spv_set1(1.0f / 120.0f));
    p = spv_fma(p, r, spv_set1(1.0f / 24.0f));
    p = spv_fma(p, r, spv_set1(1.0f / 6.0f));
    p = spv_fma(p, r, spv_set1(0.5f));
    p = spv_fma(p, r, spv_set1(1.0f));
    p = spv_fma(p, r, spv_set1(1.0f));
    return spv_lt_select(x, lo, spv_zero(), spv_ldexp_(p, n));
}

#endif
