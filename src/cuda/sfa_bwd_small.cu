// Top-k sparse flash attention backward for Hopper (sm_90a), H = N1 / N2 <= 32 heads per key head,
// key-major: D = 512 + Dr = 64, shared key/value, any sbs, modes 0 and 3, GQA.
// Since 2026-12-03 the union form of sfa_bwd90.cu takes H = 4, 8, 16, 32 with sbs <= 64 (0.64-0.89x
// this kernel's time with fp32 adds, 0.78-0.99x deterministic, on every public case; runbook);
// this kernel runs the dense-enough rows of the other head counts (1-3, not a power of two) and
// sbs > 64.
//
// Token-major, every (token, selected key) pair adds a 576-wide dK row: at 4-16 heads those adds,
// not the MMAs, bound the speed (runbook).  Here a CTA owns one block of 64 consecutive keys and
// walks the tokens that selected any of them, so dK / dV of its keys stay in registers; dQ gets
// one add of (heads x 576) per (token, key block) instead of one dK row per key.
//
// Lists, built on the device per call (no host synchronisation; workspace bounded by shapes):
//   touch:  bit s1 of bitmap[(b, n2), key block] for every token whose row selects a key of it;
//   count:  per list, the exclusive popcount prefix of each 32-token word, and the list length;
//   scan:   list offsets; fill: visit v = (list offset + rank) -> token s1, in increasing s1
//           (a stable order: the sums below do not depend on scheduling);
//   mult:   per visit, the multiplicity of each of the block's 64 keys in the token's row
//           (uint16 pairs; 0 = not selected or causally masked; duplicates count twice).
// Main kernel, CTA = (list, window of 32 T tokens; see the kernel): a producer warpgroup gathers
// the key block once (sfa::Gather) and, per step, the Q and dO rows of the step's tokens (32 token-head rows: T =
// 32 / HP tokens of HP heads each, HP = H rounded up to a power of two; padded rows masked), with
// the step's multiplicities, into two stages.  Two consumer warpgroups, each for the whole step:
//   S^T = K Q^T and dP^T = V dO^T (SS m64n32, keys = MMA rows); P^T = mult exp2(S^T sl2 - LSE2),
//   dS^T = scale P^T (dP^T - Delta) in fp32 (both warpgroups compute them: no exchange, no rounding
//   before the product; the duplicated S / dP GEMMs are 28 % of the step's MMA);
//   dKV[64 x its boxes] += dS^T Q + P^T dO (RS: P^T, dS^T packed from the accumulators as the A
//   operand; warpgroup 0 boxes 0-3 and the rope box 8, warpgroup 1 boxes 4-7), stored once;
//   dQ^T[its boxes] = K^T dS^T (A = key box read MN-major, B = its own dS tile), added to the dQ
//   accumulator (warpgroup 0 boxes 0-3, 1 boxes 4-8).
// The chunk's dKV (64 keys x 576) is added into the dK accumulator of sfa_host.cu at the end; both
// accumulators are int64 fixed point (deterministic, bitwise reproducible) or fp32 (fast mode).
#include <math.h>
#include <stdlib.h>

#include "hopper/hopper.cuh"
#include "sfa_adds.cuh"
#include "sfa_bwd_small.h"
#include "sfa_gather.cuh"
#include "sfa_kmaj.cuh"

namespace {

using sfa::Params;
using sfa::SmallLists;

constexpr int BOX = sfa::GBOX;  // 64 rows x 128 bytes (key block box)
constexpr int NR = 32;          // token-head rows per step
constexpr int RBOX = NR * 128;  // 32-row box: 4 KB
// per stage: Q (9 boxes) and dO (8 boxes) of 32 rows; beside them, per stage, the multiplicities
// [tokens][64] (uint16), LSE2 [32] and Delta [32]
constexpr int ST_DO = 9 * RBOX, SQD = 17 * RBOX;
constexpr int MS_CNT = 0, MS_LSE = 32 * 128, MS_DELTA = MS_LSE + NR * 4, MISC = MS_DELTA + NR * 4;
constexpr int OFF_K = 0, OFF_ST = 9 * BOX, OFF_DS = OFF_ST + 2 * SQD, OFF_MISC = OFF_DS + 2 * RBOX;
constexpr int OFF_BAR = OFF_MISC + 2 * MISC;
constexpr int SMEM = OFF_BAR + 64 + 1024;  // + alignment slack
static_assert(SMEM <= 232448, "fits in 227 KB");
constexpr int STEPS = 32;  // steps per CTA at most (a window of 32 T tokens)

enum { NB_DS0 = 1 /* and 2 */ };

// The consumers split each step's two score GEMMs between them through the 8 KB of the dS
// region R (measured 2026-12-01 against computing both on each warpgroup, same results bit for
// bit: 8 % faster deterministic, 12 % fast mode, on the N1 <= 16 suite cases):
//   phase A: warpgroup 1 computes dP^T and writes it (fp32, fragment order: float4 (i, thread) at
//            (i 128 + t) 16);
//   phase B: warpgroup 0 computes S^T, reads dP^T, forms P^T and dS^T in fp32, and writes the
//            one dS tile [32 rows][64 keys] (bf16/fp16, sw128) at R and its P^T A fragments at
//            R + 4 KB (uint4 (kk, thread) at 4096 + (kk 128 + t) 16); warpgroup 1 reads P^T and
//            dS^T back as its A fragments; both dQ^T GEMMs read the one dS tile.
// Three mbarriers of 128 arrivals order R: xdp (phase A written), xps (phase B written), rfree
// (warpgroup 0's dQ^T GEMMs of the step, the last readers of R, are done); warpgroup 1's own
// readers of the previous step meet at a named barrier before it overwrites R.

// ---- list building ---------------------------------------------------------------------------
// The key range [k0, k1] that index entry `bi` selects among nkeys keys within the causal limit
// (k1 < k0: none).
__device__ __forceinline__ void entry_keys(const Params &p, int bi, int lim, int nkeys, int &k0, int &k1) {
    k0 = 0;
    k1 = -1;
    if (bi < 0 || bi >= p.nblk) return;
    const long long a = (long long)bi << p.log2sbs;
    const long long kmax = min((long long)nkeys - 1, (long long)lim);
    if (a > kmax) return;
    k0 = (int)a;
    k1 = (int)min(a + p.sbs - 1, kmax);
}

__device__ __forceinline__ int lim_of(const Params &p, int s1) { return p.mode == 3 ? p.S2 - p.S1 + s1 : p.S2 - 1; }

// The index row (b, s1, n2) of this warp (one warp per row); false past the last row.  Varlen
// calls (p.vl.tok set; B 1, s1 the packed token): the token's keys (tk = {sequence, first key
// row, keys, causal limit}); false for a token past cu_seqlens_q[B].
struct IdxRow {
    int b, s1, n2, lim, nkeys;
    int4 tk;
    const int32_t *irow;
};
__device__ __forceinline__ bool warp_row(const Params &p, IdxRow &r) {
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= (int64_t)p.B * p.S1 * p.N2) return false;
    r.n2 = (int)(row % p.N2);
    r.s1 = (int)(row / p.N2 % p.S1);
    r.b = (int)(row / p.N2 / p.S1);
    r.irow = p.idx + r.b * p.sidx[0] + (int64_t)r.s1 * p.sidx[1] + r.n2 * p.sidx[2];
    r.lim = lim_of(p, r.s1);
    r.nkeys = p.S2;
    r.tk = make_int4(0, 0, 0, 0);
    if (p.vl.tok) {
        r.tk = __ldg(p.vl.tok + r.s1);
        if (r.tk.x < 0) return false;
        r.lim = r.tk.w;
        r.nkeys = r.tk.z;
    }
    return true;
}
// The key-side row of the row's key k (dense: k; varlen packed keys: the sequence's first row +
// k; pages: through the block table, -1 for a page id outside the pool, which the device check
// refuses before anything is written: nothing is read for it here).  The lists, the kernels and
// the dK / dV accumulator of a varlen call are over key-side rows (sfa_bwd_kmaj.cu only).
__device__ __forceinline__ int key_row(const Params &p, const IdxRow &r, int k) {
    if (!p.vl.tok) return k;
    if (!p.vl.table) return r.tk.y + k;
    const int ps = p.vl.page_size, sl = k / ps;
    const int pg = __ldg(p.vl.table + (int64_t)r.tk.x * p.vl.tab_s0 + (int64_t)sl * p.vl.tab_s1);
    return (unsigned)pg < (unsigned)p.vl.num_pages ? pg * ps + (k - sl * ps) : -1;
}

// One warp per index row (b, s1, n2): sets bit s1 in the bitmap of every key block it touches.
// With at most TOUCH_MASK key blocks per (b, n2), the warp first collects the blocks its row
// touches in a shared bit mask and then sets one bitmap bit per block (not one per index entry:
// 32 consecutive rows share each bitmap word, so per-entry atomics contended; ncu, sfa05).
constexpr int TOUCH_MASK = 1024;
__global__ void __launch_bounds__(256) touch_kernel(const Params p, SmallLists L) {
    __shared__ uint32_t mask_all[8][TOUCH_MASK / 32];
    IdxRow r;
    if (!warp_row(p, r)) return;  // warp-uniform
    const int lane = threadIdx.x & 31, b = r.b, s1 = r.s1, n2 = r.n2, lim = r.lim;
    const int32_t *irow = r.irow;
    uint32_t *bm = L.bitmap + ((int64_t)(b * p.N2 + n2) * L.nkb) * L.s1w + (s1 >> 5);
    const uint32_t bit = 1u << (s1 & 31);
    if (p.vl.tok) {  // key-side rows: runs of keys in one page (packed keys: the whole range)
        for (int e = lane; e < p.K; e += 32) {
            int k0, k1;
            entry_keys(p, __ldg(irow + e * p.sidx[3]), lim, r.nkeys, k0, k1);
            for (int k = k0; k <= k1;) {
                const int end = p.vl.table ? min(k1, (k / p.vl.page_size + 1) * p.vl.page_size - 1) : k1;
                const int row = key_row(p, r, k);
                if (row >= 0)
                    for (int kb = row >> 6; kb <= (row + end - k) >> 6; kb++) atomicOr(bm + (int64_t)kb * L.s1w, bit);
                k = end + 1;
            }
        }
        return;
    }
    if (L.nkb > TOUCH_MASK) {
        for (int e = lane; e < p.K; e += 32) {
            int k0, k1;
            entry_keys(p, __ldg(irow + e * p.sidx[3]), lim, r.nkeys, k0, k1);
            for (int kb = k0 >> 6; k0 <= k1 && kb <= (k1 >> 6); kb++) atomicOr(bm + (int64_t)kb * L.s1w, bit);
        }
        return;
    }
    uint32_t *mask = mask_all[threadIdx.x >> 5];
    mask[lane] = 0u;
    __syncwarp();
    for (int e = lane; e < p.K; e += 32) {
        int k0, k1;
        entry_keys(p, __ldg(irow + e * p.sidx[3]), lim, r.nkeys, k0, k1);
        for (int kb = k0 >> 6; k0 <= k1 && kb <= (k1 >> 6); kb++) atomicOr(mask + (kb >> 5), 1u << (kb & 31));
    }
    __syncwarp();
    uint32_t bits = lane * 32 < L.nkb ? mask[lane] : 0u;
    while (bits) {
        const int kb = lane * 32 + __ffs(bits) - 1;
        bits &= bits - 1;
        atomicOr(bm + (int64_t)kb * L.s1w, bit);
    }
}

// Exclusive prefix sums of the CTA's values, chunk by chunk (all threads call it for every chunk):
// returns this thread's prefix and adds the chunk's total to `running` (the same in every thread).
template <int NT> __device__ __forceinline__ int block_scan(int c, int *warp_sum, int &running) {
    int x = c;  // inclusive scan in the warp, then across warps
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if ((threadIdx.x & 31) >= o) x += y;
    }
    if ((threadIdx.x & 31) == 31) warp_sum[threadIdx.x >> 5] = x;
    __syncthreads();
    int before = running, total = 0;
    for (int i = 0; i < NT / 32; i++) {
        if (i < (int)(threadIdx.x >> 5)) before += warp_sum[i];
        total += warp_sum[i];
    }
    __syncthreads();  // warp_sum is rewritten by the next chunk
    running += total;
    return before + x - c;
}

// One CTA (256 threads) per list: exclusive popcount prefix per word, the list length.
__global__ void count_kernel(SmallLists L) {
    const int64_t l = blockIdx.x;
    const uint32_t *bm = L.bitmap + l * L.s1w;
    uint32_t *pre = L.wpre + l * L.s1w;
    __shared__ int warp_sum[8];
    int running = 0;
    for (int w0 = 0; w0 < L.s1w; w0 += 256) {
        const int w = w0 + threadIdx.x;
        const int e = block_scan<256>(w < L.s1w ? __popc(bm[w]) : 0, warp_sum, running);
        if (w < L.s1w) pre[w] = (uint32_t)e;
    }
    if (threadIdx.x == 0) L.len[l] = running;
}

// One CTA (1024 threads): off[l] = sum of len[< l]; off[nl] = the number of visits.
__global__ void scan_kernel(SmallLists L, int nl) {
    __shared__ int warp_sum[32];
    int running = 0;
    for (int i0 = 0; i0 < nl; i0 += 1024) {
        const int i = i0 + threadIdx.x;
        const int e = block_scan<1024>(i < nl ? L.len[i] : 0, warp_sum, running);
        if (i < nl) L.off[i] = e;
    }
    if (threadIdx.x == 0) L.off[nl] = running;
}

// One thread per (list, word): the tokens of the word's set bits, in order.
__global__ void fill_kernel(SmallLists L, int64_t nwords) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nwords) return;
    const int64_t l = i / L.s1w;
    const int w = (int)(i % L.s1w);
    uint32_t bits = L.bitmap[i];
    int v = L.off[l] + (int)L.wpre[i];
    while (bits) {
        const int bit = __ffs(bits) - 1;
        bits &= bits - 1;
        L.vtok[v] = w * 32 + bit;
        v++;
    }
}

// The multiplicity rows of the visits that exist (128 bytes each), zeroed with coalesced stores.
__global__ void zero_mult_kernel(SmallLists L, int nl) {
    const int64_t n = (int64_t)L.off[nl] * 8;
    uint4 *m = reinterpret_cast<uint4 *>(L.vmult);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        m[i] = make_uint4(0, 0, 0, 0);
}

// The warp's index row entry by entry (each lane loads one of 32, then they are shuffled out in
// order): f(k0, k1) for the key range of every entry, called by all 32 lanes.
template <class F>
__device__ __forceinline__ void warp_entries(const Params &p, const int32_t *irow, int lim, int nkeys, int lane, F f) {
    for (int e0 = 0; e0 < p.K; e0 += 32) {
        const int mine = e0 + lane < p.K ? __ldg(irow + (int64_t)(e0 + lane) * p.sidx[3]) : -1;
        const int n = min(32, p.K - e0);
        for (int x = 0; x < n; x++) {
            int k0, k1;
            entry_keys(p, __shfl_sync(0xffffffffu, mine, x), lim, nkeys, k0, k1);
            f(k0, k1);
        }
    }
}

// One warp per index row: each selected key's multiplicity in its visit (+1 per selection).
// With few key blocks (at most TOUCH_MASK, and no more than K), the row's visit index of every
// block is looked up once into a shared table instead of three loads per index entry.
__global__ void __launch_bounds__(256) mult_kernel(const Params p, SmallLists L) {
    __shared__ int vis_all[8][TOUCH_MASK];
    IdxRow r;
    if (!warp_row(p, r)) return;  // warp-uniform
    const int lane = threadIdx.x & 31, b = r.b, s1 = r.s1, n2 = r.n2, lim = r.lim;
    const int32_t *irow = r.irow;
    const int64_t l0 = (int64_t)(b * p.N2 + n2) * L.nkb;
    const uint32_t below = (1u << (s1 & 31)) - 1u;
    auto visit = [&](int kb) {
        const int64_t l = l0 + kb, wi = l * L.s1w + (s1 >> 5);
        return L.off[l] + (int)L.wpre[wi] + __popc(L.bitmap[wi] & below);
    };
    if (p.vl.tok) {  // key-side rows: a warp per entry, a lane per key (rows of an entry need not share a block)
        warp_entries(p, irow, lim, r.nkeys, lane, [&](int k0, int k1) {
            for (int k = k0 + lane; k <= k1; k += 32) {
                const int row = key_row(p, r, k);
                if (row >= 0) atomicAdd(L.vmult + (int64_t)visit(row >> 6) * 32 + ((row & 63) >> 1), 1u << ((row & 1) * 16));
            }
        });
        return;
    }
    const bool table = L.nkb <= TOUCH_MASK && L.nkb <= p.K;
    int *vis = vis_all[threadIdx.x >> 5];
    if (table) {
        for (int kb = lane; kb < L.nkb; kb += 32) vis[kb] = visit(kb);  // blocks not touched: unused
        __syncwarp();
    }
    if (p.sbs >= 32) {
        // blocks of 32 keys or more: the warp takes one entry at a time, lane l the key pair
        // (2 l, 2 l + 1) of each 64-key block the entry covers (one coalesced 128-byte add per
        // block; with an entry per lane, each lane's 64 serial adds per entry took 372 us on
        // sfas01, H200)
        warp_entries(p, irow, lim, r.nkeys, lane, [&](int k0, int k1) {
            for (int kb = k0 >> 6; k0 <= k1 && kb <= (k1 >> 6); kb++) {
                const int ka = kb * 64 + 2 * lane;
                const uint32_t inc = (ka >= k0 && ka <= k1 ? 1u : 0u) | (ka + 1 >= k0 && ka + 1 <= k1 ? 1u << 16 : 0u);
                if (inc) atomicAdd(L.vmult + (int64_t)(table ? vis[kb] : visit(kb)) * 32 + lane, inc);
            }
        });
        return;
    }
    for (int e = lane; e < p.K; e += 32) {
        int k0, k1;
        entry_keys(p, __ldg(irow + e * p.sidx[3]), lim, r.nkeys, k0, k1);
        for (int k = k0; k <= k1; k++) {
            const int v = table ? vis[k >> 6] : visit(k >> 6);
            atomicAdd(L.vmult + (int64_t)v * 32 + ((k & 63) >> 1), 1u << ((k & 1) * 16));
        }
    }
}

// One CTA (256 threads) per list: the keys some visit selects (kused; the kernels zero-fill the
// other rows of the block).  Warp w ORs the multiplicity rows of visits w, w + 8, ... (lane l:
// keys 2 l and 2 l + 1) and stops once all 64 keys are seen: with blocks of 64 keys selected
// whole that is the first visit, so the pass reads a fraction of vmult.
__global__ void __launch_bounds__(256) used_kernel(SmallLists L) {
    const int64_t l = blockIdx.x;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, v1 = L.off[l + 1];
    __shared__ unsigned long long all;
    if (threadIdx.x == 0) all = 0ull;
    __syncthreads();
    uint32_t m = 0u;
    for (int v = L.off[l] + w; v < v1; v += 8) {
        m |= __ldg(L.vmult + (int64_t)v * 32 + lane);
        if (__all_sync(0xffffffffu, (m & 0xffffu) && (m >> 16))) break;
    }
    const uint32_t ev = __ballot_sync(0xffffffffu, m & 0xffffu), od = __ballot_sync(0xffffffffu, m >> 16);
    if (lane == 0) {
        unsigned long long u = 0ull;  // bit 2 i: even key 2 i (ev bit i), bit 2 i + 1: od bit i
        for (int i = 0; i < 32; i++) u |= (unsigned long long)((ev >> i) & 1) << (2 * i) | (unsigned long long)((od >> i) & 1) << (2 * i + 1);
        atomicOr(&all, u);
    }
    __syncthreads();
    if (threadIdx.x == 0) L.kused[l] = all;
}

// Delta = rowsum(dO O) (fp32) and LSE * log2(e) (+inf for rows without a key) per (b, s1, n1);
// G = rows_lanes(L.dv) lanes per row (16 bytes of o and dout each per load), 32 / G rows per
// warp (a warp per row left half the lanes idle at D 128: 69 us on sfas01, H200).
// Lanes per row: a power of two (the xor reduction), at most 32 and dv / 8 (D 192: 16).
__host__ __device__ inline int rows_lanes(int dv) {
    int g = 1;
    while (2 * g <= (dv / 8 < 32 ? dv / 8 : 32)) g *= 2;
    return g;
}
template <typename T> __global__ void rows_kernel(const Params p, SmallLists L) {
    const int G = rows_lanes(L.dv);
    const int lane = threadIdx.x & 31, gl = lane % G;
    const int64_t row = (((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5) * (32 / G) + lane / G;
    const bool live = row < (int64_t)p.B * p.S1 * p.N1;
    const int64_t rr = live ? row : 0;
    const int n1 = (int)(rr % p.N1), s1 = (int)(rr / p.N1 % p.S1), b = (int)(rr / p.N1 / p.S1);
    const T *o = static_cast<const T *>(p.o) + b * p.so[0] + (int64_t)s1 * p.so[1] + (int64_t)n1 * p.so[2];
    const T *d = static_cast<const T *>(p.dout) + b * p.sdo[0] + (int64_t)s1 * p.sdo[1] + (int64_t)n1 * p.sdo[2];
    float sum = 0.f;
    for (int col = gl * 8; live && col < L.dv; col += 8 * G) {
        const uint4 ov = *reinterpret_cast<const uint4 *>(o + col), dv = *reinterpret_cast<const uint4 *>(d + col);
        const uint32_t *oe = reinterpret_cast<const uint32_t *>(&ov), *de = reinterpret_cast<const uint32_t *>(&dv);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 a = hop::elt<T>::unpack(oe[e]), c = hop::elt<T>::unpack(de[e]);
            sum += a.x * c.x + a.y * c.y;
        }
    }
    for (int o2 = G / 2; o2 > 0; o2 >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o2);
    if (live && gl == 0) {
        const float lse = p.lse_in[b * p.slse[0] + (int64_t)s1 * p.slse[1] + (int64_t)n1 * p.slse[2]];
        L.delta[row] = sum;
        // +inf for a row without keys (P = 0); a NaN LSE stays NaN, so that P and everything it
        // reaches (dV of the row's keys with a separate V) is NaN, as the spec says
        L.lse2[row] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    }
}

// ---- main kernel -------------------------------------------------------------------------------
using sfa::kmaj_ds_at;

struct Sm {
    unsigned char *k, *st, *ds, *misc;
    uint64_t *full, *empty;  // [2] each
    uint64_t *xdp, *xps, *rfree;  // R's phases (see above)
};

template <typename T, int HP, int C>
__device__ __forceinline__ void consume(const Params &p, const SmallLists &L, const Sm &s, int b, int n2, int kb,
                                        int v0, int v1) {
    constexpr int TT = NR / HP;                        // tokens per step
    constexpr int NDKV = C == 0 ? 5 : 4;               // dKV boxes: C = 0: 0-3 and 8; C = 1: 4-7
    constexpr int NDQ = C == 0 ? 4 : 5, DQ0 = C == 0 ? 0 : 4;  // dQ^T boxes
    const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31, q4 = lane & 3;
    const int r0 = warp * 16 + (lane >> 2);
    const float sl2 = p.scale_log2, scale = p.scale;
    const bool det = p.acc_i64 != nullptr;
    const float fsq = det ? *L.fix_scale_q : 1.f;
    unsigned char *sds = s.ds;  // the dS tile [32 token-head rows][64 keys] at R, written by WG0

    float dkv[NDKV][32];
#pragma unroll
    for (int i = 0; i < NDKV; i++)
#pragma unroll
        for (int j = 0; j < 32; j++) dkv[i][j] = 0.f;

    const uint64_t kd = hop::desc_sw128(s.k, 16, 1024);
    auto kmaj64 = [](uint64_t d, int kk) { return hop::desc_add(d, (kk >> 2) * BOX + (kk & 3) * 32); };
    auto kmaj32 = [](uint64_t d, int kk) { return hop::desc_add(d, (kk >> 2) * RBOX + (kk & 3) * 32); };
    const int nsteps = (v1 - v0 + TT - 1) / TT;
    for (int it = 0; it < nsteps; it++) {
        const int st = it & 1;
        const uint32_t ph = (it >> 1) & 1;
        unsigned char *sq = s.st + st * SQD, *sdo = sq + ST_DO, *ms = s.misc + st * MISC;
        const uint16_t *cnt = reinterpret_cast<const uint16_t *>(ms + MS_CNT);  // [TT][64]
        const float *lse2 = reinterpret_cast<const float *>(ms + MS_LSE), *delta = reinterpret_cast<const float *>(ms + MS_DELTA);
        const int vs = v0 + it * TT, ntok = min(TT, v1 - vs);
        const uint64_t qd = hop::desc_sw128(sq, 16, 1024), dod = hop::desc_sw128(sdo, 16, 1024);

        uint32_t pa[2][4], da[2][4];
        {  // the score tiles live in this scope only
            float sa[16], dpa[16];
            const uint32_t xph = it & 1;
            hop::mbar_wait(s.full + st, ph);
            if constexpr (C == 0) {
                // ---- S^T (64 keys x 32 token-heads), P^T in fp32; which entries are selected
                hop::wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 36; kk++) hop::elt<T>::template ssn<32, 0, 0>(sa, kmaj64(kd, kk), kmaj32(qd, kk), kk > 0);
                hop::wgmma_commit();
                hop::wgmma_wait<0>();
                hop::reg_fence(sa);
                uint32_t sel = 0;
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int th = 8 * j + 2 * q4 + e, tok = th / HP, h = th % HP;
                        const bool ok = tok < ntok && h < p.H;
                        const float l2 = lse2[th];
#pragma unroll
                        for (int hh = 0; hh < 2; hh++) {
                            const int key = r0 + 8 * hh, i = 4 * j + 2 * hh + e;
                            const float m = ok ? (float)cnt[tok * 64 + key] : 0.f;
                            sa[i] = m > 0.f ? m * hop::ex2(sa[i] * sl2 - l2) : 0.f;
                            sel |= (m > 0.f ? 1u : 0u) << i;
                        }
                    }
                // ---- dP^T from warpgroup 1 (phase A), then dS^T = scale P^T (dP^T - Delta)
                hop::mbar_wait(s.xdp, xph);
#pragma unroll
                for (int i4 = 0; i4 < 4; i4++) {
                    const float4 v = *reinterpret_cast<const float4 *>(s.ds + (i4 * 128 + t) * 16);
                    dpa[4 * i4] = v.x;
                    dpa[4 * i4 + 1] = v.y;
                    dpa[4 * i4 + 2] = v.z;
                    dpa[4 * i4 + 3] = v.w;
                }
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float dl = delta[8 * j + 2 * q4 + e];
#pragma unroll
                        for (int hh = 0; hh < 2; hh++) {
                            const int i = 4 * j + 2 * hh + e;
                            // unselected keys: exactly 0 (not 0 * a non-finite dP of another key's row)
                            dpa[i] = (sel >> i) & 1u ? scale * sa[i] * (dpa[i] - dl) : 0.f;
                        }
                    }
                sfa::kmaj_pack_a<T>(sa, pa);
                sfa::kmaj_pack_a<T>(dpa, da);
                hop::bar_sync(NB_DS0, 128);  // every thread of this warpgroup has read phase A
                // ---- phase B: the dS tile and the P^T fragments
                sfa::kmaj_store_ds<T>(sds, dpa, q4, r0);
#pragma unroll
                for (int kk = 0; kk < 2; kk++)
                    *reinterpret_cast<uint4 *>(s.ds + 4096 + (kk * 128 + t) * 16) = make_uint4(pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
                hop::fence_proxy_async();
                hop::mbar_arrive(s.xps);
                hop::bar_sync(NB_DS0, 128);  // the dS tile is whole for this warpgroup's dQ^T GEMMs
            } else {
                // ---- dP^T (64 keys x 32 token-heads) into R once warpgroup 0 is done with R
                hop::wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 32; kk++) hop::elt<T>::template ssn<32, 0, 0>(dpa, kmaj64(kd, kk), kmaj32(dod, kk), kk > 0);
                hop::wgmma_commit();
                hop::wgmma_wait<0>();
                hop::reg_fence(dpa);
                if (it > 0) {
                    hop::mbar_wait(s.rfree, xph ^ 1u);
                    // and every thread of this warpgroup has read the previous step's R (racecheck
                    // saw warps of this warpgroup one step apart there)
                    hop::bar_sync(NB_DS0 + 1, 128);
                }
#pragma unroll
                for (int i4 = 0; i4 < 4; i4++)
                    *reinterpret_cast<float4 *>(s.ds + (i4 * 128 + t) * 16) =
                        make_float4(dpa[4 * i4], dpa[4 * i4 + 1], dpa[4 * i4 + 2], dpa[4 * i4 + 3]);
                hop::mbar_arrive(s.xdp);
                // ---- phase B: P^T fragments as written, dS^T fragments from the tile
                hop::mbar_wait(s.xps, xph);
#pragma unroll
                for (int kk = 0; kk < 2; kk++) {
                    const uint4 v = *reinterpret_cast<const uint4 *>(s.ds + 4096 + (kk * 128 + t) * 16);
                    pa[kk][0] = v.x;
                    pa[kk][1] = v.y;
                    pa[kk][2] = v.z;
                    pa[kk][3] = v.w;
                }
                // da[kk][r] packs elements i = 8 kk + 2 r and i + 1: (key, th) and (key, th + 1)
#pragma unroll
                for (int kk = 0; kk < 2; kk++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const int i = 8 * kk + 2 * r, j = i >> 2, hh = (i >> 1) & 1;
                        const int th = 8 * j + 2 * q4, key = r0 + 8 * hh;
                        const uint32_t lo = *reinterpret_cast<const uint16_t *>(sds + kmaj_ds_at(th, key));
                        const uint32_t hi = *reinterpret_cast<const uint16_t *>(sds + kmaj_ds_at(th + 1, key));
                        da[kk][r] = lo | hi << 16;
                    }
            }
        }

        // ---- dKV += dS^T Q + P^T dO (B = the stage's Q / dO boxes read MN-major: 16 rows per k-step)
        hop::wgmma_fence();
#pragma unroll
        for (int i = 0; i < NDKV; i++) {
            const int box = C == 0 ? (i < 4 ? i : 8) : 4 + i;
            const uint64_t qb = hop::desc_sw128(sq + box * RBOX, RBOX, 1024);
#pragma unroll
            for (int kk = 0; kk < 2; kk++) hop::elt<T>::template rs64<1>(dkv[i], da[kk], hop::desc_add(qb, kk * 2048), 1);
            if (box < 8) {
                const uint64_t ob = hop::desc_sw128(sdo + box * RBOX, RBOX, 1024);
#pragma unroll
                for (int kk = 0; kk < 2; kk++) hop::elt<T>::template rs64<1>(dkv[i], pa[kk], hop::desc_add(ob, kk * 2048), 1);
            }
        }
        hop::wgmma_commit();

        // ---- dQ^T[box] = K^T dS^T (M = 64 columns of the box, N = 32 token-heads, K = 64 keys),
        // added to the dQ accumulator rows of the step's token-heads
        const uint64_t dsd = hop::desc_sw128(sds, 16, 1024);
        // this thread's 8 token-head columns: dQ accumulator row (in units of rows; -1: padding),
        // looked up once per step, not once per box (looked up before the step's GEMMs instead, to
        // hide the loads, it cost 8-14 % on every key-major case: 8 more live registers, more spills)
        int qrow[8];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int th = 8 * j + 2 * q4 + e, tok = th / HP, h = th % HP;
                qrow[2 * j + e] = tok < ntok && h < p.H ? (b * p.S1 + L.vtok[vs + tok]) * p.N1 + n2 * p.H + h : -1;
            }
#pragma unroll 1
        for (int y = 0; y < NDQ; y++) {
            const int box = DQ0 + y;
            float q[16];
            sfa::kmaj_dq_tile<T>(q, s.k + box * BOX, dsd);
            if (y == 0) {
                hop::reg_fence(dkv[0]);  // the dKV group has completed too: the stage is free
                hop::mbar_arrive(s.empty + st);
            }
            if constexpr (C == 0)
                if (y == NDQ - 1) hop::mbar_arrive(s.rfree);  // R's last reader of the step is done
            sfa::kmaj_add_dq(L, q, qrow, box * 64, sfa::DQK, r0, det, fsq);
        }
#pragma unroll
        for (int i = 0; i < NDKV; i++) hop::reg_fence(dkv[i]);
    }

    // ---- the chunk's dK / dV rows into the dK accumulator (keys past S2: nothing)
    const float fs = det ? *p.fix_scale : 1.f;
    const int64_t base = ((int64_t)b * p.S2 * p.N2 + n2) * sfa::DQK;
    const int ka = kb * 64 + r0, kb8 = ka + 8;
    const int k0 = ka < p.S2 ? ka : -1, k8 = kb8 < p.S2 ? kb8 : -1;
    if (det) {
#pragma unroll
        for (int i = 0; i < NDKV; i++) sfa::add_box<1>(p, dkv[i], k0, k8, lane, base, (C == 0 ? (i < 4 ? i : 8) : 4 + i) * 64, fs);
    } else {
#pragma unroll
        for (int i = 0; i < NDKV; i++) sfa::add_box<0>(p, dkv[i], k0, k8, lane, base, (C == 0 ? (i < 4 ? i : 8) : 4 + i) * 64, fs);
    }
}

template <typename T, int HP>
__global__ void __launch_bounds__(384, 1) sfa_bwd_small_kernel(const __grid_constant__ Params p, const __grid_constant__ SmallLists L) {
    constexpr int TT = NR / HP;
    // CTA (list l, token window c): the visits of l whose token lies in [c W, (c + 1) W), W =
    // STEPS T tokens (a multiple of 32: the window's visits start at a word's prefix count).  The
    // grid runs list-fastest, so the CTAs resident at a time share one window and their dQ adds
    // stay within W x N1 x 576 accumulator rows that L2 holds (with chunks of the list instead,
    // concurrent CTAs hit rows all over the sequence: ncu on sfa15, DRAM-bound at 63 % of peak)
    const int64_t l = blockIdx.x;
    const int64_t wrow = l * L.s1w;
    const int w0 = (int)blockIdx.y * TT, w1 = w0 + TT;  // the window's first word, the next one's
    const int v0 = L.off[l] + (int)L.wpre[wrow + w0];
    const int vend = L.off[l] + (w1 < L.s1w ? (int)L.wpre[wrow + w1] : L.len[l]);
    if (v0 >= vend) return;  // no token of this window selects a key of the block
    const int v1 = min(vend, v0 + STEPS * TT);
    const int kb = (int)(l % L.nkb), n2 = (int)(l / L.nkb % p.N2), b = (int)(l / L.nkb / p.N2);

    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = hop::align1024(smem_raw);
    Sm s;
    s.k = sm + OFF_K;
    s.st = sm + OFF_ST;
    s.ds = sm + OFF_DS;
    s.misc = sm + OFF_MISC;
    s.full = reinterpret_cast<uint64_t *>(sm + OFF_BAR);
    s.empty = s.full + 2;
    uint64_t *kbar = s.full + 4;
    s.xdp = s.full + 5;
    s.xps = s.full + 6;
    s.rfree = s.full + 7;  // 8 barriers: the 64 bytes at OFF_BAR
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0), t = threadIdx.x & 127;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 2; i++) {
            hop::mbar_init(s.full + i, 128);
            hop::mbar_init(s.empty + i, 256);
        }
        hop::mbar_init(kbar, 128);
        for (int i = 5; i < 8; i++) hop::mbar_init(s.full + i, 128);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // ------------------------------------------------------------------ producer
        hop::setmaxnreg_dec<40>();
        sfa::kmaj_load_block<T, sfa::Mla>(s.k, kbar, p, b, n2, kb, __ldg(L.kused + l), t);
        const T *qb = static_cast<const T *>(p.q) + b * p.sq[0] + (int64_t)n2 * p.H * p.sq[2];
        const T *qrb = static_cast<const T *>(p.qr) + b * p.sqr[0] + (int64_t)n2 * p.H * p.sqr[2];
        const T *dob = static_cast<const T *>(p.dout) + b * p.sdo[0] + (int64_t)n2 * p.H * p.sdo[2];
        const int nsteps = (v1 - v0 + TT - 1) / TT;
        for (int it = 0; it < nsteps; it++) {
            const int st = it & 1;
            if (it >= 2) hop::mbar_wait(s.empty + st, ((it >> 1) - 1) & 1);
            unsigned char *sq = s.st + st * SQD, *ms = s.misc + st * MISC;
            const int vs = v0 + it * TT, ntok = min(TT, v1 - vs);
            // Q (9 boxes) and dO (8 boxes) rows th = tok * HP + h, 8 threads per row (128
            // contiguous bytes per row and instruction), 16 rows per pass: the row's token and
            // source pointers once per row, then 17 chunks at immediate offsets (ncu: the
            // per-chunk index arithmetic of a flat loop was the producer's main cost)
#pragma unroll
            for (int pass = 0; pass < 2; pass++) {
                const int th = (t >> 3) + 16 * pass, cc = t & 7, tok = th / HP, h = th % HP;
                const bool ok = tok < ntok && h < p.H;
                const int s1 = ok ? L.vtok[vs + tok] : 0;
                const T *qs = qb + (int64_t)s1 * p.sq[1] + (int64_t)h * p.sq[2] + cc * 8;
                const T *rs = qrb + (int64_t)s1 * p.sqr[1] + (int64_t)h * p.sqr[2] + cc * 8;
                const T *ds = dob + (int64_t)s1 * p.sdo[1] + (int64_t)h * p.sdo[2] + cc * 8;
                const uint32_t so = hop::sw128(th, cc);
#pragma unroll
                for (int i = 0; i < 8; i++) sfa::cp_async16(sq + i * RBOX + so, ok ? qs + i * 64 : qb, ok ? 16 : 0);
                sfa::cp_async16(sq + 8 * RBOX + so, ok ? rs : qb, ok ? 16 : 0);
#pragma unroll
                for (int i = 0; i < 8; i++) sfa::cp_async16(sq + ST_DO + i * RBOX + so, ok ? ds + i * 64 : qb, ok ? 16 : 0);
            }
            // multiplicities [TT][64] (128 bytes per visit), LSE2 and Delta per token-head row
            sfa::kmaj_step_rows<HP>(ms, MS_CNT, MS_LSE, MS_DELTA, p, L, b, n2, 0, vs, ntok, t);
            hop::cp_async_arrive_noinc(s.full + st);
        }
        sfa::cp_async_wait<0>();
        return;
    }

    // ------------------------------------------------------------------------------- consumers
    hop::setmaxnreg_inc<232>();
    hop::mbar_wait(kbar, 0);
    if (wg == 1) consume<T, HP, 0>(p, L, s, b, n2, kb, v0, v1);
    else consume<T, HP, 1>(p, L, s, b, n2, kb, v0, v1);
}

template <typename T, int HP> cudaError_t launch_main(const Params &p, const SmallLists &L, int nl, cudaStream_t st) {
    static unsigned long long done = 0;
    const cudaError_t e = hop::set_smem(sfa_bwd_small_kernel<T, HP>, SMEM, &done);
    if (e != cudaSuccess) return e;
    constexpr int TT = NR / HP;
    const int chunks = (p.S1 + STEPS * TT - 1) / (STEPS * TT);  // a list holds at most S1 tokens
    sfa_bwd_small_kernel<T, HP><<<dim3((unsigned)nl, (unsigned)chunks), 384, SMEM, st>>>(p, L);
    return cudaGetLastError();
}

template <typename T> cudaError_t launch_all(const Params &p, const SmallLists &L, int shape, int bf16, cudaStream_t st) {
    const int nl = p.B * p.N2 * L.nkb;
    const int64_t rows = (int64_t)p.B * p.S1 * p.N2;
    const unsigned g_rows = (unsigned)((rows * 32 + 255) / 256);
    cudaError_t e = cudaMemsetAsync(L.bitmap, 0, (size_t)nl * L.s1w * 4, st);
    if (e != cudaSuccess) return e;
    const int rpw = 32 / rows_lanes(L.dv);  // rows_kernel's rows per warp
    rows_kernel<T><<<(unsigned)((((int64_t)p.B * p.S1 * p.N1 + rpw - 1) / rpw * 32 + 255) / 256), 256, 0, st>>>(p, L);
    touch_kernel<<<g_rows, 256, 0, st>>>(p, L);
    count_kernel<<<(unsigned)nl, 256, 0, st>>>(L);
    scan_kernel<<<1, 1024, 0, st>>>(L, nl);
    const int64_t nwords = (int64_t)nl * L.s1w;
    fill_kernel<<<(unsigned)((nwords + 255) / 256), 256, 0, st>>>(L, nwords);
    zero_mult_kernel<<<132 * 8, 256, 0, st>>>(L, nl);
    mult_kernel<<<g_rows, 256, 0, st>>>(p, L);
    used_kernel<<<(unsigned)nl, 256, 0, st>>>(L);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (shape != sfa::SHAPE_MLA) return spattn_sfa_bwd_kmaj_launch(&p, &L, bf16, shape, st);
    const int H = p.H;
    if (H <= 1) return launch_main<T, 1>(p, L, nl, st);
    if (H <= 2) return launch_main<T, 2>(p, L, nl, st);
    if (H <= 4) return launch_main<T, 4>(p, L, nl, st);
    if (H <= 8) return launch_main<T, 8>(p, L, nl, st);
    if (H <= 16) return launch_main<T, 16>(p, L, nl, st);
    return launch_main<T, 32>(p, L, nl, st);
}

}  // namespace

// Launcher used by sfa_host.cu: builds the lists and runs the main kernel, this file's for the
// Mla shape, sfa_bwd_kmaj.cu's for the others (the accumulators, the fixed-point scales and the
// list buffers of L are set; the dQ accumulator is zeroed).
extern "C" cudaError_t spattn_sfa_bwd_small_launch(const sfa::Params *p, const sfa::SmallLists *L, int is_bf16,
                                                   int shape, cudaStream_t st) {
    return is_bf16 ? launch_all<__nv_bfloat16>(*p, *L, shape, 1, st) : launch_all<__half>(*p, *L, shape, 0, st);
}
