// Top-k sparse flash attention backward for Hopper (sm_90a), key-major, for the shapes other than
// DeepSeek's (sfa_bwd_small.cu has that one): a separate value tensor with D 128 (NSA-style
// selection: blocks of 64 contiguous keys), D 128 + Dr 64 (NSA's d_k 192 / d_v 128) and D 64
// (sfa::Sep in sfa_gather.cuh); any head count, modes 0 and 3, GQA, any sbs.
//
// The lists are sfa_bwd_small.cu's (built on the device per call): per (b, n2, 64-key block), the
// tokens whose index row selects any of its keys, in increasing s1, with each key's multiplicity.
// A CTA owns one key block and a window of those tokens (L.ww words of 32 tokens), so dK and dV of
// its 64 keys stay in registers; dQ gets one add of (32 token-head rows x D + Dr) per step.
//
// Why not sfa_bwd_small.cu's consumers: at D 576 a step's GEMMs are large and its 9 + 8 boxes of
// dK / dV accumulators do not fit one warpgroup, so its two consumers split the boxes and
// exchange P and dS every step.  Here the accumulators of every box fit one warpgroup (at most 5
// boxes of 64 x 64: 160 registers), so the consumers run whole steps independently, alternating
// (warpgroup c takes the steps it = c, c + 2, ...), and meet once at the end to sum their dK / dV.
//
// Per step (32 token-head rows = TT tokens of HP heads, HP = H rounded up to a power of two, 32
// when H > 32: then blockIdx.z is the chunk of 32 heads), in the consumer warpgroup of the step:
//   S^T = K Q^T, dP^T = V dO^T (SS m64n32, keys = MMA rows); P^T = mult exp2(S^T sl2 - LSE2),
//   dS^T = scale P^T (dP^T - Delta) in fp32;
//   dK[box] += dS^T Q[box], dV[box] += P^T dO[box] (RS: P^T, dS^T packed from the accumulators);
//   dQ^T[box] = K^T dS^T (A = the key box read MN-major, B = the step's dS tile in shared memory),
//   added to the dQ accumulator rows of the step's token-heads.
// Accumulators: dQ [B, S1, N1, 64 NBK], dK / dV rows of sfa_host.cu's [B, S2, N2, 576] (dK in
// columns 0 .. 64 NBK - 1, dV after them: in 64-column boxes); int64 fixed point (deterministic,
// bitwise reproducible) or fp32 (deterministic = 0).
// D not a multiple of 64 (Params::dn < 64 NBN): the last value box of K, V, Q and dO is
// zero-filled past D, so the box's columns past D add zeros to dQ / dK / dV (the conversions
// skip them) and every other column is exact.
#include <math.h>

#include "hopper/hopper.cuh"
#include "sfa_adds.cuh"
#include "sfa_bwd_small.h"
#include "sfa_gather.cuh"
#include "sfa_kmaj.cuh"

namespace {

using sfa::Params;
using sfa::SmallLists;

constexpr int BOX = sfa::GBOX;  // 64 key rows x 128 bytes
constexpr int NR = 32;          // token-head rows per step
constexpr int RBOX = NR * 128;  // a 32-row box: 4 KB
// per stage beside Q / dO: the multiplicities [TT][64] (uint16), LSE2 [32], Delta [32], the
// visits' tokens [TT] (TT <= 8: rows of 4 heads at least)
constexpr int MS_CNT = 0, MS_LSE = 8 * 128, MS_DELTA = MS_LSE + NR * 4, MS_TOK = MS_DELTA + NR * 4, MISC = MS_TOK + 8 * 4;

template <class S> struct Lay {
    static constexpr int NDKV = S::NBK + (S::SEPV ? S::NBN : 0);  // dK (+ dV) boxes
    // more than 5 boxes (D 256: 4 + 4) do not fit one warpgroup: SPLIT, both consumers take every
    // step, warpgroup 0 holds dK, 1 dV (each computes S^T / dP^T itself: no exchange)
    static constexpr bool SPLIT = NDKV > 5;
    static constexpr int NREG = SPLIT ? (S::NBK > S::NBN ? S::NBK : S::NBN) : NDKV;  // boxes a consumer holds
    static constexpr int SQD = (S::NBK + S::NBN) * RBOX;          // a stage's Q and dO boxes
    // shared memory with n stages: the key block, the stages, a dS tile [32][64] per consumer, the
    // stages' misc, the barriers (+ alignment slack)
    static constexpr int smem_for(int n) { return S::NBT * BOX + n * SQD + 2 * RBOX + n * MISC + 128 + 1024; }
    // stages: four (two per consumer warpgroup, or the producer up to four steps ahead when
    // SPLIT) where they fit, else two (D 256 + Dr 64 separate: 9 key boxes and 9 Q / dO boxes)
    static constexpr int NST = smem_for(4) <= 232448 ? 4 : 2;
    static constexpr int OFF_K = 0, OFF_ST = S::NBT * BOX, OFF_DS = OFF_ST + NST * SQD;
    static constexpr int OFF_MISC = OFF_DS + 2 * RBOX;
    static constexpr int OFF_BAR = OFF_MISC + NST * MISC;
    static constexpr int SMEM = OFF_BAR + 128 + 1024;
    static_assert(SMEM == smem_for(NST) && SMEM <= 232448, "fits in 227 KB");
    static_assert(OFF_DS % 1024 == 0 && MISC % 16 == 0, "swizzled dS tiles, 16-byte copies");
    static_assert(NST == 4 || SPLIT, "two stages: one step at a time for both consumers");
    // the end's exchange of dK / dV partials (64 x 64 fp32 per box) reuses the stages, tiles and
    // misc, or (not enough there: two stages) everything from the key block on: every copy has
    // landed and every GEMM completed by then
    static constexpr int OFF_RED = NDKV * 64 * 64 * 4 <= OFF_BAR - OFF_ST ? OFF_ST : OFF_K;
    static_assert(NDKV * 64 * 64 * 4 <= OFF_BAR - OFF_RED, "the partials fit");
    static_assert(NREG <= 5 && (!SPLIT || S::SEPV), "accumulators of one warpgroup");
};

// The CTA's summed dK / dV rows red [64 keys][wc] (fp32, shared) added to the accumulator rows
// [B, S2, N2, 576] of its keys (past S2: none), columns 0 .. wc - 1, by 256 threads: fp32 four
// columns per red.v4, deterministic int64 fixed point one column per red (a warp's 32 columns
// contiguous), the flag path for non-finite values out of line.
__device__ __noinline__ void add_rows_slow(const Params &p, int64_t i, float v, float fs) {
    sfa::add_fix(p.acc_i64, p.acc_flags, i, v, fs);
}
__device__ __forceinline__ void add_rows(const Params &p, const float *red, int wc, int kb, int n2, int b, float fs,
                                         bool det, int t) {
    const int64_t base = ((int64_t)b * p.S2 * p.N2 + n2) * sfa::DQK;
    const int rows = min(64, p.S2 - kb * 64);
    if (!det) {
        const int per = wc / 4;  // float4 per row
#pragma unroll 1
        for (int x = t; x < rows * per; x += 256) {
            const int r = x / per, c = (x - r * per) * 4;
            const float4 v = *reinterpret_cast<const float4 *>(red + r * wc + c);
            sfa::red_add_v4(p.acc_f32 + base + (int64_t)(kb * 64 + r) * p.N2 * sfa::DQK + c, v.x, v.y, v.z, v.w);
        }
        return;
    }
#pragma unroll 1
    for (int x0 = 0; x0 < 64 * wc; x0 += 256) {  // whole warps in every round (the vote)
        const int x = x0 + t, r = x / wc, c = x - r * wc;
        const float v = x < rows * wc ? red[x] : 0.f;
        const int64_t i = base + (int64_t)(kb * 64 + r) * p.N2 * sfa::DQK + c;
        const bool fin = fabsf(v) <= FLT_MAX;
        if (__all_sync(0xffffffffu, fin)) {
            if (x < rows * wc) sfa::red_add_u64(p.acc_i64 + i, (unsigned long long)__float2ll_rn(v * fs));
        } else if (x < rows * wc) {
            add_rows_slow(p, i, v, fs);
        }
    }
}

struct Sm {
    unsigned char *k, *st, *misc, *ds, *red;
    uint64_t *full, *empty, *kbar;  // full / empty [Lay::NST]
};

// S^T = K Q^T and dP^T = V dO^T of step `it` (SS m64n32, keys = MMA rows) into sa / dpa, one
// commit group, once the step's stage is full.
template <typename T, class S>
__device__ __forceinline__ void scores(float (&sa)[16], float (&dpa)[16], const Sm &s, uint64_t kd, int it) {
    constexpr int NST = Lay<S>::NST;
    const int st = it & (NST - 1);
    unsigned char *sq = s.st + st * Lay<S>::SQD;
    const uint64_t qd = hop::desc_sw128(sq, 16, 1024), dod = hop::desc_sw128(sq + S::NBK * RBOX, 16, 1024);
    hop::mbar_wait(s.full + st, (it / NST) & 1);
    hop::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4 * S::NBK; kk++)
        hop::elt<T>::template ssn<32, 0, 0>(sa, hop::desc_add(kd, (kk >> 2) * BOX + (kk & 3) * 32),
                                            hop::desc_add(qd, (kk >> 2) * RBOX + (kk & 3) * 32), kk > 0);
#pragma unroll
    for (int kk = 0; kk < 4 * S::NBN; kk++)
        hop::elt<T>::template ssn<32, 0, 0>(dpa, hop::desc_add(kd, S::vbox(kk >> 2) * BOX + (kk & 3) * 32),
                                            hop::desc_add(dod, (kk >> 2) * RBOX + (kk & 3) * 32), kk > 0);
    hop::wgmma_commit();
}

// Consumer warpgroup C (0 / 1, a run-time value: one copy of this code for both, which halves the
// kernel's instruction footprint; ncu on sfas01 showed no_instruction as the first stall reason
// with a copy per warpgroup).
template <typename T, class S, int HP>
__device__ __forceinline__ void consume(const Params &p, const SmallLists &L, const Sm &s, int b, int n2, int kb,
                                        int hc, int v0, int v1, const int C) {
    using LY = Lay<S>;
    constexpr int TT = NR / HP, NBK = S::NBK, NBN = S::NBN, NDKV = LY::NDKV, NREG = LY::NREG, W = 64 * NBK;
    constexpr bool SPLIT = LY::SPLIT;
    const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31, q4 = lane & 3;
    const int r0 = warp * 16 + (lane >> 2);
    const float sl2 = p.scale_log2, scale = p.scale;
    const bool det = p.acc_i64 != nullptr;
    const float fsq = det ? *L.fix_scale_q : 1.f;
    unsigned char *sds = s.ds + C * RBOX;
    const int head0 = hc * NR;

    float dkv[NREG][32];
#pragma unroll
    for (int i = 0; i < NREG; i++)
#pragma unroll
        for (int j = 0; j < 32; j++) dkv[i][j] = 0.f;

    const uint64_t kd = hop::desc_sw128(s.k, 16, 1024), dsd = hop::desc_sw128(sds, 16, 1024);
    const int nsteps = (v1 - v0 + TT - 1) / TT;
    // Measured and not kept (H200, same call, sfas01-04): the next step's S^T / dP^T issued before
    // this step's dQ adds, so that the adds run under the tensor work: 1.00-1.04x the time.
    float sa[16], dpa[16];
    for (int it = SPLIT ? 0 : C; it < nsteps; it += SPLIT ? 1 : 2) {
        const int st = it & (LY::NST - 1);
        unsigned char *sq = s.st + st * LY::SQD, *sdo = sq + NBK * RBOX, *ms = s.misc + st * MISC;
        const uint16_t *cnt = reinterpret_cast<const uint16_t *>(ms + MS_CNT);  // [TT][64]
        const float *lse2 = reinterpret_cast<const float *>(ms + MS_LSE), *delta = reinterpret_cast<const float *>(ms + MS_DELTA);
        const int *stok = reinterpret_cast<const int *>(ms + MS_TOK);
        const int vs = v0 + it * TT, ntok = min(TT, v1 - vs);

        uint32_t pa[2][4], da[2][4];
        float pv[16], dsv[16];
        scores<T, S>(sa, dpa, s, kd, it);
        hop::wgmma_wait<0>();
        hop::reg_fence(sa);
        hop::reg_fence(dpa);
        // P^T = mult exp2(S^T sl2 - LSE2), dS^T = scale P^T (dP^T - Delta); unselected keys and
        // padding rows exactly 0 (not 0 times a non-finite dP of another key's row)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int th = 8 * j + 2 * q4 + e, tok = th / HP, h = th % HP;
                const bool ok = tok < ntok && head0 + h < p.H;
                const float l2 = lse2[th], dl = delta[th];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int key = r0 + 8 * hh, i = 4 * j + 2 * hh + e;
                    const float m = ok ? (float)cnt[tok * 64 + key] : 0.f;
                    pv[i] = m > 0.f ? m * hop::ex2(sa[i] * sl2 - l2) : 0.f;
                    dsv[i] = m > 0.f ? scale * pv[i] * (dpa[i] - dl) : 0.f;
                }
            }
        sfa::kmaj_pack_a<T>(pv, pa);
        sfa::kmaj_pack_a<T>(dsv, da);
        hop::bar_sync(1 + C, 128);  // every warp's dQ^T GEMMs of the previous step have read the tile
        sfa::kmaj_store_ds<T>(sds, dsv, q4, r0);
        hop::fence_proxy_async();
        hop::bar_sync(1 + C, 128);  // the tile is whole for the dQ^T GEMMs

        // ---- dK += dS^T Q, dV += P^T dO (B = the stage's Q / dO boxes read MN-major: 16 rows per k-step)
        if constexpr (SPLIT) {
            // warpgroup 0: dK = dS^T Q, 1: dV = P^T dO; operands selected, not branched on (a
            // wgmma under a branch on C is serialised by ptxas: C7518)
            uint32_t xa[2][4];
#pragma unroll
            for (int kk = 0; kk < 2; kk++)
#pragma unroll
                for (int r = 0; r < 4; r++) xa[kk][r] = C ? pa[kk][r] : da[kk][r];
            unsigned char *xb = C ? sdo : sq;
            hop::wgmma_fence();
#pragma unroll
            for (int i = 0; i < NREG; i++) {
                // with rope (NBK = NBN + 1) warpgroup 1's last box has no dO box: it re-reads
                // box 0 into an accumulator the end does not write (no branch around wgmma)
                const int bi = NBK != NBN && C && i >= NBN ? 0 : i;
                const uint64_t bd = hop::desc_sw128(xb + bi * RBOX, RBOX, 1024);
#pragma unroll
                for (int kk = 0; kk < 2; kk++) hop::elt<T>::template rs64<1>(dkv[i], xa[kk], hop::desc_add(bd, kk * 2048), 1);
            }
            hop::wgmma_commit();
        } else {
            hop::wgmma_fence();
#pragma unroll
            for (int i = 0; i < NBK; i++) {
                const uint64_t qb = hop::desc_sw128(sq + i * RBOX, RBOX, 1024);
#pragma unroll
                for (int kk = 0; kk < 2; kk++) hop::elt<T>::template rs64<1>(dkv[i], da[kk], hop::desc_add(qb, kk * 2048), 1);
            }
#pragma unroll
            for (int d = 0; d < NBN; d++) {
                const uint64_t ob = hop::desc_sw128(sdo + d * RBOX, RBOX, 1024);
#pragma unroll
                for (int kk = 0; kk < 2; kk++)
                    hop::elt<T>::template rs64<1>(dkv[S::SEPV ? NBK + d : d], pa[kk], hop::desc_add(ob, kk * 2048), 1);
            }
            hop::wgmma_commit();
        }

        // ---- dQ^T[box] = K^T dS^T (M = 64 columns of the box, N = 32 token-heads, K = 64 keys)
        int qrow[8];  // this thread's 8 token-head columns: dQ accumulator row (-1: padding)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int th = 8 * j + 2 * q4 + e, tok = th / HP, h = th % HP;
                qrow[2 * j + e] = tok < ntok && head0 + h < p.H ? (b * p.S1 + stok[tok]) * p.N1 + n2 * p.H + head0 + h : -1;
            }
        // SPLIT: the dQ^T boxes halved between the consumers
        const int box0 = SPLIT ? C * (NBK / 2) : 0, box1 = SPLIT ? (C ? NBK : NBK / 2) : NBK;
#pragma unroll 1
        for (int box = box0; box < box1; box++) {
            float q[16];
            sfa::kmaj_dq_tile<T>(q, s.k + box * BOX, dsd);
            if (box == box0) {
#pragma unroll
                for (int i = 0; i < NREG; i++) hop::reg_fence(dkv[i]);  // the dK / dV group is done: the stage is free
                hop::reg_fence(pa);
                hop::reg_fence(da);
                hop::mbar_arrive(s.empty + st);
            }
            sfa::kmaj_add_dq(L, q, qrow, box * 64, W, r0, det, fsq);
        }
#pragma unroll
        for (int i = 0; i < NREG; i++) hop::reg_fence(dkv[i]);
    }

    // ---- the two consumers' dK / dV partials summed in shared memory (row-major [64 keys][NDKV
    // 64 columns] fp32 over the stages, free now: every step's copies were waited on), then all
    // 256 consumer threads add the sums into the accumulator rows, coalesced, in one rolled loop
    // (a register box per add_box call unrolled 4-5 times made the kernel's code too large)
    constexpr int WC = NDKV * 64;  // columns of a partial row
    float *red = reinterpret_cast<float *>(s.red);
    auto at = [&](int v) { return (r0 + 8 * ((v >> 1) & 1)) * WC + 8 * (v >> 2) + 2 * q4 + (v & 1); };
    hop::bar_sync(3, 256);
    if (SPLIT) {  // warpgroup 0's dK boxes, then 1's dV boxes: no sums
#pragma unroll
        for (int i = 0; i < NREG; i++)
            if (i < (C ? NBN : NBK))
#pragma unroll
                for (int v = 0; v < 32; v++) red[at(v) + 64 * (i + C * NBK)] = dkv[i][v];
    } else if (C == 1) {
#pragma unroll
        for (int i = 0; i < NDKV; i++)
#pragma unroll
            for (int v = 0; v < 32; v++) red[at(v) + 64 * i] = dkv[i][v];
    }
    hop::bar_sync(3, 256);
    if (!SPLIT && C == 0)
#pragma unroll
        for (int i = 0; i < NDKV; i++)
#pragma unroll
            for (int v = 0; v < 32; v++) red[at(v) + 64 * i] += dkv[i][v];
    hop::bar_sync(3, 256);
    add_rows(p, red, WC, kb, n2, b, det ? *p.fix_scale : 1.f, det, C * 128 + t);
}

template <typename T, class S, int HP>
__global__ void __launch_bounds__(384, 1) sfa_bwd_kmaj_kernel(const __grid_constant__ Params p, const __grid_constant__ SmallLists L) {
    using LY = Lay<S>;
    constexpr int TT = NR / HP, NBN = S::NBN, NBR = S::NBR, NBK = S::NBK;
    // CTA (list l, window y of L.ww words, head chunk z): the visits of l whose token lies in the
    // window (they start at a word's prefix count).  List-fastest grid: the CTAs resident at a
    // time share one window, so their dQ adds stay in rows that L2 holds.
    const int64_t l = blockIdx.x;
    const int64_t wrow = l * L.s1w;
    const int w0 = (int)blockIdx.y * L.ww, w1 = w0 + L.ww;
    const int v0 = L.off[l] + (int)L.wpre[wrow + w0];
    const int v1 = L.off[l] + (w1 < L.s1w ? (int)L.wpre[wrow + w1] : L.len[l]);
    if (v0 >= v1) return;  // no token of this window selects a key of the block
    const int kb = (int)(l % L.nkb), n2 = (int)(l / L.nkb % p.N2), b = (int)(l / L.nkb / p.N2);
    const int hc = (int)blockIdx.z, head0 = hc * NR;

    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = hop::align1024(smem_raw);
    Sm s;
    s.k = sm + LY::OFF_K;
    s.st = sm + LY::OFF_ST;
    s.misc = sm + LY::OFF_MISC;
    s.ds = sm + LY::OFF_DS;
    s.red = sm + LY::OFF_RED;
    constexpr int NST = LY::NST;
    s.full = reinterpret_cast<uint64_t *>(sm + LY::OFF_BAR);
    s.empty = s.full + NST;
    s.kbar = s.empty + NST;
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0), t = threadIdx.x & 127;
    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; i++) {
            hop::mbar_init(s.full + i, 128);
            hop::mbar_init(s.empty + i, LY::SPLIT ? 256 : 128);
        }
        hop::mbar_init(s.kbar, 128);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // ------------------------------------------------------------------ producer
        hop::setmaxnreg_dec<40>();
        sfa::kmaj_load_block<T, S>(s.k, s.kbar, p, b, n2, kb, __ldg(L.kused + l), t);
        const T *qb = static_cast<const T *>(p.q) + b * p.sq[0] + (int64_t)(n2 * p.H + head0) * p.sq[2];
        const T *qrb = NBR ? static_cast<const T *>(p.qr) + b * p.sqr[0] + (int64_t)(n2 * p.H + head0) * p.sqr[2] : qb;
        const T *dob = static_cast<const T *>(p.dout) + b * p.sdo[0] + (int64_t)(n2 * p.H + head0) * p.sdo[2];
        const int nsteps = (v1 - v0 + TT - 1) / TT;
        for (int it = 0; it < nsteps; it++) {
            const int st = it & (NST - 1);
            if (it >= NST) hop::mbar_wait(s.empty + st, ((it / NST) - 1) & 1);
            unsigned char *sq = s.st + st * LY::SQD, *ms = s.misc + st * MISC;
            const int vs = v0 + it * TT, ntok = min(TT, v1 - vs);
            // Q (NBK boxes) and dO (NBN boxes) rows th = tok * HP + h, 8 threads per row (128
            // contiguous bytes per row and instruction), 16 rows per pass
#pragma unroll
            for (int pass = 0; pass < 2; pass++) {
                const int th = (t >> 3) + 16 * pass, cc = t & 7, tok = th / HP, h = th % HP;
                const bool ok = tok < ntok && head0 + h < p.H;
                const int s1 = ok ? L.vtok[vs + tok] : 0;
                const T *qs = qb + (int64_t)s1 * p.sq[1] + (int64_t)h * p.sq[2] + cc * 8;
                const T *rs = NBR ? qrb + (int64_t)s1 * p.sqr[1] + (int64_t)h * p.sqr[2] + cc * 8 : qb;
                const T *ds = dob + (int64_t)s1 * p.sdo[1] + (int64_t)h * p.sdo[2] + cc * 8;
                const uint32_t so = hop::sw128(th, cc);
                // the last value box's chunks past D (Params::dn), the rope's past Dr (dr) zero-filled
                const bool okl = ok && (NBN - 1) * 64 + cc * 8 < p.dn, okr = ok && cc * 8 < p.dr;
#pragma unroll
                for (int i = 0; i < NBN; i++) {
                    const bool oki = i < NBN - 1 ? ok : okl;
                    sfa::cp_async16(sq + i * RBOX + so, oki ? qs + i * 64 : qb, oki ? 16 : 0);
                }
#pragma unroll
                for (int i = 0; i < NBR; i++) sfa::cp_async16(sq + (NBN + i) * RBOX + so, okr ? rs + i * 64 : qb, okr ? 16 : 0);
#pragma unroll
                for (int i = 0; i < NBN; i++) {
                    const bool oki = i < NBN - 1 ? ok : okl;
                    sfa::cp_async16(sq + (NBK + i) * RBOX + so, oki ? ds + i * 64 : qb, oki ? 16 : 0);
                }
            }
            // multiplicities, LSE2 and Delta per token-head row, the visits' tokens
            sfa::kmaj_step_rows<HP>(ms, MS_CNT, MS_LSE, MS_DELTA, p, L, b, n2, head0, vs, ntok, t);
            if (t < TT) sfa::cp_async4(ms + MS_TOK + t * 4, t < ntok ? L.vtok + vs + t : L.vtok, t < ntok);
            hop::cp_async_arrive_noinc(s.full + st);
        }
        sfa::cp_async_wait<0>();
        return;
    }

    // ------------------------------------------------------------------------------- consumers
    hop::setmaxnreg_inc<232>();
    hop::mbar_wait(s.kbar, 0);
    consume<T, S, HP>(p, L, s, b, n2, kb, hc, v0, v1, wg - 1);
}

template <typename T, class S, int HP> cudaError_t launch_hp(const Params &p, const SmallLists &L, int nl, cudaStream_t st) {
    static unsigned long long done = 0;
    const cudaError_t e = hop::set_smem(sfa_bwd_kmaj_kernel<T, S, HP>, Lay<S>::SMEM, &done);
    if (e != cudaSuccess) return e;
    const int windows = (L.s1w + L.ww - 1) / L.ww, chunks = (p.H + NR - 1) / NR;
    sfa_bwd_kmaj_kernel<T, S, HP><<<dim3((unsigned)nl, (unsigned)windows, (unsigned)chunks), 384, Lay<S>::SMEM, st>>>(p, L);
    return cudaGetLastError();
}

// S0: the shape; the kernel always takes its PadOf instantiation (the partial-box tests: no
// measurable cost in this backward, H200 2026-12-05, sfa_shapes.cases 0.995-1.001x of the
// tree without them)
template <typename T, class S0> cudaError_t launch_shape(const Params &p, const SmallLists &L, int nl, cudaStream_t st) {
    using S = sfa::PadOf<S0>;
    // fewer than 4 heads per key head run 4-head rows (the padded rows masked)
    if (p.H <= 4) return launch_hp<T, S, 4>(p, L, nl, st);
    if (p.H <= 8) return launch_hp<T, S, 8>(p, L, nl, st);
    if (p.H <= 16) return launch_hp<T, S, 16>(p, L, nl, st);
    return launch_hp<T, S, 32>(p, L, nl, st);
}

template <typename T> cudaError_t launch_t(const Params &p, const SmallLists &L, int shape, int nl, cudaStream_t st) {
    switch (shape) {
    case sfa::SHAPE_NSA: return launch_shape<T, sfa::Nsa>(p, L, nl, st);
    case sfa::SHAPE_SEP_128_64: return launch_shape<T, sfa::Sep<2, 1>>(p, L, nl, st);
    case sfa::SHAPE_SEP_64: return launch_shape<T, sfa::Sep<1, 0>>(p, L, nl, st);
    case sfa::SHAPE_SEP_256: return launch_shape<T, sfa::Sep<4, 0>>(p, L, nl, st);
    case sfa::SHAPE_SHV_128_64: return launch_shape<T, sfa::Shv<2, 1>>(p, L, nl, st);
    case sfa::SHAPE_SHV_128: return launch_shape<T, sfa::Shv<2, 0>>(p, L, nl, st);
    case sfa::SHAPE_SHV_256_64: return launch_shape<T, sfa::Shv<4, 1>>(p, L, nl, st);
    case sfa::SHAPE_SHV_256: return launch_shape<T, sfa::Shv<4, 0>>(p, L, nl, st);
    case sfa::SHAPE_SEP_64_64: return launch_shape<T, sfa::Sep<1, 1>>(p, L, nl, st);
    case sfa::SHAPE_SEP_192: return launch_shape<T, sfa::Sep<3, 0>>(p, L, nl, st);
    case sfa::SHAPE_SEP_192_64: return launch_shape<T, sfa::Sep<3, 1>>(p, L, nl, st);
    case sfa::SHAPE_SHV_64: return launch_shape<T, sfa::Shv<1, 0>>(p, L, nl, st);
    case sfa::SHAPE_SHV_64_64: return launch_shape<T, sfa::Shv<1, 1>>(p, L, nl, st);
    case sfa::SHAPE_SHV_192: return launch_shape<T, sfa::Shv<3, 0>>(p, L, nl, st);
    case sfa::SHAPE_SHV_192_64: return launch_shape<T, sfa::Shv<3, 1>>(p, L, nl, st);
    case sfa::SHAPE_SEP_256_64: return launch_shape<T, sfa::Sep<4, 1>>(p, L, nl, st);
    default: return cudaErrorInvalidValue;
    }
}

}  // namespace

// The main kernel of the key-major backward for a shape of spattn_sfa_bwd_kmaj_shape (the lists of
// L built by sfa_bwd_small.cu's launcher, which calls this).
extern "C" cudaError_t spattn_sfa_bwd_kmaj_launch(const sfa::Params *p, const sfa::SmallLists *L, int is_bf16, int shape,
                                                  cudaStream_t st) {
    const int nl = p->B * p->N2 * L->nkb;
    return is_bf16 ? launch_t<__nv_bfloat16>(*p, *L, shape, nl, st) : launch_t<__half>(*p, *L, shape, nl, st);
}
