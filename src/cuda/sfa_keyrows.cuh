// The online-softmax step and the LSE store of the forwards whose MMA rows are keys (sfa_fwd_small.cu per token,
// sfa_fwd_group.cu per (token, block) of a group): one 64-key block's S^T (m64 x N heads) in a
// consumer warpgroup, turned into P^T in shared memory for O^T += V^T P^T.
#pragma once
#include <math.h>

#include "hopper/hopper.cuh"

namespace sfa {

// st: this thread's scores of the block (st[4 g + 2 rr + h]: key r0 + 8 rr, head 8 g + 2 q4 + h),
// v0 / v1 whether keys r0 / r0 + 8 count (else -inf).  The parts keyrows_softmax_voted runs when
// the max moves: keyrows_max takes each head's max over the 64 keys of the scaled scores (warp
// shuffles, then the 4 warps' maxima through red [4][N] fp32 and named barrier bar_id of the
// warpgroup's 128 threads) and updates the running max m, giving the rescale factors alpha.
template <int N>
__device__ __forceinline__ void keyrows_max(const float (&st)[N / 2], float *red, float (&m)[N / 8][2],
                                            float (&alpha)[N / 8][2], int warp, int lane, int bar_id) {
    constexpr int NJ = N / 8;
    const int q4 = lane & 3;
    float bm[NJ][2];
#pragma unroll
    for (int g = 0; g < NJ; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float x = fmaxf(st[4 * g + h], st[4 * g + 2 + h]);
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
}
// O^T and the sums l rescaled (O^T's previous P V GEMMs have completed)
template <int N, int ND>
__device__ __forceinline__ void keyrows_rescale(float (&o)[ND][N / 2], float (&l)[N / 8][2], const float (&alpha)[N / 8][2]) {
#pragma unroll
    for (int g = 0; g < N / 8; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            l[g][h] *= alpha[g][h];
#pragma unroll
            for (int d = 0; d < ND; d++) {
                o[d][4 * g + h] *= alpha[g][h];
                o[d][4 * g + 2 + h] *= alpha[g][h];
            }
        }
}

// P = (P^T)^T into a token's P tile ([N heads][64 keys], 128-byte swizzled rows, 1024-byte
// aligned) by stmatrix.trans: P^T's 8 x 8 pieces (keys 16 warp + 8 rr .., heads 8 g ..; piece
// mi = 2 g + rr is the fragment register pack(p[2 mi], p[2 mi + 1])) stored transposed, lane i
// giving row i % 8 of piece i / 8 (of the call's four).  off: this thread's row addresses within
// a tile, the same for every tile.
template <typename T, int N> struct PTrans {
    static constexpr int NX = N >= 16 ? N / 16 : 1;  // stmatrix calls (x4; one x2 at N 8)
    uint32_t off[NX];
    __device__ __forceinline__ PTrans(int warp, int lane) {
#pragma unroll
        for (int k = 0; k < NX; k++) {
            const int mi = 4 * k + ((lane >> 3) & (N >= 16 ? 3 : 1));
            off[k] = hop::sw128(8 * (mi >> 1) + (lane & 7), 2 * warp + (mi & 1));
            hop::opaque(off[k]);
        }
    }
    __device__ __forceinline__ void store(const float (&p)[N / 2], uint32_t tile) const {
        using E = hop::elt<T>;
        if constexpr (N == 8) {
            hop::stmatrix_x2_trans(tile + off[0], E::pack(p[0], p[1]), E::pack(p[2], p[3]));
        } else {
#pragma unroll
            for (int k = 0; k < NX; k++)
                hop::stmatrix_x4_trans(tile + off[k], E::pack(p[8 * k], p[8 * k + 1]), E::pack(p[8 * k + 2], p[8 * k + 3]),
                                       E::pack(p[8 * k + 4], p[8 * k + 5]), E::pack(p[8 * k + 6], p[8 * k + 7]));
        }
    }
};

// The step keeping the running max where it may stay (FA's lazy rescale), with one barrier a
// block in the common case: P^T = exp2(s sl2 - m) from the kept max, stored (pt) and fenced, then
// one barrier reduction over the warpgroup both publishes the tile and asks whether any score
// passed its column's max by more than LAZY_TAU (base 2).  Only then the exchange of the full
// step (keyrows_max), O^T and l rescaled, P^T again from the new max, stored, and bar_id again.
// Otherwise P^T <= 2^LAZY_TAU, within fp16's range, at fp32's relative precision.  A token's
// first block with keys always exchanges (m starts at -1e30); a NaN score is ignored by the
// vote and propagates through P as in the full step; an infinite one exchanges (m inf, P NaN).
// red needs no second buffer: the closing barrier orders its reads before the next exchange.
constexpr float LAZY_TAU = 8.f;
template <typename T, int N, int ND>
__device__ __forceinline__ void keyrows_softmax_voted(float (&st)[N / 2], bool v0, bool v1, float sl2, float *red,
                                                      const PTrans<T, N> &pt, uint32_t tile, float (&m)[N / 8][2],
                                                      float (&l)[N / 8][2], float (&o)[ND][N / 2], int warp, int lane,
                                                      int bar_id) {
    constexpr int NJ = N / 8;
    float x[N / 2];
    float top = -INFINITY;
#pragma unroll
    for (int g = 0; g < NJ; g++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int i = 4 * g + 2 * rr + h;
                st[i] = (rr ? v1 : v0) ? st[i] : -INFINITY;
                x[i] = fmaf(st[i], sl2, -m[g][h]);
                top = fmaxf(top, x[i]);
            }
#pragma unroll
    for (int i = 0; i < N / 2; i++) x[i] = hop::ex2(x[i]);
    pt.store(x, tile);
    hop::fence_proxy_async();
    if (hop::bar_red_or(top > LAZY_TAU, bar_id, 128)) {  // the same answer in the warpgroup's 128 threads
#pragma unroll
        for (int i = 0; i < N / 2; i++) st[i] *= sl2;
        float alpha[NJ][2];
        keyrows_max<N>(st, red, m, alpha, warp, lane, bar_id);
        keyrows_rescale<N, ND>(o, l, alpha);
#pragma unroll
        for (int g = 0; g < NJ; g++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                x[4 * g + h] = hop::ex2(st[4 * g + h] - m[g][h]);
                x[4 * g + 2 + h] = hop::ex2(st[4 * g + 2 + h] - m[g][h]);
            }
        pt.store(x, tile);
        hop::fence_proxy_async();
        hop::bar_sync(bar_id, 128);
    }
#pragma unroll
    for (int g = 0; g < NJ; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) l[g][h] += x[4 * g + h] + x[4 * g + 2 + h];
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
