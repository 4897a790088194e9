// Block-sparse attention forward (FA2 style): one CTA per (query tile, head, batch), 8 warps x
// 16 query rows; the CTA walks its query tile's schedule (key tiles marked full or partial,
// built on the device by bsa_sched.cu), K/V tiles double-buffered with cp.async, S = Q K^T and
// O += P V on mma.sync m16n8k16 with fp32 accumulation, online softmax in base 2.  Only partial
// tiles read the block mask per token (mask[i / bx][j / by]).
#include <math.h>

#include "bsa_common.cuh"
#include "bsa_launch.h"

template <int DP, typename T>
__global__ void __launch_bounds__(bsa_fwd_tile(DP).warps * 32, 2) bsa_fwd_kernel(const bsa_params p) {
    constexpr bsa_tile TL = bsa_fwd_tile(DP);
    constexpr int BM = TL.bm, BN = TL.bn, NT = TL.warps * 32;
    static_assert(BM == TL.warps * 16, "16 query rows per warp");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __half *sQ = reinterpret_cast<__half *>(smem_raw);
    __half *sK = sQ + BM * DP;
    __half *sV = sK + 2 * BN * DP;

    const int m = blockIdx.x, n = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int hk = n / p.G;
    const long long row_id = ((long long)b * p.N + n) * gridDim.x + m;
    const int cnt = p.sq.cnt[row_id];
    const int *lst = p.sq.list + row_id * p.sq.stride;
    const int r0 = m * BM;
    const float sl2 = p.scale_log2;

    bsa_load_tile<BM, DP, NT, T>(sQ, p.q, b, n, r0, p.Sq, p.D, tid);
    if (cnt > 0) {
        int t = lst[0] >> 1;
        bsa_load_tile<BN, DP, NT, T>(sK, p.k, b, hk, t * BN, p.Skv, p.D, tid);
        bsa_load_tile<BN, DP, NT, T>(sV, p.v, b, hk, t * BN, p.Skv, p.D, tid);
    }
    cp_async_commit();

    const int i0 = r0 + warp * 16 + g;
    const int rb0 = min(i0 / p.bx, p.nbx - 1), rb1 = min((i0 + 8) / p.bx, p.nbx - 1);
    const uint8_t *mr0 = p.mask.p + (long long)b * p.mask.s0 + (long long)n * p.mask.s1 + (long long)rb0 * p.mask.s2;
    const uint8_t *mr1 = p.mask.p + (long long)b * p.mask.s0 + (long long)n * p.mask.s1 + (long long)rb1 * p.mask.s2;

    float acc[DP / 8][4];
#pragma unroll
    for (int i = 0; i < DP / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float mx0 = -INFINITY, mx1 = -INFINITY, l0 = 0.f, l1 = 0.f;

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

        float s[BN / 8][4];
#pragma unroll
        for (int i = 0; i < BN / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t qa[4];
            bsa_lda<DP>(sQ, warp * 16, kk * 16, lane, qa);
#pragma unroll
            for (int nn = 0; nn < BN / 16; nn++) {
                uint32_t bb[4];
                bsa_ldb_nk<DP>(ks, nn * 16, kk * 16, lane, bb);
                bsa_t<T>::mma(s[2 * nn], qa, bb[0], bb[1]);
                bsa_t<T>::mma(s[2 * nn + 1], qa, bb[2], bb[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            s[nt][0] *= sl2; s[nt][1] *= sl2; s[nt][2] *= sl2; s[nt][3] *= sl2;
        }
        if (e & 1) {  // partial tile: token-level check against the block mask
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int j = t * BN + nt * 8 + 2 * c + h;
                    bool okc = j < p.Skv;
                    long long cb = (long long)min(j / p.by, p.nby - 1) * p.mask.s3;
                    if (!(okc && __ldg(mr0 + cb))) s[nt][h] = -INFINITY;
                    if (!(okc && __ldg(mr1 + cb))) s[nt][2 + h] = -INFINITY;
                }
            }
        }
        float n0 = mx0, n1 = mx1;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            n0 = fmaxf(n0, fmaxf(s[nt][0], s[nt][1]));
            n1 = fmaxf(n1, fmaxf(s[nt][2], s[nt][3]));
        }
        n0 = fmaxf(n0, __shfl_xor_sync(0xffffffffu, n0, 1));
        n0 = fmaxf(n0, __shfl_xor_sync(0xffffffffu, n0, 2));
        n1 = fmaxf(n1, __shfl_xor_sync(0xffffffffu, n1, 1));
        n1 = fmaxf(n1, __shfl_xor_sync(0xffffffffu, n1, 2));
        const float u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
        const float a0 = exp2f(mx0 - u0), a1 = exp2f(mx1 - u1);
        mx0 = n0;
        mx1 = n1;
        float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            s[nt][0] = exp2f(s[nt][0] - u0); s[nt][1] = exp2f(s[nt][1] - u0);
            s[nt][2] = exp2f(s[nt][2] - u1); s[nt][3] = exp2f(s[nt][3] - u1);
            ls0 += s[nt][0] + s[nt][1];
            ls1 += s[nt][2] + s[nt][3];
        }
        l0 = l0 * a0 + ls0;
        l1 = l1 * a1 + ls1;
#pragma unroll
        for (int dt = 0; dt < DP / 8; dt++) {
            acc[dt][0] *= a0; acc[dt][1] *= a0; acc[dt][2] *= a1; acc[dt][3] *= a1;
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t a[4] = {bsa_t<T>::pack(s[2 * kk][0], s[2 * kk][1]), bsa_t<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                             bsa_t<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             bsa_t<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dd = 0; dd < DP / 16; dd++) {
                uint32_t bb[4];
                bsa_ldb_kn<DP>(vs, kk * 16, dd * 16, lane, bb);
                bsa_t<T>::mma(acc[2 * dd], a, bb[0], bb[1]);
                bsa_t<T>::mma(acc[2 * dd + 1], a, bb[2], bb[3]);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
    bsa_acc_to_smem<DP, T>(sQ, acc, warp * 16, lane, inv0, inv1);
    if (p.lse && c == 0) {
        if (i0 < p.Sq)
            p.lse[(long long)b * p.lse_s0 + (long long)n * p.lse_s1 + (long long)i0 * p.lse_s2] =
                l0 > 0.f ? (mx0 + __log2f(l0)) * BSA_LN2 : -INFINITY;
        if (i0 + 8 < p.Sq)
            p.lse[(long long)b * p.lse_s0 + (long long)n * p.lse_s1 + (long long)(i0 + 8) * p.lse_s2] =
                l1 > 0.f ? (mx1 + __log2f(l1)) * BSA_LN2 : -INFINITY;
    }
    __syncthreads();
    bsa_store_tile<BM, DP, NT, T>(sQ, p.o, b, n, r0, p.Sq, p.D, tid);
}

template <int DP, typename T> static cudaError_t launch_fwd(const bsa_params &p, cudaStream_t st) {
    constexpr bsa_tile TL = bsa_fwd_tile(DP);
    const size_t smem = (size_t)(TL.bm + 4 * TL.bn) * DP * 2;
    static bool attr = false;
    if (!attr) {
        cudaError_t e = cudaFuncSetAttribute(bsa_fwd_kernel<DP, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        attr = true;
    }
    dim3 grid((p.Sq + TL.bm - 1) / TL.bm, p.N, p.B);
    bsa_fwd_kernel<DP, T><<<grid, TL.warps * 32, smem, st>>>(p);
    return cudaGetLastError();
}

extern "C" cudaError_t spattn_bsa_launch_fwd(const bsa_params *p, int dp, int bf16, cudaStream_t st) {
    if (dp == 64) return bf16 ? launch_fwd<64, __nv_bfloat16>(*p, st) : launch_fwd<64, __half>(*p, st);
    return bf16 ? launch_fwd<128, __nv_bfloat16>(*p, st) : launch_fwd<128, __half>(*p, st);
}
