// Schedules of the block-sparse attention kernels, built on the device from the uint8 block
// mask (no token-level mask is ever materialized).  One warp per row of the schedule; each
// lane classifies one tile (empty / full / partial) by reading the mask blocks the tile
// overlaps, and a ballot compacts the non-empty tiles in order.
#include <limits.h>

#include <cub/block/block_scan.cuh>

#include "bsa_launch.h"

// Classifies the tile rows [r0, r1] x cols [c0, c1] (inclusive, clamped to the tensor) of
// mask head (b, h): 0 empty, 1 every pair attended, 2 some pairs attended.
__device__ __forceinline__ int bsa_classify(const bsa_mask_view &m, int b, int h, int r0, int r1, int c0, int c1,
                                            int bx, int by) {
    const uint8_t *base = m.p + (long long)b * m.s0 + (long long)h * m.s1;
    int any = 0, all = 1;
    for (int rb = r0 / bx; rb <= r1 / bx; rb++)
        for (int cb = c0 / by; cb <= c1 / by; cb++) {
            int v = __ldg(base + (long long)rb * m.s2 + (long long)cb * m.s3) != 0;
            any |= v;
            all &= v;
        }
    return any ? (all ? 1 : 2) : 0;
}

template <bool VL>
__global__ void bsa_sched_q_kernel(const bsa_params p, int bm, int bn, int nqt, int nkt, int *cnt, int *list) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (long long)p.B * p.N * nqt) return;
    const int m = (int)(row % nqt), bn_ = (int)(row / nqt), b = bn_ / p.N, n = bn_ % p.N;
    int vSq = 0, vSkv = 0, vnk = 0;
    if constexpr (VL) {  // sequence b's lengths; tiles past its queries and bad prefix sums: empty
        const int4 sq = p.vl.seq[b];
        vSq = sq.y;
        vSkv = sq.w;
        if (*p.vl.err != ~0ull || m * bm >= vSq) {
            if (lane == 0) cnt[row] = 0;
            return;
        }
        vnk = (vSkv + bn - 1) / bn;  // <= nkt: Skv_b <= max_seqlen_kv (checked)
    }
    const auto Sq = [&]() { return bsa_len<VL>(vSq, p.Sq); };
    const auto Skv = [&]() { return bsa_len<VL>(vSkv, p.Skv); };
    const auto nk = [&]() { return bsa_len<VL>(vnk, nkt); };
    const int r0 = m * bm, r1 = min(Sq(), r0 + bm) - 1;
    int out = 0;
    int *dst = list + row * nkt;
    for (int t0 = 0; t0 < nk(); t0 += 32) {
        const int t = t0 + lane;
        int code = 0;
        if (t < nk()) {
            const int c0 = t * bn, c1 = min(Skv(), c0 + bn) - 1;
            code = bsa_classify(p.mask, b, n, r0, r1, c0, c1, p.bx, p.by);
            if (code == 1 && c0 + bn > Skv()) code = 2;  // edge tile: keys past Skv are masked
        }
        const unsigned bal = __ballot_sync(0xffffffffu, code != 0);
        if (code) dst[out + __popc(bal & ((1u << lane) - 1))] = t * 2 + (code == 2);
        out += __popc(bal);
    }
    if (lane == 0) cnt[row] = out;
}

// Key-major schedule of the Hopper backward: per (b, kv head, key tile of bn keys) the (group
// head, query tile) pairs e = hg * nqt + m that hit it, as e * 16 + code1 * 4 + code0 where
// code_h (0 empty, 1 full, 2 partial) classifies the tile's key half h (bn / 2 keys each; one
// consumer warpgroup per half, which skips an empty half's GEMMs).
// VL: sequence b's lengths (key tiles past its keys and bad prefix sums: empty rows).
template <bool VL>
__global__ void bsa_sched_k_kernel(const bsa_params p, int bm, int bn, int nqt, int nkt, int *cnt, int *list) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (long long)p.B * p.Nkv * nkt) return;
    const int t = (int)(row % nkt), bh = (int)(row / nkt), b = bh / p.Nkv, hk = bh % p.Nkv;
    const int hb = bn / 2, c0 = t * bn;
    int vSq = 0, vSkv = 0;
    if constexpr (VL) {
        const int4 sq = p.vl.seq[b];
        vSq = sq.y;
        vSkv = sq.w;
        if (*p.vl.err != ~0ull || c0 >= vSkv) {
            if (lane == 0) cnt[row] = 0;
            return;
        }
    }
    const auto Sq = [&]() { return bsa_len<VL>(vSq, p.Sq); };
    const auto Skv = [&]() { return bsa_len<VL>(vSkv, p.Skv); };
    const int total = p.G * nqt;
    int out = 0;
    int *dst = list + row * (long long)total;
    for (int e0 = 0; e0 < total; e0 += 32) {
        const int e = e0 + lane;
        int code = 0;
        if (e < total) {
            const int hg = e / nqt, m = e % nqt;
            const int r0 = m * bm, r1 = min(Sq(), r0 + bm) - 1;
            // rows past Sq carry lse2 = +inf (P = 0) and keys past Skv are never written: no edge marks
            if (!VL || r0 < Sq())  // VL: query tiles past the sequence hit nothing
                for (int h = 0; h < 2; h++) {
                    const int k0 = c0 + h * hb, k1 = min(Skv(), k0 + hb) - 1;
                    if (k0 < Skv()) code |= bsa_classify(p.mask, b, hk * p.G + hg, r0, r1, k0, k1, p.bx, p.by) << (2 * h);
                }
        }
        const unsigned bal = __ballot_sync(0xffffffffu, code != 0);
        if (code) dst[out + __popc(bal & ((1u << lane) - 1))] = e * 16 + code;
        out += __popc(bal);
    }
    if (lane == 0) cnt[row] = out;
}

// Forward schedule: per (b, n, query tile of bm rows) the attended key chunks of u keys, as
// int2 {chunk * 2 + partial, row bits}; with bsa_fwd90_rowbits, bit r of the row bits is the
// mask bit of the tile's block row r0 / bx + r for the chunk's block column (one column: u
// divides by), else 0 (the kernel reads the mask per token).  Edge chunks (past Skv) are partial.
// VL (packed variable-length batch): Sq / Skv are sequence b's own (p.vl.seq; block rows and
// columns restart at its first token); tiles past its queries, and every tile when the prefix
// sums are bad (p.vl.err), get count -1: no CTA needs to run for them (bsa_order_kernel puts
// them last and the forward's grid stops before them).  The list stride nkt covers max_seqlen_kv.
template <bool VL>
__global__ void bsa_sched_fwd_kernel(const bsa_params p, int bm, int u, int nqt, int nkt, int rowbits, int *cnt,
                                     int2 *list) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= (long long)p.B * p.N * nqt) return;
    const int m = (int)(row % nqt), bn_ = (int)(row / nqt), b = bn_ / p.N, n = bn_ % p.N;
    int vSq = 0, vSkv = 0, vnk = 0;
    if constexpr (VL) {
        const int4 sq = p.vl.seq[b];
        vSq = sq.y;
        vSkv = sq.w;
        if (*p.vl.err != ~0ull || m * bm >= vSq) {
            if (lane == 0) cnt[row] = -1;
            return;
        }
        vnk = (vSkv + u - 1) / u;  // <= nkt (the list stride): Skv <= max_seqlen_kv (checked)
    }
    // dense: p.Sq, p.Skv and nkt read at each use, as before VL
    const auto Sq = [&]() { return bsa_len<VL>(vSq, p.Sq); };
    const auto Skv = [&]() { return bsa_len<VL>(vSkv, p.Skv); };
    const auto nk = [&]() { return bsa_len<VL>(vnk, nkt); };
    const int r0 = m * bm, r1 = min(Sq(), r0 + bm) - 1, rb0 = r0 / p.bx, rb1 = r1 / p.bx;
    const unsigned all = rb1 - rb0 >= 31 ? 0xffffffffu : (2u << (rb1 - rb0)) - 1;
    const uint8_t *mb = p.mask.p + (long long)b * p.mask.s0 + (long long)n * p.mask.s1;
    int out = 0;
    int2 *dst = list + row * nkt;
    for (int t0 = 0; t0 < nk(); t0 += 32) {
        const int t = t0 + lane;
        int code = 0;
        unsigned bits = 0;
        if (t < nk()) {
            const int c0 = t * u, c1 = min(Skv(), c0 + u) - 1;
            if (rowbits) {
                const long long cb = (long long)(c0 / p.by) * p.mask.s3;
                for (int rb = rb0; rb <= rb1; rb++) bits |= (unsigned)(__ldg(mb + (long long)rb * p.mask.s2 + cb) != 0) << (rb - rb0);
                code = bits == 0 ? 0 : bits == all ? 1 : 2;
            } else {
                code = bsa_classify(p.mask, b, n, r0, r1, c0, c1, p.bx, p.by);
            }
            if (code == 1 && c0 + u > Skv()) code = 2;
        }
        const unsigned bal = __ballot_sync(0xffffffffu, code != 0);
        if (code) dst[out + __popc(bal & ((1u << lane) - 1))] = make_int2(t * 2 + (code == 2), (int)bits);
        out += __popc(bal);
    }
    if (lane == 0) cnt[row] = out;
}

extern "C" cudaError_t spattn_bsa_launch_sched_fwd(const bsa_params *p, int bm, int u, int *cnt, int2 *list,
                                                   cudaStream_t st) {
    const int nqt = (p->Sq + bm - 1) / bm, nkt = (p->Skv + u - 1) / u;
    const long long rows = (long long)p->B * p->N * nqt;
    const unsigned grid = (unsigned)((rows + 3) / 4);
    const int rowbits = bsa_fwd90_rowbits(p->bx, p->by, u);
    if (p->vl.seq) bsa_sched_fwd_kernel<true><<<grid, 128, 0, st>>>(*p, bm, u, nqt, nkt, rowbits, cnt, list);
    else bsa_sched_fwd_kernel<false><<<grid, 128, 0, st>>>(*p, bm, u, nqt, nkt, rowbits, cnt, list);
    return cudaGetLastError();
}

// ---- packed variable-length forward / backward: prefix-sum checks, sequence table, per-sequence TMA maps
// One kernel, before anything that reads the lengths:
//   * the prefix sums against the CPU's rules (spattn_seqs_check_values: cu[0] = 0, non-
//     decreasing, lengths <= max_seqlen, cu[B] <= T).  The first violation in the CPU's order is
//     kept in *err by atomicMin over key = ((side * (B + 2) + pos) << 2) | kind (side 0 q, 1 kv;
//     pos 0 the start, 1 + b sequence b, B + 1 the end; kind 0 start != 0, 1 decreasing, 2 longer
//     than max_seqlen, 3 past T).  *err is ~0 before (memset by the host); the schedule and the
//     forward kernel write nothing unless it stays ~0;
//   * seq[b] = {cu_q[b], Sq_b, cu_kv[b], Skv_b};
//   * per sequence and tensor (one warp each) a copy of the call's TMA map with the base moved to
//     the sequence's first row and the row count set to its length, so that the TMA engine
//     zero-fills every row past the sequence's end: keys and values of the next sequence, or rows
//     past cu[B] (which may hold anything, NaN included), never reach a product (a masked key's
//     value still enters P V as 0 * v).  Modified in shared memory and copied out with the
//     tensormap release fence (the pattern PTX documents for device-side maps); the forward
//     kernel acquires each map before its first TMA.
constexpr int kPrepThreads = 256;

// a.nmaps = 4 adds a map of query rows: the backward's dO, the forward's o (tm [B][4] = q, k, v,
// dO / o); 6 (packed backward) two of key rows: dk, dv (tm [B][6] = q, k, v, dO, dk, dv).
__global__ void __launch_bounds__(kPrepThreads) bsa_vl_prep_kernel(const __grid_constant__ CUtensorMap tq,
                                                                   const __grid_constant__ CUtensorMap tk,
                                                                   const __grid_constant__ CUtensorMap tv,
                                                                   const __grid_constant__ CUtensorMap tdo,
                                                                   const __grid_constant__ CUtensorMap tdk,
                                                                   const __grid_constant__ CUtensorMap tdv,
                                                                   const bsa_vl_prep_args a) {
    __shared__ alignas(128) CUtensorMap stage[kPrepThreads / 32];
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long nthr = (long long)gridDim.x * blockDim.x;
    const long long B = a.B, P = B + 2;
    for (long long x = tid; x < 2 * P; x += nthr) {
        const int side = (int)(x / P);
        const long long pos = x % P;
        const int *cu = side ? a.cu_kv : a.cu_q;
        const long long st = side ? a.st_kv : a.st_q;
        int kind = -1;
        if (pos == 0) {
            if (cu[0] != 0) kind = 0;
        } else if (pos <= B) {
            const long long s = cu[(pos - 1) * st], e = cu[pos * st];
            if (e < s) kind = 1;
            else if (e - s > (side ? a.max_kv : a.max_q)) kind = 2;
        } else if ((side == 0 || a.page_size == 0) && cu[B * st] > (side ? a.Tkv : a.Tq)) {  // pages: no bound
            kind = 3;
        }
        if (kind >= 0) atomicMin(a.err, (unsigned long long)(((side * P + pos) << 2) | kind));
    }
    for (long long b = tid; b < B; b += nthr) {
        const int q0 = a.cu_q[b * a.st_q], k0 = a.cu_kv[b * a.st_kv];
        a.seq[b] = make_int4(q0, a.cu_q[(b + 1) * a.st_q] - q0, k0, a.cu_kv[(b + 1) * a.st_kv] - k0);
    }
    // one warp per (sequence, tensor); the condition is warp-uniform (the copy-out is .aligned)
    const long long w = tid >> 5;
    const int lane = threadIdx.x & 31;
    const int nm = a.nmaps;
    if (!a.tm || w >= nm * B) return;  // no maps for the reference path
    const long long b = w / nm;
    const int which = (int)(w % nm);
    const CUtensorMap *tmpl = which == 0 ? &tq : which == 1 ? &tk : which == 2 ? &tv : which == 3 ? &tdo : which == 4 ? &tdk : &tdv;
    CUtensorMap *sm = &stage[threadIdx.x >> 5];
    if (lane < 16) reinterpret_cast<uint2 *>(sm)[lane] = reinterpret_cast<const uint2 *>(tmpl)[lane];
    __syncwarp();
    if (lane == 0) {
        const bool qside = which == 0 || which == 3;  // q and dO / o: query rows (dk, dv: key rows)
        const int *cu = qside ? a.cu_q : a.cu_kv;
        const long long st = qside ? a.st_q : a.st_kv;
        const long long r0 = cu[b * st], len = (long long)cu[(b + 1) * st] - r0;
        const uint32_t s = (uint32_t)__cvta_generic_to_shared(sm);
        // bad prefix sums give a meaningless map; nothing uses it then (*err gates every reader)
        if (a.page_size > 0 && !qside) {
            // paged k / v: the pool's map (base kept) with dimension 2, the rows of a page, cut to
            // the rows of the sequence's last page: the forward loads that page's boxes through this
            // map, so rows past the sequence's last key (which may hold anything) read as 0
            const long long ps = a.page_size;
            const unsigned rows = (unsigned)(len < 1 ? 1 : len - (len - 1) / ps * ps);  // 1 .. page_size
            asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 2, %1;" ::"r"(s), "r"(rows)
                         : "memory");
        } else {
            const unsigned long long base = (unsigned long long)(a.base[which] + r0 * a.row_bytes[which]);
            const unsigned rows = (unsigned)(len < 1 ? 1 : len > 0x7fffffff ? 0x7fffffff : len);  // dims >= 1
            asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;" ::"r"(s), "l"(base)
                         : "memory");
            asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %1;" ::"r"(s), "r"(rows)
                         : "memory");
        }
    }
    CUtensorMap *dst = a.tm + nm * b + which;
    // the copy below reads its destination as it writes it (compute-sanitizer initcheck: ~465K
    // uninitialised 4-byte reads per quick check in a fresh workspace); a plain store of the 128
    // bytes first (one per lane, ordered before the copy by the warp barrier) makes it defined
    reinterpret_cast<uint32_t *>(dst)[lane] = 0u;
    __syncwarp();
    asm volatile(
        "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;" ::"l"(
            dst),
        "r"((uint32_t)__cvta_generic_to_shared(sm))
        : "memory");
}

extern "C" cudaError_t spattn_bsa_launch_vl_prep(const CUtensorMap *tmpl, const bsa_vl_prep_args *a, cudaStream_t st) {
    // threads: one warp per map (nmaps * B warps) and at least one per prefix-sum check (grid-stride)
    const long long maps = (long long)a->B * a->nmaps * 32, checks = 2 * ((long long)a->B + 2);
    const long long blocks = ((maps > checks ? maps : checks) + kPrepThreads - 1) / kPrepThreads;
    bsa_vl_prep_kernel<<<(unsigned)blocks, kPrepThreads, 0, st>>>(tmpl[0], tmpl[1], tmpl[2], tmpl[a->nmaps > 3 ? 3 : 0],
                                                                  tmpl[a->nmaps > 5 ? 4 : 0], tmpl[a->nmaps > 5 ? 5 : 0], *a);
    return cudaGetLastError();
}

// ---- paged forward: the block table (spattn_bsa_launch_vl_table in bsa_launch.h) -----------------
// One CTA per table row (grid-stride over rows; uniform per CTA, so the barriers are safe).  The
// row's used slots are those of ceil(Skv_b / page_size) pages; capacity first (a row needing more
// than max_pages slots is not read), then each slot's id range, then repeats: a bitmap of the
// row's id range [lo, hi] in shared memory, kVlTabBits ids per round (one round unless the ids
// spread over more than 2^18 pages); only when a repeat exists is the first repeating slot
// searched (O(need^2), refused calls only), so the key names the slot the CPU names.  Lengths
// from bad prefix sums give any row any verdict: the prefix-sum key is smaller and wins.
constexpr int kVlTabBits = 8 * 32768;  // ids per round (32 KB of dynamic shared memory)
constexpr int kVlTabThreads = 256;

__global__ void __launch_bounds__(kVlTabThreads) bsa_vl_table_kernel(const bsa_vl_table_args a) {
    extern __shared__ unsigned tab_bits[];
    __shared__ int s_lo, s_hi;
    const unsigned long long W = 2ull * (unsigned long long)a.max_pages + 3;
    for (long long r = blockIdx.x; r < a.B; r += gridDim.x) {
        const unsigned long long rk = BSA_VL_TAB_KEY + (unsigned long long)r * W;
        const long long len = (long long)a.cu_kv[(r + 1) * a.st_kv] - a.cu_kv[r * a.st_kv];
        const long long need = len > 0 ? (len + a.page_size - 1) / a.page_size : 0;
        if (need > a.max_pages) {
            if (threadIdx.x == 0) atomicMin(a.err, rk);
            continue;
        }
        const int *row = a.table + r * a.tab_s0;
        if (threadIdx.x == 0) {
            s_lo = INT_MAX;
            s_hi = -1;
        }
        __syncthreads();
        for (long long j = threadIdx.x; j < need; j += blockDim.x) {
            const int pg = row[j * a.tab_s1];
            if (pg < 0 || pg >= a.num_pages) {
                atomicMin(a.err, rk + (unsigned long long)(j + 1) * 2);
            } else {
                atomicMin(&s_lo, pg);
                atomicMax(&s_hi, pg);
            }
        }
        __syncthreads();
        const long long lo = s_lo, hi = s_hi;
        int dup = 0;
        for (long long base = lo; base <= hi && !dup; base += kVlTabBits) {
            for (int i = threadIdx.x; i < kVlTabBits / 32; i += blockDim.x) tab_bits[i] = 0u;
            __syncthreads();
            int mine = 0;
            for (long long j = threadIdx.x; j < need; j += blockDim.x) {
                const long long pg = row[j * a.tab_s1];
                if (pg >= base && pg < base + kVlTabBits && pg <= hi) {  // in range: lo >= 0, hi < num_pages
                    const unsigned off = (unsigned)(pg - base), m = 1u << (off & 31);
                    if (atomicOr(&tab_bits[off >> 5], m) & m) mine = 1;
                }
            }
            dup = __syncthreads_or(mine);
        }
        if (dup)
            for (long long j = threadIdx.x; j < need; j += blockDim.x) {
                const int pg = row[j * a.tab_s1];
                if (pg < 0 || pg >= a.num_pages) continue;
                for (long long j2 = 0; j2 < j; j2++)
                    if (row[j2 * a.tab_s1] == pg) {
                        atomicMin(a.err, rk + (unsigned long long)(j + 1) * 2 + 1);
                        break;
                    }
            }
        __syncthreads();  // s_lo, s_hi and the bitmap are reused by the next row
    }
}

extern "C" cudaError_t spattn_bsa_launch_vl_table(const bsa_vl_table_args *a, cudaStream_t st) {
    if (a->B <= 0) return cudaSuccess;
    const long long g = a->B < 1024 ? a->B : 1024;
    bsa_vl_table_kernel<<<(unsigned)g, kVlTabThreads, kVlTabBits / 8, st>>>(*a);
    return cudaGetLastError();
}

extern "C" cudaError_t spattn_bsa_launch_sched_q(const bsa_params *p, int bm, int bn, int *cnt, int *list,
                                                 cudaStream_t st) {
    const int nqt = (p->Sq + bm - 1) / bm, nkt = (p->Skv + bn - 1) / bn;
    const long long rows = (long long)p->B * p->N * nqt;
    if (p->vl.seq) bsa_sched_q_kernel<true><<<(unsigned)((rows + 3) / 4), 128, 0, st>>>(*p, bm, bn, nqt, nkt, cnt, list);
    else bsa_sched_q_kernel<false><<<(unsigned)((rows + 3) / 4), 128, 0, st>>>(*p, bm, bn, nqt, nkt, cnt, list);
    return cudaGetLastError();
}

extern "C" cudaError_t spattn_bsa_launch_sched_k(const bsa_params *p, int bm, int bn, int *cnt, int *list,
                                                 cudaStream_t st) {
    const int nqt = (p->Sq + bm - 1) / bm, nkt = (p->Skv + bn - 1) / bn;
    const long long rows = (long long)p->B * p->Nkv * nkt;
    if (p->vl.seq) bsa_sched_k_kernel<true><<<(unsigned)((rows + 3) / 4), 128, 0, st>>>(*p, bm, bn, nqt, nkt, cnt, list);
    else bsa_sched_k_kernel<false><<<(unsigned)((rows + 3) / 4), 128, 0, st>>>(*p, bm, bn, nqt, nkt, cnt, list);
    return cudaGetLastError();
}

// Slots of the split key-major rows of the Hopper backward (bsa_launch.h): a scan of the
// candidate flags in row order, so which rows split does not depend on timing.
constexpr int kSlotThreads = 1024;
__global__ void __launch_bounds__(kSlotThreads) bsa_split_slots_kernel(const int *cnt, long long rows, int nkt,
                                                                      int chunk, int cap, int *slot) {
    using Scan = cub::BlockScan<int, kSlotThreads>;
    __shared__ typename Scan::TempStorage tmp;
    int base = 0;
    for (long long r0 = 0; r0 < rows; r0 += kSlotThreads) {
        const long long r = r0 + threadIdx.x;
        int cand = 0;
        if (r < rows && base < cap) {
            const int c = cnt[r], t = (int)(r % nkt);
            if (c > chunk) {
                int lo = INT_MAX;
                for (int d = -2; d <= 2; d++)
                    if (d && t + d >= 0 && t + d < nkt) lo = min(lo, cnt[r + d]);
                cand = lo == INT_MAX || 2ll * lo < c;
            }
        }
        int before, total;
        Scan(tmp).ExclusiveSum(cand, before, total);
        __syncthreads();  // tmp is reused by the next tile's scan
        if (r < rows) slot[r] = cand && base + before < cap ? base + before : -1;
        base += total;
    }
}

extern "C" cudaError_t spattn_bsa_launch_split_slots(const int *cnt, long long rows, int nkt, int chunk, int cap,
                                                     int *slot, cudaStream_t st) {
    bsa_split_slots_kernel<<<1, kSlotThreads, 0, st>>>(cnt, rows, nkt, chunk, cap, slot);
    return cudaGetLastError();
}

// Launch order of the forward's CTAs (and of the non-deterministic backward's, per_tile = 1): rows
// by decreasing tile count (ceil(cnt / per_tile)),
// so that the longest rows start first and the short ones fill the tail; rows of count -1 (a
// varlen forward's tiles past their sequence) come after all others, empty ones included.  A
// counting sort in one CTA: histogram, scan, placement.  Placement within a bin uses atomics: the order of equal
// rows varies, which changes nothing but the launch order (every row's result is computed by
// one CTA alone).
constexpr int kOrderBins = 4096, kOrderThreads = 1024;
__global__ void __launch_bounds__(kOrderThreads) bsa_order_kernel(const int *cnt, long long rows, int per_tile,
                                                                  int *order, int *ctr) {
    if (ctr && threadIdx.x < 2) ctr[threadIdx.x] = 0;
    using Scan = cub::BlockScan<int, kOrderThreads>;
    __shared__ int hist[kOrderBins];
    __shared__ typename Scan::TempStorage tmp;
    constexpr int PER = kOrderBins / kOrderThreads;
    for (int i = threadIdx.x; i < kOrderBins; i += kOrderThreads) hist[i] = 0;
    __syncthreads();
    auto bin = [&](long long r) {
        const int c = cnt[r], t = (c + per_tile - 1) / per_tile;
        return c < 0 ? kOrderBins - 1 : kOrderBins - 2 - min(t, kOrderBins - 2);  // heaviest in bin 0
    };
    for (long long r = threadIdx.x; r < rows; r += kOrderThreads) atomicAdd(&hist[bin(r)], 1);
    __syncthreads();
    int v[PER];
    for (int k = 0; k < PER; k++) v[k] = hist[threadIdx.x * PER + k];
    Scan(tmp).ExclusiveSum(v, v);
    __syncthreads();
    for (int k = 0; k < PER; k++) hist[threadIdx.x * PER + k] = v[k];
    __syncthreads();
    for (long long r = threadIdx.x; r < rows; r += kOrderThreads) order[atomicAdd(&hist[bin(r)], 1)] = (int)r;
}

extern "C" cudaError_t spattn_bsa_launch_order(const int *cnt, long long rows, int per_tile, int *order, int *ctr,
                                               cudaStream_t st) {
    bsa_order_kernel<<<1, kOrderThreads, 0, st>>>(cnt, rows, per_tile, order, ctr);
    return cudaGetLastError();
}
