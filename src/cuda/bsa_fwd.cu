// Block-sparse attention forward for Hopper (sm_90a), FlashAttention-3 style:
//   - a schedule row = (query tile of 128 rows, head, batch); 3 warpgroups: warpgroup 0 is the
//     producer (one warp: lane 0 loads Q, lane g < BN / U the tile's chunk g; registers lowered
//     with setmaxnreg), warpgroups 1 and 2 are consumers, 64 query rows each (registers raised);
//   - Q (128 x DP) is loaded once by TMA; K and V tiles (BN x DP) stream through a STAGES-deep
//     ring of shared-memory buffers completed on mbarriers (full: TMA bytes landed; empty: all
//     256 consumer threads are done with it);
//   - a K/V tile is packed from BN / U key chunks of U keys (U = 16..128, bsa_fwd90_chunk: the
//     largest that divides the mask's block width): the CTA's schedule (bsa_sched.cu, at chunk
//     width U) lists the chunks its query tile attends, each full or partial, and consecutive
//     groups of BN / U of them form the tiles, so fine masks never pay for whole 128 x 128
//     tiles of mostly masked blocks; the last tile is padded with a repeated, masked chunk;
//   - S = Q K^T is a wgmma with both operands in shared memory (K-major, 128-byte swizzle),
//     O += P V a wgmma with P from registers and V read MN-major from shared memory;
//   - the softmax of tile j overlaps the P V product of tile j - 1: S_j is issued, then
//     P_{j-1} V_{j-1}; the consumer waits for S_j only, runs the softmax while P V runs, then
//     waits for P V before rescaling O;
//   - only partial tiles evaluate the token mask, from the block mask bits (mask[i/bx][j/by]);
//     keys past Skv are masked there too (edge tiles are always partial); the mask is turned
//     into bits while the tile's S GEMM runs (tile_bits) and applied after it;
//   - the epilogue writes each consumer's normalised 64 rows of O into its own Q rows (swizzled)
//     and TMA-stores them (O views TMA can write; VL: through the sequence's own map, whose row
//     count clips the stores at its end; else per-element stores);
//   - persistent: one CTA per SM; each takes its first schedule row by its index and the next
//     ones, in the heaviest-first launch order, from a row counter in global memory (a static
//     split was 1.2-1.4x slower on bigbird masks, whose few heavy rows it cannot balance); Q is
//     double-buffered and the K / V ring runs across rows, so the producer loads the next row's
//     Q and first tiles while the consumers finish this row's last tiles and epilogue (a row's
//     prologue and the CTA switch were ~3.7 us of ~34 per causal S 4096 row when each row was a
//     CTA);
//   - VL (packed variable-length batch, spattn_bsa_fwd_varlen): a CTA is (sequence b, head,
//     query tile) with b's own Sq / Skv in every edge test, TMA maps whose base is b's first row
//     and whose row count is its length (rows past its end read as 0, as past S in a dense
//     call), O / LSE rows offset by b's first query row, and the mask at batch index b.  Only
//     the per-CTA setup and the edge bounds differ; the dense instantiations are unchanged;
//   - PG (paged K / V, VL only): K / V chunks are loaded per page, in slabs of R = 2^lr rows
//     (8 <= R <= U, R divides page_size, so a slab never crosses a page): slab at sequence-local
//     key j0 -> page table[b, j0 / page_size], rows j0 % page_size.., through the pool's map (D,
//     Nkv, page_size, num_pages); each slab lands at its rows of the 128-byte-swizzled tile
//     (R * 128 contiguous bytes per 64-column box, R a multiple of the 8-row swizzle atom), so
//     the consumers see the layout of one U-row box.  Rows past Skv read as 0, as in the packed
//     path: the sequence's last page goes through its own copy of the map whose page has only
//     the rows up to Skv (written by the prep kernel; TMA zero-fills the rest), and a slab that
//     starts at or past Skv reads rows page_size.. (outside every page: all zero) without
//     touching the table.  So no row a sequence does not own (NaN in the tests) reaches a
//     product, not even as 0 * v, and no table slot past the sequence's pages is read.
// The online softmax runs in base 2 with fp32 accumulation; rows that attend nothing get O = 0
// and LSE = -inf.  Non-finite inputs follow spattn.h: a NaN (or +inf) score makes the row sum
// NaN, hence O (NaN * 0) and LSE NaN; the running max ignores NaN (fmaxf), which is harmless
// because every exp2 of a NaN score is NaN anyway.
#include <math.h>
#include <stdlib.h>

#include "bsa_common.cuh"
#include "bsa_launch.h"
#include "bsa_paged.cuh"
#include "hopper/hopper.cuh"

namespace {

// Makes a TMA map written in global memory by an earlier kernel (the varlen prep kernel, through
// the generic proxy) visible to this thread's TMA loads (the tensormap proxy).
__device__ __forceinline__ void tmap_acquire(const CUtensorMap *m) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(m))
                 : "memory");
}

template <int DP> struct FwdCfg {
    static constexpr bsa_fwd90_tile TL = bsa_fwd90_tile_for(DP);
    static constexpr int BM = TL.bm, BN = TL.bn, ST = TL.stages;
    static constexpr int NBOX = DP / 64;                     // 64-column TMA boxes per row
    static constexpr int Q_BYTES = BM * DP * 2, KV_BYTES = BN * DP * 2;
    // Q double-buffered (the next row's Q lands while this row runs), K and V rings
    static constexpr int OFF_K = 2 * Q_BYTES, OFF_V = OFF_K + ST * KV_BYTES, OFF_BAR = OFF_V + ST * KV_BYTES;
    static constexpr int SMEM = OFF_BAR + (4 + 4 * ST) * 8 + 16 + 1024;  // + rows posted, alignment slack
};

template <int DP, typename T, bool VL, bool PG = false>
__global__ void __launch_bounds__(384, 1)
    bsa_fwd90_kernel(const bsa_params p, const __grid_constant__ CUtensorMap tmq,
                     const __grid_constant__ CUtensorMap tmk, const __grid_constant__ CUtensorMap tmv,
                     const __grid_constant__ CUtensorMap tmo, const int flags, const int lu, const int rows, int *ctr) {
    // flags: bit 0 O by TMA stores (tmo); bit 1 the last CTA to finish sets ctr[0..1] back to 0
    // (ctr[1] counts finished CTAs).  ctr[0]: the row counter, 0 at launch
    const bool o_tma = flags & 1, reset = flags & 2;
    using C = FwdCfg<DP>;
    static_assert(VL || !PG, "paged K / V come with a varlen batch only");
    constexpr int BM = C::BM, BN = C::BN, ST = C::ST, NBOX = C::NBOX;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = hop::align1024(smem_raw);
    unsigned char *sQ = sm, *sK = sm + C::OFF_K, *sV = sm + C::OFF_V;
    uint64_t *barQ = reinterpret_cast<uint64_t *>(sm + C::OFF_BAR);  // [2]: Q buffer landed
    uint64_t *qempty = barQ + 2;                                        // [2]: Q buffer free again
    uint64_t *fullK = qempty + 2, *fullV = fullK + ST, *emptyK = fullV + ST, *emptyV = emptyK + ST;
    int2 *posted = reinterpret_cast<int2 *>(emptyV + ST);  // [2]: {row id or -1 (no more), count} per Q buffer
    if constexpr (VL) {
        if (*p.vl.err != ~0ull) return;  // bad prefix sums / table: nothing is written (the host reports it)
    }

    const int nqt = (p.Sq + BM - 1) / BM;
    const int U = 1 << lu, G = BN >> lu;  // chunks per tile
    static_assert(BN == 128, "tiles of 128 keys (G = 128 / U)");
    const int wg = threadIdx.x >> 7, tid = threadIdx.x & 127;
    // Persistent CTAs: CTA c runs launch-order position c (p.sq.order, heaviest first), then
    // positions gridDim.x + t for the tickets t it draws from *ctr, until one is past the rows
    // (rows < 2^31, checked by the host).  The producer draws them and posts each row with its Q
    // buffer (posted[]); the consumers follow.  A row's Q, K and V buffers are loaded while the
    // previous row's last tiles and epilogue run (one CTA per SM: that row's prologue was ~3 us
    // of ~34 per causal S 4096 row)
    // the schedule row at position j: (b, n, query tile m); VL: false when the tile lies past
    // its sequence's queries (nothing to do), else the sequence's lengths and maps
    struct Item {
        long long q0;
        int row_id, m, n, b, bt, vSq, vSkv;
        const CUtensorMap *mq, *mk, *mv, *mo;
    };
    const auto item = [&](int row_id, Item &w) {
        w.row_id = row_id;
        w.m = w.row_id % nqt;
        w.n = (w.row_id / nqt) % p.N;
        w.b = w.row_id / nqt / p.N;
        w.bt = w.b;
        w.q0 = 0;
        w.vSq = w.vSkv = 0;
        w.mq = &tmq;
        w.mk = &tmk;
        w.mv = &tmv;
        w.mo = &tmo;
        if constexpr (VL) {
            const int4 sq = p.vl.seq[w.b];
            if (w.m * BM >= sq.y) return false;  // a tile past the sequence's queries
            w.q0 = sq.x;
            w.vSq = sq.y;
            w.vSkv = sq.w;
            w.bt = 0;
            w.mq = static_cast<const CUtensorMap *>(p.vl.tm) + (o_tma ? 4 : 3) * w.b;  // q, k, v (, o)
            w.mk = w.mq + 1;
            w.mv = w.mq + 2;
            w.mo = w.mq + 3;
        }
        return true;
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; s++) {
            hop::mbar_init(barQ + s, 1);
            hop::mbar_init(qempty + s, 2);  // one arrival per consumer warpgroup
        }
        for (int s = 0; s < ST; s++) {
            hop::mbar_init(fullK + s, 1);
            hop::mbar_init(fullV + s, 1);
            hop::mbar_init(emptyK + s, 256);
            hop::mbar_init(emptyV + s, 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // ---------------------------------------------------------------- producer
        hop::setmaxnreg_dec<24>();
        // warp 0; lane gi < G loads the list entry of the tile's chunk gi and issues its copies (the
        // G dependent list loads of one thread were serial; G = 128 / U <= 8).  Q first, before the
        // list count is known (an empty row still loads it: its consumers wait for it and then
        // release the buffer like any other)
        if (tid >= 32) return;
        const int gi = tid;
        if (gi == 0 && !VL) {
            hop::tma_prefetch_desc(&tmq);
            hop::tma_prefetch_desc(&tmk);
            hop::tma_prefetch_desc(&tmv);
        }
        int gt = 0, kq = 0;  // tiles and rows (Q buffer uses) so far
        for (int k = 0;; k++) {
            int j = blockIdx.x;  // the first row by CTA index, then from the counter
            if (k > 0) {
                if (gi == 0) j = (int)gridDim.x + atomicAdd(ctr, 1);
                j = __shfl_sync(0xffffffffu, j, 0);
            }
            if (j >= rows) {  // no more rows: post -1 on the next Q buffer (no bytes: a plain arrival)
                if (gi == 0) {
                    const int qb = kq & 1;
                    hop::mbar_wait(qempty + qb, ((kq >> 1) & 1) ^ 1);
                    posted[qb] = make_int2(-1, 0);
                    hop::mbar_arrive(barQ + qb);
                    if (reset) {  // the last CTA to finish: the counter back to 0 for the next launch
                        __threadfence();
                        if (atomicAdd(ctr + 1, 1) == (int)gridDim.x - 1) {
                            atomicExch(ctr, 0);
                            atomicExch(ctr + 1, 0);
                        }
                    }
                }
                break;
            }
            Item w;
            if (!item(p.sq.order ? p.sq.order[j] : j, w)) continue;
            const int cnt = p.sq.cnt[w.row_id];  // attended key chunks of U = 2^lu keys
            const int2 *lst = reinterpret_cast<const int2 *>(p.sq.list) + (long long)w.row_id * p.sq.stride;
            const int ntiles = (cnt + G - 1) >> (7 - lu);
            const int hk = w.n / p.G;
            // tile 0's entries are loaded together with the count, not after it (one dependent
            // first-touch load less per row): the row holds stride >= 1 entries, lane gi < G reads
            // entry min(gi, stride - 1) and the padding is resolved by a shuffle once cnt is known
            const int first = gi < G && p.sq.stride > 0 ? lst[min(gi, p.sq.stride - 1)].x : 0;
            const int qb = kq & 1;
            if (gi == 0) {
                if constexpr (VL) {  // maps written by the prep kernel: acquire before the first TMA
                    tmap_acquire(w.mq);
                    tmap_acquire(w.mk);
                    tmap_acquire(w.mv);
                    hop::tma_prefetch_desc(w.mq);
                    hop::tma_prefetch_desc(w.mk);
                    hop::tma_prefetch_desc(w.mv);
                    if constexpr (PG) {
                        hop::tma_prefetch_desc(&tmk);
                        hop::tma_prefetch_desc(&tmv);
                    }
                }
                hop::mbar_wait(qempty + qb, ((kq >> 1) & 1) ^ 1);  // the row two back released it
                posted[qb] = make_int2(w.row_id, cnt);  // read by the consumers after their wait on barQ
                hop::mbar_expect_tx(barQ + qb, C::Q_BYTES);
#pragma unroll
                for (int x = 0; x < NBOX; x++)
                    hop::tma_load_4d(sQ + qb * C::Q_BYTES + x * BM * 128, w.mq, x * 64, w.m * BM, w.n, w.bt, barQ + qb);
            }
            for (int it = 0; it < ntiles; it++) {
                const int s = (gt + it) % ST;
                const uint32_t par = (((gt + it) / ST) & 1) ^ 1;
                // padding slots repeat the last chunk (masked)
                const int ex = it == 0 ? __shfl_sync(0xffffffffu, first, min(gi, cnt - 1))
                                       : (gi < G ? lst[min(it * G + gi, cnt - 1)].x : 0);
                const int key = (ex >> 1) << lu;
                hop::mbar_wait(emptyK + s, par);
                if (gi == 0) hop::mbar_expect_tx(fullK + s, C::KV_BYTES);
                __syncwarp();
                if (gi < G) {
                    if constexpr (PG) {
                        bsa_load_paged<NBOX, BN>(sK + s * C::KV_BYTES + gi * U * 128, &tmk, w.mk, key, U, p.vl.lr, hk,
                                                 p.vl.table + w.b * p.vl.tab_s0, p.vl.tab_s1, p.vl.page_size, w.vSkv,
                                                 fullK + s);
                    } else {
#pragma unroll
                        for (int x = 0; x < NBOX; x++)
                            hop::tma_load_4d(sK + s * C::KV_BYTES + x * BN * 128 + gi * U * 128, w.mk, x * 64, key, hk,
                                             w.bt, fullK + s);
                    }
                }
                hop::mbar_wait(emptyV + s, par);
                if (gi == 0) hop::mbar_expect_tx(fullV + s, C::KV_BYTES);
                __syncwarp();
                if (gi < G) {
                    if constexpr (PG) {
                        bsa_load_paged<NBOX, BN>(sV + s * C::KV_BYTES + gi * U * 128, &tmv, w.mv, key, U, p.vl.lr, hk,
                                                 p.vl.table + w.b * p.vl.tab_s0, p.vl.tab_s1, p.vl.page_size, w.vSkv,
                                                 fullV + s);
                    } else {
#pragma unroll
                        for (int x = 0; x < NBOX; x++)
                            hop::tma_load_4d(sV + s * C::KV_BYTES + x * BN * 128 + gi * U * 128, w.mv, x * 64, key, hk,
                                             w.bt, fullV + s);
                    }
                }
            }
            gt += ntiles;
            kq++;
        }
        return;
    }
    // ------------------------------------------------------------------------------- consumers
    hop::setmaxnreg_inc<240>();
    const int cw = wg - 1;  // consumer warpgroup: rows [64 cw, 64 cw + 64) of each tile
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const float sl2 = p.scale_log2;
    const bool rowbits = bsa_fwd90_rowbits(p.bx, p.by, U);
    // Releases the Q buffer of the previous row (qb ^ 1) once this warpgroup's O stores from it
    // have read it (the stores were issued at the end of that row; waited for here, after this
    // row's first GEMMs are issued, so the wait overlaps them)
    const auto release_prev = [&](int kq) {
        if (kq > 0 && tid == 0) {
            hop::bulk_wait_read();
            hop::mbar_arrive(qempty + ((kq - 1) & 1));
        }
    };
    int gt = 0, kq = 0;
    for (;;) {
        // the row the producer posted with this Q buffer (after its Q landed)
        const int qb = kq & 1;
        hop::mbar_wait(barQ + qb, (kq >> 1) & 1);
        const int2 pr = posted[qb];
        if (pr.x < 0) break;
        Item w;
        item(pr.x, w);
        const int m = w.m, n = w.n, b = w.b, bt = w.bt;
        const int vSq = w.vSq, vSkv = w.vSkv;
        const long long q0 = w.q0;
        // the query / key counts of the edge tests (dense: read from p at each use, as before VL)
        const auto Sq = [&]() { return bsa_len<VL>(vSq, p.Sq); };
        const auto Skv = [&]() { return bsa_len<VL>(vSkv, p.Skv); };
        const int cnt = pr.y;  // attended key chunks of U = 2^lu keys
        // entries {chunk * 2 + partial, row bits} (bsa_sched_fwd_kernel)
        const int2 *lst = reinterpret_cast<const int2 *>(p.sq.list) + (long long)w.row_id * p.sq.stride;
        const int ntiles = (cnt + G - 1) >> (7 - lu);
        const int r0 = m * BM;
        unsigned char *sQb = sQ + qb * C::Q_BYTES;
        const int i_lo = r0 + cw * 64 + warp * 16 + g;  // this thread's two rows: i_lo, i_lo + 8
        // block rows of this thread's two rows relative to the tile's first (< 32 when rowbits)
        const int rl0 = min(i_lo / p.bx - r0 / p.bx, 31), rl1 = min((i_lo + 8) / p.bx - r0 / p.bx, 31);

        float o[DP / 2], s[BN / 2];
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int i = 0; i < DP / 2; i++) o[i] = 0.f;
        float mx0 = -INFINITY, mx1 = -INFINITY, l0 = 0.f, l1 = 0.f;

        // descriptors: Q rows of this warpgroup (A, K-major), K (B, K-major), V (B, MN-major)
        auto qdesc = [&](int kk) {
            return hop::desc_sw128(sQb + (kk / 4) * BM * 128 + cw * 64 * 128 + (kk % 4) * 32, 16, 1024);
        };
        auto kdesc = [&](int st, int kk) {
            return hop::desc_sw128(sK + st * C::KV_BYTES + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024);
        };
        auto vdesc = [&](int st, int kk) { return hop::desc_sw128(sV + st * C::KV_BYTES + kk * 16 * 128, BN * 128, 1024); };
        auto issue_qk = [&](int st) {
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < DP / 16; kk++) hop::elt<T>::template ss128<0, 0>(s, qdesc(kk), kdesc(st, kk), kk > 0);
            hop::wgmma_commit();
        };
        auto issue_pv = [&](int st) {
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                if constexpr (DP == 128) hop::elt<T>::template rs128<1>(o, pa[kk], vdesc(st, kk), 1);
                else hop::elt<T>::template rs64<1>(o, pa[kk], vdesc(st, kk), 1);
            }
            hop::wgmma_commit();
        };
        // The token mask of tile it as bits, computed while the tile's S GEMM runs (the list and mask
        // loads were on the softmax's critical path): bit 2 jj + h of m0 / m1 keeps column
        // jj * 8 + 2 c + h of row i_lo / i_lo + 8.  Returns whether the tile is partial (a chunk
        // marked partial, or padding); m0 / m1 are only meaningful then.
        auto tile_bits = [&](int it, uint32_t &m0, uint32_t &m1) {
            const int e0 = it * G;
            bool part = e0 + G > cnt;  // padded tile
            for (int gi = 0; gi < G && !part; gi++) part = lst[e0 + gi].x & 1;
            m0 = m1 = 0u;
            if (!part) return false;
            if (rowbits) {  // the schedule's row bits: no mask reads
                // chunk gi holds columns [gi U, gi U + U): bits [gi U / 4, gi U / 4 + U / 4)
                const int nb = U >> 2;
                for (int gi = 0; gi < G && e0 + gi < cnt; gi++) {
                    const int2 en = lst[e0 + gi];
                    const int key0 = (en.x >> 1) << lu;
                    uint32_t bits = (nb >= 32 ? ~0u : (1u << nb) - 1u) << (gi * nb);
                    if (key0 + U > Skv()) {  // the edge chunk: columns past Skv
#pragma unroll
                        for (int jj = 0; jj < BN / 8; jj++)
#pragma unroll
                            for (int h = 0; h < 2; h++)
                                if (((jj * 8) >> lu) == gi && key0 + ((jj * 8 + 2 * c + h) & (U - 1)) >= Skv())
                                    bits &= ~(1u << (2 * jj + h));
                    }
                    if ((en.y >> rl0) & 1) m0 |= bits;
                    if ((en.y >> rl1) & 1) m1 |= bits;
                }
            } else {  // per token: mask[i / bx][j / by]
                const uint8_t *mb = p.mask.p + (long long)b * p.mask.s0 + (long long)n * p.mask.s1;
                const uint8_t *mr0 = mb + (long long)min(bsa_div(i_lo, p.bx, p.inv_bx), p.nbx - 1) * p.mask.s2;
                const uint8_t *mr1 = mb + (long long)min(bsa_div(i_lo + 8, p.bx, p.inv_bx), p.nbx - 1) * p.mask.s2;
#pragma unroll
                for (int jj = 0; jj < BN / 8; jj++) {
                    const int e = e0 + ((jj * 8) >> lu);
                    const bool valid = e < cnt;
                    const int key0 = valid ? (lst[e].x >> 1) << lu : 0;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int j = key0 + ((jj * 8 + 2 * c + h) & (U - 1));
                        const bool okc = valid && j < Skv();
                        const long long cb = (long long)min(bsa_div(j, p.by, p.inv_by), p.nby - 1) * p.mask.s3;
                        if (okc && __ldg(mr0 + cb)) m0 |= 1u << (2 * jj + h);
                        if (okc && __ldg(mr1 + cb)) m1 |= 1u << (2 * jj + h);
                    }
                }
            }
            return true;
        };
        // Applies the token mask of a partial tile (tile_bits), updates the running max and sums
        // (scaled); leaves exp2 values in s and returns the rescale factors of O.
        auto softmax = [&](bool part, uint32_t m0, uint32_t m1, float &a0, float &a1) {
            if (!(sl2 > 0.f)) {  // a negative scale reverses the order: scale first (rare)
#pragma unroll
                for (int i = 0; i < BN / 2; i++) s[i] *= sl2;
            }
            if (part) {
#pragma unroll
                for (int jj = 0; jj < BN / 8; jj++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (!((m0 >> (2 * jj + h)) & 1u)) s[4 * jj + h] = -INFINITY;
                        if (!((m1 >> (2 * jj + h)) & 1u)) s[4 * jj + 2 + h] = -INFINITY;
                    }
            }
            // max of the raw scores, then the scale folded into one FFMA per exp2 (sc > 0 keeps the
            // order); mx0/mx1 stay in scaled log2 units
            const float sc = sl2 > 0.f ? sl2 : 1.f;
            float t0 = -INFINITY, t1 = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < BN / 8; jj++) {
                t0 = fmaxf(t0, fmaxf(s[4 * jj], s[4 * jj + 1]));
                t1 = fmaxf(t1, fmaxf(s[4 * jj + 2], s[4 * jj + 3]));
            }
            t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 1));
            t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 2));
            t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 1));
            t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 2));
            float n0 = fmaxf(mx0, t0 * sc), n1 = fmaxf(mx1, t1 * sc);
            // lazy rescaling: keep the running max unless the tile's exceeds it by more than 8 (log2
            // units): P <= 2^8 loses nothing in fp16 / bf16 (same relative rounding), l and O stay
            // fp32, and O needs no rescale (a = 1).  0.990x the time, geomean over the public suite
            // (every case <= 1.00x; H200).
            if (n0 <= mx0 + 8.f) n0 = mx0;
            if (n1 <= mx1 + 8.f) n1 = mx1;
            const float u0 = n0 == -INFINITY ? 0.f : n0, u1 = n1 == -INFINITY ? 0.f : n1;
            a0 = bsa_exp2(mx0 - u0);
            a1 = bsa_exp2(mx1 - u1);
            mx0 = n0;
            mx1 = n1;
            float ls0 = 0.f, ls1 = 0.f;
#pragma unroll
            for (int jj = 0; jj < BN / 8; jj++) {
                s[4 * jj] = bsa_exp2(fmaf(s[4 * jj], sc, -u0));
                s[4 * jj + 1] = bsa_exp2(fmaf(s[4 * jj + 1], sc, -u0));
                s[4 * jj + 2] = bsa_exp2(fmaf(s[4 * jj + 2], sc, -u1));
                s[4 * jj + 3] = bsa_exp2(fmaf(s[4 * jj + 3], sc, -u1));
                ls0 += s[4 * jj] + s[4 * jj + 1];
                ls1 += s[4 * jj + 2] + s[4 * jj + 3];
            }
            l0 = l0 * a0 + ls0;
            l1 = l1 * a1 + ls1;
        };
        auto to_pa = [&]() {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                pa[kk][0] = hop::elt<T>::pack(s[8 * kk], s[8 * kk + 1]);
                pa[kk][1] = hop::elt<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
                pa[kk][2] = hop::elt<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
                pa[kk][3] = hop::elt<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
            }
        };
        auto rescale = [&](float a0, float a1) {
#pragma unroll
            for (int jj = 0; jj < DP / 8; jj++) {
                o[4 * jj] *= a0; o[4 * jj + 1] *= a0; o[4 * jj + 2] *= a1; o[4 * jj + 3] *= a1;
            }
        };

        // Ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named barrier
        // 1 + cw: "my turn"), so one's softmax runs while the other's GEMMs occupy the tensor
        // cores.  Every issue point syncs on its own barrier and arrives on the other's; warpgroup
        // 1 opens with an arrival for warpgroup 0 and skips its last one, so the counts match
        // within each row.
        const int n_issue = ntiles + 1;
        int issue_no = 0;
        auto my_turn = [&]() { hop::bar_sync(1 + cw, 256); };
        auto your_turn = [&]() {
            if (cw == 0 || ++issue_no < n_issue) hop::bar_arrive(2 - cw, 256);
        };
        if (ntiles > 0) {
            if (cw == 1) hop::bar_arrive(1, 256);
            float a0, a1;
            const int s0 = gt % ST;
            hop::mbar_wait(fullK + s0, (gt / ST) & 1);
            my_turn();
            issue_qk(s0);
            your_turn();
            release_prev(kq);
            uint32_t m0, m1;
            bool part = tile_bits(0, m0, m1);
            hop::wgmma_wait<0>();
            hop::reg_fence(s);
            hop::mbar_arrive(emptyK + s0);
            softmax(part, m0, m1, a0, a1);
            to_pa();
            for (int it = 1; it < ntiles; it++) {
                const int sk = (gt + it) % ST, sv = (gt + it - 1) % ST;
                hop::mbar_wait(fullK + sk, ((gt + it) / ST) & 1);
                hop::mbar_wait(fullV + sv, ((gt + it - 1) / ST) & 1);
                my_turn();
                issue_qk(sk);
                issue_pv(sv);
                your_turn();
                part = tile_bits(it, m0, m1);
                hop::wgmma_wait<1>();  // S_it is ready; P V of the previous tile still runs
                hop::reg_fence(s);
                hop::mbar_arrive(emptyK + sk);
                softmax(part, m0, m1, a0, a1);
                hop::wgmma_wait<0>();
                hop::reg_fence(o);
                hop::reg_fence(pa);
                hop::mbar_arrive(emptyV + sv);
                // lazy: only warps where some row's running max moved (warp-uniform, so skipped FMULs)
                if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);
                to_pa();
            }
            const int sv = (gt + ntiles - 1) % ST;
            hop::mbar_wait(fullV + sv, ((gt + ntiles - 1) / ST) & 1);
            my_turn();
            issue_pv(sv);
            your_turn();
            hop::wgmma_wait<0>();
            hop::reg_fence(o);
            hop::reg_fence(pa);
            hop::mbar_arrive(emptyV + sv);
        } else {
            release_prev(kq);
        }

        // ---- epilogue: normalise, store O (only rows < Sq, columns < D) and LSE (VL: rows q0 + i)
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
        if (o_tma) {
            // O through this warpgroup's 64 Q rows (its own S GEMMs are done; the other warpgroup
            // reads only its own rows): the 128-byte swizzled layout the map's boxes use
            // (conflict-free: the 8 rows of a store instruction land in 8 different 16-byte chunks),
            // then two TMA stores, whose reads the next row's release_prev waits for.  Per-element
            // stores were 8 sectors per instruction: ~2.3 us per CTA (measured, H200)
            unsigned char *so = sQb + cw * 64 * 128;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = warp * 16 + g + 8 * h;
                const float inv = h ? inv1 : inv0;
#pragma unroll
                for (int jj = 0; jj < DP / 8; jj++) {
                    const uint32_t v = hop::elt<T>::pack(o[4 * jj + 2 * h] * inv, o[4 * jj + 2 * h + 1] * inv);
                    *reinterpret_cast<uint32_t *>(so + (jj >> 3) * BM * 128 + hop::sw128(r, jj & 7) + 4 * c) = v;
                }
            }
            hop::fence_proxy_async();
            hop::bar_sync(3 + cw, 128);
            if (tid == 0) {
                if constexpr (VL) tmap_acquire(w.mo);  // written by the prep kernel
#pragma unroll
                for (int x = 0; x < NBOX; x++) hop::tma_store_4d(w.mo, so + x * BM * 128, x * 64, r0 + cw * 64, n, bt);
                hop::bulk_commit();
            }
        }
        T *ob = reinterpret_cast<T *>(p.o.p) + (long long)bt * p.o.s0 + (long long)n * p.o.s1 + q0 * p.o.s2;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = i_lo + 8 * h;
            if (i >= Sq()) continue;
            const float inv = h ? inv1 : inv0;
            T *orow = ob + (long long)i * p.o.s2;
#pragma unroll
            for (int jj = 0; jj < DP / 8 && !o_tma; jj++) {
                const int col = jj * 8 + 2 * c;
                if (col >= p.D) continue;
                const uint32_t v = hop::elt<T>::pack(o[4 * jj + 2 * h] * inv, o[4 * jj + 2 * h + 1] * inv);
                if (p.o.vec) {
                    *reinterpret_cast<uint32_t *>(orow + col) = v;
                } else {
                    const T *e = reinterpret_cast<const T *>(&v);
                    orow[(long long)col * p.o.s3] = e[0];
                    orow[(long long)(col + 1) * p.o.s3] = e[1];
                }
            }
            if (p.lse && c == 0) {
                const float l = h ? l1 : l0, mxv = h ? mx1 : mx0;
                p.lse[(long long)bt * p.lse_s0 + (long long)n * p.lse_s1 + (q0 + i) * p.lse_s2] =
                    l > 0.f ? (mxv + __log2f(l)) * BSA_LN2 : l == 0.f ? -INFINITY : __int_as_float(0x7fc00000);
            }
        }
        gt += ntiles;
        kq++;
    }
    if (tid == 0) hop::bulk_wait_read();  // the last row's stores have read shared memory before the CTA exits
}

template <int DP, typename T, bool VL, bool PG>
cudaError_t launch(const bsa_params &p, const bsa_tmaps &tm, int lu, int *ctr, bool reset, cudaStream_t st) {
    using C = FwdCfg<DP>;
    static unsigned long long done = 0;
    cudaError_t e = hop::set_smem(bsa_fwd90_kernel<DP, T, VL, PG>, C::SMEM, &done);
    if (e != cudaSuccess) return e;
    long long rows = (long long)((p.Sq + C::BM - 1) / C::BM) * p.N * p.B;
    // VL: the sequences' tiles number at most N (ceil(Tq / BM) + B); the launch order puts the
    // tiles past a sequence's end (up to B * N * ceil(max_seqlen_q / BM), mostly empty slots
    // when lengths vary) last, so the grid stops before them instead of running them as CTAs
    // that exit at once (14K of 18K on 32 sequences of 26-4527 tokens)
    if (VL) {
        const long long cap = (long long)p.N * ((p.vl.Tq + C::BM - 1) / C::BM + p.B);
        rows = rows < cap ? rows : cap;
    }
    if (rows == 0) return cudaSuccess;
    // persistent: one CTA per SM (at most one per row), each drawing rows from the counter
    const long long sms = hop::sm_count();
    dim3 grid((unsigned)(rows < sms ? rows : sms));
    const int flags = (tm.o_tma ? 1 : 0) | (reset ? 2 : 0);
    bsa_fwd90_kernel<DP, T, VL, PG><<<grid, 384, C::SMEM, st>>>(p, tm.q, tm.k, tm.v, tm.o, flags, lu, (int)rows, ctr);
    return cudaGetLastError();
}

template <bool VL, bool PG = false>
cudaError_t launch_dt(const bsa_params &p, const bsa_tmaps &tm, int dp, int bf16, int lu, int *ctr, bool reset,
                      cudaStream_t st) {
    if (dp == 64)
        return bf16 ? launch<64, __nv_bfloat16, VL, PG>(p, tm, lu, ctr, reset, st)
                    : launch<64, __half, VL, PG>(p, tm, lu, ctr, reset, st);
    return bf16 ? launch<128, __nv_bfloat16, VL, PG>(p, tm, lu, ctr, reset, st)
                : launch<128, __half, VL, PG>(p, tm, lu, ctr, reset, st);
}

}  // namespace

extern "C" cudaError_t spattn_bsa_launch_fwd(const bsa_params *p, const bsa_tmaps *tm, int dp, int bf16, int chunk,
                                             int *ctr, int reset, cudaStream_t st) {
    const int lu = chunk == 16 ? 4 : chunk == 32 ? 5 : chunk == 64 ? 6 : 7;
    if (!p->vl.seq) return launch_dt<false>(*p, *tm, dp, bf16, lu, ctr, reset, st);
    return p->vl.table ? launch_dt<true, true>(*p, *tm, dp, bf16, lu, ctr, reset, st)
                       : launch_dt<true>(*p, *tm, dp, bf16, lu, ctr, reset, st);
}
