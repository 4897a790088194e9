// The online-softmax step and the LSE store of the forwards whose MMA rows are keys (sfa_fwd_small.cu per token,
// sfa_fwd_group.cu per (token, block) of a group): one 64-key block's S^T (m64 x N heads) in a
// consumer warpgroup, turned into P^T in shared memory for O^T += V^T P^T.
#pragma once
#include <math.h>

#include "hopper/hopper.cuh"

namespace sfa {

// st: this thread's scores of the block (st[4 g + 2 rr + h]: key r0 + 8 rr, head 8 g + 2 q4 + h),
// v0 / v1 whether keys r0 / r0 + 8 count (else -inf).  Scales by sl2, takes each head's max over
// the 64 keys (warp shuffles, then the 4 warps' maxima through red [4][N] fp32 and named barrier
// bar_id of the warpgroup's 128 threads), updates the running max m and sums l, rescales O^T (its
// previous P V GEMMs have completed), leaves P^T in st and stores P = (P^T)^T into sP ([N heads]
// [64 keys], 128-byte swizzled rows: the K-major B operand), then fences it for the async proxy
// and syncs bar_id again (the tile is whole, and every read of red is done).
template <typename T, int N, int ND>
__device__ __forceinline__ void keyrows_softmax(float (&st)[N / 2], bool v0, bool v1, float sl2, float *red,
                                                unsigned char *sP, float (&m)[N / 8][2], float (&l)[N / 8][2],
                                                float (&o)[ND][N / 2], int warp, int lane, int r0, int bar_id) {
    constexpr int NJ = N / 8;
    const int q4 = lane & 3;
    float bm[NJ][2];
#pragma unroll
    for (int g = 0; g < NJ; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float &a = st[4 * g + h], &bb = st[4 * g + 2 + h];
            a = v0 ? a * sl2 : -INFINITY;
            bb = v1 ? bb * sl2 : -INFINITY;
            float x = fmaxf(a, bb);
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
            bm[g][h] = x;
        }
    if (lane < 4) {
#pragma unroll
        for (int g = 0; g < NJ; g++)
            *reinterpret_cast<float2 *>(red + warp * N + 8 * g + 2 * q4) = make_float2(bm[g][0], bm[g][1]);
    }
    hop::bar_sync(bar_id, 128);
    float alpha[NJ][2];
#pragma unroll
    for (int g = 0; g < NJ; g++) {
        float2 x = *reinterpret_cast<const float2 *>(red + 8 * g + 2 * q4);
#pragma unroll
        for (int w = 1; w < 4; w++) {
            const float2 y = *reinterpret_cast<const float2 *>(red + w * N + 8 * g + 2 * q4);
            x.x = fmaxf(x.x, y.x);
            x.y = fmaxf(x.y, y.y);
        }
        const float n0 = fmaxf(m[g][0], x.x), n1 = fmaxf(m[g][1], x.y);
        alpha[g][0] = hop::ex2(m[g][0] - n0);
        alpha[g][1] = hop::ex2(m[g][1] - n1);
        m[g][0] = n0;
        m[g][1] = n1;
    }
    // P^T, the running sums, O^T rescaled
#pragma unroll
    for (int g = 0; g < NJ; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float pa = hop::ex2(st[4 * g + h] - m[g][h]), pb = hop::ex2(st[4 * g + 2 + h] - m[g][h]);
            st[4 * g + h] = pa;
            st[4 * g + 2 + h] = pb;
            l[g][h] = l[g][h] * alpha[g][h] + pa + pb;
        }
#pragma unroll
    for (int d = 0; d < ND; d++)
#pragma unroll
        for (int g = 0; g < NJ; g++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                o[d][4 * g + h] *= alpha[g][h];
                o[d][4 * g + 2 + h] *= alpha[g][h];
            }
#pragma unroll
    for (int g = 0; g < NJ; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int col = 8 * g + 2 * q4 + h;
            const uint32_t pk = hop::elt<T>::pack(st[4 * g + h], st[4 * g + 2 + h]);  // rows r0, r0 + 8
            *reinterpret_cast<uint16_t *>(sP + hop::sw128(col, r0 >> 3) + (r0 & 7) * 2) = (uint16_t)(pk & 0xffffu);
            *reinterpret_cast<uint16_t *>(sP + hop::sw128(col, (r0 >> 3) + 1) + (r0 & 7) * 2) = (uint16_t)(pk >> 16);
        }
    hop::fence_proxy_async();
    hop::bar_sync(bar_id, 128);
}

// The LSE of this thread's columns (heads head0 + 8 g + 2 q4 + h < head0 + nh) from their base-2
// max mf and sum lf: ln(l) + m ln 2; a head without keys -inf, a NaN sum NaN.  lse: the token's
// row, stride ls2 between heads.
template <int N>
__device__ __forceinline__ void keyrows_store_lse(float *lse, int64_t ls2, int head0, int nh, int q4,
                                                  const float (&mf)[N / 8][2], const float (&lf)[N / 8][2]) {
#pragma unroll
    for (int g = 0; g < N / 8; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int col = 8 * g + 2 * q4 + h;
            const float ll = lf[g][h];
            if (col < nh)
                lse[(int64_t)(head0 + col) * ls2] =
                    ll > 0.f ? (mf[g][h] + log2f(ll)) * 0.69314718055994531f : ll == 0.f ? -INFINITY : ll;
        }
}

}  // namespace sfa
