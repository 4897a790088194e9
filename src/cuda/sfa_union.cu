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
#include "sfa_common.cuh"

namespace {

using sfa::Params;

// One CTA per group; the tokens' bitmaps over the key range in shared memory ([ug][nkw] words,
// nkw = ceil(S2 / 64); the host keeps ug * nkw * 8 within UNION_PLAN_SMEM).
// first_bad (optional): the index check folded in, as check_idx_kernel (sfa_host.cu) reports it: the
// smallest row-major position (((b S1 + s1) N2 + n2) K + slot) of a value < -1 or >= nblk.
__global__ void __launch_bounds__(256) sfa_union_plan_kernel(const __grid_constant__ Params p, float min_density,
                                                             int *cnt, int *lst, unsigned long long *msk,
                                                             unsigned long long *first_bad) {
    extern __shared__ unsigned long long bm[];
    __shared__ unsigned long long s_sel;
    __shared__ int s_dup, s_nb;
    const int G = p.ug, nkw = (p.S2 + 63) >> 6, tid = threadIdx.x, lane = tid & 31;
    const int grp = blockIdx.x, b = blockIdx.y / p.N2, n2 = blockIdx.y % p.N2;
    const int64_t gi = (int64_t)blockIdx.y * p.ungroups + grp;
    for (int i = tid; i < G * nkw; i += 256) bm[i] = 0ull;
    if (tid == 0) {
        s_sel = 0;
        s_dup = 0;
        s_nb = 0;
    }
    __syncthreads();
    unsigned long long sel = 0;
    int dup = 0;
    const int ntok = min(G, p.S1 - grp * G);
    const int32_t *row0 = p.idx + b * p.sidx[0] + (int64_t)grp * G * p.sidx[1] + n2 * p.sidx[2];
    unsigned long long bad = ~0ull;  // this thread's first bad position
    // selected block bi (slot e) of token tt into its bitmap
    auto add = [&](int tt, int e, int bi) {
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
    int nb = 0;
    for (int w = tid; w < nkw; w += 256) {
        unsigned long long a = 0;
        for (int tt = 0; tt < G; tt++) a |= bm[tt * nkw + w];
        nb += a != 0;
    }
    for (int x = 16; x > 0; x >>= 1) nb += __shfl_xor_sync(0xffffffffu, nb, x);
    if (lane == 0 && nb) atomicAdd(&s_nb, nb);
    __syncthreads();
    const int NB = s_nb;
    const bool take = !s_dup && NB <= p.ucap && (double)s_sel >= (double)min_density * NB * 64.0 * G;
    if (!take) {
        if (tid == 0) cnt[gi] = -1;
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

// Launcher used by sfa_host.cu (p->ug, p->lg2h, p->ungroups, p->ucap set; the outputs are the
// call's union workspace).
extern "C" cudaError_t spattn_sfa_union_plan_launch(const sfa::Params *p, float min_density, int *cnt, int *lst,
                                                    unsigned long long *msk, unsigned long long *first_bad,
                                                    cudaStream_t st) {
    const size_t smem = (size_t)p->ug * ((p->S2 + 63) / 64) * 8;
    if (smem > 48 * 1024) {
        const cudaError_t e =
            cudaFuncSetAttribute(sfa_union_plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    dim3 grid((unsigned)p->ungroups, (unsigned)(p->B * p->N2));
    sfa_union_plan_kernel<<<grid, 256, smem, st>>>(*p, min_density, cnt, lst, msk, first_bad);
    return cudaGetLastError();
}
