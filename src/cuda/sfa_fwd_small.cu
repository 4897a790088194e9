// Top-k sparse flash attention forward for Hopper (sm_90a) with few query heads per key head
// (H = N1 / N2 <= 32): the keys are the MMA rows, so no MMA row is padding.  Same operator and
// layout contract as sfa_fwd.cu (D = 512 value / nope part plus Dr = 64 rope, V = K's first 512
// columns, any sbs, modes 0 and 3, GQA); the 64-head kernel there pads H to 64 MMA rows, which
// made the small-head cases cost as much per key as 64 heads.
//
// One CTA = one query token (b, s1, n2) and its H heads (N = H rounded up to 8, 16 or 32: the
// wgmma N).  384 threads:
//   - warpgroup 0, the producer: gathers the selected key rows, 64 per block, 576 columns, with
//     16-byte cp.async into the 128-byte-swizzled layout wgmma reads (as sfa_fwd.cu); block 2j
//     goes to buffer 0, 2j + 1 to buffer 1, each completed and released in two halves (columns
//     0-255; 256-575);
//   - warpgroups 1 and 2, the consumers: warpgroup c owns buffer c (even / odd blocks) and runs
//     its own online softmax over its blocks, with its own O^T:
//       S^T = K Q^T      (64 keys x N heads; A = the key block, B = Q, both K-major in shared memory)
//       P^T = exp2(S^T * scale_log2 - m)  per head (column): the block max over the 64 keys is a
//                        shuffle within each warp and a 4-warp exchange in shared memory
//       O^T += V^T P^T   (512 x N in 8 tiles of 64; A = V^T, the block read MN-major; B = P, stored
//                        [N heads][64 keys] in shared memory)
//     so the two warpgroups never wait for each other inside the loop.  At the end each
//     finalises 256 of the 512 output columns, merging the other's partial (m, l, O) as a
//     split-KV combine.
// Softmax in base 2, fp32; rows with no valid key get O = 0 and LSE = -inf; a NaN score (or
// +inf) makes O and LSE of its head NaN.
// VL = true: the packed variable-length / paged form, as in sfa_fwd.cu (per-CTA token lookup,
// sequence-local keys translated in the gather).
// S = a separate-V shape (sfa::Sep in sfa_gather.cuh; sfa::Nsa: D = 128, no rope, NSA-style
// selection): the same kernel with blocks of the K boxes then the V boxes, the K half released
// after S^T, the output's d-tiles split between the warpgroups at the end; any H (grid.z: chunks
// of N <= 32 heads).  S = sfa::Mla is the DeepSeek shape above; sfa::Shv the same layout (V = the
// first D columns of the gathered block) at D 128 / 256 with or without rope, any H.  D not a
// multiple of 64 runs the shape of D rounded up (Params::dn: the last value box partial, its
// columns past D zero in K, V and Q, so S and P V are exact; O's columns past D not stored).
#include <math.h>

#include <type_traits>

#include "cta_trace.cuh"
#include "hopper/hopper.cuh"
#include "sfa_gather.cuh"
#include "sfa_keyrows.cuh"

namespace {

using sfa::Params;

constexpr int BK = sfa::GBK;                  // selected keys per block
constexpr int BOX = sfa::GBOX;                // one box of 64 rows

// S (sfa_gather.cuh): the block's boxes.  Mla: 9 (8 nope + rope; V = boxes 0-7), 73728 bytes;
// Nsa: 2 of K then 2 of V, 32768 bytes.
template <int N, typename S> struct SmallCfg {
    static constexpr int NBOX = S::NBK;                               // boxes of the score (Q and K)
    static constexpr int TILE = S::NBT * BOX;                         // one gathered block
    // O^T d-tiles; at the end warpgroup 0 finalises HA of them, warpgroup 1 the other HB
    static constexpr int ND = S::NBN, HA = (ND + 1) / 2, HB = ND - HA;
    static constexpr int QBOX = N * 128;                              // a 64-column box of Q (N rows)
    static constexpr int OFF_K = 0;                                   // 2 key buffers
    static constexpr int OFF_Q = 2 * TILE;                            // [NBOX boxes][N][128 B]
    static constexpr int OFF_P = OFF_Q + NBOX * QBOX;                 // [2 wg][2 phase][N][128 B]
    static constexpr int OFF_RED = OFF_P + 4 * N * 128;               // [2 wg][2 phase][4 warps][N] fp32
    static constexpr int OFF_M = OFF_RED + 2 * 2 * 4 * N * 4;         // [2 wg][N] fp32 final max
    static constexpr int OFF_L = OFF_M + 2 * N * 4;                   // [2 wg][4 warps][N] fp32 sums
    static constexpr int OFF_VALID = OFF_L + 2 * 4 * N * 4;           // [2][64]
    static constexpr int OFF_BAR = OFF_VALID + 2 * BK;                // rdy[2][2], fre[2][2], vbar[2]
    static constexpr int OFF_LAST = OFF_BAR + 10 * 8;
    static constexpr int SMEM = OFF_LAST + 16 + 1024;                 // + alignment slack
    static_assert(OFF_Q % 1024 == 0 && OFF_P % 1024 == 0 && QBOX % 1024 == 0, "swizzle atoms");
    static_assert(OFF_BAR % 8 == 0, "mbarrier alignment");
    static_assert(SMEM <= 232448, "fits in 227 KB");
    // the final exchange of O^T halves (2 x HA tiles x N/2 x 128 fp32) reuses the key buffers;
    // O is staged as [N][D] in the Q area
    static_assert(2 * HA * (N / 2) * 128 * 4 <= 2 * TILE, "exchange fits");
    static_assert(ND <= NBOX, "O fits the Q area");
    // buffer halves, completed and released separately: shared V (Mla): columns 0-255 (read by
    // the first k-steps of S^T and the first d-tiles of P V), then the rest (an odd count of value
    // boxes: the larger part first; D 64 without rope: the second half empty); separate V (Nsa):
    // K (released after S^T), then V
    static constexpr int H0 = S::SEPV ? S::NBK : (ND + 1) / 2;
    // CTAs per SM and the registers of the producer / consumers (setmaxnreg).  The kernel launches
    // with LREG registers per thread (ptxas takes the bound when setmaxnreg is used) and the
    // CTA's setmaxnreg calls can only share that pool: a larger sum leaves setmaxnreg.inc spinning
    // forever (a two-CTA Nsa form with 48 / 104 hung on the H200, 2026-12-02).  Separate-V shapes
    // whose shared memory fits twice (228 KB per SM, 1 KB reserved per CTA: all but D 256) run two
    // CTAs per SM with 40 / 96: 0.73x the time of one CTA (sfas01-04, H200), the gather's latency
    // hidden by the other CTA's.
    // The other shared-V shapes (sfa::Shv) keep one CTA: at 40 / 96 registers ptxas spilled 84-356
    // bytes in them (D 256 at N 32: 356), against 16-36 in the separate-V ones.
    static constexpr int CTAS = S::SEPV && 2 * (SMEM + 1024) <= 233472 ? 2 : 1;
    static constexpr int LREG = 65536 / (384 * CTAS) / 8 * 8;  // 168 or 80
    static constexpr int PREG = CTAS == 2 ? 40 : 72, CREG = CTAS == 2 ? 96 : 216;
    static_assert(128 * PREG + 256 * CREG <= 384 * LREG, "setmaxnreg within the CTA's launch registers");
};

// named barriers: NB_Q consumers (256); NB_RED + c, NB_O + c one consumer warpgroup (128);
// NB_SCAN, NB_FIN all 384 (named: producer and consumers reach NB_FIN at different PCs, which
// __syncthreads does not allow; compute-sanitizer synccheck)
enum { NB_Q = 1, NB_RED = 2 /* and 3 */, NB_O = 4 /* and 5 */, NB_SCAN = 9, NB_FIN = 10 };

template <int N, typename T, bool VL, typename S>
__global__ void __launch_bounds__(384, SmallCfg<N, S>::CTAS) sfa_fwd_small_kernel(const __grid_constant__ Params p) {
    using C = SmallCfg<N, S>;
    constexpr int NBOX = C::NBOX, TILE = C::TILE, ND = C::ND, HA = C::HA, HB = C::HB;
    // warpgroup 1's d-tile HA + tt (clamped: the selects below need a valid compile-time index
    // where HA + tt = ND, which only odd ND reaches and then guards off)
    auto ot = [](int tt) { return HA + tt < ND ? HA + tt : ND - 1; };
    constexpr int NJ = N / 8;  // column groups of 8 heads in an m64nN accumulator
    SPATTN_TRACE(const unsigned long long tr0 = cta_trace::now(); unsigned long long tr1 = 0, tr2 = 0;)
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = hop::align1024(smem_raw);
    unsigned char *sQ = sm + C::OFF_Q;
    float *sRed = reinterpret_cast<float *>(sm + C::OFF_RED);
    float *sMf = reinterpret_cast<float *>(sm + C::OFF_M);
    float *sLf = reinterpret_cast<float *>(sm + C::OFF_L);
    uint8_t *valid = sm + C::OFF_VALID;  // [2][64]
    uint64_t *rdy = reinterpret_cast<uint64_t *>(sm + C::OFF_BAR);  // [buffer][half]
    uint64_t *fre = rdy + 4, *vbar = rdy + 8;                         // vbar[buffer]
    int *s_last = reinterpret_cast<int *>(sm + C::OFF_LAST);

    const int s1 = p.S1 - 1 - (int)blockIdx.x;  // the longest rows (mode 3) first
    const int b = blockIdx.y / p.N2, n2 = blockIdx.y % p.N2;
    // heads [head0, head0 + nh): blockIdx.z is the chunk of N heads (H > 32: generic shapes only)
    const int head0 = n2 * p.H + (int)blockIdx.z * N, nh = min(N, p.H - (int)blockIdx.z * N);
    // a token of a group the union kernel (sfa_fwd.cu UN, Mla) or the group kernel
    // (sfa_fwd_group.cu, the other shapes) took (sfa_union.cu's plan, Params::ucnt) is done
    if (p.ucnt && __ldg(p.ucnt + (int64_t)blockIdx.y * p.ungroups + (s1 >> p.lg2ug)) >= 0) return;
    // VL: s1 is the packed token (b = 0, batch strides 0); tokens past cu_seqlens_q[B] exit
    sfa::TokenRow tr;
    if (!sfa::token_row<VL>(p, b, n2, s1, tr)) return;
    const int4 tk = tr.tk;
    const int lim = tr.lim;
    const int32_t *irow = tr.irow;
    const int64_t si3 = tr.si3;
    const T *qb = static_cast<const T *>(p.q) + b * p.sq[0] + (int64_t)s1 * p.sq[1];
    const T *qrb = static_cast<const T *>(p.qr) + b * p.sqr[0] + (int64_t)s1 * p.sqr[1];
    // warp-uniform in the compiler's view (a shuffle), so wgmma is not in a divergent path
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0), t = threadIdx.x & 127;
    // the index scan's verdict (see sfa_fwd.cu): loaded now, used at the stores
    const unsigned long long gate = sfa::gate_word(p.gate);
    if (threadIdx.x == 0) {
        for (int i = 0; i < 4; i++) {
            hop::mbar_init(rdy + i, 128);
            hop::mbar_init(fre + i, 128);
        }
        hop::mbar_init(vbar, 16);
        hop::mbar_init(vbar + 1, 16);
        *s_last = -1;
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // ------------------------------------------------------------------ producer
        hop::setmaxnreg_dec<C::PREG>();
        const sfa::Gather<T, VL, S> gat = VL ? sfa::Gather<T, VL, S>(p, n2, t, tk) : sfa::Gather<T, VL, S>(p, b, n2, t);
        unsigned char *buf0 = sm + C::OFF_K, *buf1 = buf0 + TILE;
        int np = 1;  // pair 0 is gathered before the scan's answer (harmless when it is 0)
        // The buffer waits with a suspend-time hint: 0.99-1.00x the time of plain polling on every
        // small-head case (H200, same call, medians of 10).  Polling was not why batched index
        // loads are slower here: with the hint they still took 1.15x on sfa18, 0.86x on sfa16.
        auto wait_free = [&](uint64_t *bar, uint32_t par) { hop::mbar_wait_hint(bar, par, 1000000u); };
        for (int i = 0; i < np; i++) {
            const uint32_t fp = (i & 1) ^ 1;
            int k0[4], k1[4];
            gat.template keys<true>(p, irow, si3, 2 * i, lim, k0);  // serial loads (key_of_serial)
            gat.template keys<true>(p, irow, si3, 2 * i + 1, lim, k1);
            // each consumer reads the first half first (C::H0)
            wait_free(fre + 0, fp);
            gat.copy(buf0, k0, 0, C::H0);
            hop::cp_async_arrive_noinc(rdy + 0);
            wait_free(fre + 2, fp);
            gat.copy(buf1, k1, 0, C::H0);
            hop::cp_async_arrive_noinc(rdy + 2);
            // a buffer's flags are rewritten once its consumer released both halves (it read them)
            wait_free(fre + 1, fp);
            gat.copy(buf0, k0, C::H0, S::NBT);
            hop::cp_async_arrive_noinc(rdy + 1);
            if (gat.ig == 0) {
                gat.flags(valid, k0);
                hop::mbar_arrive(vbar);
            }
            wait_free(fre + 3, fp);
            gat.copy(buf1, k1, C::H0, S::NBT);
            hop::cp_async_arrive_noinc(rdy + 3);
            if (gat.ig == 0) {
                gat.flags(valid + BK, k1);
                hop::mbar_arrive(vbar + 1);
            }
            if (i == 0) {
                hop::bar_sync(NB_SCAN, 384);
                np = sfa::npairs_of(*s_last);
            }
        }
        sfa::cp_async_wait<0>();
        // the consumers' final exchange reuses the key buffers; arrive, not sync: compute-sanitizer's synccheck
        // reports a barrier synced at two PCs as divergent
        hop::bar_arrive(NB_FIN, 384);
        return;
    }

    // ------------------------------------------------------------------------------- consumers
    hop::setmaxnreg_inc<C::CREG>();
    const int c = wg - 1;  // buffer c: blocks c, c + 2, ...
    const int warp = t >> 5, lane = t & 31, q4 = lane & 3;
    const int r0 = warp * 16 + (lane >> 2);  // this thread's rows (keys; in O^T: columns d) r0, r0 + 8
    const float sl2 = p.scale_log2;
    unsigned char *buf = sm + C::OFF_K + c * TILE;

    float o[ND][N / 2], st[N / 2];
    float m[NJ][2], l[NJ][2];  // per column (head 8 g + 2 q4 + h) of this thread
#pragma unroll
    for (int d = 0; d < ND; d++)
#pragma unroll
        for (int x = 0; x < N / 2; x++) o[d][x] = 0.f;
#pragma unroll
    for (int g = 0; g < NJ; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            // -1e30 instead of -inf keeps exp2(m_old - m_new) finite while a head has no valid key
            m[g][h] = -1e30f;
            l[g][h] = 0.f;
        }

    sfa::load_q<T, S>(sQ, N, p, qb, qrb, head0, nh, t + c * 128, 256);  // rows past nh are zero
    sfa::prescan_last(p, irow, si3, lim, t + c * 128, 256, s_last);
    sfa::cp_async_wait<0>();
    hop::fence_proxy_async();
    hop::bar_sync(NB_Q, 256);
    const int npairs = sfa::npairs_of(*s_last);
    hop::bar_arrive(NB_SCAN, 384);

    // Descriptors, k-steps added to the address field at each use (hop::desc_add)
    const uint64_t kd = hop::desc_sw128(buf, 16, 1024), qd = hop::desc_sw128(sQ, 16, 1024);
    const uint64_t vd = hop::desc_sw128(buf, BOX, 1024);
    auto kdesc = [&](int kk) { return hop::desc_add(kd, (kk >> 2) * BOX + (kk & 3) * 32); };
    auto qdesc = [&](int kk) { return hop::desc_add(qd, (kk >> 2) * C::QBOX + (kk & 3) * 32); };
    // V^T tile dt (d = 64 dt ..) read MN-major: 16 keys (rows of 128 bytes) per k-step
    auto vdesc = [&](int dt, int kk) { return hop::desc_add(vd, S::vbox(dt) * BOX + kk * 16 * 128); };
    const sfa::PTrans<T, N> pt(warp, lane);

    for (int j = 0; j < npairs; j++) {
        const uint32_t ph = j & 1;
        unsigned char *sP = sm + C::OFF_P + (c * 2 + ph) * N * 128;
        float *red = sRed + (c * 2 + ph) * 4 * N;
        // S^T = K Q^T, 4 NBOX k-steps; shared V: columns 0-255 are completed first
        hop::mbar_wait(rdy + 2 * c, ph);
        hop::wgmma_fence();
        if constexpr (S::SEPV) {  // the first half is all of K: released once S^T has read it
#pragma unroll
            for (int kk = 0; kk < 4 * NBOX; kk++) hop::elt<T>::template ssn<N, 0, 0>(st, kdesc(kk), qdesc(kk), kk > 0);
            hop::wgmma_commit();
            hop::wgmma_wait<0>();
            hop::reg_fence(st);
            hop::mbar_arrive(fre + 2 * c);
        } else {
#pragma unroll
            for (int kk = 0; kk < 4 * C::H0; kk++) hop::elt<T>::template ssn<N, 0, 0>(st, kdesc(kk), qdesc(kk), kk > 0);
            hop::wgmma_commit();
            hop::mbar_wait(rdy + 2 * c + 1, ph);
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 4 * C::H0; kk < 4 * NBOX; kk++) hop::elt<T>::template ssn<N, 0, 0>(st, kdesc(kk), qdesc(kk), 1);
            hop::wgmma_commit();
            hop::wgmma_wait<0>();
            hop::reg_fence(st);
        }

        SPATTN_TRACE(if (j == 0) tr1 = cta_trace::now();)  // first S^T ready
        // scaled scores, invalid keys (rows) at -inf; per column the block max over the 64 keys
        hop::mbar_wait(vbar + c, ph);
        const bool v0 = valid[c * BK + r0], v1 = valid[c * BK + r0 + 8];
        // P^T and the running sums from the kept max (O^T rescaled where it moves: its previous
        // P V completed at the last wait), P into sP
        sfa::keyrows_softmax_voted<T, N, ND>(st, v0, v1, sl2, red, pt, hop::smem_u32(sP), m, l, o, warp, lane, NB_RED + c);
        // O^T += V^T P^T.  Shared V: d-tiles 0 .. H0-1 (the first half of the block), then the
        // rest; each half of the buffer is released as soon as its GEMMs have read it (the rope
        // box after S^T).  Separate V: all d-tiles from the second half (V), released after them.
        const uint64_t pd = hop::desc_sw128(sP, 16, 1024);
        if constexpr (S::SEPV) {
            hop::mbar_wait(rdy + 2 * c + 1, ph);
            hop::wgmma_fence();
#pragma unroll
            for (int d = 0; d < ND; d++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++) hop::elt<T>::template ssn<N, 1, 0>(o[d], vdesc(d, kk), hop::desc_add(pd, kk * 32), 1);
            hop::wgmma_commit();
            hop::wgmma_wait<0>();
#pragma unroll
            for (int d = 0; d < ND; d++) hop::reg_fence(o[d]);
            hop::mbar_arrive(fre + 2 * c + 1);
        } else {
            hop::wgmma_fence();
#pragma unroll
            for (int d = 0; d < C::H0; d++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++) hop::elt<T>::template ssn<N, 1, 0>(o[d], vdesc(d, kk), hop::desc_add(pd, kk * 32), 1);
            hop::wgmma_commit();
#pragma unroll
            for (int d = C::H0; d < ND; d++)
#pragma unroll
                for (int kk = 0; kk < 4; kk++) hop::elt<T>::template ssn<N, 1, 0>(o[d], vdesc(d, kk), hop::desc_add(pd, kk * 32), 1);
            hop::wgmma_commit();
            hop::wgmma_wait<1>();
#pragma unroll
            for (int d = 0; d < C::H0; d++) hop::reg_fence(o[d]);
            hop::mbar_arrive(fre + 2 * c);
            hop::wgmma_wait<0>();
#pragma unroll
            for (int d = C::H0; d < ND; d++) hop::reg_fence(o[d]);
            hop::mbar_arrive(fre + 2 * c + 1);
        }
    }

    SPATTN_TRACE(tr2 = cta_trace::now();)  // this warpgroup's last P V done
    // ---- epilogue: per head, this warpgroup's max and the row sums of its 4 warps; then each
    // warpgroup finalises its d-tiles (warpgroup 0: 0 .. HA-1, warpgroup 1: HA .. ND-1) merged
    // with the other's partials of them (exchanged through the free key buffers)
#pragma unroll
    for (int g = 0; g < NJ; g++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float x = l[g][h];
            x += __shfl_xor_sync(0xffffffffu, x, 4);
            x += __shfl_xor_sync(0xffffffffu, x, 8);
            x += __shfl_xor_sync(0xffffffffu, x, 16);
            l[g][h] = x;
        }
    // with the producer: its copies have all landed (pair 0 is gathered even when no pair is
    // visited), so the key buffers can carry the exchange
    hop::bar_sync(NB_FIN, 384);
    if (lane < 4) {
#pragma unroll
        for (int g = 0; g < NJ; g++) {
            *reinterpret_cast<float2 *>(sLf + (c * 4 + warp) * N + 8 * g + 2 * q4) = make_float2(l[g][0], l[g][1]);
            if (warp == 0) *reinterpret_cast<float2 *>(sMf + c * N + 8 * g + 2 * q4) = make_float2(m[g][0], m[g][1]);
        }
    }
    float *ex = reinterpret_cast<float *>(sm + C::OFF_K);  // [source wg][HA tiles][N/2][128 threads]
#pragma unroll
    for (int tt = 0; tt < HA; tt++)
        if (c || tt < HB)
#pragma unroll
            for (int x = 0; x < N / 2; x++)  // the other's tiles (selects: no dynamic register index)
                ex[((c * HA + tt) * (N / 2) + x) * 128 + t] = c ? o[tt][x] : o[ot(tt)][x];
    hop::bar_sync(NB_Q, 256);

    float so[NJ][2], sx[NJ][2], inv[NJ][2], lf[NJ][2], mf[NJ][2];
#pragma unroll
    for (int g = 0; g < NJ; g++) {
        const int col = 8 * g + 2 * q4;
        const float2 mo = *reinterpret_cast<const float2 *>(sMf + c * N + col);
        const float2 mx = *reinterpret_cast<const float2 *>(sMf + (1 - c) * N + col);
        float2 lo = make_float2(0.f, 0.f), lx = make_float2(0.f, 0.f);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const float2 a = *reinterpret_cast<const float2 *>(sLf + (c * 4 + w) * N + col);
            const float2 bb = *reinterpret_cast<const float2 *>(sLf + ((1 - c) * 4 + w) * N + col);
            lo.x += a.x;
            lo.y += a.y;
            lx.x += bb.x;
            lx.y += bb.y;
        }
        const float own[2] = {mo.x, mo.y}, oth[2] = {mx.x, mx.y}, lown[2] = {lo.x, lo.y}, loth[2] = {lx.x, lx.y};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float mm = fmaxf(own[h], oth[h]);
            so[g][h] = hop::ex2(own[h] - mm);
            sx[g][h] = hop::ex2(oth[h] - mm);
            const float ll = lown[h] * so[g][h] + loth[h] * sx[g][h];
            lf[g][h] = ll;
            mf[g][h] = mm;
            inv[g][h] = ll > 0.f ? 1.f / ll : ll == 0.f ? 0.f : ll;
        }
    }
    // O (normalised, T) staged as [N heads][D] rows of 2 D bytes in the Q area (free: every S
    // GEMM has completed), then 16-byte row-contiguous global stores of this half
    unsigned char *os = sQ;
    constexpr int ROWB = S::D * 2;
#pragma unroll
    for (int tt = 0; tt < HA; tt++)
        if (!c || tt < HB)
#pragma unroll
        for (int g = 0; g < NJ; g++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int rr = 0; rr < 2; rr++) {
                    const int x = 4 * g + 2 * rr + h, col = 8 * g + 2 * q4 + h, d = (HA * c + tt) * 64 + r0 + 8 * rr;
                    const float other = ex[(((1 - c) * HA + tt) * (N / 2) + x) * 128 + t];
                    const float mine = c ? o[ot(tt)][x] : o[tt][x];
                    const float v = (mine * so[g][h] + other * sx[g][h]) * inv[g][h];
                    const uint32_t pk = hop::elt<T>::pack(v, 0.f);
                    *reinterpret_cast<uint16_t *>(os + col * ROWB + d * 2) = (uint16_t)(pk & 0xffffu);
                }
    hop::bar_sync(NB_O + c, 128);
    // 16-byte chunks of this warpgroup's part of a head's row (a constant when ND is even)
    const int CH = HA == HB || !c ? HA * 8 : HB * 8;
    T *ob = static_cast<T *>(p.out_o) + b * p.so[0] + (int64_t)s1 * p.so[1] + (int64_t)head0 * p.so[2] + c * HA * 64;
    for (int x = t; x < nh * CH; x += 128) {
        const int row = x / CH, ch = x % CH;
        if (gate == ~0ull && (!S::PADV || c * HA * 64 + ch * 8 < p.dn))  // columns past D: padding
            __stcs(reinterpret_cast<int4 *>(ob + (int64_t)row * p.so[2] + ch * 8),
                   *reinterpret_cast<const int4 *>(os + row * ROWB + (c * HA * 64 + ch * 8) * 2));  // streamed
    }
    if (c == 0 && warp == 0 && lane < 4 && p.out_lse && gate == ~0ull)
        sfa::keyrows_store_lse<N>(p.out_lse + b * p.slse[0] + (int64_t)s1 * p.slse[1], p.slse[2], head0, nh, q4, mf, lf);
    SPATTN_TRACE(if (threadIdx.x == 128 && cta_trace::g_rec) cta_trace::g_rec[cta_trace::block()] =
                     cta_trace::Rec{{tr0, tr1, tr2, cta_trace::now()}, npairs, cta_trace::smid()};)
}

template <int N, typename T, bool VL, typename S> cudaError_t launch(const Params &p, cudaStream_t st) {
    static unsigned long long done = 0;
    const cudaError_t e = hop::set_smem(sfa_fwd_small_kernel<N, T, VL, S>, SmallCfg<N, S>::SMEM, &done);
    if (e != cudaSuccess) return e;
    // VL: S1 = Tq, B = 1; z: chunks of N heads
    const dim3 grid((unsigned)p.S1, (unsigned)(p.B * p.N2), (unsigned)((p.H + N - 1) / N));
    SPATTN_TRACE(const long long nctas = (long long)grid.x * grid.y * grid.z;
                 cta_trace::Rec *trace = cta_trace::begin(nctas, st);)
    sfa_fwd_small_kernel<N, T, VL, S><<<grid, 384, SmallCfg<N, S>::SMEM, st>>>(p);
    SPATTN_TRACE(cta_trace::end(trace, nctas, st);)
    return cudaGetLastError();
}

template <typename T, bool VL, typename S> cudaError_t launch_h(const Params &p, cudaStream_t st) {
    return p.H <= 8 ? launch<8, T, VL, S>(p, st) : p.H <= 16 ? launch<16, T, VL, S>(p, st) : launch<32, T, VL, S>(p, st);
}

template <bool VL, typename S> cudaError_t launch_t(const sfa::Params *p, int is_bf16, cudaStream_t st) {
    if constexpr (!std::is_same<S, sfa::Mla>::value)  // D or Dr not a whole box count: the tests
        if (sfa::padded<S>(*p))
            return is_bf16 ? launch_h<__nv_bfloat16, VL, sfa::PadOf<S>>(*p, st) : launch_h<__half, VL, sfa::PadOf<S>>(*p, st);
    return is_bf16 ? launch_h<__nv_bfloat16, VL, S>(*p, st) : launch_h<__half, VL, S>(*p, st);
}
template <bool VL> cudaError_t launch_shape(const sfa::Params *p, int is_bf16, int shape, cudaStream_t st) {
    switch (shape) {
    case sfa::SHAPE_MLA: return launch_t<VL, sfa::Mla>(p, is_bf16, st);
    case sfa::SHAPE_NSA: return launch_t<VL, sfa::Nsa>(p, is_bf16, st);
    case sfa::SHAPE_SEP_128_64: return launch_t<VL, sfa::Sep<2, 1>>(p, is_bf16, st);
    case sfa::SHAPE_SEP_64: return launch_t<VL, sfa::Sep<1, 0>>(p, is_bf16, st);
    case sfa::SHAPE_SEP_256: return launch_t<VL, sfa::Sep<4, 0>>(p, is_bf16, st);
    case sfa::SHAPE_SHV_128_64: return launch_t<VL, sfa::Shv<2, 1>>(p, is_bf16, st);
    case sfa::SHAPE_SHV_128: return launch_t<VL, sfa::Shv<2, 0>>(p, is_bf16, st);
    case sfa::SHAPE_SHV_256_64: return launch_t<VL, sfa::Shv<4, 1>>(p, is_bf16, st);
    case sfa::SHAPE_SHV_256: return launch_t<VL, sfa::Shv<4, 0>>(p, is_bf16, st);
    case sfa::SHAPE_SEP_64_64: return launch_t<VL, sfa::Sep<1, 1>>(p, is_bf16, st);
    case sfa::SHAPE_SEP_192: return launch_t<VL, sfa::Sep<3, 0>>(p, is_bf16, st);
    case sfa::SHAPE_SEP_192_64: return launch_t<VL, sfa::Sep<3, 1>>(p, is_bf16, st);
    case sfa::SHAPE_SHV_64: return launch_t<VL, sfa::Shv<1, 0>>(p, is_bf16, st);
    case sfa::SHAPE_SHV_64_64: return launch_t<VL, sfa::Shv<1, 1>>(p, is_bf16, st);
    case sfa::SHAPE_SHV_192: return launch_t<VL, sfa::Shv<3, 0>>(p, is_bf16, st);
    case sfa::SHAPE_SHV_192_64: return launch_t<VL, sfa::Shv<3, 1>>(p, is_bf16, st);
    case sfa::SHAPE_SEP_256_64: return launch_t<VL, sfa::Sep<4, 1>>(p, is_bf16, st);
    default: return cudaErrorInvalidValue;
    }
}

}  // namespace

// Launcher used by sfa_host.cu: shape sfa::SHAPE_MLA for H = N1 / N2 <= 32, a separate-V
// shape for any H (chunks of 32 heads).
extern "C" cudaError_t spattn_sfa_small_fwd_launch(const sfa::Params *p, int is_bf16, int shape, cudaStream_t st) {
    return p->vl.tok ? launch_shape<true>(p, is_bf16, shape, st) : launch_shape<false>(p, is_bf16, shape, st);
}
