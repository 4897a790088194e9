// Top-k sparse flash attention forward, fast path (D = 512, Dr = 64, shared key/value), sm_90a.
//
// One CTA = one query token (b, s1, n2) and HT = 16*R of the H = N1/N2 query heads that share
// its index row (the heads are the MMA M dimension).  The selected keys are gathered once per
// CTA, 32 per tile, full 576-wide rows, by cp.async into shared memory (double buffered: the
// next tile's gather overlaps this tile's math) and reused by every head of the CTA.
// Warps: 4 per 16-row group.  Warp (r, c) computes S for rows r*16.. and keys c*8..c*8+7 of the
// tile (mma.sync m16n8k16, 36 k-steps over 576), the four warps of a row group exchange row
// maxima through shared memory (online softmax in the log2 domain), write P (bf16/fp16) to
// shared memory, and warp (r, c) then accumulates O[rows r, columns c*128..c*128+127] += P V
// with V = the first 512 columns of the same key tile (ldmatrix.trans).
// Tiles whose 32 slots are all padding / masked are skipped (one ballot per tile).
#include "sfa_common.cuh"

namespace sfa {

template <typename T, int R, int MR>
__global__ void __launch_bounds__(128 * R / MR, 1) fwd_kernel(const Params p) {
    constexpr int HT = 16 * R;
    constexpr int NW = 4 * R / MR;  // warp (r, c): rows r*16*MR.. (MR m-tiles), column group c
    constexpr int NT = 32 * NW;
    constexpr int LDP = NK + PAD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw);            // [HT][LDQK]
    T *sK = sQ + HT * LDQK;                              // [2][NK][LDQK]
    T *sP = sK + 2 * NK * LDQK;                          // [HT][LDP]
    float *sMax = reinterpret_cast<float *>(sP + HT * LDP);  // [4][HT]
    float *sL = sMax + 4 * HT;                           // [4][HT]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int r = warp >> 2, c = warp & 3;
    const int ngroups = (p.H + HT - 1) / HT;
    const int s1 = blockIdx.x / ngroups, g = blockIdx.x % ngroups;
    const int b = blockIdx.y / p.N2, n2 = blockIdx.y % p.N2;
    const int head0 = n2 * p.H + g * HT;  // first query head of this CTA
    const int nh = min(HT, p.H - g * HT);
    const int lim = p.mode == 3 ? p.S2 - p.S1 + s1 : p.S2 - 1;
    const int32_t *row = p.idx + b * p.sidx[0] + (int64_t)s1 * p.sidx[1] + n2 * p.sidx[2];
    const int ntiles = (p.K * p.sbs + NK - 1) / NK;

    const T *qb = static_cast<const T *>(p.q) + b * p.sq[0] + (int64_t)s1 * p.sq[1];
    const T *qrb = static_cast<const T *>(p.qr) + b * p.sqr[0] + (int64_t)s1 * p.sqr[1];
    const T *kb = static_cast<const T *>(p.k) + b * p.sk[0] + n2 * p.sk[2];
    const T *krb = static_cast<const T *>(p.kr) + b * p.skr[0] + n2 * p.skr[2];

    // Q (rows past nh are zero).
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
    cp_async_commit();

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

    float acc[MR][16][4];
#pragma unroll
    for (int mi = 0; mi < MR; ++mi)
#pragma unroll
        for (int i = 0; i < 16; ++i) acc[mi][i][0] = acc[mi][i][1] = acc[mi][i][2] = acc[mi][i][3] = 0.f;
    float m0[MR], m1[MR], l0[MR], l1[MR];
#pragma unroll
    for (int mi = 0; mi < MR; ++mi) {
        m0[mi] = m1[mi] = -INFINITY;
        l0[mi] = l1[mi] = 0.f;
    }
    const int gq = lane >> 2, tq = lane & 3;
    const int row0 = r * 16 * MR;  // rows of m-tile mi: row0 + mi*16 + gq and + 8
    int buf = 0;

    while (t < ntiles) {
        cp_async_wait<0>();
        __syncthreads();  // (A) tile t (and Q) visible; everybody done with the other buffer
        int tn = next_tile(p, row, p.sidx[3], t + 1, ntiles, lim, lane, next_key);
        if (tn < ntiles) load_tile(buf ^ 1, next_key);

        const T *Kt = sK + buf * NK * LDQK;
        // ---- S = Q K^T for this warp's rows, keys c*8..c*8+7; independent accumulators per
        // k-step parity (short MMA dependency chains), one B fragment shared by the MR m-tiles
        float s[MR][4], s2[MR][4];
#pragma unroll
        for (int mi = 0; mi < MR; ++mi)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[mi][i] = s2[mi][i] = 0.f;
        {
            const uint32_t aBase = smem_u32(sQ + (row0 + (lane & 15)) * LDQK + (lane >> 4) * 8);
            const uint32_t bBase = smem_u32(Kt + (c * 8 + (lane & 7)) * LDQK + (lane >> 3) * 8);
#pragma unroll(MR == 1 ? 6 : 3)
            for (int ks = 0; ks < DQK / 16; ks += 2) {
                uint32_t bb[4];
                ldsm_x4(bb, bBase + ks * 32);
#pragma unroll
                for (int mi = 0; mi < MR; ++mi) {
                    uint32_t a0[4], a1[4];
                    ldsm_x4(a0, aBase + mi * 16 * LDQK * 2 + ks * 32);
                    ldsm_x4(a1, aBase + mi * 16 * LDQK * 2 + ks * 32 + 32);
                    mma16816<T>(s[mi], a0, bb);
                    mma16816<T>(s2[mi], a1, bb + 2);
                }
            }
        }
        // ---- masking and row maxima ----
        const int slot0 = c * 8 + tq * 2;
        const bool v0 = __shfl_sync(0xffffffffu, cur_key, slot0) >= 0;
        const bool v1 = __shfl_sync(0xffffffffu, cur_key, slot0 + 1) >= 0;
#pragma unroll
        for (int mi = 0; mi < MR; ++mi) {
            const int rowA = row0 + mi * 16 + gq;
            s[mi][0] = v0 ? (s[mi][0] + s2[mi][0]) * p.scale_log2 : -INFINITY;
            s[mi][1] = v1 ? (s[mi][1] + s2[mi][1]) * p.scale_log2 : -INFINITY;
            s[mi][2] = v0 ? (s[mi][2] + s2[mi][2]) * p.scale_log2 : -INFINITY;
            s[mi][3] = v1 ? (s[mi][3] + s2[mi][3]) * p.scale_log2 : -INFINITY;
            float mx0 = fmaxf(s[mi][0], s[mi][1]), mx1 = fmaxf(s[mi][2], s[mi][3]);
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            if (tq == 0) {
                sMax[c * HT + rowA] = mx0;
                sMax[c * HT + rowA + 8] = mx1;
            }
        }
        __syncthreads();  // (B)
#pragma unroll
        for (int mi = 0; mi < MR; ++mi) {
            const int rowA = row0 + mi * 16 + gq;
            float n0 = m0[mi], n1 = m1[mi];
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                n0 = fmaxf(n0, sMax[cc * HT + rowA]);
                n1 = fmaxf(n1, sMax[cc * HT + rowA + 8]);
            }
            // Every processed tile has a valid key for every row, so n0/n1 are finite here.
            const float al0 = exp2f(m0[mi] - n0), al1 = exp2f(m1[mi] - n1);
            m0[mi] = n0;
            m1[mi] = n1;
            const float p0 = exp2f(s[mi][0] - n0), p1 = exp2f(s[mi][1] - n0);
            const float p2 = exp2f(s[mi][2] - n1), p3 = exp2f(s[mi][3] - n1);
            l0[mi] = l0[mi] * al0 + p0 + p1;
            l1[mi] = l1[mi] * al1 + p2 + p3;
            *reinterpret_cast<uint32_t *>(sP + rowA * LDP + slot0) = Ty<T>::pack(p0, p1);
            *reinterpret_cast<uint32_t *>(sP + (rowA + 8) * LDP + slot0) = Ty<T>::pack(p2, p3);
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                acc[mi][i][0] *= al0;
                acc[mi][i][1] *= al0;
                acc[mi][i][2] *= al1;
                acc[mi][i][3] *= al1;
            }
        }
        __syncthreads();  // (C) P visible
        // ---- O[rows, cols c*128..] += P V (one V fragment shared by the MR m-tiles) ----
#pragma unroll
        for (int ks = 0; ks < NK / 16; ++ks) {
            uint32_t a[MR][4];
#pragma unroll
            for (int mi = 0; mi < MR; ++mi)
                ldsm_x4(a[mi], smem_u32(sP + (row0 + mi * 16 + (lane & 15)) * LDP + ks * 16 + (lane >> 4) * 8));
            const uint32_t vBase =
                smem_u32(Kt + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDQK + c * 128 +
                         (lane >> 4) * 8);
#pragma unroll
            for (int nt = 0; nt < 16; nt += 2) {
                uint32_t bb[4];
                ldsm_x4_t(bb, vBase + nt * 16);
#pragma unroll
                for (int mi = 0; mi < MR; ++mi) {
                    mma16816<T>(acc[mi][nt], a[mi], bb);
                    mma16816<T>(acc[mi][nt + 1], a[mi], bb + 2);
                }
            }
        }
        t = tn;
        cur_key = next_key;
        buf ^= 1;
    }

    // ---- epilogue: row sums across the 4 warps of the row group ----
#pragma unroll
    for (int mi = 0; mi < MR; ++mi) {
        const int rowA = row0 + mi * 16 + gq;
        float a0 = l0[mi], a1 = l1[mi];
        a0 += __shfl_xor_sync(0xffffffffu, a0, 1);
        a0 += __shfl_xor_sync(0xffffffffu, a0, 2);
        a1 += __shfl_xor_sync(0xffffffffu, a1, 1);
        a1 += __shfl_xor_sync(0xffffffffu, a1, 2);
        if (tq == 0) {
            sL[c * HT + rowA] = a0;
            sL[c * HT + rowA + 8] = a1;
        }
    }
    __syncthreads();
    T *ob = static_cast<T *>(p.out_o) + b * p.so[0] + (int64_t)s1 * p.so[1];
#pragma unroll
    for (int mi = 0; mi < MR; ++mi) {
        const int rowA = row0 + mi * 16 + gq;
        float L0 = 0.f, L1 = 0.f;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
            L0 += sL[cc * HT + rowA];
            L1 += sL[cc * HT + rowA + 8];
        }
        const float inv0 = L0 > 0.f ? 1.f / L0 : 0.f, inv1 = L1 > 0.f ? 1.f / L1 : 0.f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int hr = rowA + half * 8;
            if (hr >= nh) continue;
            const float inv = half ? inv1 : inv0;
            T *orow = ob + (head0 + hr) * p.so[2] + c * 128 + tq * 2;
#pragma unroll
            for (int nt = 0; nt < 16; ++nt)
                *reinterpret_cast<uint32_t *>(orow + nt * 8) =
                    Ty<T>::pack(acc[mi][nt][half * 2] * inv, acc[mi][nt][half * 2 + 1] * inv);
            if (c == 0 && tq == 0 && p.out_lse) {
                const float L = half ? L1 : L0, m = half ? m1[mi] : m0[mi];
                p.out_lse[b * p.slse[0] + (int64_t)s1 * p.slse[1] + (head0 + hr) * p.slse[2]] =
                    L > 0.f ? (m + log2f(L)) * 0.69314718055994531f : -INFINITY;
            }
        }
    }
}

template <typename T, int R, int MR>
static cudaError_t launch_fwd(const Params &p, cudaStream_t st) {
    constexpr int HT = 16 * R;
    size_t smem = (size_t)(HT * LDQK + 2 * NK * LDQK + HT * (NK + PAD)) * sizeof(T) +
                  8 * HT * sizeof(float);
    cudaError_t e = cudaFuncSetAttribute(fwd_kernel<T, R, MR>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int ngroups = (p.H + HT - 1) / HT;
    dim3 grid((unsigned)(p.S1 * ngroups), (unsigned)(p.B * p.N2));
    fwd_kernel<T, R, MR><<<grid, 128 * R / MR, smem, st>>>(p);
    return cudaGetLastError();
}

}  // namespace sfa

// Launcher used by sfa_host.cu: picks the head-group size from H.
extern "C" cudaError_t spattn_sfa_fast_fwd_launch(const sfa::Params *p, int is_bf16,
                                                  cudaStream_t st) {
    const int H = p->H;
    if (is_bf16) {
        if (H <= 16) return sfa::launch_fwd<__nv_bfloat16, 1, 1>(*p, st);
        if (H <= 32) return sfa::launch_fwd<__nv_bfloat16, 2, 1>(*p, st);
        return sfa::launch_fwd<__nv_bfloat16, 4, 2>(*p, st);
    }
    if (H <= 16) return sfa::launch_fwd<__half, 1, 1>(*p, st);
    if (H <= 32) return sfa::launch_fwd<__half, 2, 1>(*p, st);
    return sfa::launch_fwd<__half, 4, 2>(*p, st);
}
