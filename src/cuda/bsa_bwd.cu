// Block-sparse attention backward for Hopper (sm_90a), FlashAttention-3 style: one kernel for
// dK, dV and dQ (5 GEMMs per tile pair); Delta and lse2 come from bsa_bwd_pre.cu.  See
// docs/runbooks/block_sparse_attention.md, "CUDA backward on Hopper".
//   - one CTA per (b, kv head, key tile of BN = 128 keys), walking the key-major list of
//     (group head g, query tile m of BM = 64 rows) pairs that hit it, so dK / dV of the whole GQA
//     group accumulate in registers and are stored once (no atomics; dense calls through the K / V
//     tiles in shared memory and TMA stores);
//   - launched as the Delta kernel's programmatic dependent (K / V loads start before
//     griddepcontrol.wait), the dQ postprocess as this kernel's;
//   - warpgroup 0: warp 0 = producer (lane 0: TMA of K, V once, then Q and dO tiles into a
//     2-stage ring on mbarriers; the warp stages LSE2 / Delta of each query tile in shared
//     memory), warps 1 and 2 = dQ writers (even / odd steps, see below); warpgroups 1 and 2 =
//     consumers, 64 keys each;
//   - keys are the MMA rows: S^T = K Q^T and dP^T = V dO^T (both operands in shared memory),
//     P^T = exp2(S^T * scale_log2 - LSE2), dS^T = P^T (dP^T - Delta), then dV += P^T dO and
//     dK += dS^T Q with P^T / dS^T from registers;
//   - dS is also written to shared memory (stmatrix .trans, K-major) for dQ = dS K; warpgroup c computes
//     dQ columns [64 c, 64 c + 64) (D = 64: warpgroup 0 only) and stages the fp32 partial in one
//     of two shared buffers (buffer = step parity); that buffer's writer warp adds it to an fp32
//     accumulator with one bulk reduction per step (cp.reduce.async.bulk), so the consumers go
//     on with the next tile, and waits for the add to land before its next one, two steps later;
//   - deterministic mode: the adds into one query tile happen in ascending key-tile order: a
//     semaphore per (b, head, query tile) counts them; the writer waits until it equals its rank
//     (the number of key tiles below its own in the query tile's q-major list, searched by the
//     writer warp's lanes 32 steps ahead), adds both halves with one bulk reduction, frees the
//     staging buffer once it is read, waits for the add to land, increments.  CTAs are launched
//     key tile ascending across all heads (key tile 0 of every head, then key tile 1, ...), so
//     every wait is on a CTA launched earlier (no deadlock) and the CTAs resident together
//     belong to many heads (few share a query tile's chain); each CTA walks its query tiles
//     descending, so for causal and banded masks the lower key tile has passed a shared query
//     tile first.  (This replaced the per-head, key tile descending order: 0.875x the time,
//     geomean over the public suite, causal 0.82x, bigbird 0.67-0.75x, none slower; H200.)
//     The first add (rank 0) is a store, so the accumulator is never zeroed.
//   - non-deterministic mode: the writer claims the query tile (atomicAdd on its semaphore); the
//     first claimant stores and adds kStored once the store has landed, the others spin until
//     then and add in any order (no zeroing of the accumulator either); each landed add is
//     counted per query tile (lnd, next to the semaphores).
//   - a postprocess kernel writes dq = scale * accumulator, each query tile as soon as its last
//     add has landed (det: the order semaphore; non-det: lnd), overlapping the backward's tail
//     (bsa_dq_post_kernel).
//   - VL (packed variable-length batch, spattn_bsa_bwd_varlen): a CTA is (sequence b, kv head,
//     key tile of max_seqlen_kv) with b's own Sq / Skv in every edge test (a key tile past b's
//     keys returns at once), TMA maps from bsa_vl_prep_kernel whose base is b's first row and
//     whose row count is its length (q, dO, k, v rows past its end read as 0, as past S in a
//     dense call; lse2 = +inf there, so P = 0), Delta / lse2 by packed token, the dQ
//     accumulator and semaphores per (head, bsa_vl_qtile), dK / dV rows k0 + j, and the mask at
//     batch index b; nothing is written when the prefix sums are bad (*p.vl.err != ~0).  The
//     postprocess finds each packed token's sequence by a binary search over seq and also zeroes
//     the dK / dV rows past cu_kv[B].  The dense instantiations are unchanged.
//   - PG (paged K / V, VL only; spattn_bsa_bwd_varlen with a block table): K and V of the key
//     tile come page by page in slabs of 2^lr rows through the page pool's map (bsa_load_paged,
//     as the paged forward: rows past the sequence's keys read as 0, no page it does not own is
//     read); dK (scaled) / dV rows go as fp32 to a scratch [B * max_seqlen_kv][Nkv][D] through
//     p.dk / p.dv (row b * Skv + key), and bsa_pages.cu folds them into the pages (the sum over
//     the sequences sharing a page row in ascending b, 0 for rows nobody uses).  The VL
//     postprocess then writes dQ only.  The packed VL instantiations are unchanged.
#include <math.h>

#include "bsa_common.cuh"
#include "bsa_launch.h"
#include "bsa_paged.cuh"
#include "bsa_tiles.h"
#include "cta_trace.cuh"
#include "hopper/hopper.cuh"

namespace {

constexpr int BM = 64, BN = 128, ST = 2;
// non-deterministic dQ: a query tile's semaphore counts the claims of its adds (atomicAdd 1 each);
// the first claimant adds kStored once its store has landed (claims per tile < 2^24)
constexpr int kStored = 1 << 24;

template <int DP> struct BwdCfg {
    static constexpr int NBOX = DP / 64, NH = DP / 64;  // 64-column boxes; dQ halves of 64 columns
    static constexpr int T_BYTES = BM * DP * 2;         // a Q or dO tile
    static constexpr int KV_BYTES = BN * DP * 2;
    static constexpr int OFF_K = 0, OFF_V = KV_BYTES, OFF_Q = 2 * KV_BYTES, OFF_DO = OFF_Q + ST * T_BYTES;
    static constexpr int OFF_DS = OFF_DO + ST * T_BYTES;          // dS: 2 boxes [BM queries][64 keys] bf16
    static constexpr int OFF_DQ = OFF_DS + BN * BM * 2;           // [2][NH][BM][64] fp32
    static constexpr int OFF_LD = OFF_DQ + 2 * NH * BM * 64 * 4;   // [ST][2][BM] fp32: LSE2, Delta
    static constexpr int OFF_MB = OFF_LD + ST * 2 * BM * 4;         // [ST][BM][2] u64: token mask bits
    static constexpr int OFF_BAR = OFF_MB + ST * BM * 16;
    static constexpr int SMEM = OFF_BAR + (1 + 3 * ST + 4) * 8 + 1024;
    static_assert(SMEM <= 232448, "fits in 227 KB");
};

enum { NB_DS = 1, NB_DSE = 2, NB_KV = 3, NB_ST = 4 };  // NB_ST + c: consumer c's TMA-store barrier

// Position of element (row r, column col) of a 64 x 64 fp32 dQ half in the staging buffer and
// the accumulator: the wgmma accumulator fragment order, so that each consumer thread stores its
// 32 values as 8 float4 at (warp * 8 + j) * 32 + lane (rows warp * 16 + lane / 4 (+ 8), columns
// 8 j + 2 (lane % 4) (+ 1)) without bank conflicts; the postprocess kernels read through it.
__device__ __forceinline__ int dq_frag_off(int r, int col) {
    const int rr = r & 15, lane = ((rr & 7) << 2) | ((col & 7) >> 1);
    return (((r >> 4) * 8 + (col >> 3)) * 32 + lane) * 4 + ((rr >> 3) << 1) + (col & 1);
}

// Token mask of a step with a partial half, as bits: word 2 r + h of dst covers keys
// [64 h, 64 h + 64) of the tile for query row r (bit = mask[i / bx][key / by], 0 for i >= Sq or
// key >= Skv), so the consumers test one bit per element instead of dividing and loading.  Run
// by the producer warp: lane x takes pair x of (query block, key block) pairs of the tile (one
// mask byte each, loaded together), then a warp OR per query block gives that block's 128 bits
// to its rows (lane: rows lane, lane + 32).  A lane per row walking its key blocks was a chain
// of dependent L2 loads (by = 16: 8 per row, 2 rows per lane) that delayed the step's Q / dO
// copies behind it (ncu on bsa15: a quarter of the stall samples on the Q / dO barrier).
// Rows [i0, i0 + BM), keys [c0, c1) of the sequence exist below Sq / c1.
__device__ __forceinline__ void bwd_mask_bits(uint64_t *dst, const uint8_t *mb, const bsa_params &p, int i0, int Sq,
                                              int c0, int c1, int lane) {
    // the rows are ORed in place (a query block's pairs may span two rounds): few live registers
    // in the 24-register producer
    dst[2 * lane] = dst[2 * lane + 1] = dst[2 * lane + 64] = dst[2 * lane + 65] = 0;
    const int i1 = min(Sq, i0 + BM);  // rows [i0, i1) exist
    if (i0 >= i1 || c0 >= c1) return;  // warp-uniform
    const int qb0 = i0 / p.bx, kb0 = c0 / p.by, nk = (c1 - 1) / p.by - kb0 + 1;
    const int np = ((i1 - 1) / p.bx - qb0 + 1) * nk;  // pairs
    for (int base = 0; base < np; base += 32) {  // warp-uniform
        const int x = base + lane;
        uint64_t w0 = 0, w1 = 0;
        int myq = -1;
        if (x < np) {
            myq = qb0 + x / nk;
            const int kb = kb0 + x % nk;
            if (mb[(long long)min(myq, p.nbx - 1) * p.mask.s2 + (long long)min(kb, p.nby - 1) * p.mask.s3]) {
                // bits [lo, hi) of the 128-bit row
                const int lo = max(kb * p.by, c0) - c0, hi = (int)min((long long)(kb + 1) * p.by, (long long)c1) - c0;
                const uint64_t a = lo < 64 ? ~0ull << lo : 0ull, bb = hi < 64 ? ~(~0ull << hi) : ~0ull;
                w0 = a & bb;
                const int l1 = max(lo, 64) - 64, h1 = hi - 64;
                if (h1 > 0) w1 = (~0ull << l1) & (h1 < 64 ? ~(~0ull << h1) : ~0ull);
            }
        }
        const int qlo = qb0 + base / nk, qhi = qb0 + min(np - 1, base + 31) / nk;
        for (int q = qlo; q <= qhi; q++) {
            const bool me = myq == q;
            const uint32_t v0 = __reduce_or_sync(0xffffffffu, me ? (uint32_t)w0 : 0u);
            const uint32_t v1 = __reduce_or_sync(0xffffffffu, me ? (uint32_t)(w0 >> 32) : 0u);
            const uint32_t v2 = __reduce_or_sync(0xffffffffu, me ? (uint32_t)w1 : 0u);
            const uint32_t v3 = __reduce_or_sync(0xffffffffu, me ? (uint32_t)(w1 >> 32) : 0u);
            const uint64_t lo64 = (uint64_t)v1 << 32 | v0, hi64 = (uint64_t)v3 << 32 | v2;
            // rows [max(i0, q bx), min(i1, (q + 1) bx)) of the tile take them
            const int r0 = max(i0, q * p.bx) - i0, r1 = min(i1, (q + 1) * p.bx) - i0;
            for (int r = lane; r < BM; r += 32)
                if (r >= r0 && r < r1) dst[2 * r] |= lo64, dst[2 * r + 1] |= hi64;
        }
    }
}

// VL: the per-sequence maps are written by bsa_vl_prep_kernel (generic proxy): acquire them for
// the tensormap proxy before the first TMA that uses them.
__device__ __forceinline__ void bwd_tmap_acquire(const CUtensorMap *m) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(m))
                 : "memory");
}

template <int DP, typename T, bool VL, bool PG = false>
__global__ void __launch_bounds__(384, 1)
    bsa_bwd90_kernel(const bsa_params p, const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmdo,
                     const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                     const __grid_constant__ CUtensorMap tmdk, const __grid_constant__ CUtensorMap tmdv, const int kv_tma,
                     float *dqacc, int *sem, int *lnd, int det, const bsa_split sp) {
    using C = BwdCfg<DP>;
    static_assert(VL || !PG, "paged K / V come with a varlen batch only");
    // trace (debugging build): t0 entry, t1 K / V landed, t2 last step done, t3 dK / dV stores
    // issued (consumer 0's thread 0; dense calls with TMA stores), n = the row's steps
    SPATTN_TRACE(const unsigned long long tr0 = cta_trace::now(); unsigned long long tr1 = 0, tr2 = 0;)
    constexpr int NBOX = C::NBOX, NH = C::NH;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = hop::align1024(smem_raw);
    unsigned char *sK = sm + C::OFF_K, *sV = sm + C::OFF_V, *sQ = sm + C::OFF_Q, *sDO = sm + C::OFF_DO;
    unsigned char *sDS = sm + C::OFF_DS;
    float *sDQ = reinterpret_cast<float *>(sm + C::OFF_DQ);
    float *sLD = reinterpret_cast<float *>(sm + C::OFF_LD);
    uint64_t *sMB = reinterpret_cast<uint64_t *>(sm + C::OFF_MB);
    uint64_t *barKV = reinterpret_cast<uint64_t *>(sm + C::OFF_BAR), *full = barKV + 1, *empty = full + ST, *fullLD = empty + ST;
    uint64_t *dqfull = fullLD + ST, *dqempty = dqfull + 2;  // the two dQ staging buffers

    const int nkt = (p.Skv + BN - 1) / BN, nqt = p.nqt;
    // blocks: chunk fastest; row = (b * Nkv + hk) * nkt + nt.  Deterministic: key tile ascending
    // over all heads (see the header), query tiles walked descending; non-deterministic mode with
    // p.sk.order: rows heaviest first (no dQ order to keep), else key tile descending per head.
    const int ck = (int)(blockIdx.x % sp.splits);
    const long long bx = blockIdx.x / sp.splits, nheads = (long long)p.B * p.Nkv;
    const long long row = det          ? (bx % nheads) * nkt + bx / nheads
                          : p.sk.order ? (long long)p.sk.order[bx]
                                       : bx / nkt * nkt + (nkt - 1 - bx % nkt);
    const int nt = (int)(row % nkt);
    const long long bh = row / nkt;
    const int hk = (int)(bh % p.Nkv), b = (int)(bh / p.Nkv);
    // VL: sequence b's lengths, rows and maps; tensors are [1, H, T, D] views (batch index 0),
    // the mask keeps b
    int vSq = 0, vSkv = 0, bt = b;
    long long q0 = 0, k0 = 0;
    const CUtensorMap *mq = &tmq, *mdo = &tmdo, *mk = &tmk, *mv = &tmv, *mdk = &tmdk, *mdv = &tmdv;
    // Launched as the Delta kernel's programmatic dependent: what is read before hop::griddep_wait()
    // (lists, counts, a plan's slots, the varlen table and maps, K and V) was written before the
    // Delta kernel ran; LSE2 / Delta, the zeroed semaphores and accumulator, and slots written by
    // spattn_bsa_launch_split_slots only after it.  Every exit path waits first (griddep_wait).
    if constexpr (VL) {
        // bad prefix sums: nothing is written (the host reports it)
        if (*p.vl.err != ~0ull) return hop::griddep_wait();
        const int4 sq = p.vl.seq[b];
        if (nt * BN >= sq.w) return hop::griddep_wait();  // a key tile past the sequence's keys: nothing to do
        q0 = sq.x;
        vSq = sq.y;
        vSkv = sq.w;
        bt = 0;
        mq = static_cast<const CUtensorMap *>(p.vl.tm) + (kv_tma ? 6 : 4) * b;  // q, k, v, dO (, dk, dv)
        mk = mq + 1;
        mv = mq + 2;
        mdo = mq + 3;
        mdk = mq + 4;
        mdv = mq + 5;
    }
    // the query / key counts of the edge tests (dense: read from p at each use, as before VL)
    const auto Sq = [&]() { return bsa_len<VL>(vSq, p.Sq); };
    const auto Skv = [&]() { return bsa_len<VL>(vSkv, p.Skv); };
    // a list longer than sp.chunk and more than twice as long as the shortest of the key tiles
    // within 2 of it (a global key column, not a causal or banded mask's gradual slope, nor a
    // random or dense mask's uniform rows) is split: chunk ck takes entries [ck chunk, (ck + 1)
    // chunk).  Splitting every long list costs the deterministic mode: the chunk of a causal key
    // tile 0 that holds the last query tiles waits for every other key tile's add there (measured
    // on the H200: causal s8192 1.11 -> 1.98 ms); a global column's chunks do not.  The choice is
    // made before the launch (spattn_bsa_launch_split_slots: a split row's kvbuf slot, -1 for the
    // others and for candidates past the 64 MiB of slots).
    const int cnt_all = p.sk.cnt[row];
    auto slot_of = [&]() { return sp.splits > 1 ? sp.slot[row] : -1; };
    auto chunks = [&](int kslot) { return kslot >= 0 ? (cnt_all + sp.chunk - 1) / sp.chunk : 1; };
    // chunk 0 exists whenever the row does (nch >= 1); later chunks only for split rows
    if (ck > 0) {
        hop::griddep_wait();
        if (ck >= chunks(slot_of())) return;  // the whole CTA: nothing initialised yet
    }
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0), tid = threadIdx.x & 127;
    SPATTN_TRACE(unsigned *const trs = cta_trace::step_base();)
    // Token mask of a step with a partial half (bwd_mask_bits): query rows [m BM, m BM + BM) of
    // head n, keys [nt BN, nt BN + BN) of the tile
    auto mask_bits = [&](uint64_t *dst, int m, int n, int lane) {
        const uint8_t *mb = p.mask.p + (long long)b * p.mask.s0 + (long long)n * p.mask.s1;
        bwd_mask_bits(dst, mb, p, m * BM, Sq(), nt * BN, min(Skv(), nt * BN + BN), lane);
    };

    if (threadIdx.x == 0) {
        hop::mbar_init(barKV, 1);
        for (int s = 0; s < ST; s++) {
            hop::mbar_init(full + s, 1);
            hop::mbar_init(empty + s, 256);
            hop::mbar_init(fullLD + s, 32);
        }
        for (int x = 0; x < 2; x++) {
            hop::mbar_init(dqfull + x, 128 * NH);
            hop::mbar_init(dqempty + x, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    // K and V of the tile (inputs): issued before the wait, so that they load while the Delta
    // kernel ends (chunk ck > 0 of a split row loads them too, after its wait above)
    if (threadIdx.x == 0 && cnt_all > 0) {
        if constexpr (VL) {  // maps written by the prep kernel
            bwd_tmap_acquire(mq);
            bwd_tmap_acquire(mdo);
            bwd_tmap_acquire(mk);
            bwd_tmap_acquire(mv);
        }
        hop::tma_prefetch_desc(mq);
        hop::tma_prefetch_desc(mdo);
        hop::mbar_expect_tx(barKV, 2 * C::KV_BYTES);  // PG: zero-filled slabs count too
        if constexpr (PG) {  // mk / mv: the last-page maps; tmk / tmv: the pool
            const int *trow = p.vl.table + b * p.vl.tab_s0;
            bsa_load_paged<NBOX, BN>(sK, &tmk, mk, nt * BN, BN, p.vl.lr, hk, trow, p.vl.tab_s1, p.vl.page_size, Skv(),
                                     barKV);
            bsa_load_paged<NBOX, BN>(sV, &tmv, mv, nt * BN, BN, p.vl.lr, hk, trow, p.vl.tab_s1, p.vl.page_size, Skv(),
                                     barKV);
        } else {
#pragma unroll
            for (int x = 0; x < NBOX; x++) {
                hop::tma_load_4d(sK + x * BN * 128, mk, x * 64, nt * BN, hk, bt, barKV);
                hop::tma_load_4d(sV + x * BN * 128, mv, x * 64, nt * BN, hk, bt, barKV);
            }
        }
    }
    hop::griddep_wait();
    hop::griddep_launch();  // the dQ postprocess may be scheduled once every CTA is past here
    const int kslot = slot_of(), nch = chunks(kslot);
    const int cnt = nch > 1 ? min(sp.chunk, cnt_all - ck * sp.chunk) : cnt_all;
    const int *lst = p.sk.list + row * (long long)p.sk.stride + (long long)ck * sp.chunk;
    const auto ent = [&](int it) { return lst[det ? cnt - 1 - it : it]; };  // list entry of step it

    if (wg == 0) {
        hop::setmaxnreg_dec<24>();
        const int pw = tid >> 5, lane = tid & 31;
        if (pw == 0) {  // ---------------------------------------------------------- producer warp
            // the warp stages LSE2 (rows 0-63) and Delta (64-127) of each step's query tile in shared
            // memory (keeps registers of the consumers free); lane 0 issues the copies
            for (int it = 0; it < cnt; it++) {
                const int s = it % ST;
                hop::mbar_wait(empty + s, ((it / ST) & 1) ^ 1);
                const int lv = ent(it);
                const int e = lv >> 4, g = e / nqt, m = e % nqt, n = hk * p.G + g;
                // Q / dO first: the consumers need them first (S^T), LSE2 / Delta / mask bits only after
                if (lane == 0) {
                    hop::mbar_expect_tx(full + s, 2 * C::T_BYTES);
#pragma unroll
                    for (int x = 0; x < NBOX; x++) {
                        hop::tma_load_4d(sQ + s * C::T_BYTES + x * BM * 128, mq, x * 64, m * BM, n, bt, full + s);
                        hop::tma_load_4d(sDO + s * C::T_BYTES + x * BM * 128, mdo, x * 64, m * BM, n, bt, full + s);
                    }
                }
                long long rb;
                if constexpr (VL) rb = (long long)n * p.vl.Tq + q0;  // [N][Tq] by packed token
                else rb = ((long long)b * p.N + n) * p.Sq;
#pragma unroll
                for (int x = lane; x < 2 * BM; x += 32) {
                    const int i = m * BM + (x & 63);
                    sLD[s * 2 * BM + x] = x < 64 ? (i < Sq() ? p.lse2[rb + i] : INFINITY) : (i < Sq() ? p.delta[rb + i] : 0.f);
                }
                if ((lv & 0xa) != 0) mask_bits(sMB + s * BM * 2, m, n, lane);  // a partial half
                hop::mbar_arrive(fullLD + s);
            }
        } else if (pw == 1 || pw == 2) {  // ---------------------------------------------- dQ writers
            // Two writer warps: warp 1 takes the even steps (staging buffer 0), warp 2 the odd ones
            // (buffer 1), so each has two steps between its adds to wait for its add to land (which
            // the early postprocess needs to know).  One writer waiting for each add to land took
            // 1.03-1.06x the time of not knowing in the non-deterministic mode, where adds into one
            // tile from many CTAs land slowly; two writers: 0.961-0.964x non-deterministic and
            // 0.971-0.972x deterministic (where the chain waits of two steps now overlap; H200).
            const int wr = pw - 1;
            // The rank of a step (key tiles above nt in the query tile's q-major list, ascending) is a
            // binary search of dependent L2 loads: the warp's 32 lanes search the next 32 steps' ranks
            // in parallel, so lane 0's serial path per step is the wait, the add and the release only.
            // (Lane 0 searching each step itself made the writer the bottleneck of the deterministic
            // mode: measured on the H200, the parallel search takes 0.892x the time, geomean over
            // the public suite; causal cases then run as fast as the non-deterministic mode.)
            auto rank_of = [&](int it) {
                const int e = ent(it) >> 4, g = e / nqt, m = e % nqt, n = hk * p.G + g;
                const long long tile = ((long long)b * p.N + n) * nqt + m;  // schedule row
                const int qc = p.sq.cnt[tile];
                const int *ql = p.sq.list + tile * (long long)p.sq.stride;
                int lo = 0, hi = qc;
                while (lo < hi) {
                    const int mid = (lo + hi) >> 1;
                    if ((ql[mid] >> 1) < nt) lo = mid + 1;
                    else hi = mid;
                }
                return lo;  // key tiles below nt
            };
            for (int base = 0; base < cnt; base += 32) {
                const int nstep = min(32, cnt - base);
                const int my_rank = det && lane < nstep && (lane & 1) == wr ? rank_of(base + lane) : 0;
                for (int i = wr; i < nstep; i += 2) {  // base is even: step base + i has parity i
                    const int pre = __shfl_sync(0xffffffffu, my_rank, i);
                    if (lane == 0) {
                        const int it = base + i;
                        const int buf = it & 1;
                        const int e = ent(it) >> 4, g = e / nqt, m = e % nqt, n = hk * p.G + g;
                        long long at;  // accumulator tile
                        // VL: q0 read again per step (the writer runs on 24 registers: keeping it live spilled)
                        if constexpr (VL) at = (long long)n * p.vl.ntile + bsa_vl_qtile(p.vl.seq[b].x, b, m);
                        else at = ((long long)b * p.N + n) * nqt + m;
                        const int rank = pre;
                        int *sp = sem + at;
                        // non-det: claim the tile before the data wait (the atomic's latency hides there;
                        // claiming after it measured 1.002-1.005x); the first claimant stores, the
                        // others add once its store has landed
                        const bool first = !det && atomicAdd(sp, 1) == 0;
                        hop::mbar_wait(dqfull + buf, (it >> 1) & 1);
                        if (det) hop::spin_until_eq(sp, rank);
                        else if (!first) hop::spin_until_ge(sp, kStored);
                        // the tile's NH halves are contiguous in the buffer and in the accumulator: one
                        // add. The first in the order (det: rank 0; non-det: the first claimant) stores
                        // instead, so the accumulator needs no zeroing (the postprocess writes 0 for
                        // query tiles nothing reaches)
                        float *dst = dqacc + at * NH * (long long)(BM * 64);
                        const uint32_t src = hop::smem_u32(sDQ + buf * NH * BM * 64);
                        if (det ? rank == 0 : first)
                            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
                                         "r"(src), "r"(NH * BM * 64 * 4)
                                         : "memory");
                        else
                            asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                                         "r"(src), "r"(NH * BM * 64 * 4)
                                         : "memory");
                        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the buffer is read
                        hop::mbar_arrive(dqempty + buf);
                        if (det) {
                            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the add has landed
                            // the deterministic postprocess converts a query tile once sem = its count of
                            // adds (bsa_dq_post_kernel) and reads it through the generic proxy: the proxy
                            // fence orders the landed async-proxy add before the release
                            hop::fence_proxy_async_global();
                            // a release add (no full fence: membar.sc cost ~1 us per link of the chain)
                            hop::release_inc(sp);
                        } else if (first) {
                            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the store has landed
                            hop::release_add(sp, kStored);
                        }
                        if constexpr (!VL) {
                            // non-det: the tile's count of landed adds (lnd) is the postprocess's
                            // readiness, as the order semaphore is the deterministic mode's
                            if (!det) {
                                asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the add has landed
                                hop::fence_proxy_async_global();
                                hop::release_inc(lnd + at);
                            }
                        }
                    }
                    __syncwarp();
                }
            }
            if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
        }
        return;
    }
    // ------------------------------------------------------------------------------- consumers
    hop::setmaxnreg_inc<240>();
    const int c = wg - 1;  // keys [64 c, 64 c + 64) of the tile
    const int warp = tid >> 5, lane = tid & 31, q4 = lane & 3;
    const int kr = warp * 16 + (lane >> 2);            // this thread's key rows kr, kr + 8 (of 64)
    const int key0 = nt * BN + c * 64 + kr;           // global key of row kr
    const float sl2 = p.scale_log2;
    float dk[DP / 2], dv[DP / 2];
#pragma unroll
    for (int i = 0; i < DP / 2; i++) dk[i] = dv[i] = 0.f;

    // descriptors (128-byte swizzle, boxes of 64 columns)
    const uint64_t dK = hop::desc_sw128(sK + c * 64 * 128, 16, 1024), dV = hop::desc_sw128(sV + c * 64 * 128, 16, 1024);
    auto kmaj = [&](uint64_t base, int rows, int kk) {  // K-major operand, k-step kk of 16 columns
        return hop::desc_add(base, (kk >> 2) * rows * 128 + (kk & 3) * 32);
    };

    if (cnt > 0) hop::mbar_wait(barKV, 0);
    SPATTN_TRACE(tr1 = cta_trace::now();)
    for (int it = 0; it < cnt; it++) {
        const int s = it % ST;
        SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 0);)
        // list entry: pair e, then 2 bits per key half (0 empty, 1 full, 2 partial); broadcast so
        // that ptxas sees the branches around the wgmma below as warp-uniform
        const int e2 = __shfl_sync(0xffffffffu, ent(it), 0);
        const int act0 = e2 & 3, act1 = (e2 >> 2) & 3, my = c ? act1 : act0, part = my == 2;
        const uint64_t dQk = hop::desc_sw128(sQ + s * C::T_BYTES, 16, 1024), dDOk = hop::desc_sw128(sDO + s * C::T_BYTES, 16, 1024);
        // MN-major views of the same tiles (B of dV / dK: k = query rows, n = head dim)
        const uint64_t dQn = hop::desc_sw128(sQ + s * C::T_BYTES, BM * 128, 1024);
        const uint64_t dDOn = hop::desc_sw128(sDO + s * C::T_BYTES, BM * 128, 1024);
        // both warpgroups' dQ of the previous step has read sDS (each waited for its own)
        hop::bar_sync(NB_DSE, 256);
        SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 1);)
        // an empty own half skips S, P, dV, dP, dS and dK (its dS rows are left out of dQ below)
        if (my) {
            float st[32], dpt[32];
            uint32_t pa[4][4], da[4][4];
            hop::mbar_wait(full + s, (it / ST) & 1);
            SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 2);)

            // S^T = K Q^T (64 keys x 64 queries).  dP^T follows once P^T is formed: S^T, dP^T and the
            // dK / dV accumulators together do not fit in registers at D = 128 (ptxas serialises the
            // wgmmas and spills S^T, measured with -Xptxas -v)
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < DP / 16; kk++) hop::elt<T>::template ss64<0, 0>(st, kmaj(dK, BN, kk), kmaj(dQk, BM, kk), kk > 0);
            hop::wgmma_commit();
            hop::mbar_wait(fullLD + s, (it / ST) & 1);
            const float *L = sLD + s * 2 * BM, *Dl = L + BM;  // per query column of the tile
            hop::wgmma_wait<0>();
            hop::reg_fence(st);
            SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 3);)

            // P^T = exp2(S^T scale_log2 - LSE2); partial halves: the token mask bits of the step
            // (keys past Skv and queries past Sq are 0 there; a full half needs no test: rows past Sq
            // have LSE2 = +inf and keys past Skv read as zero rows, never written)
            if (part) {
                const uint64_t *mbits = sMB + s * BM * 2 + c;
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int col = 8 * j + 2 * q4 + h;  // query column of accumulators 4 j + 2 r + h
                        const uint64_t w = mbits[2 * col] >> kr;
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const int x = 4 * j + 2 * r + h;  // row kr + 8 r
                            st[x] = (w >> (8 * r)) & 1 ? bsa_exp2(st[x] * sl2 - L[col]) : 0.f;
                        }
                    }
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int col = 8 * j + 2 * q4 + h;
#pragma unroll
                        for (int r = 0; r < 2; r++) st[4 * j + 2 * r + h] = bsa_exp2(st[4 * j + 2 * r + h] * sl2 - L[col]);
                    }
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                pa[kk][0] = hop::elt<T>::pack(st[8 * kk], st[8 * kk + 1]);
                pa[kk][1] = hop::elt<T>::pack(st[8 * kk + 2], st[8 * kk + 3]);
                pa[kk][2] = hop::elt<T>::pack(st[8 * kk + 4], st[8 * kk + 5]);
                pa[kk][3] = hop::elt<T>::pack(st[8 * kk + 6], st[8 * kk + 7]);
            }
            SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 4);)
            // dP^T = V dO^T, then dV += P^T dO (A from registers, B MN-major: 16 query rows per
            // k-step), still in flight while dS^T is formed
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < DP / 16; kk++) hop::elt<T>::template ss64<0, 0>(dpt, kmaj(dV, BN, kk), kmaj(dDOk, BM, kk), kk > 0);
            hop::wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                if constexpr (DP == 128) hop::elt<T>::template rs128<1>(dv, pa[kk], hop::desc_add(dDOn, kk * 2048), 1);
                else hop::elt<T>::template rs64<1>(dv, pa[kk], hop::desc_add(dDOn, kk * 2048), 1);
            }
            hop::wgmma_commit();
            hop::wgmma_wait<1>();  // dP^T (dV may still run)
            hop::reg_fence(dpt);
            SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 5);)
            // dS^T = P^T (dP^T - Delta) with P^T as packed (its rounding is of the order of dS^T's own,
            // which the dK / dQ GEMMs see anyway)
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    const float2 pp = hop::elt<T>::unpack(pa[kk][w]);
                    const int x = 8 * kk + 2 * w, col = 16 * kk + 8 * (w >> 1) + 2 * q4;
                    da[kk][w] = hop::elt<T>::pack(pp.x * (dpt[x] - Dl[col]), pp.y * (dpt[x + 1] - Dl[col + 1]));
                }
            SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 6);)
            // dK += dS^T Q
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                if constexpr (DP == 128) hop::elt<T>::template rs128<1>(dk, da[kk], hop::desc_add(dQn, kk * 2048), 1);
                else hop::elt<T>::template rs64<1>(dk, da[kk], hop::desc_add(dQn, kk * 2048), 1);
            }
            hop::wgmma_commit();
            // dS to shared memory, transposed back to [64 queries][64 keys] in this consumer's box
            // (K-major A of dQ = dS K, 128-byte swizzle), while dV / dK run (the previous step's dQ
            // has read it: barrier NB_DSE at the top of the step).  da[kk][w] is the 8 x 8 block of
            // keys 16 warp + 8 (w & 1) .. and queries 8 (2 kk + (w >> 1)) ..; lane i addresses row
            // i % 8 of block i / 8 (a query row, 16 bytes of keys)
            {
                const int m = lane >> 3, key_chunk = 2 * warp + (m & 1);
                const uint32_t box = hop::smem_u32(sDS) + c * (BM * 128);
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    const int q = 8 * (2 * kk + (m >> 1)) + (lane & 7);
                    hop::stmatrix_x4_trans(box + hop::sw128(q, key_chunk), da[kk][0], da[kk][1], da[kk][2], da[kk][3]);
                }
            }
            hop::fence_proxy_async();
        }

        SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 7);)
        // dV / dK done before dQ is issued: with all three in flight the accumulators do not fit
        // (ptxas serialises / spills at D = 128)
        hop::wgmma_wait<0>();
        hop::reg_fence(dk);
        hop::reg_fence(dv);
        hop::mbar_arrive(empty + s);  // Q and dO of this stage are no longer read (dQ reads dS and K)
        SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 8);)
        hop::bar_sync(NB_DS, 256);
        SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 9);)

        // dQ half c = dS K[:, 64 c .. 64 c + 63]: A = dS K-major (the two consumers' 64-key boxes), B
        // = K MN-major
        const bool has_dq = c < NH;
        float dq[32];
        if (has_dq) {
            const uint64_t dA0 = hop::desc_sw128(sDS, 16, 1024), dB = hop::desc_sw128(sK + c * BN * 128, 8192, 1024);
            // k-steps of 16 keys: 0-3 the first key half, 4-7 the second (an empty half is skipped)
            const int k0 = act0 ? 0 : 4, k1 = act1 ? 8 : 4;
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
                if (kk >= k0 && kk < k1)
                    hop::elt<T>::template ss64<0, 1>(dq, kmaj(dA0, BM, kk), hop::desc_add(dB, kk * 2048), kk > k0);
            hop::wgmma_commit();
        }
        hop::wgmma_wait<0>();
        hop::reg_fence(dk);
        hop::reg_fence(dv);
        if (has_dq) {
            SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 10);)
            hop::reg_fence(dq);
            // fp32 partial to shared memory (64 x 64, fragment order) once the writer's add of two steps
            // ago has read the buffer; the writer adds it
            const int buf = it & 1;
            hop::mbar_wait(dqempty + buf, ((it >> 1) & 1) ^ 1);
            SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 11);)
            // in fragment order (dq_frag_off): one conflict-free 16-byte store per thread and j
            float4 *sq = reinterpret_cast<float4 *>(sDQ + (buf * NH + c) * BM * 64);
#pragma unroll
            for (int j = 0; j < 8; j++) sq[(warp * 8 + j) * 32 + lane] = make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
            hop::fence_proxy_async();
            hop::mbar_arrive(dqfull + buf);
            SPATTN_TRACE(if (tid == 0) cta_trace::step_at(trs, c, it, 12);)
        }
    }
    SPATTN_TRACE(tr2 = cta_trace::now();)

    // a split row: chunk ck adds the sum of chunks 0 .. ck - 1 (fp32, in the order of the chunks)
    // to its own dK / dV; all but the last pass the sum on through sp.buf, the last stores
    if (nch > 1) {
        float4 *buf = reinterpret_cast<float4 *>(sp.buf + kslot * (2ll * BN * DP));
        // [tensor (dK, dV)][consumer][DP / 8 float4][thread]: 512-byte warp accesses
        const auto slot = [&](int w, int i) { return buf + ((w * 2 + c) * (DP / 8) + i) * 128 + tid; };
        if (ck > 0) {
            if (c == 0 && tid == 0) hop::spin_until_eq(sp.sem + row, ck);
            hop::bar_sync(NB_KV, 256);
#pragma unroll
            for (int i = 0; i < DP / 8; i++) {
                const float4 a = __ldcg(slot(0, i)), d = __ldcg(slot(1, i));
                dk[4 * i] = a.x + dk[4 * i];
                dk[4 * i + 1] = a.y + dk[4 * i + 1];
                dk[4 * i + 2] = a.z + dk[4 * i + 2];
                dk[4 * i + 3] = a.w + dk[4 * i + 3];
                dv[4 * i] = d.x + dv[4 * i];
                dv[4 * i + 1] = d.y + dv[4 * i + 1];
                dv[4 * i + 2] = d.z + dv[4 * i + 2];
                dv[4 * i + 3] = d.w + dv[4 * i + 3];
            }
        }
        if (ck < nch - 1) {
#pragma unroll
            for (int i = 0; i < DP / 8; i++) {
                __stcg(slot(0, i), make_float4(dk[4 * i], dk[4 * i + 1], dk[4 * i + 2], dk[4 * i + 3]));
                __stcg(slot(1, i), make_float4(dv[4 * i], dv[4 * i + 1], dv[4 * i + 2], dv[4 * i + 3]));
            }
            __threadfence();
            hop::bar_sync(NB_KV, 256);
            if (c == 0 && tid == 0) hop::release_inc(sp.sem + row);
            return;
        }
    }

    // dK (scaled) and dV of this thread's rows, once (VL: the first key row read again here, not
    // kept live through the loop)
    const float sc = p.scale;
    if constexpr (PG) {  // fp32 scratch rows b * Skv + key (p.dk / p.dv: [Skv rows per sequence][Nkv][D])
        k0 = (long long)b * p.Skv;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int key = key0 + 8 * r;
            if (key >= Skv()) continue;
            float *dkr = reinterpret_cast<float *>(p.dk.p) + (long long)hk * p.dk.s1 + (k0 + key) * p.dk.s2;
            float *dvr = reinterpret_cast<float *>(p.dv.p) + (long long)hk * p.dv.s1 + (k0 + key) * p.dv.s2;
#pragma unroll
            for (int j = 0; j < DP / 8; j++) {
                const int col = 8 * j + 2 * q4;  // D % 8 == 0: col + 1 < D too, 8-byte aligned
                if (col >= p.D) continue;
                *reinterpret_cast<float2 *>(dkr + col) = make_float2(dk[4 * j + 2 * r] * sc, dk[4 * j + 2 * r + 1] * sc);
                *reinterpret_cast<float2 *>(dvr + col) = make_float2(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
            }
        }
        return;
    }
    if (kv_tma) {
        // dK / dV through the K / V tiles in shared memory (128-byte swizzled, this consumer's 64
        // rows of each 64-column box) and TMA stores: the per-element stores were 8 sectors per
        // warp instruction (the forward's epilogue measured ~2.3 us per CTA that way).  K is read
        // by both consumers' dQ GEMMs (box c by consumer c): both done first; V rows are private.
        hop::bar_sync(NB_KV, 256);
        unsigned char *kb = sK + c * 64 * 128, *vb = sV + c * 64 * 128;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = kr + 8 * r;
#pragma unroll
            for (int j = 0; j < DP / 8; j++) {
                const int off = (j >> 3) * BN * 128 + hop::sw128(row, j & 7) + 4 * q4;
                *reinterpret_cast<uint32_t *>(kb + off) = bsa_t<T>::pack(dk[4 * j + 2 * r] * sc, dk[4 * j + 2 * r + 1] * sc);
                *reinterpret_cast<uint32_t *>(vb + off) = bsa_t<T>::pack(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
            }
        }
        hop::fence_proxy_async();
        hop::bar_sync(NB_ST + c, 128);
        if (tid == 0) {
            if constexpr (VL) {  // the sequence's maps (rows = its keys: the stores clip at its end)
                bwd_tmap_acquire(mdk);
                bwd_tmap_acquire(mdv);
            }
#pragma unroll
            for (int x = 0; x < NBOX; x++) {
                hop::tma_store_4d(mdk, kb + x * BN * 128, x * 64, nt * BN + c * 64, hk, bt);
                hop::tma_store_4d(mdv, vb + x * BN * 128, x * 64, nt * BN + c * 64, hk, bt);
            }
            hop::bulk_commit();
            SPATTN_TRACE(if (c == 0 && cta_trace::g_rec) cta_trace::g_rec[cta_trace::block()] =
                             cta_trace::Rec{{tr0, tr1, tr2, cta_trace::now()}, cnt, cta_trace::smid()};)
            hop::bulk_wait_read();  // shared memory is read before the CTA exits
        }
        return;
    }
    if constexpr (VL) k0 = p.vl.seq[b].z;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key >= Skv()) continue;
        T *dkr = reinterpret_cast<T *>(p.dk.p) + (long long)bt * p.dk.s0 + (long long)hk * p.dk.s1 + (k0 + key) * p.dk.s2;
        T *dvr = reinterpret_cast<T *>(p.dv.p) + (long long)bt * p.dv.s0 + (long long)hk * p.dv.s1 + (k0 + key) * p.dv.s2;
        // contiguous, even D, 4-byte aligned rows (the usual case): one 4-byte store per pair
        if (p.dk.s3 == 1 && p.dv.s3 == 1 && !(p.D & 1) && !((reinterpret_cast<uintptr_t>(dkr) | reinterpret_cast<uintptr_t>(dvr)) & 3)) {
#pragma unroll
            for (int j = 0; j < DP / 8; j++) {
                const int col = 8 * j + 2 * q4;
                if (col >= p.D) continue;
                *reinterpret_cast<uint32_t *>(dkr + col) = bsa_t<T>::pack(dk[4 * j + 2 * r] * sc, dk[4 * j + 2 * r + 1] * sc);
                *reinterpret_cast<uint32_t *>(dvr + col) = bsa_t<T>::pack(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
            }
            continue;
        }
#pragma unroll
        for (int j = 0; j < DP / 8; j++) {
            const int col = 8 * j + 2 * q4;
            if (col >= p.D) continue;
            const T k0 = bsa_t<T>::fromf(dk[4 * j + 2 * r] * sc), k1 = bsa_t<T>::fromf(dk[4 * j + 2 * r + 1] * sc);
            const T v0 = bsa_t<T>::fromf(dv[4 * j + 2 * r]), v1 = bsa_t<T>::fromf(dv[4 * j + 2 * r + 1]);
            dkr[(long long)col * p.dk.s3] = k0;
            dvr[(long long)col * p.dv.s3] = v0;
            if (col + 1 < p.D) {
                dkr[(long long)(col + 1) * p.dk.s3] = k1;
                dvr[(long long)(col + 1) * p.dv.s3] = v1;
            }
        }
    }
}

// Row r, columns [c, c + 8) of a 64 x 64 accumulator half (c a multiple of 8), scaled, to 8
// elements of the dq row `dst` (columns c + k < D; stride s3): four float2 at dq_frag_off(r, c +
// 2 k), one 16-byte store when the row is contiguous and aligned.  none: no key tile reaches the
// query tile (its accumulator was never written: det does not zero it), the row is 0.
template <typename T>
__device__ __forceinline__ void dq_store8(const float *half, int r, int c, float scale, T *dst, long long s3, int D, bool none) {
    const float *src = half + dq_frag_off(r, c);
    float v[8];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 x = none ? make_float2(0.f, 0.f) : *reinterpret_cast<const float2 *>(src + 4 * k);
        v[2 * k] = x.x * scale;
        v[2 * k + 1] = x.y * scale;
    }
    bsa_store8<T>(dst + (long long)c * s3, s3, v, min(8, D - c));
}

// dq[b, n, i, :] = scale * accumulator (layout [B*N][nqt][NH][64 x 64 in fragment order]).  A CTA
// converts one 64 x 64 half of a query tile at a time (grid-stride over the B N nqt NH halves):
// its 16 KB read as consecutive float4 (float4 q of the fragment order holds rows 16 (q / 256) +
// (q % 32) / 4 and + 8, columns 8 ((q / 32) % 8) + 2 (q % 4) and + 1), scaled, converted, staged
// as [64 rows][64 columns] of T in rows of 144 bytes (the staging stores hit 32 distinct banks),
// then stored as 16-byte row chunks.  The thread-per-8-columns form before it (four float2 reads
// through dq_frag_off, 4096 CTAs on bsa17) took 21.7 us for 50 MB on bsa17 (ncu, H200).
template <int DP, typename T>
__global__ void __launch_bounds__(256) bsa_dq_post_kernel(const bsa_params p, const float *acc, const int *ready) {
    constexpr int NH = DP / 64, RB = 144;
    __shared__ __align__(16) unsigned char stg[BM * RB];
    // Launched as the backward kernel's programmatic dependent, this kernel starts once every
    // backward CTA has started and takes SMs as the backward's CTAs leave them.  No
    // griddepcontrol.wait: a query tile is converted once all its adds have landed (ready[tile]
    // = its count of key tiles: the deterministic order semaphore, or the non-deterministic
    // landed count; released by the writers), so the tiles finished early are converted during
    // the backward's tail instead of after it (deterministic 0.964-0.966x the time, public suite,
    // H200; the non-deterministic mode gains with the two writer warps: runbook).  No deadlock:
    // every backward CTA is resident or done before any of these CTAs exists.
    const int t = threadIdx.x;
    const long long units = (long long)p.B * p.N * p.nqt * NH;
    for (long long u = blockIdx.x; u < units; u += gridDim.x) {
        const long long tile = u / NH;
        const int h = (int)(u - tile * NH);
        if (h * 64 >= p.D) continue;  // CTA-uniform
        // no key tile reaches the query tile: its accumulator was never written (det does not zero it)
        const int qc = p.sq.cnt[tile];
        const bool none = qc == 0;
        if (!none) {
            if (t == 0) hop::spin_until_ge(ready + tile, qc);  // acquire: the adds' sums are visible
            __syncthreads();
        }
        const float4 *src = reinterpret_cast<const float4 *>(acc + (tile * NH + h) * (BM * 64));
        float4 x[4];
#pragma unroll
        for (int k = 0; k < 4; k++) x[k] = none ? make_float4(0.f, 0.f, 0.f, 0.f) : __ldcg(src + t + 256 * k);
        __syncthreads();  // the previous unit's staging is read
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int q = t + 256 * k, j32 = q >> 5, ln = q & 31;
            const int r = 16 * (j32 >> 3) + (ln >> 2), c = 8 * (j32 & 7) + 2 * (ln & 3);
            *reinterpret_cast<uint32_t *>(stg + r * RB + c * 2) = bsa_t<T>::pack(x[k].x * p.scale, x[k].y * p.scale);
            *reinterpret_cast<uint32_t *>(stg + (r + 8) * RB + c * 2) = bsa_t<T>::pack(x[k].z * p.scale, x[k].w * p.scale);
        }
        __syncthreads();
        // 32-bit divisions where the counts allow (a 64-bit one is ~100 instructions per thread)
        int m, b, n;
        if (units < (1LL << 31)) {
            const unsigned ub = (unsigned)tile / (unsigned)p.nqt;
            m = (int)((unsigned)tile - ub * (unsigned)p.nqt);
            b = (int)(ub / (unsigned)p.N);
            n = (int)(ub - (unsigned)b * (unsigned)p.N);
        } else {
            const long long bn = tile / p.nqt;
            m = (int)(tile - bn * p.nqt);
            b = (int)(bn / p.N);
            n = (int)(bn - (long long)b * p.N);
        }
        T *dqb = reinterpret_cast<T *>(p.dq.p) + (long long)b * p.dq.s0 + (long long)n * p.dq.s1;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int y = t + 256 * k, r = y >> 3, ch = y & 7, i = m * BM + r, col = h * 64 + ch * 8;
            if (i >= p.Sq || col >= p.D) continue;
            T *dst = dqb + (long long)i * p.dq.s2 + (long long)col * p.dq.s3;
            const unsigned char *sv = stg + r * RB + ch * 16;
            if (p.dq.vec && col + 8 <= p.D) {
                *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(sv);
            } else {
                const T *e = reinterpret_cast<const T *>(sv);
                for (int z = 0; z < 8 && col + z < p.D; z++) dst[(long long)z * p.dq.s3] = e[z];
            }
        }
    }
}

// VL: dq[0, n, t, :] = scale * accumulator for packed tokens t < cu_q[B] (sequence b of t by a
// binary search over seq: the last b with seq[b].x <= t), then dK / dV rows [cu_kv[B], Tkv) = 0.
// Nothing when the prefix sums are bad.  PG (paged): dQ only (bsa_pages.cu writes every page row).
template <int DP, typename T, bool PG = false> __global__ void bsa_vl_post_kernel(const bsa_params p, const float *acc) {
    constexpr int NH = DP / 64, CPR = DP / 8;
    hop::griddep_wait();  // the backward kernel's adds (launched as its programmatic dependent)
    if (*p.vl.err != ~0ull) return;
    const int4 last = p.vl.seq[p.B - 1];
    const long long tq = (long long)last.x + last.y, tk = (long long)last.z + last.w;
    const long long nk = (p.vl.Tkv - tk) * p.Nkv * p.D;
    const long long step = (long long)gridDim.x * blockDim.x;
    const int g = threadIdx.x % CPR, c = (g * 8) & 63, h = g >> 3;
    const long long rows = tq * p.N, rstep = (long long)gridDim.x * (blockDim.x / CPR);
    if (g * 8 < p.D)
        for (long long x = blockIdx.x * (long long)(blockDim.x / CPR) + threadIdx.x / CPR; x < rows; x += rstep) {
            const long long t = x / p.N;
            const int n = (int)(x - t * p.N);
            int lo = 0, hi = p.B - 1;  // last b with seq[b].x <= t (seq[0].x = 0)
            while (lo < hi) {
                const int mid = (lo + hi + 1) >> 1;
                if (p.vl.seq[mid].x <= t) lo = mid;
                else hi = mid - 1;
            }
            const long long q0 = p.vl.seq[lo].x, i = t - q0;  // i < Sq_lo: t < cu_q[lo + 1]
            const long long at = (long long)n * p.vl.ntile + bsa_vl_qtile(q0, lo, (int)(i / BM));
            T *dst = reinterpret_cast<T *>(p.dq.p) + (long long)n * p.dq.s1 + t * p.dq.s2;
            const long long tile = ((long long)lo * p.N + n) * p.nqt + i / BM;  // the q-major list row
            dq_store8<T>(acc + (at * NH + h) * (BM * 64), (int)(i % BM), c, p.scale, dst + (long long)h * 64 * p.dq.s3, p.dq.s3,
                         p.D - h * 64, p.sq.cnt[tile] == 0);
        }
    if constexpr (!PG)
        for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < nk; x += step) {
            const int d = (int)(x % p.D);
            const long long tn = x / p.D, t = tk + tn / p.Nkv;
            const int h = (int)(tn % p.Nkv);
            reinterpret_cast<T *>(p.dk.p)[(long long)h * p.dk.s1 + t * p.dk.s2 + (long long)d * p.dk.s3] = bsa_t<T>::fromf(0.f);
            reinterpret_cast<T *>(p.dv.p)[(long long)h * p.dv.s1 + t * p.dv.s2 + (long long)d * p.dv.s3] = bsa_t<T>::fromf(0.f);
        }
}

template <int DP, typename T, bool VL, bool PG>
cudaError_t launch(const bsa_params &p, const bsa_bwd_tmaps &tm, float *dqacc, int *sem, int *lnd, int det,
                   const bsa_split &sp, cudaStream_t st) {
    using C = BwdCfg<DP>;
    static unsigned long long done = 0;
    cudaError_t e = hop::set_smem(bsa_bwd90_kernel<DP, T, VL, PG>, C::SMEM, &done);
    if (e != cudaSuccess) return e;
    const long long ctas = (long long)p.B * p.Nkv * ((p.Skv + BN - 1) / BN) * sp.splits;
    // programmatic dependent launches: this kernel after the Delta kernel, the postprocess after
    // this one (measured on the H200: 0.985x the time deterministic, 0.983x non-deterministic;
    // short backwards gain most, bsa01 0.95x)
    SPATTN_TRACE(cta_trace::Rec *trace = cta_trace::begin(ctas, st); unsigned *steps = cta_trace::step_begin(ctas, st);)
    e = hop::launch_pdl(bsa_bwd90_kernel<DP, T, VL, PG>, dim3((unsigned)ctas), dim3(384), C::SMEM, st, p, tm.q, tm.dout,
                        tm.k, tm.v, tm.dk, tm.dv, PG ? 0 : tm.kv_tma, dqacc, sem, lnd, det, sp);
    SPATTN_TRACE(cta_trace::end(trace, ctas, st); cta_trace::step_end(steps, ctas, st);)
    if (e != cudaSuccess) return e;
    const long long total = VL ? (long long)p.N * p.vl.Tq * p.D + (long long)p.Nkv * p.vl.Tkv * p.D
                               : (long long)p.B * p.N * p.Sq * p.D;
    const long long blocks = (total + 2047) / 2048;  // 8 columns per thread (grid-stride loops)
    const unsigned grid = (unsigned)(blocks < 65536 ? (blocks < 1 ? 1 : blocks) : 65536);
    if constexpr (VL) {
        return hop::launch_pdl(bsa_vl_post_kernel<DP, T, PG>, dim3(grid), dim3(256), 0, st, p, dqacc);
    } else {  // a half tile per CTA and pass, at most 8 CTAs per SM (grid-stride)
        const long long units = (long long)p.B * p.N * p.nqt * (DP / 64);
        // per query tile the count of landed adds: the order semaphore, or lnd (non-deterministic)
        const int *ready = det ? sem : lnd;
        return hop::launch_pdl(bsa_dq_post_kernel<DP, T>, dim3(hop::grid_cap(units, 8)), dim3(256), 0, st, p, dqacc, ready);
    }
}

template <bool VL, bool PG = false>
cudaError_t launch_dt(const bsa_params &p, const bsa_bwd_tmaps &tm, int dp, int bf16, float *dqacc, int *sem, int *lnd, int det,
                      const bsa_split &sp, cudaStream_t st) {
    if (dp == 64)
        return bf16 ? launch<64, __nv_bfloat16, VL, PG>(p, tm, dqacc, sem, lnd, det, sp, st)
                    : launch<64, __half, VL, PG>(p, tm, dqacc, sem, lnd, det, sp, st);
    return bf16 ? launch<128, __nv_bfloat16, VL, PG>(p, tm, dqacc, sem, lnd, det, sp, st)
                : launch<128, __half, VL, PG>(p, tm, dqacc, sem, lnd, det, sp, st);
}

}  // namespace

// tiles of the dQ accumulator: dense B * N * ceil(Sq / 64); varlen N * vl.ntile
static long long acc_tiles(const bsa_params *p) {
    if (p->vl.seq) return (long long)p->N * p->vl.ntile;
    return (long long)p->B * p->N * ((p->Sq + BM - 1) / BM);
}
extern "C" size_t spattn_bsa_bwd90_acc_bytes(const bsa_params *p, int dp) {
    return (size_t)acc_tiles(p) * BM * dp * 4;
}
static long long key_rows(const bsa_params *p) { return (long long)p->B * p->Nkv * ((p->Skv + BN - 1) / BN); }
extern "C" size_t spattn_bsa_bwd90_sem_bytes(const bsa_params *p, int dp) {
    (void)dp;
    return (size_t)bsa_bwd90_sem_bytes(acc_tiles(p), key_rows(p));
}

extern "C" cudaError_t spattn_bsa_launch_bwd90(const bsa_params *p, const bsa_bwd_tmaps *tm, int dp, int bf16, float *dqacc,
                                               int *sem, const int *planned_slot, float *kvbuf, int det, cudaStream_t st) {
    bsa_split sp;
    sp.splits = bsa_bwd90_splits(p->G, p->nqt);
    sp.chunk = bsa_bwd90_chunk(p->G, p->nqt);
    sp.buf = kvbuf;
    sp.sem = sem + acc_tiles(p);
    int *slot = sp.sem + key_rows(p);
    sp.slot = planned_slot ? planned_slot : slot;
    if (sp.splits > 1 && !planned_slot) {
        const cudaError_t e = spattn_bsa_launch_split_slots(p->sk.cnt, key_rows(p), (p->Skv + BN - 1) / BN, sp.chunk,
                                                            (int)bsa_bwd90_split_slots(p->G, p->nqt, key_rows(p), dp),
                                                            slot, st);
        if (e != cudaSuccess) return e;
    }
    int *lnd = slot + key_rows(p);  // per accumulator tile: landed adds (non-deterministic, dense)
    if (!p->vl.seq) return launch_dt<false>(*p, *tm, dp, bf16, dqacc, sem, lnd, det, sp, st);
    return p->vl.table ? launch_dt<true, true>(*p, *tm, dp, bf16, dqacc, sem, lnd, det, sp, st)
                       : launch_dt<true>(*p, *tm, dp, bf16, dqacc, sem, lnd, det, sp, st);
}
