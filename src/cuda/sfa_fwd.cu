// Top-k sparse flash attention forward for Hopper (sm_90a): D = 512 (value / nope part) plus
// Dr = 64 (rope), shared key/value (V = the first 512 columns of K), any sbs, modes 0 and 3, GQA.
//
// One CTA = one query token (b, s1, n2) and 64 of the H = N1 / N2 query heads sharing its index
// row; the heads are the MMA rows (a group with fewer heads is zero-padded).  384 threads:
//   - warpgroup 0, the producer (registers lowered): gathers the selected key rows, 64 per
//     block, 576 columns, with 16-byte cp.async into the 128-byte-swizzled layout wgmma reads
//     (8 threads per row, coalesced 128-byte segments); invalid slots (-1, out of range, past
//     the causal limit) are zero-filled, never read, and flagged in shared memory;
//   - warpgroups 1 and 2, the consumers: two key buffers, warpgroup 1 owns even blocks, 2 odd
//     ones.  Each computes S = Q K^T of its block (wgmma m64n64k16, 36 k-steps, both operands in
//     shared memory) and owns 256 of the 512 output columns: O_half += P_even V_even[:, half]
//     + P_odd V_odd[:, half], its own P from registers, the other's P through shared memory.
//   - the running max is chained: warpgroup 1 takes max(m, rowmax S_even) and posts it,
//     warpgroup 2 takes max of that and rowmax S_odd (m') and posts it back; warpgroup 1 then
//     rescales its P to m' before sharing it, so both halves of O see one base per block pair.
//   - each key buffer is completed and released in two halves (columns 0-255; 256-575), so the
//     next block's gather and its S GEMM start while the other half is still being read.
// P of the even block is written over the even buffer's rope columns (no longer needed after
// S); the odd block's P has its own 8 KB (its buffer's rope half is refilled earlier).
// Rows of the index whose remaining slots are all invalid end the loop (a pre-scan finds the
// last valid slot), so padded tails cost nothing.
// Softmax in base 2, fp32; rows with no valid key get O = 0 and LSE = -inf; a NaN score (or
// +inf) makes O and LSE of its row NaN.
// VL = true: the packed variable-length / paged form (sfa::Varlen): a CTA = one packed token;
// its sequence, key range and causal limit come from the pre-pass's table (one load per CTA),
// the gather translates sequence-local keys to rows of k; the loop is the dense one.
// UN = true: the union form for H = 4 .. 32 heads per key head (sfa_union.cu builds its lists): a
// CTA = a group of 64 / H consecutive tokens of one (b, n2), their heads the 64 MMA rows (row r:
// token r / H, head r % H); the blocks are 64 contiguous keys, those of the group's union, and
// each row keeps only the keys its token selected (per-token 64-bit masks instead of the valid
// flags).  Where neighbouring tokens select much of the same keys (causal top-k over short
// contexts), one block then serves 64 / H tokens: no per-token gather and no MMA row wasted.
// With VL: groups of packed tokens of one sequence, blocks of key-side rows (sfa_union.cu's VL
// plan); rows of tokens past cu_seqlens_q[B] are zero and not stored.
// A group whose union leaves gaps comes compacted (Params::UCOMPACT): its blocks are the union's
// keys themselves, 64 at a time, so fewer blocks cover the same selections.
#include <math.h>

#include "cta_trace.cuh"
#include "hopper/hopper.cuh"
#include "sfa_gather.cuh"

namespace {

using sfa::Params;

constexpr int BH = 64;                  // query heads per CTA (MMA rows)
constexpr int BK = sfa::GBK;                  // selected keys per block
constexpr int NBOX = sfa::GNBOX;              // 9 boxes of 64 columns (128 bytes) per row
constexpr int BOX = sfa::GBOX;                // one box of 64 rows
constexpr int TILE = NBOX * BOX;        // Q tile or one key block: 73728 bytes
constexpr int UMAX = 16;                // UN: tokens per group at most (H >= 4)
// OFF_VALID: the blocks' valid flags [2][64] bytes, or (UN) their tokens' masks [2][UMAX] words
constexpr int OFF_Q = 0, OFF_K = TILE, OFF_P1 = 3 * TILE, OFF_VALID = OFF_P1 + BOX;
constexpr int OFF_M = OFF_VALID + 2 * UMAX * 8, OFF_L = OFF_M + 32 * 8, OFF_BAR = OFF_L + 64 * 8;
constexpr int OFF_LAST = OFF_BAR + 12 * 8;
constexpr int SMEM = OFF_LAST + 16 + 1024;  // + alignment slack
static_assert(SMEM <= 232448, "fits in 227 KB");

// named barriers (consumers only, 256 threads, except NB_SCAN: all 384)
enum { NB_Q = 1, NB_P0 = 4, NB_P1 = 5, NB_O = 7 /* and 8 */, NB_SCAN = 9 /* 384 */ };

template <typename T, bool VL, bool UN>
__global__ void __launch_bounds__(384, 1) sfa_fwd90_kernel(const __grid_constant__ Params p) {
    SPATTN_TRACE(const unsigned long long tr0 = cta_trace::now(); unsigned long long tr1 = 0, tr2 = 0;)
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = hop::align1024(smem_raw);
    unsigned char *sQ = sm + OFF_Q, *sK0 = sm + OFF_K, *sK1 = sm + OFF_K + TILE, *sP1 = sm + OFF_P1;
    unsigned char *sP0 = sK0 + 8 * BOX;  // the even block's rope box
    uint8_t *valid = sm + OFF_VALID;     // [2][64]
    unsigned long long *umk = reinterpret_cast<unsigned long long *>(sm + OFF_VALID);  // UN: [2][UMAX]
    float2 *sM = reinterpret_cast<float2 *>(sm + OFF_M);   // [32] running max, by row quad
    float2 *sL = reinterpret_cast<float2 *>(sm + OFF_L);   // [2][32] row sums
    uint64_t *rdy = reinterpret_cast<uint64_t *>(sm + OFF_BAR);  // [block][half]
    uint64_t *fre = rdy + 4, *vbar = rdy + 8, *xbar = rdy + 9;  // xbar: the consumers' row-sum exchange
    // the per-pair max exchange: warpgroup 1 posts (mpost), warpgroup 2 answers (mans)
    uint64_t *mpost = rdy + 10, *mans = rdy + 11;
    int *s_last = reinterpret_cast<int *>(sm + OFF_LAST);

    const int ngroups = UN ? p.ungroups : (p.H + BH - 1) / BH;
    const int ugrp = UN ? ngroups - 1 - (int)blockIdx.x : 0;  // UN: the token group, longest first
    // UN: s1 = the group's first token
    const int s1 = UN ? ugrp * p.ug : p.S1 - 1 - (int)(blockIdx.x / ngroups);  // the longest rows (mode 3) first
    const int g = UN ? 0 : (int)(blockIdx.x % ngroups);
    const int b = blockIdx.y / p.N2, n2 = blockIdx.y % p.N2;
    const int head0 = n2 * p.H + g * BH, nh = UN ? BH : min(BH, p.H - g * BH);
    const int64_t ugi = UN ? (int64_t)blockIdx.y * p.ungroups + ugrp : 0;
    const int ucraw = UN ? __ldg(p.ucnt + ugi) : 0;  // -1: the gather kernels take the group
    if (UN && ucraw < 0) return;
    const int ucnt = ucraw & ~sfa::UCOMPACT;  // UN: blocks; compacted (ukey) or contiguous (ublk)
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

    // The index scan ran just before: with a bad value the kernel computes (key_of masks every
    // out-of-range index, so nothing is read out of bounds) but writes nothing; the host reports
    // BAD_INDEX.  Loaded now, used at the stores: the load's latency hides behind the main loop.
    const unsigned long long gate = sfa::gate_word(p.gate);
    if (threadIdx.x == 0) {
        for (int i = 0; i < 4; i++) {
            hop::mbar_init(rdy + i, 128);
            hop::mbar_init(fre + i, i == 1 ? 256 : 128);  // fre + 1: both warpgroups (sP0)
        }
        hop::mbar_init(vbar, 16);
        hop::mbar_init(xbar, 256);
        hop::mbar_init(mpost, 128);
        hop::mbar_init(mans, 128);
        *s_last = -1;
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();  // barrier init and s_last = -1 are visible
    // The consumers load Q and pre-scan the index row (the last valid slot decides how many block
    // pairs are visited) while the producer already gathers pair 0; it learns the count on NB_SCAN.

    if (wg == 0) {  // ------------------------------------------------------------------ producer
        hop::setmaxnreg_dec<72>();
        // UN + VL: the plan's keys are key-side rows already (first key row 0)
        const sfa::Gather<T, VL> gat = VL ? sfa::Gather<T, VL>(p, n2, t, UN ? make_int4(tk.x, 0, tk.z, tk.w) : tk)
                                          : sfa::Gather<T, VL>(p, b, n2, t);
        // pair 0 is gathered before the scan's answer (harmless when it is 0); UN: the count is known
        int np = UN ? (ucnt + 1) / 2 : 1;
        const int *ulst = UN ? p.ublk + ugi * p.ucap : nullptr;
        const unsigned long long *umsk = UN ? p.umask + ugi * p.ucap * p.ug : nullptr;
        for (int i = 0; i < np; i++) {
            const uint32_t fp = (i & 1) ^ 1;
            int k0[4], k1[4];
            if constexpr (UN) {  // an odd count's last pair: no odd block
                if (ucraw & sfa::UCOMPACT) {  // the union's keys, 64 per block (-1 past the last)
                    const int *kl = p.ukey + (ugi * p.ucap + 2 * i) * BK + gat.grp;
                    const bool odd = 2 * i + 1 < ucnt;
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        k0[r] = __ldg(kl + 16 * r);
                        k1[r] = odd ? __ldg(kl + BK + 16 * r) : -1;
                    }
                } else {  // 64 contiguous keys per block; keys no token of the group selects
                          // zero-filled (a NaN row times P = 0 would be NaN in O)
                    const bool odd = 2 * i + 1 < ucnt;
                    const int kb0 = __ldg(ulst + 2 * i), kb1 = odd ? __ldg(ulst + 2 * i + 1) : -1;
                    // the OR of the group's token masks of both blocks in one L2 trip (the plan
                    // kernel wrote them: not in L1): lane l loads token l's mask of block 2i
                    // (l < ug) or token l - ug's of block 2i + 1 (the next ug words; 2 ug <= 32),
                    // then a butterfly within each aligned run of ug lanes (a power of two).  A
                    // loop over the tokens waited on L2 up to 5 times a pair (review, ptxas).
                    const int lane = t & 31;
                    unsigned long long u = lane < p.ug || (odd && lane < 2 * p.ug)
                                               ? __ldg(umsk + (int64_t)(2 * i) * p.ug + lane) : 0ull;
                    for (int o = 1; o < p.ug; o <<= 1) u |= __shfl_xor_sync(0xffffffffu, u, o);
                    const unsigned long long u0 = __shfl_sync(0xffffffffu, u, 0);
                    const unsigned long long u1 = __shfl_sync(0xffffffffu, u, p.ug & 31);
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const int j = gat.grp + 16 * r, a = kb0 * BK + j, bb = kb1 * BK + j;
                        const int kend = VL ? p.vl.rows : p.S2;
                        k0[r] = a < kend && ((u0 >> j) & 1) ? a : -1;
                        k1[r] = kb1 >= 0 && bb < kend && ((u1 >> j) & 1) ? bb : -1;
                    }
                }
            } else {
                gat.keys(p, irow, si3, 2 * i, lim, k0);
                gat.keys(p, irow, si3, 2 * i + 1, lim, k1);
            }
            // order: what each consumer reads first (even: columns 0-255 first; odd: 256-575)
            hop::mbar_wait(fre + 0, fp);
            gat.copy(sK0, k0, 0, 4);
            hop::cp_async_arrive_noinc(rdy + 0);
            hop::mbar_wait(fre + 3, fp);
            gat.copy(sK1, k1, 4, NBOX);
            hop::cp_async_arrive_noinc(rdy + 3);
            hop::mbar_wait(fre + 1, fp);
            gat.copy(sK0, k0, 4, NBOX);
            hop::cp_async_arrive_noinc(rdy + 1);
            hop::mbar_wait(fre + 2, fp);
            gat.copy(sK1, k1, 0, 4);
            hop::cp_async_arrive_noinc(rdy + 2);
            if (gat.ig == 0) {
                if constexpr (UN) {  // the tokens' masks of the two blocks (thread grp: token grp)
                    if (gat.grp < p.ug) {
                        umk[gat.grp] = __ldg(umsk + (int64_t)(2 * i) * p.ug + gat.grp);
                        umk[UMAX + gat.grp] = 2 * i + 1 < ucnt ? __ldg(umsk + (int64_t)(2 * i + 1) * p.ug + gat.grp) : 0ull;
                    }
                } else {
                    gat.flags(valid, k0);
                    gat.flags(valid + BK, k1);
                }
                hop::mbar_arrive(vbar);
            }
            if (!UN && i == 0) {
                hop::bar_sync(NB_SCAN, 384);
                np = sfa::npairs_of(*s_last);
            }
        }
        sfa::cp_async_wait<0>();
        return;
    }

    // ------------------------------------------------------------------------------- consumers
    hop::setmaxnreg_inc<216>();
    const int c = wg - 1;  // 0: even blocks, output columns 0-255; 1: odd blocks, 256-511
    const int warp = t >> 5, lane = t & 31, q4 = lane & 3, quad = t >> 2;
    const int r0 = warp * 16 + (lane >> 2);  // this thread's rows r0, r0 + 8
    const float sl2 = p.scale_log2;
    unsigned char *sKo = c ? sK1 : sK0;      // own block's buffer

    float o[128], s[32];
    uint32_t pa[4][4];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    // -1e30 instead of -inf keeps exp2(m_old - m_new) finite when a block is fully masked
    float m0 = -1e30f, m1 = -1e30f, l0 = 0.f, l1 = 0.f;

    if constexpr (UN) {
        sfa::load_q_union<T, VL>(sQ, p, b, s1, head0, t + c * 128, 256);  // rows of tokens past S1 are zero
    } else {
        sfa::load_q<T>(sQ, BH, p, qb, qrb, head0, nh, t + c * 128, 256);  // rows past nh are zero
        sfa::prescan_last(p, irow, si3, lim, t + c * 128, 256, s_last);
    }
    sfa::cp_async_wait<0>();
    hop::fence_proxy_async();
    hop::bar_sync(NB_Q, 256);
    const int npairs = UN ? (ucnt + 1) / 2 : sfa::npairs_of(*s_last);
    if (!UN) hop::bar_arrive(NB_SCAN, 384);
    // UN: the tokens of this thread's rows r0, r0 + 8
    const int utA = UN ? r0 >> p.lg2h : 0, utB = UN ? (r0 + 8) >> p.lg2h : 0;

    // Descriptors: one base each, k-steps added to the address field (addr >> 4; shared memory
    // offsets never carry out of it) at each use (hop::desc_add).
    const uint64_t qd = hop::desc_sw128(sQ, 16, 1024), kd = hop::desc_sw128(sKo, 16, 1024);
    const uint64_t vd0 = hop::desc_sw128(sK0 + c * 4 * BOX, BOX, 1024), vd1 = hop::desc_sw128(sK1 + c * 4 * BOX, BOX, 1024);
    const uint64_t pd0 = hop::desc_sw128(sP0, 16, 1024), pd1 = hop::desc_sw128(sP1, 16, 1024);
    auto qdesc = [&](int kk) { return hop::desc_add(qd, (kk >> 2) * BOX + (kk & 3) * 32); };
    auto kdesc = [&](int kk) { return hop::desc_add(kd, (kk >> 2) * BOX + (kk & 3) * 32); };
    // V = a block's first 512 columns read MN-major: 64-column boxes BOX apart, 16 keys per k-step
    auto vdesc = [&](int blk, int kk) { return hop::desc_add(blk ? vd1 : vd0, kk * 16 * 128); };
    auto pdesc = [&](int blk, int kk) { return hop::desc_add(blk ? pd1 : pd0, kk * 32); };
    auto qk = [&](int box0, int box1, bool first) {
#pragma unroll
        for (int kk = box0 * 4; kk < box1 * 4; kk++) hop::elt<T>::template ss64<0, 0>(s, qdesc(kk), kdesc(kk), !(first && kk == box0 * 4));
    };
    // scaled scores with invalid keys at -inf (after scaling: a negative scale keeps the mask)
    auto mask_scale = [&]() {
        if constexpr (UN) {  // each row its token's mask: bit 8 j + 2 q4 (+ 1) of the block's word
            const unsigned long long *mk = umk + c * UMAX;
            const unsigned long long wa = mk[utA] >> (2 * q4), wb = mk[utB] >> (2 * q4);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                s[4 * j] = (wa >> (8 * j)) & 1 ? s[4 * j] * sl2 : -INFINITY;
                s[4 * j + 1] = (wa >> (8 * j + 1)) & 1 ? s[4 * j + 1] * sl2 : -INFINITY;
                s[4 * j + 2] = (wb >> (8 * j)) & 1 ? s[4 * j + 2] * sl2 : -INFINITY;
                s[4 * j + 3] = (wb >> (8 * j + 1)) & 1 ? s[4 * j + 3] * sl2 : -INFINITY;
            }
            return;
        }
        const uint8_t *v = valid + c * BK;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint16_t vv = *reinterpret_cast<const uint16_t *>(v + 8 * j + 2 * q4);
            const bool a = vv & 0xff, bb = vv >> 8;
            s[4 * j] = a ? s[4 * j] * sl2 : -INFINITY;
            s[4 * j + 1] = bb ? s[4 * j + 1] * sl2 : -INFINITY;
            s[4 * j + 2] = a ? s[4 * j + 2] * sl2 : -INFINITY;
            s[4 * j + 3] = bb ? s[4 * j + 3] * sl2 : -INFINITY;
        }
    };
    auto rowmax = [&](float &t0, float &t1) {
        t0 = -INFINITY;
        t1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            t0 = fmaxf(t0, fmaxf(s[4 * j], s[4 * j + 1]));
            t1 = fmaxf(t1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
        }
        t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 1));
        t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 2));
        t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 1));
        t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 2));
    };
    auto scale_o = [&](float a0, float a1) {
#pragma unroll
        for (int j = 0; j < 32; j++) {
            o[4 * j] *= a0;
            o[4 * j + 1] *= a0;
            o[4 * j + 2] *= a1;
            o[4 * j + 3] *= a1;
        }
    };
    // P (fp32 in s) times f0 (row r0) / f1 (row r0 + 8), packed as the register operand
    auto pack_p = [&](float f0, float f1) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            pa[kk][0] = hop::elt<T>::pack(s[8 * kk] * f0, s[8 * kk + 1] * f0);
            pa[kk][1] = hop::elt<T>::pack(s[8 * kk + 2] * f1, s[8 * kk + 3] * f1);
            pa[kk][2] = hop::elt<T>::pack(s[8 * kk + 4] * f0, s[8 * kk + 5] * f0);
            pa[kk][3] = hop::elt<T>::pack(s[8 * kk + 6] * f1, s[8 * kk + 7] * f1);
        }
    };
    // P = exp2(s - m') with the pair's max m' = (n0, n1); O and the sums rescaled from the old max
    auto softmax = [&](float n0, float n1) {
        const float a0 = hop::ex2(m0 - n0), a1 = hop::ex2(m1 - n1);
        scale_o(a0, a1);
        float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[4 * j] = hop::ex2(s[4 * j] - n0);
            s[4 * j + 1] = hop::ex2(s[4 * j + 1] - n0);
            s[4 * j + 2] = hop::ex2(s[4 * j + 2] - n1);
            s[4 * j + 3] = hop::ex2(s[4 * j + 3] - n1);
            ls0 += s[4 * j] + s[4 * j + 1];
            ls1 += s[4 * j + 2] + s[4 * j + 3];
        }
        l0 = l0 * a0 + ls0;
        l1 = l1 * a1 + ls1;
        m0 = n0;
        m1 = n1;
        pack_p(1.f, 1.f);
    };
    // P (bf16/fp16, as packed for the register operand) into a 64 x 64 swizzled tile
    auto store_p = [&](unsigned char *dst) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            *reinterpret_cast<uint32_t *>(dst + hop::sw128(r0, 2 * kk) + q4 * 4) = pa[kk][0];
            *reinterpret_cast<uint32_t *>(dst + hop::sw128(r0 + 8, 2 * kk) + q4 * 4) = pa[kk][1];
            *reinterpret_cast<uint32_t *>(dst + hop::sw128(r0, 2 * kk + 1) + q4 * 4) = pa[kk][2];
            *reinterpret_cast<uint32_t *>(dst + hop::sw128(r0 + 8, 2 * kk + 1) + q4 * 4) = pa[kk][3];
        }
    };
    auto pv_local = [&](int blk) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++) hop::elt<T>::template rs256<1>(o, pa[kk], vdesc(blk, kk), 1);
    };
    auto pv_remote = [&](int blk) {  // the other warpgroup's P and block
#pragma unroll
        for (int kk = 0; kk < 4; kk++) hop::elt<T>::template ss256<0, 1>(o, pdesc(blk, kk), vdesc(blk, kk), 1);
    };

    // Per block pair: warpgroup 1 posts e = max(m, rowmax S_even) and runs its softmax and P V at
    // e while warpgroup 2 answers with the pair's max m' (its own row max included); both then
    // share P at the one base m' (warpgroup 1 rescales its P and O by 2^(e - m')) and issue P V
    // for the other's block.
    if (c == 0) {
        if (npairs > 0) {
            hop::mbar_wait(rdy + 0, 0);
            hop::wgmma_fence();
            qk(0, 4, true);
            hop::wgmma_commit();  // a wait inside an open chain would serialise it
            hop::mbar_wait(rdy + 1, 0);
            hop::wgmma_fence();
            qk(4, NBOX, false);
            hop::wgmma_commit();
            hop::wgmma_wait<0>();
            hop::reg_fence(s);
        }
        SPATTN_TRACE(tr1 = cta_trace::now();)  // first S ready
        for (int i = 0; i < npairs; i++) {
            const uint32_t ph = i & 1;
            hop::mbar_wait(vbar, ph);
            mask_scale();
            float t0, t1;
            rowmax(t0, t1);
            const float e0 = fmaxf(m0, t0), e1 = fmaxf(m1, t1);
            if (q4 == 0) sM[quad] = make_float2(e0, e1);
            // mbarriers (release / acquire), not named barriers: racecheck models the ordering of
            // sM's writes and reads (within and across pairs) only through them, and a rendezvous
            // at one named barrier reached at two PCs is what synccheck reports as divergent.
            // Costs ~1.4 % on the 64-head cases (H200, sfa07 577 -> 569 TFLOP/s); named barriers
            // with post and answer slots by parity cost ~1 % and still fail racecheck, a symmetric
            // exchange (both post, both wait) 3 %.
            hop::mbar_arrive(mpost);
            // The softmax at this block's own max and the local P V issued before the pair's max
            // is known, so they overlap warpgroup 2's S GEMM; then P (for the other warpgroup)
            // and O are brought to the pair's base m' by f = 2^(e - m') <= 1 (a second rescale
            // per pair; H200: 0.94-0.97x the time of waiting for m' first, every 64-head case).
            softmax(e0, e1);
            hop::wgmma_fence();
            pv_local(0);
            hop::wgmma_commit();
            hop::wgmma_wait<0>();
            hop::reg_fence(o);
            hop::mbar_arrive(fre + 0);  // even block, columns 0-255
            hop::mbar_wait(mans, ph);   // the pair's max m'
            const float2 mp = sM[quad];
            const float f0 = hop::ex2(e0 - mp.x), f1 = hop::ex2(e1 - mp.y);
            pack_p(f0, f1);  // the local P V has completed: pa is free
            store_p(sP0);
            hop::fence_proxy_async();
            hop::bar_arrive(NB_P0, 256);
            // sP0 is the even block's rope box, refilled once fre + 1 completes; warpgroup 2
            // arrives there after reading it (so after this store), but racecheck sees that order
            // only through mbarriers, not through the named barrier: this arrival makes it visible
            hop::mbar_arrive(fre + 1);
            if (__any_sync(0xffffffffu, f0 != 1.f || f1 != 1.f)) scale_o(f0, f1);
            l0 *= f0;
            l1 *= f1;
            m0 = mp.x;
            m1 = mp.y;
            hop::bar_sync(NB_P1, 256);
            hop::wgmma_fence();
            pv_remote(1);
            hop::wgmma_commit();
            if (i + 1 < npairs) {  // the next even block's S overlaps the remote P V
                hop::mbar_wait(rdy + 0, ph ^ 1);
                hop::wgmma_fence();
                qk(0, 4, true);
                hop::wgmma_commit();
                hop::wgmma_wait<1>();
                hop::mbar_arrive(fre + 2);  // odd block, columns 0-255 (and its P)
                hop::mbar_wait(rdy + 1, ph ^ 1);
                hop::wgmma_fence();
                qk(4, NBOX, false);
                hop::wgmma_commit();
                hop::wgmma_wait<0>();
                hop::reg_fence(s);
                hop::reg_fence(o);
            } else {
                hop::wgmma_wait<0>();
                hop::reg_fence(o);
                hop::mbar_arrive(fre + 2);
            }
        }
        SPATTN_TRACE(tr2 = cta_trace::now();)  // last P V done
    } else {
        for (int i = 0; i < npairs; i++) {
            const uint32_t ph = i & 1;
            hop::mbar_wait(rdy + 3, ph);
            hop::wgmma_fence();
            qk(4, NBOX, true);
            hop::wgmma_commit();
            hop::mbar_wait(rdy + 2, ph);
            hop::wgmma_fence();
            qk(0, 4, false);
            hop::wgmma_commit();
            hop::wgmma_wait<0>();
            hop::reg_fence(s);
            hop::reg_fence(o);
            hop::mbar_wait(vbar, ph);
            mask_scale();
            float t0, t1;
            rowmax(t0, t1);
            hop::mbar_wait(mpost, ph);  // the even block's max
            const float2 me = sM[quad];
            const float n0 = fmaxf(me.x, t0), n1 = fmaxf(me.y, t1);
            __syncwarp();
            if (q4 == 0) sM[quad] = make_float2(n0, n1);
            hop::mbar_arrive(mans);
            softmax(n0, n1);
            store_p(sP1);
            hop::fence_proxy_async();
            hop::bar_arrive(NB_P1, 256);
            hop::wgmma_fence();
            pv_local(1);
            hop::wgmma_commit();
            hop::bar_sync(NB_P0, 256);
            pv_remote(0);
            hop::wgmma_commit();
            hop::wgmma_wait<1>();
            hop::mbar_arrive(fre + 3);  // odd block, columns 256-575
            hop::wgmma_wait<0>();
            hop::reg_fence(o);
            hop::mbar_arrive(fre + 1);  // even block, columns 256-575 (and its P)
        }
    }

    // ---- epilogue: row sums of both halves, normalise, store O and LSE
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (q4 == 0) sL[c * 32 + quad] = make_float2(l0, l1);
    // the 256 consumer threads through an mbarrier (release / acquire): racecheck reports a
    // hazard on this STS, barrier, LDS sequence across a 256-thread named barrier (no real race),
    // and synccheck rejects a CTA-wide barrier the producer would reach at another PC
    hop::mbar_arrive(xbar);
    hop::mbar_wait(xbar, 0);
    const float2 lo = sL[(c ^ 1) * 32 + quad];
    l0 += lo.x;
    l1 += lo.y;
    // O through shared memory (the Q tile is free: every S GEMM has completed before the row-sum barrier): this
    // warpgroup's 64 x 256 half in four 128-byte-swizzled boxes, then 16-byte row-contiguous
    // global stores
    const float inv0 = l0 > 0.f ? 1.f / l0 : l0 == 0.f ? 0.f : l0;
    const float inv1 = l1 > 0.f ? 1.f / l1 : l1 == 0.f ? 0.f : l1;
    unsigned char *so = sQ + c * 4 * BOX;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        unsigned char *bx = so + (j >> 3) * BOX + q4 * 4;
        *reinterpret_cast<uint32_t *>(bx + hop::sw128(r0, j & 7)) = hop::elt<T>::pack(o[4 * j] * inv0, o[4 * j + 1] * inv0);
        *reinterpret_cast<uint32_t *>(bx + hop::sw128(r0 + 8, j & 7)) = hop::elt<T>::pack(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
    hop::bar_sync(NB_O + c, 128);
    // row -> (token, head): UN row r is token s1 + r / H, head head0 + r % H; else token s1, head head0 + r
    const int rsh = UN ? p.lg2h : 30, rmask = UN ? p.H - 1 : 0x3fffffff;
    T *ob = static_cast<T *>(p.out_o) + b * p.so[0] + (int64_t)s1 * p.so[1] + (int64_t)head0 * p.so[2] + c * 256;
#pragma unroll 4
    for (int x = t; x < 64 * 32; x += 128) {
        const int row = x >> 5, ch = x & 31, tok = row >> rsh;
        if (row < nh && (UN ? sfa::union_tok_ok<VL>(p, s1 + tok) : s1 + tok < p.S1) && gate == ~0ull)
            __stcs(reinterpret_cast<int4 *>(ob + (int64_t)tok * p.so[1] + (int64_t)(row & rmask) * p.so[2] + ch * 8),
                   *reinterpret_cast<const int4 *>(so + (ch >> 3) * BOX + hop::sw128(row, ch & 7)));  // streamed
    }
    const int tok0 = r0 >> rsh, tok1 = (r0 + 8) >> rsh;
    const bool ok0 = r0 < nh && (UN ? sfa::union_tok_ok<VL>(p, s1 + tok0) : s1 + tok0 < p.S1);
    const bool ok1 = r0 + 8 < nh && (UN ? sfa::union_tok_ok<VL>(p, s1 + tok1) : s1 + tok1 < p.S1);
    if (c == 0 && q4 == 0 && p.out_lse && gate == ~0ull) {
        float *lse = p.out_lse + b * p.slse[0] + (int64_t)s1 * p.slse[1] + (int64_t)head0 * p.slse[2];
        if (ok0)
            lse[(int64_t)tok0 * p.slse[1] + (int64_t)(r0 & rmask) * p.slse[2]] =
                l0 > 0.f ? (m0 + log2f(l0)) * 0.69314718055994531f : l0 == 0.f ? -INFINITY : l0;
        if (ok1)
            lse[(int64_t)tok1 * p.slse[1] + (int64_t)((r0 + 8) & rmask) * p.slse[2]] =
                l1 > 0.f ? (m1 + log2f(l1)) * 0.69314718055994531f : l1 == 0.f ? -INFINITY : l1;
    }
    SPATTN_TRACE(if (threadIdx.x == 128 && cta_trace::g_rec) cta_trace::g_rec[cta_trace::block()] =
                     cta_trace::Rec{{tr0, tr1, tr2, cta_trace::now()}, npairs, cta_trace::smid()};)
}

template <typename T, bool VL, bool UN = false> cudaError_t launch(const Params &p, cudaStream_t st) {
    static unsigned long long done = 0;
    const cudaError_t e = hop::set_smem(sfa_fwd90_kernel<T, VL, UN>, SMEM, &done);
    if (e != cudaSuccess) return e;
    const int ngroups = (p.H + BH - 1) / BH;
    // VL: S1 = Tq, B = 1; UN: one CTA per token group
    dim3 grid(UN ? (unsigned)p.ungroups : (unsigned)((long long)p.S1 * ngroups), (unsigned)(p.B * p.N2));
    SPATTN_TRACE(cta_trace::Rec *trace = cta_trace::begin((long long)grid.x * grid.y, st);)
    sfa_fwd90_kernel<T, VL, UN><<<grid, 384, SMEM, st>>>(p);
    SPATTN_TRACE(cta_trace::end(trace, (long long)grid.x * grid.y, st);)
    return cudaGetLastError();
}

}  // namespace

// Launcher used by sfa_host.cu.
extern "C" cudaError_t spattn_sfa_fast_fwd_launch(const sfa::Params *p, int is_bf16, cudaStream_t st) {
    if (p->vl.tok) return is_bf16 ? launch<__nv_bfloat16, true>(*p, st) : launch<__half, true>(*p, st);
    return is_bf16 ? launch<__nv_bfloat16, false>(*p, st) : launch<__half, false>(*p, st);
}
// The union form (p->ucnt set by sfa_union.cu's plan, H = 4 .. 32; p->vl.tok set: the varlen
// form, groups of packed tokens of one sequence over key-side rows); its groups of ucnt -1 are
// left to the gather kernels, launched after it.
extern "C" cudaError_t spattn_sfa_union_fwd_launch(const sfa::Params *p, int is_bf16, cudaStream_t st) {
    if (p->vl.tok) return is_bf16 ? launch<__nv_bfloat16, true, true>(*p, st) : launch<__half, true, true>(*p, st);
    return is_bf16 ? launch<__nv_bfloat16, false, true>(*p, st) : launch<__half, false, true>(*p, st);
}
