// The union pass of the sfa forward at H = 4 .. 32 heads per key head (Mla shape): for each group
// of ug = 64 / H consecutive query tokens of one (b, n2), the 64-key blocks any of them selected
// and each token's selection in them, so that sfa_fwd.cu's union form (UN) can run the group as
// one 64-row tile over contiguous key blocks instead of ug per-token gathers.
//
// Why: causal top-k over contexts not much longer than K (the public suite's 4 / 8 / 16-head
// cases: K 1024-8192 of 2048-8192 keys) selects most keys each token can reach, so neighbouring
// tokens share nearly every block; the gather kernels then fetch each key ug times and (keys as
// MMA rows) compute at the copy roofline of 66-280 TFLOP/s, while a 64-row tile over shared
// blocks runs at the 64-head kernel's MMA rate times the group's density.
//
// A group goes to the union kernel when it repeats no selected key (the union's masks count a key
// once; an index repeated in a row is two softmax terms: the gather kernels keep those rows) and
// its density, selected keys / (blocks x 64 x ug), is at least `min_density` (sfa_host.cu's
// union_min_density: the gather kernels' rate at H over the union kernel's); else its count is -1
// and the gather kernels take its tokens.  Index values out of range are ignored here (the index
// check reports them and gates every write).
//
// Compaction (Params::ukey set): when the union's keys, packed 64 to a block, need fewer blocks
// than its contiguous 64-key blocks (the tokens' selections leave gaps inside blocks: causal top-k
// with K well under the reachable keys, sfa02's tail), the group gets the packed form: the key ids
// ascending and each token's bits at the packed positions; the density is then counted over the
// packed blocks.  The gather of a packed block costs what a contiguous one does (a 16-byte copy
// per key row and chunk either way).
#include "sfa_common.cuh"

namespace {

using sfa::Params;

// The bits of x at the set bits of m, packed to the low end in order (x86's pext; the
// parallel-suffix method of Hacker's Delight 7-4: six rounds, no loop over bits).
__device__ __forceinline__ unsigned long long compress64(unsigned long long x, unsigned long long m) {
    x &= m;
    unsigned long long mk = ~m << 1;
#pragma unroll
    for (int i = 0; i < 6; i++) {
        unsigned long long mp = mk ^ (mk << 1);
        mp ^= mp << 2;
        mp ^= mp << 4;
        mp ^= mp << 8;
        mp ^= mp << 16;
        mp ^= mp << 32;
        const unsigned long long mv = mp & m;
        m = (m ^ mv) | (mv >> (1 << i));
        const unsigned long long t = x & mv;
        x = (x ^ t) | (t >> (1 << i));
        mk &= ~mp;
    }
    return x;
}

// One CTA per group; the tokens' bitmaps over the key range in shared memory ([ug][nkw] words,
// nkw = ceil(S2 / 64); the host keeps ug * nkw * 8 within UNION_PLAN_SMEM).
// first_bad (optional): the index check folded in, as check_idx_kernel (sfa_host.cu) reports it: the
// smallest row-major position (((b S1 + s1) N2 + n2) K + slot) of a value < -1 or >= nblk.
// VL (the packed variable-length / paged backward): a group is ug consecutive packed tokens (B = 1,
// S1 = Tq), whatever sequences they belong to, and its key space is the key side's rows
// (p.vl.rows): each token's selected keys (sequence-local, limit and count from p.vl.tok; the
// values were checked before the call) become rows (packed: the sequence's first row + key;
// paged: the block table).  A group whose tokens belong to two sequences goes to the per-token
// kernel (cnt -1).  Tokens past cu_seqlens_q[B] select nothing.
template <bool VL>
__global__ void __launch_bounds__(256) sfa_union_plan_kernel(const __grid_constant__ Params p, float min_density,
                                                             int *cnt, int *lst, int *ukey, unsigned long long *msk,
                                                             unsigned long long *first_bad) {
    extern __shared__ unsigned long long bm[];
    __shared__ unsigned long long s_sel;
    __shared__ int s_dup, s_wsum[8], s_wnb[8];
    __shared__ int4 s_tk[16];  // VL: the group's tokens' p.vl.tok entries
    const int G = p.ug, nkw = ((VL ? p.vl.rows : p.S2) + 63) >> 6, tid = threadIdx.x, lane = tid & 31;
    const int grp = blockIdx.x, b = blockIdx.y / p.N2, n2 = blockIdx.y % p.N2;
    const int64_t gi = (int64_t)blockIdx.y * p.ungroups + grp;
    for (int i = tid; i < G * nkw; i += 256) bm[i] = 0ull;
    if (tid == 0) {
        s_sel = 0;
        s_dup = 0;
    }
    __syncthreads();
    unsigned long long sel = 0;
    int dup = 0;
    const int ntok = min(G, p.S1 - grp * G);
    if (VL && tid < G) s_tk[tid] = tid < ntok ? __ldg(p.vl.tok + grp * G + tid) : make_int4(-1, 0, 0, -1);
    if (VL) {
        __syncthreads();
        // a group whose tokens belong to two sequences is left to the per-token kernel: a
        // non-finite value of one sequence must not reach another's gradients through the
        // union's 0 * NaN products (spattn.h); such groups are at most B - 1
        int sq = -1;
        bool mixed = false;
        for (int tt = 0; tt < G; tt++) {
            const int x = s_tk[tt].x;
            if (x < 0) continue;
            mixed |= sq >= 0 && x != sq;
            sq = x;
        }
        if (mixed) {
            if (tid == 0) cnt[gi] = -1;
            return;
        }
    }
    const int32_t *row0 = p.idx + b * p.sidx[0] + (int64_t)grp * G * p.sidx[1] + n2 * p.sidx[2];
    unsigned long long bad = ~0ull;  // this thread's first bad position
    // bits [r0, r0 + n) of token tt's bitmap (n <= 64: up to three 32-bit words; VL rows need not
    // start at a multiple of the block size)
    auto set_range = [&](int tt, long long r0, int n) {
        unsigned *h = reinterpret_cast<unsigned *>(bm + tt * nkw);
        while (n > 0) {
            const int o = (int)(r0 & 31), m = min(n, 32 - o);
            const unsigned bits = (m == 32 ? ~0u : (1u << m) - 1) << o;
            dup |= (atomicOr(h + (r0 >> 5), bits) & bits) != 0;
            r0 += m;
            n -= m;
        }
    };
    // selected block bi (slot e) of token tt into its bitmap
    auto add = [&](int tt, int e, int bi) {
        if constexpr (VL) {
            const int4 tk = s_tk[tt];
            if (tk.x < 0 || bi < 0) return;
            const long long k0 = (long long)bi << p.log2sbs, kmax = min((long long)tk.z - 1, (long long)tk.w);
            if (k0 > kmax) return;
            int n = (int)min((long long)p.sbs, kmax - k0 + 1);
            sel += (unsigned long long)n;
            if (!p.vl.table) {
                set_range(tt, (long long)tk.y + k0, n);
                return;
            }
            // paged: the run split at page ends (a page id out of range: a table the checks
            // refused; masked here so nothing outside the bitmap is touched)
            const long long ps = p.vl.page_size;
            long long k = k0;
            while (n > 0) {
                const long long slot = k / ps, off = k - slot * ps;
                const int m = (int)min((long long)n, ps - off);
                const int pg = __ldg(p.vl.table + (int64_t)tk.x * p.vl.tab_s0 + slot * p.vl.tab_s1);
                if ((unsigned)pg < (unsigned)p.vl.num_pages) set_range(tt, (long long)pg * ps + off, m);
                k += m;
                n -= m;
            }
            return;
        }
        if (bi < -1 || bi >= p.nblk) {
            const unsigned long long r = ((unsigned long long)b * p.S1 + grp * G + tt) * p.N2 + n2;
            bad = min(bad, r * (unsigned long long)p.K + (unsigned long long)e);
        }
        if (bi < 0 || bi >= p.nblk) return;
        const long long lim = p.mode == 3 ? (long long)p.S2 - p.S1 + grp * G + tt : p.S2 - 1;
        const long long k0 = (long long)bi << p.log2sbs, kmax = min((long long)p.S2 - 1, lim);
        if (k0 > kmax) return;
        // sbs <= 64, a power of two: the block's keys lie in one 64-bit word, set through its
        // 32-bit halves (a 64-bit atomicOr on shared memory compiles to a compare-and-swap loop,
        // which the many threads setting bits of one word made the plan's main cost: ncu, sfa01,
        // 32 us against the index check's 7)
        const int n = (int)min((long long)p.sbs, kmax - k0 + 1);
        unsigned *h = reinterpret_cast<unsigned *>(bm + tt * nkw + (k0 >> 6)) + ((k0 >> 5) & 1);
        auto set = [&](unsigned *a, unsigned bits) { dup |= (atomicOr(a, bits) & bits) != 0; };
        if (n > 32) {  // sbs 64: the whole low half, then the high one
            set(h, ~0u);
            set(h + 1, n == 64 ? ~0u : (1u << (n - 32)) - 1);
        } else {
            set(h, (n == 32 ? ~0u : (1u << n) - 1) << (k0 & 31));
        }
        sel += (unsigned long long)n;
    };
    if (p.sidx[3] == 1 && (p.K & 3) == 0 && (p.sidx[1] & 3) == 0 && ((uintptr_t)row0 & 15) == 0) {
        // the group's rows as one range of 16-byte chunks, four loads in flight per thread before
        // any use (with one 4-byte load per step the loads serialise behind the atomics)
        const int per = p.K >> 2, total = ntok * per;
        for (int x0 = tid; x0 < total; x0 += 1024) {
            int4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int x = x0 + u * 256, tt = x / per;
                v[u] = x < total ? __ldg(reinterpret_cast<const int4 *>(row0 + tt * p.sidx[1]) + (x - tt * per))
                                 : make_int4(-1, -1, -1, -1);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int x = x0 + u * 256, tt = min(x / per, G - 1), e = (x - tt * per) * 4;
                add(tt, e, v[u].x);
                add(tt, e + 1, v[u].y);
                add(tt, e + 2, v[u].z);
                add(tt, e + 3, v[u].w);
            }
        }
    } else {
        for (int tt = 0; tt < ntok; tt++)
            for (int e = tid; e < p.K; e += 256) add(tt, e, __ldg(p.idx + b * p.sidx[0] + (int64_t)(grp * G + tt) * p.sidx[1] + n2 * p.sidx[2] + (int64_t)e * p.sidx[3]));
    }
    for (int x = 16; x > 0; x >>= 1) {
        sel += __shfl_xor_sync(0xffffffffu, sel, x);
        dup |= __shfl_xor_sync(0xffffffffu, dup, x);
        bad = min(bad, __shfl_xor_sync(0xffffffffu, bad, x));
    }
    if (first_bad && lane == 0 && bad != ~0ull) atomicMin(first_bad, bad);
    if (lane == 0) {
        atomicAdd(&s_sel, sel);
        if (dup) atomicOr(&s_dup, 1);
    }
    __syncthreads();
    // The union's words (kept in shared memory when compaction is possible), how many are not
    // empty (blocks of the plain form) and their set bits (keys of the compacted form); each
    // thread a run of `per` words, its first position the block's exclusive scan of the counts
    unsigned long long *uw = bm + G * nkw;                 // [nkw] (compacting only)
    int *pre = reinterpret_cast<int *>(uw + nkw);          // [nkw] first position of word w
    const bool cmp_ok = ukey != nullptr;
    const int per = (nkw + 255) / 256, wa = min(nkw, tid * per), wb = min(nkw, wa + per);
    int nb = 0, pc = 0;
    for (int w = wa; w < wb; w++) {
        unsigned long long a = 0;
        for (int tt = 0; tt < G; tt++) a |= bm[tt * nkw + w];
        if (cmp_ok) uw[w] = a;
        nb += a != 0;
        pc += __popcll(a);
    }
    int incl = pc;
    for (int x = 1; x < 32; x <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, x);
        if (lane >= x) incl += y;
    }
    for (int x = 16; x > 0; x >>= 1) nb += __shfl_xor_sync(0xffffffffu, nb, x);
    if (lane == 31) s_wsum[tid >> 5] = incl;
    if (lane == 0) s_wnb[tid >> 5] = nb;
    __syncthreads();
    int excl = incl - pc, NB = 0, U = 0;
    for (int x = 0; x < 8; x++) {
        excl += x < (tid >> 5) ? s_wsum[x] : 0;
        U += s_wsum[x];
        NB += s_wnb[x];
    }
    // compacted: ceil(U / 64) blocks of the union's keys, when that is fewer than the plain form's
    const int NBC = (U + 63) >> 6;
    // (packing pays for its plan work when it saves at least an eighth of the blocks)
    const bool cmp = cmp_ok && NBC <= NB - max(1, NB >> 3);
    const int NBF = cmp ? NBC : NB;
    const bool take = !s_dup && NBF <= p.ucap && (double)s_sel >= (double)min_density * NBF * 64.0 * G;
    if (!take) {
        if (tid == 0) cnt[gi] = -1;
        return;
    }
    if (cmp) {
        int *keys = ukey + gi * p.ucap * 64;
        unsigned long long *m = msk + gi * p.ucap * G;
        for (int i = tid; i < NBC * G; i += 256) m[i] = 0ull;
        for (int i = U + tid; i < NBC * 64; i += 256) keys[i] = -1;
        int pos = excl;  // each thread's words: their first positions
        for (int w = wa; w < wb; w++) {
            pre[w] = pos;
            pos += __popcll(uw[w]);
        }
        __syncthreads();  // masks zeroed (global, same block), pre[] complete
        // key ids: a warp per word, lane l its bits l and l + 32, at their packed positions
        const unsigned lt = (1u << lane) - 1;
        for (int w = tid >> 5; w < nkw; w += 8) {
            const unsigned long long a = uw[w];
            const unsigned lo = (unsigned)a, hi = (unsigned)(a >> 32);
            const int p0 = pre[w];
            if ((lo >> lane) & 1) keys[p0 + __popc(lo & lt)] = (w << 6) + lane;
            if ((hi >> lane) & 1) keys[p0 + __popc(lo) + __popc(hi & lt)] = (w << 6) + 32 + lane;
        }
        // masks: a thread per (word, token), the token's bits compressed by the union word (each
        // set bit of the union in order: bit n of the result), ORed into the one or two packed
        // blocks the word's keys fall in
        for (int x = tid; x < nkw * G; x += 256) {
            const int w = x / G, tt = x - w * G;
            const unsigned long long tw = bm[tt * nkw + w];
            if (!tw) continue;
            const unsigned long long c = compress64(tw, uw[w]);
            const int p0 = pre[w], blk = p0 >> 6, o = p0 & 63;
            atomicOr(m + (int64_t)blk * G + tt, c << o);
            if (o && (c >> (64 - o))) atomicOr(m + (int64_t)(blk + 1) * G + tt, c >> (64 - o));
        }
        if (tid == 0) cnt[gi] = NBC | sfa::UCOMPACT;
        return;
    }
    if (tid >= 32) return;
    // warp 0: the union's blocks in ascending order with the tokens' words
    int off = 0;
    for (int w0 = 0; w0 < nkw; w0 += 32) {
        const int w = w0 + lane;
        unsigned long long a = 0;
        if (w < nkw)
            for (int tt = 0; tt < G; tt++) a |= bm[tt * nkw + w];
        const unsigned m = __ballot_sync(0xffffffffu, a != 0);
        if (a) {
            const int64_t pos = gi * p.ucap + off + __popc(m & ((1u << lane) - 1));
            lst[pos] = w;
            for (int tt = 0; tt < G; tt++) msk[pos * G + tt] = bm[tt * nkw + w];
        }
        off += __popc(m);
    }
    if (lane == 0) cnt[gi] = off;
}

}  // namespace

// Launcher used by sfa_host.cu (p's union fields bound to the call's union workspace: the plan
// writes the counts, lists, masks and packed keys the union kernels then read through p).
// p->vl.tok set: the varlen form (key-side rows; no folded index check: first_bad must be NULL).
extern "C" cudaError_t spattn_sfa_union_plan_launch(const sfa::Params *p, float min_density,
                                                    unsigned long long *first_bad, cudaStream_t st) {
    int *cnt = const_cast<int *>(p->ucnt), *lst = const_cast<int *>(p->ublk), *ukey = const_cast<int *>(p->ukey);
    unsigned long long *msk = const_cast<unsigned long long *>(p->umask);
    const bool vl = p->vl.tok != nullptr;
    const size_t nkw = ((vl ? p->vl.rows : p->S2) + 63) / 64, smem = (p->ug + (ukey ? 1 : 0)) * nkw * 8 + (ukey ? nkw * 4 : 0);
    auto kern = vl ? sfa_union_plan_kernel<true> : sfa_union_plan_kernel<false>;
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    dim3 grid((unsigned)p->ungroups, (unsigned)(p->B * p->N2));
    kern<<<grid, 256, smem, st>>>(*p, min_density, cnt, lst, ukey, msk, vl ? nullptr : first_bad);
    return cudaGetLastError();
}
