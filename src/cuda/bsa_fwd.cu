// Block-sparse attention forward (FA2 style): one CTA per (query tile, head, batch), 4 warps x
// 32 query rows (two 16-row mma tiles per warp); the CTA walks its query tile's schedule (key
// tiles marked full or partial, built on the device by bsa_sched.cu), K/V tiles double-buffered
// with cp.async, S = Q K^T and O += P V on mma.sync m16n8k16 with fp32 accumulation, online
// softmax in base 2.  Only partial tiles read the block mask per token (mask[i / bx][j / by]).
#include <math.h>

#include "bsa_common.cuh"
#include "bsa_launch.h"

template <int DP, typename T, int CFG>
__global__ void __launch_bounds__(bsa_fwd_tile(DP, CFG).warps * 32, bsa_fwd_ctas(CFG)) bsa_fwd_kernel(const bsa_params p) {
    constexpr bsa_tile TL = bsa_fwd_tile(DP, CFG);
    constexpr int BM = TL.bm, BN = TL.bn, NT = TL.warps * 32, MT = TL.mt;
    static_assert(BM == TL.warps * 16 * MT, "16 * mt query rows per warp");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __half *sQ = reinterpret_cast<__half *>(smem_raw);
    __half *sK = sQ + BM * DP;
    __half *sV = sK + 2 * BN * DP;

    // query tiles in reverse order: under causal masks the last tiles have the most work
    const int m = gridDim.x - 1 - blockIdx.x, n = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int hk = n / p.G;
    const long long row_id = ((long long)b * p.N + n) * gridDim.x + m;
    const int cnt = p.sq.cnt[row_id];
    const int *lst = p.sq.list + row_id * p.sq.stride;
    const int r0 = m * BM, wr = warp * 16 * MT;  // first row of the tile / of this warp (in tile)
    const float sl2 = p.scale_log2;

    bsa_load_tile<BM, DP, NT, T>(sQ, p.q, b, n, r0, p.Sq, p.D, tid);
    if (cnt > 0) {
        int t = lst[0] >> 1;
        bsa_load_tile<BN, DP, NT, T>(sK, p.k, b, hk, t * BN, p.Skv, p.D, tid);
        bsa_load_tile<BN, DP, NT, T>(sV, p.v, b, hk, t * BN, p.Skv, p.D, tid);
    }
    cp_async_commit();

    float acc[MT][DP / 8][4];
    float mx[MT][2], l[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; mi++) {
#pragma unroll
        for (int i = 0; i < DP / 8; i++) acc[mi][i][0] = acc[mi][i][1] = acc[mi][i][2] = acc[mi][i][3] = 0.f;
        mx[mi][0] = mx[mi][1] = -INFINITY;
        l[mi][0] = l[mi][1] = 0.f;
    }

    for (int it = 0; it < cnt; it++) {
        const int e = lst[it], t = e >> 1, buf = it & 1;
        if (it + 1 < cnt) {
            int t2 = lst[it + 1] >> 1;
            bsa_load_tile<BN, DP, NT, T>(sK + (buf ^ 1) * BN * DP, p.k, b, hk, t2 * BN, p.Skv, p.D, tid);
            bsa_load_tile<BN, DP, NT, T>(sV + (buf ^ 1) * BN * DP, p.v, b, hk, t2 * BN, p.Skv, p.D, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __half *ks = sK + buf * BN * DP, *vs = sV + buf * BN * DP;

        float s[MT][BN / 8][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int i = 0; i < BN / 8; i++) s[mi][i][0] = s[mi][i][1] = s[mi][i][2] = s[mi][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t qa[MT][4];
#pragma unroll
            for (int mi = 0; mi < MT; mi++) bsa_lda<DP>(sQ, wr + mi * 16, kk * 16, lane, qa[mi]);
#pragma unroll
            for (int nn = 0; nn < BN / 16; nn++) {
                uint32_t bb[4];
                bsa_ldb_nk<DP>(ks, nn * 16, kk * 16, lane, bb);
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    bsa_t<T>::mma(s[mi][2 * nn], qa[mi], bb[0], bb[1]);
                    bsa_t<T>::mma(s[mi][2 * nn + 1], qa[mi], bb[2], bb[3]);
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                s[mi][nt][0] *= sl2; s[mi][nt][1] *= sl2; s[mi][nt][2] *= sl2; s[mi][nt][3] *= sl2;
            }
        if (e & 1) {  // partial tile: token-level check against the block mask
            const uint8_t *mb = p.mask.p + (long long)b * p.mask.s0 + (long long)n * p.mask.s1;
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                const int i0 = r0 + wr + mi * 16 + g;
                const uint8_t *mr0 = mb + (long long)min(bsa_div(i0, p.bx, p.inv_bx), p.nbx - 1) * p.mask.s2;
                const uint8_t *mr1 = mb + (long long)min(bsa_div(i0 + 8, p.bx, p.inv_bx), p.nbx - 1) * p.mask.s2;
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int j = t * BN + nt * 8 + 2 * c + h;
                        const bool okc = j < p.Skv;
                        const long long cb = (long long)min(bsa_div(j, p.by, p.inv_by), p.nby - 1) * p.mask.s3;
                        if (!(okc && __ldg(mr0 + cb))) s[mi][nt][h] = -INFINITY;
                        if (!(okc && __ldg(mr1 + cb))) s[mi][nt][2 + h] = -INFINITY;
                    }
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
            float n0 = mx[mi][0], n1 = mx[mi][1];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                n0 = fmaxf(n0, fmaxf(s[mi][nt][0], s[mi][nt][1]));
                n1 = fmaxf(n1, fmaxf(s[mi][nt][2], s[mi][nt][3]));
            }
            n0 = fmaxf(n0, __shfl_xor_sync(0xffffffffu, n0, 1));
            n0 = fmaxf(n0, __shfl_xor_sync(0xffffffffu, n0, 2));
            n1 = fmaxf(n1, __shfl_xor_sync(0xffffffffu, n1, 1));
            n1 = fmaxf(n1, __shfl_xor_sync(0xffffffffu, n1, 2));
            const float u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
            const float a0 = bsa_exp2(mx[mi][0] - u0), a1 = bsa_exp2(mx[mi][1] - u1);
            mx[mi][0] = n0;
            mx[mi][1] = n1;
            float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                s[mi][nt][0] = bsa_exp2(s[mi][nt][0] - u0); s[mi][nt][1] = bsa_exp2(s[mi][nt][1] - u0);
                s[mi][nt][2] = bsa_exp2(s[mi][nt][2] - u1); s[mi][nt][3] = bsa_exp2(s[mi][nt][3] - u1);
                ls0 += s[mi][nt][0] + s[mi][nt][1];
                ls1 += s[mi][nt][2] + s[mi][nt][3];
            }
            l[mi][0] = l[mi][0] * a0 + ls0;
            l[mi][1] = l[mi][1] * a1 + ls1;
#pragma unroll
            for (int dt = 0; dt < DP / 8; dt++) {
                acc[mi][dt][0] *= a0; acc[mi][dt][1] *= a0; acc[mi][dt][2] *= a1; acc[mi][dt][3] *= a1;
            }
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                a[mi][0] = bsa_t<T>::pack(s[mi][2 * kk][0], s[mi][2 * kk][1]);
                a[mi][1] = bsa_t<T>::pack(s[mi][2 * kk][2], s[mi][2 * kk][3]);
                a[mi][2] = bsa_t<T>::pack(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
                a[mi][3] = bsa_t<T>::pack(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dd = 0; dd < DP / 16; dd++) {
                uint32_t bb[4];
                bsa_ldb_kn<DP>(vs, kk * 16, dd * 16, lane, bb);
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    bsa_t<T>::mma(acc[mi][2 * dd], a[mi], bb[0], bb[1]);
                    bsa_t<T>::mma(acc[mi][2 * dd + 1], a[mi], bb[2], bb[3]);
                }
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();

#pragma unroll
    for (int mi = 0; mi < MT; mi++) {
        float l0 = l[mi][0], l1 = l[mi][1];
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
        bsa_acc_to_smem<DP, T>(sQ, acc[mi], wr + mi * 16, lane, inv0, inv1);
        const int i0 = r0 + wr + mi * 16 + g;
        if (p.lse && c == 0) {
            if (i0 < p.Sq)
                p.lse[(long long)b * p.lse_s0 + (long long)n * p.lse_s1 + (long long)i0 * p.lse_s2] =
                    l0 > 0.f ? (mx[mi][0] + __log2f(l0)) * BSA_LN2 : -INFINITY;
            if (i0 + 8 < p.Sq)
                p.lse[(long long)b * p.lse_s0 + (long long)n * p.lse_s1 + (long long)(i0 + 8) * p.lse_s2] =
                    l1 > 0.f ? (mx[mi][1] + __log2f(l1)) * BSA_LN2 : -INFINITY;
        }
    }
    __syncthreads();
    bsa_store_tile<BM, DP, NT, T>(sQ, p.o, b, n, r0, p.Sq, p.D, tid);
}

template <int DP, typename T, int CFG> static cudaError_t launch_fwd(const bsa_params &p, cudaStream_t st) {
    constexpr bsa_tile TL = bsa_fwd_tile(DP, CFG);
    const size_t smem = (size_t)(TL.bm + 4 * TL.bn) * DP * 2;
    static unsigned long long done = 0;
    cudaError_t e = bsa_set_smem(bsa_fwd_kernel<DP, T, CFG>, smem, &done);
    if (e != cudaSuccess) return e;
    dim3 grid((p.Sq + TL.bm - 1) / TL.bm, p.N, p.B);
    bsa_fwd_kernel<DP, T, CFG><<<grid, TL.warps * 32, smem, st>>>(p);
    return cudaGetLastError();
}

template <int DP, typename T> static cudaError_t launch_fwd_dp(const bsa_params &p, int cfg, cudaStream_t st) {
    switch (cfg) {
    case 1: return launch_fwd<DP, T, 1>(p, st);
    case 2: return launch_fwd<DP, T, 2>(p, st);
    default: return launch_fwd<DP, T, 0>(p, st);
    }
}

extern "C" cudaError_t spattn_bsa_launch_fwd(const bsa_params *p, int dp, int bf16, int cfg, cudaStream_t st) {
    if (dp == 64) return bf16 ? launch_fwd_dp<64, __nv_bfloat16>(*p, cfg, st) : launch_fwd_dp<64, __half>(*p, cfg, st);
    return bf16 ? launch_fwd_dp<128, __nv_bfloat16>(*p, cfg, st) : launch_fwd_dp<128, __half>(*p, cfg, st);
}
