// Top-k sparse flash attention backward, token-major mma.sync kernel (D = 512, Dr = 64, shared
// key/value), sm_90a: H <= 32 heads per key head with sparse selections only (sfa_host.cu:
// small_shape; denser rows take the key-major sfa_bwd_small.cu, more heads sfa_bwd90.cu).
//
// One CTA = one query token (b, s1, n2) and HT = 16*R heads of its group (R = 1 or 2); the
// selected keys are gathered once per CTA, 32 per tile (576-wide rows, cp.async, double
// buffered) and reused by every head.  Per tile, warp (r, c) (4 warps per 16-row group):
//   1. S = Q K^T and dP = dO V^T for rows r*16.., keys c*8..c*8+7 (V = first 512 columns of K);
//      P = exp2(S*scale*log2e - LSE*log2e), dS = scale * P * (dP - Delta)  ->  shared memory;
//   2. dQ[rows r, columns c*144..c*144+143] += dS K       (kept in registers over all tiles);
//   3. dKV[32 keys x 576] = dS^T Q + P^T dO (dV folded into the first 512 columns: shared kv),
//      cut into 16 jobs of 16 keys x 72 columns spread over the warps, and added to a per-key
//      accumulator in global memory:
//        deterministic (default): int64 fixed point (value * 2^F rounded, exact integer
//          atomics: the sum does not depend on the order, so the result is bitwise
//          reproducible); F is chosen on the device from a bound of |dK| (sfa_host.cu);
//        deterministic = 0: fp32 atomics (red.global.add.v2.f32).
// A final kernel converts the accumulator into dk / dk_rope (keys never selected get 0).
#include "sfa_adds.cuh"
#include "sfa_common.cuh"

namespace sfa {

constexpr int LDO = D + PAD;  // dO rows in shared memory

template <typename T, int R>
__global__ void __launch_bounds__(128 * R, 1) bwd_kernel(const Params p) {
    constexpr int MR = 1;  // m-tiles per warp (2 served H >= 64, now sfa_bwd90.cu)
    constexpr int HT = 16 * R;
    constexpr int NW = 4 * R / MR;  // warp (r, c): rows r*16*MR.. (MR m-tiles), column group c
    constexpr int NT = 32 * NW;
    constexpr int LDP = NK + PAD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw);   // [HT][LDQK]
    T *sdO = sQ + HT * LDQK;                    // [HT][LDO]
    T *sK = sdO + HT * LDO;                     // [2][NK][LDQK]
    T *sP = sK + 2 * NK * LDQK;                 // [HT][LDP]
    T *sdS = sP + HT * LDP;                     // [HT][LDP]
    float *sLse = reinterpret_cast<float *>(sdS + HT * LDP);  // [HT] (log2 domain)
    float *sDelta = sLse + HT;                                // [HT]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r = warp >> 2, c = warp & 3;
    const int ngroups = (p.H + HT - 1) / HT;
    const int s1 = blockIdx.x / ngroups, g = blockIdx.x % ngroups;
    const int b = blockIdx.y / p.N2, n2 = blockIdx.y % p.N2;
    const int head0 = n2 * p.H + g * HT;
    const int nh = min(HT, p.H - g * HT);
    const int lim = p.mode == 3 ? p.S2 - p.S1 + s1 : p.S2 - 1;
    const int32_t *row = p.idx + b * p.sidx[0] + (int64_t)s1 * p.sidx[1] + n2 * p.sidx[2];
    const int ntiles = (p.K * p.sbs + NK - 1) / NK;

    const T *qb = static_cast<const T *>(p.q) + b * p.sq[0] + (int64_t)s1 * p.sq[1];
    const T *qrb = static_cast<const T *>(p.qr) + b * p.sqr[0] + (int64_t)s1 * p.sqr[1];
    const T *dob = static_cast<const T *>(p.dout) + b * p.sdo[0] + (int64_t)s1 * p.sdo[1];
    const T *obase = static_cast<const T *>(p.o) + b * p.so[0] + (int64_t)s1 * p.so[1];
    const T *kb = static_cast<const T *>(p.k) + b * p.sk[0] + n2 * p.sk[2];
    const T *krb = static_cast<const T *>(p.kr) + b * p.skr[0] + n2 * p.skr[2];

    for (int i = tid; i < HT * (DQK / 8); i += NT) {
        int h = i / (DQK / 8), ch = i % (DQK / 8);
        const T *src = qb;
        int bytes = 0;
        if (h < nh) {
            bytes = 16;
            src = ch < D / 8 ? qb + (head0 + h) * p.sq[2] + ch * 8
                             : qrb + (head0 + h) * p.sqr[2] + (ch - D / 8) * 8;
        }
        cp_async16(sQ + h * LDQK + ch * 8, src, bytes);
    }
    for (int i = tid; i < HT * (D / 8); i += NT) {
        int h = i / (D / 8), ch = i % (D / 8);
        cp_async16(sdO + h * LDO + ch * 8, h < nh ? dob + (head0 + h) * p.sdo[2] + ch * 8 : dob,
                   h < nh ? 16 : 0);
    }
    cp_async_commit();
    // Delta = rowsum(dO * O) in fp32, and the LSE in the log2 domain (+inf: P = 0 for the row).
    for (int h = warp; h < HT; h += NW) {
        float dsum = 0.f, l2 = INFINITY;
        if (h < nh) {
            const T *orow = obase + (head0 + h) * p.so[2];
            const T *drow = dob + (head0 + h) * p.sdo[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int col = (j * 32 + lane) * 8;
                uint4 ov = *reinterpret_cast<const uint4 *>(orow + col);
                uint4 dv = *reinterpret_cast<const uint4 *>(drow + col);
                const T *oe = reinterpret_cast<const T *>(&ov);
                const T *de = reinterpret_cast<const T *>(&dv);
#pragma unroll
                for (int e = 0; e < 8; ++e) dsum += Ty<T>::to_f(oe[e]) * Ty<T>::to_f(de[e]);
            }
            float lse = p.lse_in[b * p.slse[0] + (int64_t)s1 * p.slse[1] + (head0 + h) * p.slse[2]];
            if (lse > -INFINITY) l2 = lse * 1.4426950408889634f;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dsum += __shfl_xor_sync(0xffffffffu, dsum, o);
        if (lane == 0) {
            sDelta[h] = dsum;
            sLse[h] = l2;
        }
    }

    auto load_tile = [&](int buf, int key_lane) {
        T *dst = sK + buf * NK * LDQK;
        for (int i = tid; i < NK * (DQK / 8); i += NT) {
            int slot = i / (DQK / 8), ch = i % (DQK / 8);
            int key = __shfl_sync(0xffffffffu, key_lane, slot);
            const T *src = kb;
            int bytes = 0;
            if (key >= 0) {
                bytes = 16;
                src = ch < D / 8 ? kb + (int64_t)key * p.sk[1] + ch * 8
                                 : krb + (int64_t)key * p.skr[1] + (ch - D / 8) * 8;
            }
            cp_async16(dst + slot * LDQK + ch * 8, src, bytes);
        }
        cp_async_commit();
    };

    int cur_key, next_key;
    int t = next_tile(p, row, p.sidx[3], 0, ntiles, lim, lane, cur_key);
    if (t < ntiles) load_tile(0, cur_key);

    const bool det = p.acc_i64 != nullptr;
    const float fs = det ? *p.fix_scale : 1.f;
    const int gq = lane >> 2, tq = lane & 3;
    const int row0 = r * 16 * MR;  // first row of this warp
    float dq[MR][18][4];
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
        for (int i = 0; i < 18; ++i) dq[mi][i][0] = dq[mi][i][1] = dq[mi][i][2] = dq[mi][i][3] = 0.f;
    int buf = 0;

    while (t < ntiles) {
        cp_async_wait<0>();
        __syncthreads();  // (A)
        int tn = next_tile(p, row, p.sidx[3], t + 1, ntiles, lim, lane, next_key);
        if (tn < ntiles) load_tile(buf ^ 1, next_key);
        const T *Kt = sK + buf * NK * LDQK;

        // ---- 1. S and dP for rows r*16.., keys c*8.. ----
        // S and dP for MR m-tiles sharing each B fragment; two accumulators per k-step parity
        float s[MR][4], s2[MR][4], dp[MR][4], dp2[MR][4];
#pragma unroll
        for (int mi = 0; mi < MR; ++mi)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[mi][i] = s2[mi][i] = dp[mi][i] = dp2[mi][i] = 0.f;
        {
            const uint32_t aQ = smem_u32(sQ + (row0 + (lane & 15)) * LDQK + (lane >> 4) * 8);
            const uint32_t aO = smem_u32(sdO + (row0 + (lane & 15)) * LDO + (lane >> 4) * 8);
            const uint32_t bK = smem_u32(Kt + (c * 8 + (lane & 7)) * LDQK + (lane >> 3) * 8);
#pragma unroll(MR == 1 ? 4 : 2)
            for (int ks = 0; ks < D / 16; ks += 2) {
                uint32_t bb[4];
                ldsm_x4(bb, bK + ks * 32);
#pragma unroll
                for (int mi = 0; mi < MR; ++mi) {
                    uint32_t a0[4], a1[4], d0[4], d1[4];
                    ldsm_x4(a0, aQ + mi * 16 * LDQK * 2 + ks * 32);
                    ldsm_x4(a1, aQ + mi * 16 * LDQK * 2 + ks * 32 + 32);
                    ldsm_x4(d0, aO + mi * 16 * LDO * 2 + ks * 32);
                    ldsm_x4(d1, aO + mi * 16 * LDO * 2 + ks * 32 + 32);
                    mma16816<T>(s[mi], a0, bb);
                    mma16816<T>(s2[mi], a1, bb + 2);
                    mma16816<T>(dp[mi], d0, bb);
                    mma16816<T>(dp2[mi], d1, bb + 2);
                }
            }
#pragma unroll
            for (int ks = D / 16; ks < DQK / 16; ks += 2) {
                uint32_t bb[4];
                ldsm_x4(bb, bK + ks * 32);
#pragma unroll
                for (int mi = 0; mi < MR; ++mi) {
                    uint32_t a0[4], a1[4];
                    ldsm_x4(a0, aQ + mi * 16 * LDQK * 2 + ks * 32);
                    ldsm_x4(a1, aQ + mi * 16 * LDQK * 2 + ks * 32 + 32);
                    mma16816<T>(s[mi], a0, bb);
                    mma16816<T>(s2[mi], a1, bb + 2);
                }
            }
        }
        const int slot0 = c * 8 + tq * 2;
        const bool v0 = __shfl_sync(0xffffffffu, cur_key, slot0) >= 0;
        const bool v1 = __shfl_sync(0xffffffffu, cur_key, slot0 + 1) >= 0;
#pragma unroll
        for (int mi = 0; mi < MR; ++mi) {
            const int rowA = row0 + mi * 16 + gq;
            float sv[4], dv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                sv[i] = s[mi][i] + s2[mi][i];
                dv[i] = dp[mi][i] + dp2[mi][i];
            }
            const float la = sLse[rowA], lb = sLse[rowA + 8];
            const float da = sDelta[rowA], db = sDelta[rowA + 8];
            const float p0 = v0 ? exp2f(sv[0] * p.scale_log2 - la) : 0.f;
            const float p1 = v1 ? exp2f(sv[1] * p.scale_log2 - la) : 0.f;
            const float p2 = v0 ? exp2f(sv[2] * p.scale_log2 - lb) : 0.f;
            const float p3 = v1 ? exp2f(sv[3] * p.scale_log2 - lb) : 0.f;
            *reinterpret_cast<uint32_t *>(sP + rowA * LDP + slot0) = Ty<T>::pack(p0, p1);
            *reinterpret_cast<uint32_t *>(sP + (rowA + 8) * LDP + slot0) = Ty<T>::pack(p2, p3);
            *reinterpret_cast<uint32_t *>(sdS + rowA * LDP + slot0) =
                Ty<T>::pack(p.scale * p0 * (dv[0] - da), p.scale * p1 * (dv[1] - da));
            *reinterpret_cast<uint32_t *>(sdS + (rowA + 8) * LDP + slot0) =
                Ty<T>::pack(p.scale * p2 * (dv[2] - db), p.scale * p3 * (dv[3] - db));
        }
        __syncthreads();  // (B) P, dS visible

        // ---- 2. dQ[rows of this warp, cols c*144..] += dS K ----
#pragma unroll
        for (int ks = 0; ks < NK / 16; ++ks) {
            uint32_t a[MR][4];
#pragma unroll
            for (int mi = 0; mi < MR; ++mi)
                ldsm_x4(a[mi], smem_u32(sdS + (row0 + mi * 16 + (lane & 15)) * LDP + ks * 16 + (lane >> 4) * 8));
            const uint32_t kBase =
                smem_u32(Kt + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDQK + c * 144 +
                         (lane >> 4) * 8);
#pragma unroll
            for (int nt = 0; nt < 18; nt += 2) {
                uint32_t bb[4];
                ldsm_x4_t(bb, kBase + nt * 16);
#pragma unroll
                for (int mi = 0; mi < MR; ++mi) {
                    mma16816<T>(dq[mi][nt], a[mi], bb);
                    mma16816<T>(dq[mi][nt + 1], a[mi], bb + 2);
                }
            }
        }

        // ---- 3. dKV jobs: 16 keys (mt) x 72 columns (nc) ----
        for (int job = warp; job < 16; job += NW) {
            const int mt = job & 1, nc = job >> 1;
            const int col0 = nc * 72;
            float acc[9][4];
#pragma unroll
            for (int i = 0; i < 9; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
            for (int kh = 0; kh < HT / 16; ++kh) {
                uint32_t a[4];
                // A = dS^T (keys x heads) from sdS [head][key] with ldmatrix.trans
                const int hA = kh * 16 + (lane >> 4) * 8 + (lane & 7);
                const int kA = mt * 16 + ((lane >> 3) & 1) * 8;
                ldsm_x4_t(a, smem_u32(sdS + hA * LDP + kA));
                const int hB = kh * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const uint32_t qB = smem_u32(sQ + hB * LDQK + col0 + (lane >> 4) * 8);
#pragma unroll
                for (int nt = 0; nt < 8; nt += 2) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, qB + nt * 16);
                    mma16816<T>(acc[nt], a, bb);
                    mma16816<T>(acc[nt + 1], a, bb + 2);
                }
                {
                    uint32_t bb[2];
                    ldsm_x2_t(bb, qB + 8 * 16);
                    mma16816<T>(acc[8], a, bb);
                }
                // + P^T dO on the value columns (< 512)
                ldsm_x4_t(a, smem_u32(sP + hA * LDP + kA));
                const uint32_t oB = smem_u32(sdO + hB * LDO + col0 + (lane >> 4) * 8);
                if (nc < 7) {
#pragma unroll
                    for (int nt = 0; nt < 8; nt += 2) {
                        uint32_t bb[4];
                        ldsm_x4_t(bb, oB + nt * 16);
                        mma16816<T>(acc[nt], a, bb);
                        mma16816<T>(acc[nt + 1], a, bb + 2);
                    }
                    uint32_t bb[2];
                    ldsm_x2_t(bb, oB + 8 * 16);
                    mma16816<T>(acc[8], a, bb);
                } else {
                    uint32_t bb[2];
                    ldsm_x2_t(bb, oB);  // columns 504..511
                    mma16816<T>(acc[0], a, bb);
                }
            }
            // scatter-add into the per-key accumulator (`det` is uniform: no divergence)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int slot = mt * 16 + gq + half * 8;
                const int key = __shfl_sync(0xffffffffu, cur_key, slot);
                const int64_t rowbase = (((int64_t)b * p.S2 + max(key, 0)) * p.N2 + n2) * DQK + col0;
                if (det) {
                    // One 32-byte sector per quad and instruction: thread tq adds columns tq and
                    // tq + 4 of each 8-column n-tile (values regrouped by quad shuffles).
                    const int64_t i0 = rowbase + tq;
                    const int src1 = (lane & ~3) | (tq >> 1), src2 = src1 + 2;
#pragma unroll
                    for (int nt = 0; nt < 9; ++nt) {
                        const float x0 = acc[nt][half * 2], x1 = acc[nt][half * 2 + 1];
                        const float a0 = __shfl_sync(0xffffffffu, x0, src1);
                        const float a1 = __shfl_sync(0xffffffffu, x1, src1);
                        const float c0 = __shfl_sync(0xffffffffu, x0, src2);
                        const float c1 = __shfl_sync(0xffffffffu, x1, src2);
                        if (key >= 0) {
                            add_fix(p.acc_i64, p.acc_flags, i0 + nt * 8, tq & 1 ? a1 : a0, fs);
                            add_fix(p.acc_i64, p.acc_flags, i0 + nt * 8 + 4, tq & 1 ? c1 : c0, fs);
                        }
                    }
                } else if (key >= 0) {
                    float *dst = p.acc_f32 + rowbase + tq * 2;
#pragma unroll
                    for (int nt = 0; nt < 9; ++nt)
                        red_add_v2(dst + nt * 8, acc[nt][half * 2], acc[nt][half * 2 + 1]);
                }
            }
        }
        t = tn;
        cur_key = next_key;
        buf ^= 1;
    }

    // ---- dQ / dQ_rope ----
    T *dqb = static_cast<T *>(p.dq) + b * p.sdq[0] + (int64_t)s1 * p.sdq[1];
    T *dqrb = static_cast<T *>(p.dqr) + b * p.sdqr[0] + (int64_t)s1 * p.sdqr[1];
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int hr = row0 + mi * 16 + gq + half * 8;
            if (hr >= nh) continue;
#pragma unroll
            for (int nt = 0; nt < 18; ++nt) {
                const int col = c * 144 + nt * 8 + tq * 2;
                T *dst = col < D ? dqb + (head0 + hr) * p.sdq[2] + col
                                 : dqrb + (head0 + hr) * p.sdqr[2] + (col - D);
                *reinterpret_cast<uint32_t *>(dst) =
                    Ty<T>::pack(dq[mi][nt][half * 2], dq[mi][nt][half * 2 + 1]);
            }
        }
}

template <typename T, int R>
static cudaError_t launch_bwd(const Params &p, cudaStream_t st) {
    constexpr int HT = 16 * R;
    size_t smem = (size_t)(HT * LDQK + HT * LDO + 2 * NK * LDQK + 2 * HT * (NK + PAD)) * sizeof(T) +
                  2 * HT * sizeof(float);
    cudaError_t e = cudaFuncSetAttribute(bwd_kernel<T, R>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int ngroups = (p.H + HT - 1) / HT;
    dim3 grid((unsigned)(p.S1 * ngroups), (unsigned)(p.B * p.N2));
    bwd_kernel<T, R><<<grid, 128 * R, smem, st>>>(p);
    return cudaGetLastError();
}

}  // namespace sfa

extern "C" cudaError_t spattn_sfa_fast_bwd_launch(const sfa::Params *p, int is_bf16,
                                                  cudaStream_t st) {
    // H <= 32 only (more heads: sfa_bwd90.cu)
    const int H = p->H;
    if (is_bf16) return H <= 16 ? sfa::launch_bwd<__nv_bfloat16, 1>(*p, st) : sfa::launch_bwd<__nv_bfloat16, 2>(*p, st);
    return H <= 16 ? sfa::launch_bwd<__half, 1>(*p, st) : sfa::launch_bwd<__half, 2>(*p, st);
}
