// Block-sparse attention backward, deterministic (no atomics):
//   bsa_delta_kernel  Delta = rowsum(dO * O), lse2 = LSE * log2(e) (+inf on empty rows)
//   bsa_dq_kernel     query-major: per query tile, walk its key tiles; dQ = scale * dS K
//   bsa_dkdv_kernel   key-major: per key tile, walk the (head of the GQA group, query tile)
//                     pairs that hit it; dV = P^T dO, dK = scale * dS^T Q, written once.
// mma.sync m16n8k16 with fp32 accumulation; only partial tiles read the block mask per token.
#include <math.h>

#include "bsa_common.cuh"
#include "bsa_launch.h"
#include "hopper/hopper.cuh"

template <typename T> __global__ void bsa_delta_kernel(const bsa_params p, float *delta, float *lse2) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (long long)p.B * p.N * p.Sq) return;
    const int i = (int)(row % p.Sq), bn = (int)(row / p.Sq), b = bn / p.N, n = bn % p.N;
    const T *o = reinterpret_cast<const T *>(p.o.p) + b * p.o.s0 + n * p.o.s1 + i * p.o.s2;
    const T *d = reinterpret_cast<const T *>(p.dout.p) + b * p.dout.s0 + n * p.dout.s1 + i * p.dout.s2;
    float acc = 0.f;
    for (int x = lane; x < p.D; x += 32)
        acc += bsa_t<T>::tof(o[x * p.o.s3]) * bsa_t<T>::tof(d[x * p.dout.s3]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        const float l = p.lse[(long long)b * p.lse_s0 + (long long)n * p.lse_s1 + (long long)i * p.lse_s2];
        delta[row] = acc;
        lse2[row] = l == -INFINITY ? INFINITY : l * BSA_LOG2E;
    }
}

// ---- dQ ------------------------------------------------------------------------------------
template <int DP, typename T, int CFG>
__global__ void __launch_bounds__(bsa_dq_tile(DP, CFG).warps * 32, 2) bsa_dq_kernel(const bsa_params p) {
    constexpr bsa_tile TL = bsa_dq_tile(DP, CFG);
    constexpr int BM = TL.bm, BN = TL.bn, NT = TL.warps * 32, MT = TL.mt;
    static_assert(BM == TL.warps * 16 * MT, "16 * mt query rows per warp");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __half *sQ = reinterpret_cast<__half *>(smem_raw);
    __half *sO = sQ + BM * DP;  // dO
    __half *sK = sO + BM * DP;
    __half *sV = sK + 2 * BN * DP;

    const int m = gridDim.x - 1 - blockIdx.x, n = blockIdx.y, b = blockIdx.z;  // heavy (causal) tiles first
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int hk = n / p.G;
    const long long row_id = ((long long)b * p.N + n) * gridDim.x + m;
    const int cnt = p.sq.cnt[row_id];
    const int *lst = p.sq.list + row_id * p.sq.stride;
    const int r0 = m * BM, wr = warp * 16 * MT;
    const float sl2 = p.scale_log2;

    bsa_load_tile<BM, DP, NT, T>(sQ, p.q, b, n, r0, p.Sq, p.D, tid);
    bsa_load_tile<BM, DP, NT, T>(sO, p.dout, b, n, r0, p.Sq, p.D, tid);
    if (cnt > 0) {
        int t = lst[0] >> 1;
        bsa_load_tile<BN, DP, NT, T>(sK, p.k, b, hk, t * BN, p.Skv, p.D, tid);
        bsa_load_tile<BN, DP, NT, T>(sV, p.v, b, hk, t * BN, p.Skv, p.D, tid);
    }
    cp_async_commit();

    const long long rbase = ((long long)b * p.N + n) * p.Sq;
    float Lr[MT][2], Dr[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = r0 + wr + mi * 16 + g + 8 * h;
            Lr[mi][h] = i < p.Sq ? p.lse2[rbase + i] : INFINITY;
            Dr[mi][h] = i < p.Sq ? p.delta[rbase + i] : 0.f;
        }

    float acc[MT][DP / 8][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int i = 0; i < DP / 8; i++) acc[mi][i][0] = acc[mi][i][1] = acc[mi][i][2] = acc[mi][i][3] = 0.f;

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
        float s[MT][BN / 8][4], dp[MT][BN / 8][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
                s[mi][i][0] = s[mi][i][1] = s[mi][i][2] = s[mi][i][3] = dp[mi][i][0] = dp[mi][i][1] = dp[mi][i][2] =
                    dp[mi][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t qa[MT][4], oa[MT][4];
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                bsa_lda<DP>(sQ, wr + mi * 16, kk * 16, lane, qa[mi]);
                bsa_lda<DP>(sO, wr + mi * 16, kk * 16, lane, oa[mi]);
            }
#pragma unroll
            for (int nn = 0; nn < BN / 16; nn++) {
                uint32_t bb[4], vb[4];
                bsa_ldb_nk<DP>(ks, nn * 16, kk * 16, lane, bb);
                bsa_ldb_nk<DP>(vs, nn * 16, kk * 16, lane, vb);
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    bsa_t<T>::mma(s[mi][2 * nn], qa[mi], bb[0], bb[1]);
                    bsa_t<T>::mma(s[mi][2 * nn + 1], qa[mi], bb[2], bb[3]);
                    bsa_t<T>::mma(dp[mi][2 * nn], oa[mi], vb[0], vb[1]);
                    bsa_t<T>::mma(dp[mi][2 * nn + 1], oa[mi], vb[2], vb[3]);
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                s[mi][nt][0] = bsa_exp2(s[mi][nt][0] * sl2 - Lr[mi][0]);
                s[mi][nt][1] = bsa_exp2(s[mi][nt][1] * sl2 - Lr[mi][0]);
                s[mi][nt][2] = bsa_exp2(s[mi][nt][2] * sl2 - Lr[mi][1]);
                s[mi][nt][3] = bsa_exp2(s[mi][nt][3] * sl2 - Lr[mi][1]);
            }
        if (e & 1) {
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
                        if (!(okc && __ldg(mr0 + cb))) s[mi][nt][h] = 0.f;
                        if (!(okc && __ldg(mr1 + cb))) s[mi][nt][2 + h] = 0.f;
                    }
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                s[mi][nt][0] *= dp[mi][nt][0] - Dr[mi][0]; s[mi][nt][1] *= dp[mi][nt][1] - Dr[mi][0];
                s[mi][nt][2] *= dp[mi][nt][2] - Dr[mi][1]; s[mi][nt][3] *= dp[mi][nt][3] - Dr[mi][1];
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
                bsa_ldb_kn<DP>(ks, kk * 16, dd * 16, lane, bb);
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
    for (int mi = 0; mi < MT; mi++) bsa_acc_to_smem<DP, T>(sQ, acc[mi], wr + mi * 16, lane, p.scale, p.scale);
    __syncthreads();
    bsa_store_tile<BM, DP, NT, T>(sQ, p.dq, b, n, r0, p.Sq, p.D, tid);
}

// ---- dK / dV -------------------------------------------------------------------------------
template <int BM, int DP, int NT, typename T>
__device__ __forceinline__ void bsa_dkdv_load_q(const bsa_params &p, int entry, int b, int hk, __half *sQ,
                                                __half *sO, float *sL, float *sD, int tid) {
    const int gm = entry >> 1, hg = gm / p.nqt, m = gm % p.nqt, h = hk * p.G + hg;
    const int r0 = m * BM;
    bsa_load_tile<BM, DP, NT, T>(sQ, p.q, b, h, r0, p.Sq, p.D, tid);
    bsa_load_tile<BM, DP, NT, T>(sO, p.dout, b, h, r0, p.Sq, p.D, tid);
    const long long rbase = ((long long)b * p.N + h) * p.Sq;
    for (int i = tid; i < BM; i += NT) {
        const int r = r0 + i;
        sL[i] = r < p.Sq ? p.lse2[rbase + r] : INFINITY;
        sD[i] = r < p.Sq ? p.delta[rbase + r] : 0.f;
    }
}

template <int DP, typename T>
__global__ void __launch_bounds__(bsa_dkdv_tile(DP).warps * 32, 2) bsa_dkdv_kernel(const bsa_params p) {
    constexpr bsa_tile TL = bsa_dkdv_tile(DP);
    constexpr int BM = TL.bm, BN = TL.bn, NT = TL.warps * 32;
    static_assert(BN == TL.warps * 16, "16 keys per warp");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __half *sK = reinterpret_cast<__half *>(smem_raw);
    __half *sV = sK + BN * DP;
    __half *sQ = sV + BN * DP;      // 2 stages
    __half *sO = sQ + 2 * BM * DP;  // dO, 2 stages
    float *sL = reinterpret_cast<float *>(sO + 2 * BM * DP);  // 2 x BM
    float *sD = sL + 2 * BM;                                  // 2 x BM

    const int t = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const long long row_id = ((long long)b * p.Nkv + hk) * gridDim.x + t;
    const int cnt = p.sk.cnt[row_id];
    const int *lst = p.sk.list + row_id * p.sk.stride;
    const int c0 = t * BN;
    const float sl2 = p.scale_log2;

    bsa_load_tile<BN, DP, NT, T>(sK, p.k, b, hk, c0, p.Skv, p.D, tid);
    bsa_load_tile<BN, DP, NT, T>(sV, p.v, b, hk, c0, p.Skv, p.D, tid);
    if (cnt > 0) bsa_dkdv_load_q<BM, DP, NT, T>(p, lst[0], b, hk, sQ, sO, sL, sD, tid);
    cp_async_commit();

    const int j0 = c0 + warp * 16 + g;
    const int cb0 = min(j0 / p.by, p.nby - 1), cb1 = min((j0 + 8) / p.by, p.nby - 1);

    float dk[DP / 8][4], dv[DP / 8][4];
#pragma unroll
    for (int i = 0; i < DP / 8; i++) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.f;
    }

    for (int it = 0; it < cnt; it++) {
        const int e = lst[it], buf = it & 1;
        if (it + 1 < cnt) {
            bsa_dkdv_load_q<BM, DP, NT, T>(p, lst[it + 1], b, hk, sQ + (buf ^ 1) * BM * DP, sO + (buf ^ 1) * BM * DP,
                                           sL + (buf ^ 1) * BM, sD + (buf ^ 1) * BM, tid);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const __half *qs = sQ + buf * BM * DP, *os = sO + buf * BM * DP;
        const float *ls = sL + buf * BM, *ds = sD + buf * BM;
        float s[BM / 8][4], dp[BM / 8][4];
#pragma unroll
        for (int i = 0; i < BM / 8; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.f;
        // S^T = K Q^T and dP^T = V dO^T (rows: this warp's 16 keys, columns: BM queries)
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            uint32_t ka[4], va[4];
            bsa_lda<DP>(sK, warp * 16, kk * 16, lane, ka);
            bsa_lda<DP>(sV, warp * 16, kk * 16, lane, va);
#pragma unroll
            for (int nn = 0; nn < BM / 16; nn++) {
                uint32_t qb[4], ob[4];
                bsa_ldb_nk<DP>(qs, nn * 16, kk * 16, lane, qb);
                bsa_t<T>::mma(s[2 * nn], ka, qb[0], qb[1]);
                bsa_t<T>::mma(s[2 * nn + 1], ka, qb[2], qb[3]);
                bsa_ldb_nk<DP>(os, nn * 16, kk * 16, lane, ob);
                bsa_t<T>::mma(dp[2 * nn], va, ob[0], ob[1]);
                bsa_t<T>::mma(dp[2 * nn + 1], va, ob[2], ob[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < BM / 8; nt++) {
            const float2 L = *reinterpret_cast<const float2 *>(ls + nt * 8 + 2 * c);
            s[nt][0] = bsa_exp2(s[nt][0] * sl2 - L.x); s[nt][1] = bsa_exp2(s[nt][1] * sl2 - L.y);
            s[nt][2] = bsa_exp2(s[nt][2] * sl2 - L.x); s[nt][3] = bsa_exp2(s[nt][3] * sl2 - L.y);
        }
        if (e & 1) {
            const int gm = e >> 1, h = hk * p.G + gm / p.nqt, m = gm % p.nqt;
            const uint8_t *mb = p.mask.p + (long long)b * p.mask.s0 + (long long)h * p.mask.s1;
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++) {
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    const int i = m * BM + nt * 8 + 2 * c + x;
                    const uint8_t *mrow = mb + (long long)min(bsa_div(i, p.bx, p.inv_bx), p.nbx - 1) * p.mask.s2;
                    if (!__ldg(mrow + cb0 * p.mask.s3)) s[nt][x] = 0.f;
                    if (!__ldg(mrow + cb1 * p.mask.s3)) s[nt][2 + x] = 0.f;
                }
            }
        }
        // dV += P^T dO
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            uint32_t a[4] = {bsa_t<T>::pack(s[2 * kk][0], s[2 * kk][1]), bsa_t<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                             bsa_t<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             bsa_t<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dd = 0; dd < DP / 16; dd++) {
                uint32_t bb[4];
                bsa_ldb_kn<DP>(os, kk * 16, dd * 16, lane, bb);
                bsa_t<T>::mma(dv[2 * dd], a, bb[0], bb[1]);
                bsa_t<T>::mma(dv[2 * dd + 1], a, bb[2], bb[3]);
            }
        }
        // dS^T = P^T (dP^T - Delta)
#pragma unroll
        for (int nt = 0; nt < BM / 8; nt++) {
            const float2 Dl = *reinterpret_cast<const float2 *>(ds + nt * 8 + 2 * c);
            s[nt][0] *= dp[nt][0] - Dl.x; s[nt][1] *= dp[nt][1] - Dl.y;
            s[nt][2] *= dp[nt][2] - Dl.x; s[nt][3] *= dp[nt][3] - Dl.y;
        }
        // dK += dS^T Q
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++) {
            uint32_t a[4] = {bsa_t<T>::pack(s[2 * kk][0], s[2 * kk][1]), bsa_t<T>::pack(s[2 * kk][2], s[2 * kk][3]),
                             bsa_t<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             bsa_t<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dd = 0; dd < DP / 16; dd++) {
                uint32_t bb[4];
                bsa_ldb_kn<DP>(qs, kk * 16, dd * 16, lane, bb);
                bsa_t<T>::mma(dk[2 * dd], a, bb[0], bb[1]);
                bsa_t<T>::mma(dk[2 * dd + 1], a, bb[2], bb[3]);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();
    bsa_acc_to_smem<DP, T>(sK, dk, warp * 16, lane, p.scale, p.scale);
    bsa_acc_to_smem<DP, T>(sV, dv, warp * 16, lane, 1.f, 1.f);
    __syncthreads();
    bsa_store_tile<BN, DP, NT, T>(sK, p.dk, b, hk, c0, p.Skv, p.D, tid);
    bsa_store_tile<BN, DP, NT, T>(sV, p.dv, b, hk, c0, p.Skv, p.D, tid);
}

// ---- launchers -------------------------------------------------------------------------------
template <int DP, typename T, int CFG> static cudaError_t launch_dq(const bsa_params &p, cudaStream_t st) {
    constexpr bsa_tile TL = bsa_dq_tile(DP, CFG);
    const size_t smem = (size_t)(2 * TL.bm + 4 * TL.bn) * DP * 2;
    static unsigned long long done = 0;
    cudaError_t e = hop::set_smem(bsa_dq_kernel<DP, T, CFG>, smem, &done);
    if (e != cudaSuccess) return e;
    dim3 grid((p.Sq + TL.bm - 1) / TL.bm, p.N, p.B);
    bsa_dq_kernel<DP, T, CFG><<<grid, TL.warps * 32, smem, st>>>(p);
    return cudaGetLastError();
}

template <int DP, typename T> static cudaError_t launch_dkdv(const bsa_params &p, cudaStream_t st) {
    constexpr bsa_tile TL = bsa_dkdv_tile(DP);
    const size_t smem = (size_t)(2 * TL.bn + 4 * TL.bm) * DP * 2 + 4 * TL.bm * sizeof(float);
    static unsigned long long done = 0;
    cudaError_t e = hop::set_smem(bsa_dkdv_kernel<DP, T>, smem, &done);
    if (e != cudaSuccess) return e;
    dim3 grid((p.Skv + TL.bn - 1) / TL.bn, p.Nkv, p.B);
    bsa_dkdv_kernel<DP, T><<<grid, TL.warps * 32, smem, st>>>(p);
    return cudaGetLastError();
}

extern "C" cudaError_t spattn_bsa_launch_delta(const bsa_params *p, int bf16, float *delta, float *lse2,
                                               cudaStream_t st) {
    const long long rows = (long long)p->B * p->N * p->Sq;
    const unsigned blocks = (unsigned)((rows + 7) / 8);
    if (bf16)
        bsa_delta_kernel<__nv_bfloat16><<<blocks, 256, 0, st>>>(*p, delta, lse2);
    else
        bsa_delta_kernel<__half><<<blocks, 256, 0, st>>>(*p, delta, lse2);
    return cudaGetLastError();
}

template <int DP, typename T> static cudaError_t launch_dq_dp(const bsa_params &p, int cfg, cudaStream_t st) {
    return cfg == 1 ? launch_dq<DP, T, 1>(p, st) : launch_dq<DP, T, 0>(p, st);
}

extern "C" cudaError_t spattn_bsa_launch_dq(const bsa_params *p, int dp, int bf16, int cfg, cudaStream_t st) {
    if (dp == 64) return bf16 ? launch_dq_dp<64, __nv_bfloat16>(*p, cfg, st) : launch_dq_dp<64, __half>(*p, cfg, st);
    return bf16 ? launch_dq_dp<128, __nv_bfloat16>(*p, cfg, st) : launch_dq_dp<128, __half>(*p, cfg, st);
}

extern "C" cudaError_t spattn_bsa_launch_dkdv(const bsa_params *p, int dp, int bf16, cudaStream_t st) {
    if (dp == 64) return bf16 ? launch_dkdv<64, __nv_bfloat16>(*p, st) : launch_dkdv<64, __half>(*p, st);
    return bf16 ? launch_dkdv<128, __nv_bfloat16>(*p, st) : launch_dkdv<128, __half>(*p, st);
}
