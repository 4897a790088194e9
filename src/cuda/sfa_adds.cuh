// Adds of fp32 tiles into the sfa backward's global accumulators (sfa_bwd90.cu, sfa_bwd_small.cu):
// deterministic = 1: fixed point (value * 2^F rounded; integer adds are exact and order-free, so
// the sum is bitwise reproducible), packed int32 pairs with exact row bounds in the token-major,
// union and varlen forms (add_box_p32, add_row_bound), int64 in the key-major form (add_box<1>,
// add_fix); deterministic = 0: fp32 reductions.
#pragma once
#include <float.h>

#include "fixed_point.cuh"
#include "sfa_common.cuh"

namespace sfa {

__device__ __forceinline__ void red_add_f32(float *a, float x) {
    asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(a), "f"(x) : "memory");
}
__device__ __forceinline__ void red_add_v2(float *addr, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void red_add_v4(float *a, float x, float y, float z, float w) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(a), "f"(x), "f"(y), "f"(z), "f"(w)
                 : "memory");
}
__device__ __forceinline__ void red_add_u64(unsigned long long *a, unsigned long long x) {
    asm volatile("red.global.add.u64 [%0], %1;\n" ::"l"(a), "l"(x) : "memory");
}
// Fixed-point add of v * fs to acc[i] (fixed_point.cuh: a non-finite v sets its flag byte instead;
// finite values never reach the flags: one predicated branch, non-finite inputs are the rare case).
__device__ __forceinline__ void add_fix(unsigned long long *acc, uint32_t *flags, int64_t i, float v, float fs) {
    if (isfinite(v)) red_add_u64(acc + i, (unsigned long long)__float2ll_rn(v * fs));
    else fix_flag(flags, i, v);
}
// Packed int32 fixed point: this thread's column pair (8 j + 2 q4, + 1) of a row as the two int32
// lanes of one 64-bit integer add, v = lo + hi 2^32 (mod 2^64).  The sum of such words is
// (sum lo) + 2^32 (sum hi) mod 2^64, so each lane's true sum comes back exactly from the word
// while it lies in int32 (sfa_host.cu, conv_pair): integer adds are exact and order-free, so the
// result is bitwise reproducible, at the 4 bytes per element of fp32 adds instead of int64's 8.
// Whether every lane's sum stayed in range is known from the row bounds: per key row, for each
// add of a CTA's rows, (max over the columns it added of |v| 2^F, rounded down) + 1 >=
// |round(v 2^F)| of each of them (add_row_bound, one add per row and consumer warpgroup after
// its boxes), so a row bound < 2^31 means no column of the row left int32 (sfa_host.cu retries
// with a smaller F otherwise).  p.acc_p32 NULL (the probe pass): the bounds only.
__device__ __forceinline__ unsigned long long p32_word(float x0, float x1, float fs) {
    const int lo = __float2int_rn(x0 * fs), hi = __float2int_rn(x1 * fs);  // saturating: the bound flags it
    return (unsigned long long)(long long)lo + ((unsigned long long)(unsigned)hi << 32);
}
// ma / mb: this thread's running max |v| of rows ka / kb over the finite values (a non-finite
// value is flagged and its lane adds 0)
__device__ __forceinline__ void add_box_p32(const Params &p, const float (&a)[32], int ka, int kb, int lane,
                                            int64_t base, int col0, float fs, float &ma, float &mb) {
    const int q4 = lane & 3;
    const int64_t ra = base + (int64_t)max(ka, 0) * p.N2 * DQK, rb = base + (int64_t)max(kb, 0) * p.N2 * DQK;
    bool fin = true;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const float x = fabsf(a[i]);
        const bool f = x <= FLT_MAX;  // false for NaN and +-inf
        fin &= f;
        if (i & 2) mb = fmaxf(mb, f ? x : 0.f);
        else ma = fmaxf(ma, f ? x : 0.f);
    }
    if (!p.acc_p32) return;
    if (__all_sync(0xffffffffu, fin)) {
        unsigned long long *pa = reinterpret_cast<unsigned long long *>(p.acc_p32 + ra + col0 + 2 * q4);
        unsigned long long *pb = reinterpret_cast<unsigned long long *>(p.acc_p32 + rb + col0 + 2 * q4);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (ka >= 0) red_add_u64(pa + 4 * j, p32_word(a[4 * j], a[4 * j + 1], fs));
            if (kb >= 0) red_add_u64(pb + 4 * j, p32_word(a[4 * j + 2], a[4 * j + 3], fs));
        }
        return;
    }
#pragma unroll 1
    for (int h = 0; h < 2; h++) {  // some value is not finite: it sets its flag, the lane adds 0
        const int kk = h ? kb : ka;
        if (kk < 0) continue;
        const int64_t i0 = (h ? rb : ra) + col0 + 2 * q4;
#pragma unroll
        for (int j = 0; j < 8; j++) {  // selects, not a[.. h]: a stays in registers
            float x0 = h ? a[4 * j + 2] : a[4 * j], x1 = h ? a[4 * j + 3] : a[4 * j + 1];
            if (!(fabsf(x0) <= FLT_MAX)) {
                fix_flag(p.acc_flags, i0 + 8 * j, x0);
                x0 = 0.f;
            }
            if (!(fabsf(x1) <= FLT_MAX)) {
                fix_flag(p.acc_flags, i0 + 8 * j + 1, x1);
                x1 = 0.f;
            }
            red_add_u64(reinterpret_cast<unsigned long long *>(p.acc_p32 + i0 + 8 * j), p32_word(x0, x1, fs));
        }
    }
}
// After a consumer's boxes of a block: the quad's max per row, one add per row (lane q4 = 0: row
// ka, 1: row kb) into p.acc_bound [rows], row = base / 576 + key N2; the probe's first pass
// (p.fix_scale NULL: no F yet) keeps each row's largest max instead (u32 float bits)
__device__ __forceinline__ void add_row_bound(const Params &p, int ka, int kb, int lane, int64_t base, float fs,
                                              float ma, float mb) {
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, 1));
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, 2));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
    const int q4 = lane & 3, kk = q4 ? kb : ka;
    if (q4 >= 2 || kk < 0) return;
    const int64_t r = base / DQK + (int64_t)kk * p.N2;
    const float m = q4 ? mb : ma;
    if (p.fix_scale) red_add_u64(p.acc_bound + r, (unsigned long long)fminf(m * fs, 1.0e13f) + 1ull);
    else atomicMax(reinterpret_cast<unsigned *>(p.acc_bound) + r, __float_as_uint(m));  // m >= 0: bits order as values
}

// One 64-row x 64-column fp32 tile in the wgmma m64n64 accumulator layout (this thread: rows
// r0 = 16 warp + lane / 4 and r0 + 8, columns 8 j + 2 (lane % 4) (+1)) added to the dK accumulator
// [B, S2, N2, 576] (p.acc_i64 or p.acc_f32): row r0 to key ka, row r0 + 8 to key kb (< 0: nothing),
// columns col0.. of the row that starts at base + key * N2 * 576.  DET: -1 = follow p (acc_i64 set),
// 0 / 1 = known at compile time (callers that branch once for many boxes).
template <int DET = -1>
__device__ __forceinline__ void add_box(const Params &p, const float (&a)[32], int ka, int kb, int lane, int64_t base,
                                        int col0, float fs) {
    const int q4 = lane & 3;
    if (DET == 1 || (DET == -1 && p.acc_i64)) {
        // one 32-byte sector per quad and instruction: lane q adds columns q and q + 4 of each
        // 8-column group (values regrouped by quad shuffles)
        const int src1 = (lane & ~3) | (q4 >> 1), src2 = src1 + 2;
        // Common case, all 64 x 64 values finite (one vote per box): straight-line code, row
        // pointers formed once, column offsets immediate: ~6 instructions per element instead of
        // ~25 with a per-element branch (ncu, sfa07: the per-element form made the consumer code
        // too large for the instruction cache, a third of all stall samples were no_instruction)
        bool fin = true;
#pragma unroll
        for (int i = 0; i < 32; i++) fin &= fabsf(a[i]) <= FLT_MAX;  // false for NaN and +-inf
        if (__all_sync(0xffffffffu, fin)) {
            unsigned long long *pa = p.acc_i64 + base + (int64_t)max(ka, 0) * p.N2 * DQK + col0 + q4;
            unsigned long long *pb = p.acc_i64 + base + (int64_t)max(kb, 0) * p.N2 * DQK + col0 + q4;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                unsigned long long *d = h ? pb : pa;
                const bool ok = (h ? kb : ka) >= 0;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float x0 = a[4 * j + 2 * h], x1 = a[4 * j + 2 * h + 1];
                    const float a0 = __shfl_sync(0xffffffffu, x0, src1), a1 = __shfl_sync(0xffffffffu, x1, src1);
                    const float c0 = __shfl_sync(0xffffffffu, x0, src2), c1 = __shfl_sync(0xffffffffu, x1, src2);
                    if (ok) {
                        red_add_u64(d + 8 * j, (unsigned long long)__float2ll_rn((q4 & 1 ? a1 : a0) * fs));
                        red_add_u64(d + 8 * j + 4, (unsigned long long)__float2ll_rn((q4 & 1 ? c1 : c0) * fs));
                    }
                }
            }
            return;
        }
#pragma unroll 1
        for (int h = 0; h < 2; h++) {  // some value is not finite: the flags too (rare, kept small)
            const int kk = h ? kb : ka;
            const int64_t i0 = base + (int64_t)max(kk, 0) * p.N2 * DQK + col0 + q4;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float x0 = h ? a[4 * j + 2] : a[4 * j], x1 = h ? a[4 * j + 3] : a[4 * j + 1];
                const float a0 = __shfl_sync(0xffffffffu, x0, src1), a1 = __shfl_sync(0xffffffffu, x1, src1);
                const float c0 = __shfl_sync(0xffffffffu, x0, src2), c1 = __shfl_sync(0xffffffffu, x1, src2);
                if (kk >= 0) {
                    add_fix(p.acc_i64, p.acc_flags, i0 + 8 * j, q4 & 1 ? a1 : a0, fs);
                    add_fix(p.acc_i64, p.acc_flags, i0 + 8 * j + 4, q4 & 1 ? c1 : c0, fs);
                }
            }
        }
    } else {
        // lane pairs swap halves: the even lane adds 4 columns of row r0, the odd one of r0 + 8
        const bool odd = q4 & 1;
        const int kk = odd ? kb : ka;
        float *dst = p.acc_f32 + base + (int64_t)max(kk, 0) * p.N2 * DQK + col0 + 2 * (q4 & 2);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float s0 = odd ? a[4 * j] : a[4 * j + 2], s1 = odd ? a[4 * j + 1] : a[4 * j + 3];
            const float r0v = __shfl_xor_sync(0xffffffffu, s0, 1), r1v = __shfl_xor_sync(0xffffffffu, s1, 1);
            if (kk >= 0) {
                if (odd) red_add_v4(dst + 8 * j, r0v, r1v, a[4 * j + 2], a[4 * j + 3]);
                else red_add_v4(dst + 8 * j, a[4 * j], a[4 * j + 1], r0v, r1v);
            }
        }
    }
}

}  // namespace sfa
