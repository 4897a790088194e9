// Top-k sparse flash attention forward for Hopper (sm_90a), the group form of the small-head
// shapes other than Mla with D <= 128 (separate V such as NSA's D 128, shared V; H <= 32 heads
// per key head, sbs <= 64): one CTA runs G consecutive query tokens of one (b, n2) over the union
// of the 64-key blocks they selected (sfa_union.cu's plan, with G = Params::ug tokens a group), so
// a block any of them selected is gathered once instead of once per token.
//
// Why: the per-token kernel (sfa_fwd_small.cu) is bound by its gathers at these shapes (NSA-style
// D 128, sbs 64, K 16, 16 heads: 32 KB of copies per (token, block), sfas01 at ~97 TFLOP/s, 67 % of
// that copy bound); neighbouring tokens share part of their blocks (the suite's random selections:
// ~0.45 blocks per (token, block) pair at G = 8), and where they share more (NSA's real
// selections, whose local blocks coincide) the copies fall further.  Unlike the Mla union form
// (sfa_fwd.cu UN: the group's tokens x heads as 64 MMA rows, masked), no MMA row is wasted: keys
// stay the MMA rows and each (block, token) pair the token selected is its own
//   S^T = K Q_t^T (m64 x N heads), P^T = exp2(S^T sl2 - m_t), O_t^T += V^T P_t^T
// as in sfa_fwd_small.cu, with the token's online softmax state and O_t^T in registers.
//
// 384 threads: warpgroup 0 the producer (the union's blocks, NST stages, each block's token masks
// posted beside it), warpgroups 1 and 2 the consumers; consumer c owns the tokens c GW .. c GW +
// GW - 1 (GW = G / 2: 8, 4, 2 at N = 8, 16, 32 heads: GW N = 64) and visits every block: the
// S^T of all its tokens as one m64n64 GEMM (their Q rows side by side in shared memory), then the
// softmax and O_t^T GEMM of each token whose mask (the plan's 64-bit key mask of the token in that
// block: selection and causal limit) is not empty, the O^T GEMMs left in flight under the next
// token's softmax and waited once at the block's end (the mainloop's comment says why that shape).
// Groups the plan did not take (a repeated key, or more blocks than its capacity) have count -1:
// the per-token kernel runs their tokens (it skips the tokens of taken groups).
// Compacted groups (count | UCOMPACT) are the union's keys packed 64 to a block (ukey), as for the
// Mla union form.  Softmax, empty rows (O 0, LSE -inf) and non-finite scores as sfa_fwd_small.cu.
#include <math.h>

#include "cta_trace.cuh"
#include "hopper/hopper.cuh"
#include "sfa_gather.cuh"
#include "sfa_keyrows.cuh"

namespace {

using sfa::Params;

constexpr int BK = sfa::GBK;    // keys per block
constexpr int BOX = sfa::GBOX;  // one box of 64 rows
constexpr int GMAX = 16;        // tokens a group at most (the masks' area)

template <int N, typename S, int GW> struct GroupCfg {
    static constexpr int G = 2 * GW, NBK = S::NBK, ND = S::NBN, NJ = N / 8;
    static constexpr int TILE = S::NBT * BOX;   // one gathered block
    static constexpr int QBOX = G * N * 128;    // a 64-column box of the group's Q: [G tokens][N heads] rows
    static constexpr int QTOK = NBK * N * 128;  // one token's Q (its N rows in every box)
    // shared memory with n stages (the layout below, + alignment slack); four stages where they
    // fit, else three or two
    static constexpr int smem_for(int n) {
        return n * TILE + G * QTOK + 2 * GW * N * 128 + 2 * 4 * N * 4 + 2 * 4 * N * 4 + 2 * N * S::D * 2 + n * GMAX * 8 +
               3 * n * 8 + 1024;
    }
    static constexpr int NST = smem_for(4) <= 232448 ? 4 : smem_for(3) <= 232448 ? 3 : 2;
    static constexpr int OFF_K = 0;                            // NST block buffers
    static constexpr int OFF_Q = NST * TILE;                   // [NBK boxes][G tokens][N][128 B]
    static constexpr int OFF_P = OFF_Q + G * QTOK;             // [2 wg][GW tokens][N][128 B]
    static constexpr int OFF_RED = OFF_P + 2 * GW * N * 128;   // [2 wg][4 warps][N] fp32
    static constexpr int OFF_L = OFF_RED + 2 * 4 * N * 4;      // [2 wg][4 warps][N] fp32 row sums
    static constexpr int OFF_O = OFF_L + 2 * 4 * N * 4;        // [2 wg][N][D] staged O (16-bit)
    static constexpr int OFF_MSK = OFF_O + 2 * N * S::D * 2;   // [NST][GMAX] token masks
    static constexpr int OFF_BAR = OFF_MSK + NST * GMAX * 8;   // full, empty, mask [NST]
    static constexpr int SMEM = OFF_BAR + 3 * NST * 8 + 1024;  // + alignment slack
    static_assert(OFF_Q % 1024 == 0 && OFF_P % 1024 == 0 && QBOX % 1024 == 0, "swizzle atoms");
    static_assert(OFF_MSK % 8 == 0 && OFF_BAR % 8 == 0, "mask and mbarrier alignment");
    static_assert(SMEM == smem_for(NST) && SMEM <= 232448, "fits in 227 KB");
    static_assert(G <= GMAX && (N == 8 || N == 16 || N == 32), "group and head chunk");
    static_assert(GW * N == 64, "a warpgroup's tokens' Q rows are one m64n64 B operand");
    static_assert((G & (G - 1)) == 0 && G <= 32, "the producer's butterfly over the tokens' masks");
};

// named barriers: NB_Q the consumers (256); NB_RED + c, NB_O + c one consumer warpgroup (128)
enum { NB_Q = 1, NB_RED = 2 /* and 3 */, NB_O = 4 /* and 5 */ };

template <int N, typename T, typename S, int GW>
__global__ void __launch_bounds__(384, 1) sfa_fwd_group_kernel(const __grid_constant__ Params p) {
    using C = GroupCfg<N, S, GW>;
    constexpr int G = C::G, NBK = C::NBK, ND = C::ND, NJ = C::NJ, NST = C::NST, TILE = C::TILE;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = hop::align1024(smem_raw);
    unsigned char *sQ = sm + C::OFF_Q;
    unsigned long long *smsk = reinterpret_cast<unsigned long long *>(sm + C::OFF_MSK);  // [NST][GMAX]
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + C::OFF_BAR), *empty = full + NST, *mbar = empty + NST;

    const int grp = p.ungroups - 1 - (int)blockIdx.x;  // the longest rows (mode 3) first
    const int b = blockIdx.y / p.N2, n2 = blockIdx.y % p.N2;
    const int64_t ugi = (int64_t)blockIdx.y * p.ungroups + grp;
    const int ucraw = __ldg(p.ucnt + ugi);
    if (ucraw < 0) return;  // the per-token kernel takes the group
    const int ucnt = ucraw & ~sfa::UCOMPACT;
    const int s10 = grp * G, head0 = n2 * p.H, nh = p.H;  // H <= N: one chunk
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0), t = threadIdx.x & 127;
    const unsigned long long gate = sfa::gate_word(p.gate);
    SPATTN_TRACE(unsigned *const trs = cta_trace::step_base();)
    if (threadIdx.x == 0) {
        for (int i = 0; i < NST; i++) {
            hop::mbar_init(full + i, 128);
            hop::mbar_init(empty + i, 256);
            hop::mbar_init(mbar + i, G);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // ------------------------------------------------------------------ producer
        hop::setmaxnreg_dec<56>();
        const sfa::Gather<T, false, S> gat(p, b, n2, t);
        const int *ulst = p.ublk + ugi * p.ucap;
        const unsigned long long *umsk = p.umask + ugi * p.ucap * p.ug;
        const bool packed = (ucraw & sfa::UCOMPACT) != 0;
        const int lane = t & 31;
        // Block i's plan entries are loaded one block ahead, before the wait for a free stage, so
        // their L2 trips overlap it (loaded when needed, they were a serial L2 round trip or two
        // a block in front of every gather: the list entry, then a loop over the tokens' masks):
        // lane l < G holds token l's mask (the OR of the group's masks a butterfly), every
        // thread the list entry or its four compacted keys.
        int nk[4] = {-1, -1, -1, -1};
        unsigned long long nm = 0ull;
        auto fetch = [&](int i) {
            nm = lane < G ? __ldg(umsk + (int64_t)i * G + lane) : 0ull;
            if (packed) {  // the union's keys, 64 per block (-1 past the last)
                const int *kl = p.ukey + (ugi * p.ucap + i) * BK + gat.grp;
#pragma unroll
                for (int r = 0; r < 4; r++) nk[r] = __ldg(kl + 16 * r);
            } else {
                nk[0] = __ldg(ulst + i);
            }
        };
        if (ucnt > 0) fetch(0);
        for (int i = 0; i < ucnt; i++) {
            const int st = i % NST;
            SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, 2, i, 0);)
            int key[4] = {nk[0], nk[1], nk[2], nk[3]};
            const unsigned long long mk = nm;
            if (i + 1 < ucnt) fetch(i + 1);
            SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, 2, i, 1);)
            if (i >= NST) hop::mbar_wait_hint(empty + st, ((i / NST) - 1) & 1, 1000000u);
            SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, 2, i, 2);)
            if (!packed) {  // 64 contiguous keys; those no token of the group selects zero-filled
                unsigned long long u = mk;
#pragma unroll
                for (int o = 1; o < G; o <<= 1) u |= __shfl_xor_sync(0xffffffffu, u, o);
                u = __shfl_sync(0xffffffffu, u, 0);
                const int k0 = key[0] * BK + gat.grp;
#pragma unroll
                for (int r = 0; r < 4; r++) key[r] = k0 + 16 * r < p.S2 && ((u >> (gat.grp + 16 * r)) & 1) ? k0 + 16 * r : -1;
            }
            gat.copy(sm + C::OFF_K + st * TILE, key, 0, S::NBT);
            hop::cp_async_arrive_noinc(full + st);
            if (t < G) {  // the tokens' masks of the block, one lane each (mbar counts G arrivals)
                smsk[st * GMAX + t] = mk;
                hop::mbar_arrive(mbar + st);
            }
            SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, 2, i, 3);)
        }
        sfa::cp_async_wait<0>();
        return;
    }

    // ------------------------------------------------------------------------------- consumers
    hop::setmaxnreg_inc<224>();
    const int c = wg - 1;  // tokens c GW .. c GW + GW - 1 of the group
    const int warp = t >> 5, lane = t & 31, q4 = lane & 3;
    const int r0 = warp * 16 + (lane >> 2);  // this thread's rows (keys; in O^T: columns d) r0, r0 + 8
    const float sl2 = p.scale_log2;

    // Q of every token of the group, both consumers (rows past nh and tokens past S1 zero)
    for (int tt = 0; tt < G; tt++) {
        const int s1 = s10 + tt;
        const T *qb = static_cast<const T *>(p.q) + b * p.sq[0] + (int64_t)min(s1, p.S1 - 1) * p.sq[1];
        const T *qrb = static_cast<const T *>(p.qr) + b * p.sqr[0] + (int64_t)min(s1, p.S1 - 1) * p.sqr[1];
        sfa::load_q<T, S>(sQ, N, p, qb, qrb, head0, s1 < p.S1 ? nh : 0, t + c * 128, 256, tt * N, G * N);
    }
    sfa::cp_async_wait<0>();
    hop::fence_proxy_async();
    hop::bar_sync(NB_Q, 256);

    float o[GW][ND][N / 2], sc[GW][N / 2];
    float m[GW][NJ][2], l[GW][NJ][2];  // per token, per column (head 8 g + 2 q4 + h) of this thread
#pragma unroll
    for (int u = 0; u < GW; u++) {
#pragma unroll
        for (int d = 0; d < ND; d++)
#pragma unroll
            for (int x = 0; x < N / 2; x++) o[u][d][x] = 0.f;
#pragma unroll
        for (int g = 0; g < NJ; g++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                m[u][g][h] = -1e30f;  // keeps exp2(m_old - m_new) finite while a head has no key
                l[u][g][h] = 0.f;
            }
    }
    const uint64_t qd = hop::desc_sw128(sQ, 16, 1024);
    const unsigned long long *wmsk = smsk + c * GW;  // this warpgroup's tokens' masks of a stage
    unsigned long long bit0 = 1ull << r0, bit1 = 1ull << (r0 + 8);  // this thread's keys in a mask
    uint32_t tile0 = hop::smem_u32(sm + C::OFF_P + c * GW * N * 128);  // the first token's P tile
    hop::opaque(bit0);
    hop::opaque(bit1);
    hop::opaque(tile0);
    const sfa::PTrans<T, N> pt(warp, lane);
    float *red = reinterpret_cast<float *>(sm + C::OFF_RED) + c * 4 * N;

    // Per block: the S^T of all GW owned tokens as one m64n64 GEMM (their Q rows side by side:
    // one read of the key block for the four, where a GEMM per token re-read it, and no wgmma
    // under a per-token branch, which ptxas serialises: C7515), then token by token, for the tokens
    // with keys in the block, the softmax and the O_u^T GEMM, issued without waiting, so the next
    // token's softmax runs under it; one wait at the block's end, before its buffer is released
    // (a runtime wait count per token is serialised too: C7514).  P^T has a tile per token
    // (O_u^T reads it while the later tokens' softmax writes theirs).  A block none of the
    // warpgroup's tokens selected is skipped whole.
    for (int i = 0; i < ucnt; i++) {
        const int stg = i % NST;
        const uint32_t par = (i / NST) & 1;
        unsigned char *buf = sm + C::OFF_K + stg * TILE;
        const uint64_t kd = hop::desc_sw128(buf, 16, 1024), vd = hop::desc_sw128(buf, BOX, 1024);
        SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, c, i, 0);)
        hop::mbar_wait(mbar + stg, par);
        SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, c, i, 1);)
        hop::mbar_wait(full + stg, par);
        SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, c, i, 2);)
        unsigned long long msk[GW], any = 0ull;  // read once a block (the barriers below clobber memory)
#pragma unroll
        for (int u = 0; u < GW; u++) any |= msk[u] = wmsk[stg * GMAX + u];
        if (any != 0ull) {
            float(&sall)[32] = reinterpret_cast<float(&)[32]>(sc);  // GW N = 64 columns
            const uint64_t qt = hop::desc_add(qd, c * GW * N * 128);
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4 * NBK; kk++)
                hop::elt<T>::template ss64<0, 0>(sall, hop::desc_add(kd, (kk >> 2) * BOX + (kk & 3) * 32),
                                                        hop::desc_add(qt, (kk >> 2) * C::QBOX + (kk & 3) * 32), kk > 0);
            hop::wgmma_commit();
            hop::wgmma_wait<0>();
            SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, c, i, 3);)
#pragma unroll
            for (int u = 0; u < GW; u++) {
                if (msk[u] != 0ull) {
                    hop::reg_fence(sc[u]);
                    const uint32_t tile = tile0 + u * N * 128;
                    // keys the token did not select at -inf; P^T from the kept max unless a score passes it
                    sfa::keyrows_softmax_voted<T, N, ND>(sc[u], (msk[u] & bit0) != 0ull, (msk[u] & bit1) != 0ull, sl2, red, pt,
                                                         tile, m[u], l[u], o[u], warp, lane, NB_RED + c);
                    SPATTN_TRACE(if (t == 0 && u < 4) cta_trace::step_at(trs, c, i, 4 + u);)
                    // O_u^T += V^T P_u^T
                    const uint64_t pd = hop::desc_sw128(sm + C::OFF_P + (c * GW + u) * N * 128, 16, 1024);
                    hop::wgmma_fence();
#pragma unroll
                    for (int d = 0; d < ND; d++)
#pragma unroll
                        for (int kk = 0; kk < 4; kk++)
                            hop::elt<T>::template ssn<N, 1, 0>(o[u][d], hop::desc_add(vd, S::vbox(d) * BOX + kk * 16 * 128),
                                                               hop::desc_add(pd, kk * 32), 1);
                }
            }
            SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, c, i, 8);)
            hop::wgmma_commit();
            hop::wgmma_wait<0>();
#pragma unroll
            for (int u = 0; u < GW; u++)
#pragma unroll
                for (int d = 0; d < ND; d++) hop::reg_fence(o[u][d]);
            SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, c, i, 9);)
        }
        hop::mbar_arrive(empty + stg);  // both warpgroups release every block
        SPATTN_TRACE(if (t == 0) cta_trace::step_at(trs, c, i, 10);)
    }

    // ---- epilogue, token by token: the row sums over the 4 warps, O normalised and staged as
    // [N heads][D] (16-bit) in this warpgroup's area, then 16-byte row-contiguous stores
    float *sL = reinterpret_cast<float *>(sm + C::OFF_L) + c * 4 * N;
    unsigned char *os = sm + C::OFF_O + c * N * S::D * 2;
    constexpr int ROWB = S::D * 2, CH = ND * 8;  // bytes of a staged row; its 16-byte chunks
#pragma unroll
    for (int u = 0; u < GW; u++) {
        const int s1 = s10 + c * GW + u;
        float ls[NJ][2];
#pragma unroll
        for (int g = 0; g < NJ; g++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float x = l[u][g][h];
                x += __shfl_xor_sync(0xffffffffu, x, 4);
                x += __shfl_xor_sync(0xffffffffu, x, 8);
                x += __shfl_xor_sync(0xffffffffu, x, 16);
                ls[g][h] = x;
            }
        hop::bar_sync(NB_O + c, 128);  // the previous token's staged rows and sums are consumed
        if (lane < 4) {
#pragma unroll
            for (int g = 0; g < NJ; g++)
                *reinterpret_cast<float2 *>(sL + warp * N + 8 * g + 2 * q4) = make_float2(ls[g][0], ls[g][1]);
        }
        hop::bar_sync(NB_O + c, 128);
        float inv[NJ][2], lf[NJ][2];
#pragma unroll
        for (int g = 0; g < NJ; g++) {
            float2 a = make_float2(0.f, 0.f);
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const float2 y = *reinterpret_cast<const float2 *>(sL + w * N + 8 * g + 2 * q4);
                a.x += y.x;
                a.y += y.y;
            }
            lf[g][0] = a.x;
            lf[g][1] = a.y;
#pragma unroll
            for (int h = 0; h < 2; h++) inv[g][h] = lf[g][h] > 0.f ? 1.f / lf[g][h] : lf[g][h] == 0.f ? 0.f : lf[g][h];
        }
#pragma unroll
        for (int d = 0; d < ND; d++)
#pragma unroll
            for (int g = 0; g < NJ; g++)
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int rr = 0; rr < 2; rr++) {
                        const int col = 8 * g + 2 * q4 + h, dd = d * 64 + r0 + 8 * rr;
                        const uint32_t pk = hop::elt<T>::pack(o[u][d][4 * g + 2 * rr + h] * inv[g][h], 0.f);
                        *reinterpret_cast<uint16_t *>(os + col * ROWB + dd * 2) = (uint16_t)(pk & 0xffffu);
                    }
        hop::bar_sync(NB_O + c, 128);
        if (s1 < p.S1 && gate == ~0ull) {
            T *ob = static_cast<T *>(p.out_o) + b * p.so[0] + (int64_t)s1 * p.so[1] + (int64_t)head0 * p.so[2];
            for (int x = t; x < nh * CH; x += 128) {
                const int row = x / CH, ch = x % CH;
                if (!S::PADV || ch * 8 < p.dn)  // columns past D: padding
                    __stcs(reinterpret_cast<int4 *>(ob + (int64_t)row * p.so[2] + ch * 8),
                           *reinterpret_cast<const int4 *>(os + row * ROWB + ch * 16));
            }
            if (warp == 0 && lane < 4 && p.out_lse)
                sfa::keyrows_store_lse<N>(p.out_lse + b * p.slse[0] + (int64_t)s1 * p.slse[1], p.slse[2], head0, nh, q4, m[u], lf);
        }
    }
}

// Tokens per consumer warpgroup: their O^T (GW ND N / 2 fp32 a thread) and softmax state (GW N / 2)
// within 96 registers at ND 2; sfa_host.cu's group_cfg sets Params::ug = 2 GW the same way.  (Twice
// as many tokens at ND 1 spilled 8-88 bytes in ptxas.)
constexpr int group_gw(int N) { return 64 / N; }

template <int N, typename T, typename S> cudaError_t launch(const Params &p, cudaStream_t st) {
    constexpr int GW = group_gw(N);  // N 8: 8 tokens, 16: 4, 32: 2
    if (p.ug != 2 * GW) return cudaErrorInvalidValue;
    static unsigned long long done = 0;
    const cudaError_t e = hop::set_smem(sfa_fwd_group_kernel<N, T, S, GW>, GroupCfg<N, S, GW>::SMEM, &done);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)p.ungroups, (unsigned)(p.B * p.N2));
    SPATTN_TRACE(unsigned *steps = cta_trace::step_begin((long long)grid.x * grid.y, st);)
    sfa_fwd_group_kernel<N, T, S, GW><<<grid, 384, GroupCfg<N, S, GW>::SMEM, st>>>(p);
    SPATTN_TRACE(cta_trace::step_end(steps, (long long)grid.x * grid.y, st);)
    return cudaGetLastError();
}

template <typename T, typename S> cudaError_t launch_h(const Params &p, cudaStream_t st) {
    return p.H <= 8 ? launch<8, T, S>(p, st) : p.H <= 16 ? launch<16, T, S>(p, st) : p.H <= 32 ? launch<32, T, S>(p, st)
                                                                                              : cudaErrorInvalidValue;
}
template <typename S> cudaError_t launch_t(const Params &p, int is_bf16, cudaStream_t st) {
    if (sfa::padded<S>(p))  // D or Dr not a whole box count: the tests (sfa::PadOf)
        return is_bf16 ? launch_h<__nv_bfloat16, sfa::PadOf<S>>(p, st) : launch_h<__half, sfa::PadOf<S>>(p, st);
    return is_bf16 ? launch_h<__nv_bfloat16, S>(p, st) : launch_h<__half, S>(p, st);
}

}  // namespace

// Launcher used by sfa_host.cu (group_cfg): the shapes the group form takes, sfa::FwdShape values
// with at most two value boxes (O^T of four tokens in registers: D <= 128, separate or shared V,
// Dr 0 or up to 64), the union plan run before (p's union fields).
extern "C" cudaError_t spattn_sfa_group_fwd_launch(const sfa::Params *p, int is_bf16, int shape, cudaStream_t st) {
    switch (shape) {
    case sfa::SHAPE_NSA: return launch_t<sfa::Nsa>(*p, is_bf16, st);
    case sfa::SHAPE_SEP_128_64: return launch_t<sfa::Sep<2, 1>>(*p, is_bf16, st);
    case sfa::SHAPE_SEP_64: return launch_t<sfa::Sep<1, 0>>(*p, is_bf16, st);
    case sfa::SHAPE_SEP_64_64: return launch_t<sfa::Sep<1, 1>>(*p, is_bf16, st);
    case sfa::SHAPE_SHV_128: return launch_t<sfa::Shv<2, 0>>(*p, is_bf16, st);
    case sfa::SHAPE_SHV_128_64: return launch_t<sfa::Shv<2, 1>>(*p, is_bf16, st);
    case sfa::SHAPE_SHV_64: return launch_t<sfa::Shv<1, 0>>(*p, is_bf16, st);
    case sfa::SHAPE_SHV_64_64: return launch_t<sfa::Shv<1, 1>>(*p, is_bf16, st);
    default: return cudaErrorInvalidValue;
    }
}
