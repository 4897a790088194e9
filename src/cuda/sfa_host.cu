// sfa CUDA backend entry points (src/core/internal.h): index check, workspace size, forward and
// backward dispatch to the fast kernels (sfa_fwd*.cu, sfa_union.cu, sfa_bwd90.cu, sfa_bwd_small.cu),
// the deterministic fixed-point setup and the final dK / dQ conversions; the packed
// variable-length / paged forward and backward (spattn_sfa_fwd_varlen / spattn_sfa_bwd_varlen:
// device checks of the layout, the per-token pre-pass, dispatch; the varlen backward runs the
// token-major sfa_bwd90.cu, its dK accumulator over the key side's rows: packed [Tkv, N2, 576]
// or page rows [num_pages * page_size, N2, 576], converted into dk / dk_rope of the same layout).
//
// Fast path: fp16/bf16, D = 512, Dr = 64, shared key/value (v == NULL), unit stride on the last
// dimension, 16-byte aligned rows.  Every other valid input runs on the simple kernels of
// sfa_ref.cu (fp32 arithmetic, outputs converted; their backward, dense and varlen, adds dK/dV
// with fp32 atomics when deterministic = 0, in int64 fixed point when deterministic = 1).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <limits.h>

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "../core/seqs.h"
#include "../core/sfa_pack.h"
#include "convert.cuh"

#include <cub/block/block_radix_sort.cuh>
#include "maxabs.cuh"
#include "scratch.h"
#include "sfa_adds.cuh"
#include "sfa_gather.cuh"
#include "sfa_bwd_small.h"
#include "sfa_ref.h"
#include "verdict.h"
#include "sfa_common.cuh"

extern "C" cudaError_t spattn_sfa_fast_fwd_launch(const sfa::Params *p, int is_bf16, cudaStream_t st);
extern "C" cudaError_t spattn_sfa_small_fwd_launch(const sfa::Params *p, int is_bf16, int shape, cudaStream_t st);
extern "C" cudaError_t spattn_sfa_union_fwd_launch(const sfa::Params *p, int is_bf16, cudaStream_t st);
extern "C" cudaError_t spattn_sfa_group_fwd_launch(const sfa::Params *p, int is_bf16, int shape, cudaStream_t st);
extern "C" cudaError_t spattn_sfa_union_plan_launch(const sfa::Params *p, float min_density,
                                                    unsigned long long *first_bad, cudaStream_t st);
extern "C" cudaError_t spattn_sfa_bwd90_launch(const sfa::Params *p, int is_bf16, cudaStream_t st);
extern "C" cudaError_t spattn_sfa_union_bwd_launch(const sfa::Params *p, int is_bf16, cudaStream_t st);
extern "C" cudaError_t spattn_sfa_bwd_small_launch(const sfa::Params *p, const sfa::SmallLists *L, int is_bf16,
                                                   int shape, cudaStream_t st);
// sfa_pad.cu: shared-V shapes with 256 < D <= 512, Dr <= 64 run padded to the Mla shape
extern "C" int spattn_sfa_pad_route(const spattn_sfa_problem *p);
extern "C" size_t spattn_sfa_pad_workspace(const spattn_sfa_problem *p, int backward);
extern "C" spattn_status spattn_sfa_pad_fwd(const spattn_sfa_problem *p, const spattn_exec *ex);
extern "C" spattn_status spattn_sfa_pad_bwd(const spattn_sfa_problem *p, const spattn_exec *ex);
extern "C" spattn_status spattn_cuda_ref_sfa_fwd_varlen(const spattn_sfa_problem *p, const spattn_exec *ex,
                                                        const int4 *tok, float *o, float *lse);

namespace {

// A failed call is cleared from the runtime's last-error slot (so the next call does not see it)
// and an allocation failure is reported as SPATTN_STATUS_OUT_OF_MEMORY.
#define CU_TRY(expr)                                                                            \
    do {                                                                                        \
        cudaError_t e_ = (expr);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            cudaGetLastError();                                                                 \
            return spattn_set_error(e_ == cudaErrorMemoryAllocation ? SPATTN_STATUS_OUT_OF_MEMORY \
                                                                    : SPATTN_STATUS_CUDA_ERROR, \
                                    "sfa cuda: %s failed: %s", #expr, cudaGetErrorString(e_));  \
        }                                                                                       \
    } while (0)

// ---- index check ------------------------------------------------------------------------------
// One warp per index row (b, s, n): the row's offset is computed once (64-bit), the lanes stride
// over K with 32-bit arithmetic (16-byte loads when the row is contiguous and aligned); the first
// bad position (row-major linear index) is kept with atomicMin.
__global__ void check_idx_kernel(const int32_t *idx, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                                 int64_t B, int64_t S1, int64_t N2, int64_t K, int64_t nblk,
                                 unsigned long long *first_bad) {
    const int64_t rows = B * S1 * N2;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = (int64_t)gridDim.x * (blockDim.x >> 5);
    const bool vec = s3 == 1 && (K & 3) == 0;
    for (int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += nwarps) {
        const int64_t n = r % N2, t = r / N2, s = t % S1, b = t / S1;
        const int32_t *row = idx + b * s0 + s * s1 + n * s2;
        int bad = -1;  // first bad column seen by this lane
        if (vec && ((uintptr_t)row & 15) == 0) {
            // four independent 16-byte loads in flight per lane before any test: a row's 4 KB
            // (K 1024) costs two memory latencies, not eight (ncu, sfa04: 8.3 us of a 190 us forward);
            // plain loads: the forward reads the same rows next, from L2
            for (int64_t j0 = lane * 4; j0 < K; j0 += 512) {
                int4 v[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    v[u] = j0 + u * 128 < K ? __ldg(reinterpret_cast<const int4 *>(row + j0 + u * 128))
                                            : make_int4(-1, -1, -1, -1);
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int x[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
                    for (int w = 0; w < 4; w++)
                        if (bad < 0 && (x[w] < -1 || (int64_t)x[w] >= nblk)) bad = (int)(j0 + u * 128 + w);
                }
                if (bad >= 0) break;
            }
        } else {
            for (int64_t j = lane; j < K && bad < 0; j += 32) {
                const int32_t x = row[j * s3];
                if (x < -1 || (int64_t)x >= nblk) bad = (int)j;
            }
        }
        // smallest bad column of the row (lanes hold increasing columns in their own strides)
        unsigned m = bad < 0 ? 0xffffffffu : (unsigned)bad;
        for (int o = 16; o > 0; o >>= 1) m = min(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0 && m != 0xffffffffu) atomicMin(first_bad, (unsigned long long)(r * K + m));
    }
}

// ---- deterministic accumulation: bound of |dK| -> fixed-point exponent F ------------------------
// stats: [0] max|q,q_rope|  [1] max|k,k_rope|  [2] max|o|  [3] max|dout|  (float bits as uint)
//        [4] max count of one index block over the rows of one (b, n2)
//        [5] 2^F (float)  [6] 2^-F (float)
// How often each index block is selected over the rows of one (b, n2) (blockIdx.y): one warp per
// index row.  With hist_smem, the CTA counts into shared memory and adds its nonzero bins once
// (popular blocks, e.g. the causal front, took ~1000 contended global adds each: 211 us on sfa05).
__global__ void hist_kernel(const int32_t *idx, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                            int64_t S1, int64_t N2, int64_t K, int64_t nblk, int hist_smem, unsigned *hist) {
    extern __shared__ unsigned sh[];
    const int64_t g = blockIdx.y, n = g % N2, b = g / N2;
    unsigned *h = hist + g * nblk;
    unsigned *c = hist_smem ? sh : h;
    if (hist_smem) {
        for (int64_t i = threadIdx.x; i < nblk; i += blockDim.x) sh[i] = 0u;
        __syncthreads();
    }
    const int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t s = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; s < S1; s += nw) {
        const int32_t *ir = idx + b * s0 + s * s1 + n * s2;
        for (int64_t j = threadIdx.x & 31; j < K; j += 32) {
            const int32_t x = ir[j * s3];
            if (x >= 0 && x < nblk) atomicAdd(c + x, 1u);
        }
    }
    if (hist_smem) {
        __syncthreads();
        for (int64_t i = threadIdx.x; i < nblk; i += blockDim.x)
            if (sh[i]) atomicAdd(h + i, sh[i]);
    }
}
__global__ void hist_max_kernel(const unsigned *hist, int64_t n, unsigned *stats) {
    unsigned mx = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        mx = max(mx, hist[i]);
    for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) atomicMax(&stats[4], mx);
}

__global__ void fix_scale_kernel(unsigned *stats, float scale, int D, int H) {
    const float mq = __uint_as_float(stats[0]), mk = __uint_as_float(stats[1]);
    const float mo = __uint_as_float(stats[2]), mdo = __uint_as_float(stats[3]);
    const double cnt = (double)stats[4] * H;
    // |contribution of one (row, head, key)| <= P * (|scale|*(|dP| + |Delta|)*max|q| + max|dO|)
    // with P <= 1, |dP| <= D max|dO| max|k|, |Delta| <= D max|dO| max|o|; margin 8.
    const double ds = fabs((double)scale) * D * mdo * ((double)mk + mo);
    const double per = ds * mq + mdo;
    const double bound = 8.0 * cnt * per + 1e-30;
    int F = 62 - (int)ceil(log2(bound));
    F = F > 60 ? 60 : (F < -60 ? -60 : F);
    reinterpret_cast<float *>(stats)[5] = exp2f((float)F);
    reinterpret_cast<float *>(stats)[6] = exp2f((float)-F);
    // dQ (key-major backward): |dQ| <= sum_k |dS| max|k| <= |scale| (|dP| + |Delta|) max|k|, as the
    // P of a row sum to 1 (any partial sum obeys the same bound); margin 8
    const double bq = 8.0 * ds * mk + 1e-30;
    int Fq = 62 - (int)ceil(log2(bq));
    Fq = Fq > 60 ? 60 : (Fq < -60 ? -60 : Fq);
    reinterpret_cast<float *>(stats)[7] = exp2f((float)Fq);
    reinterpret_cast<float *>(stats)[8] = exp2f((float)-Fq);
}

// Accumulator rows of 576 (int64 fixed point or fp32) to dq / dk rows: a warp per row, lane l
// columns 2 (l + 32 k), k < 9 (k = 8: the rope part), 16-byte (8-byte fp32) accumulator loads and
// 2-byte flag loads, pair stores when the output row is contiguous.  The element-per-thread form
// before it did six 64-bit divisions per element (~600 instructions for a 9-byte load and a
// 2-byte store).
// det 2: packed int32 (sfa_adds.cuh add_box_p32), the pair of columns e, e + 1 as one 64-bit word:
// low lane exact, high lane one less when the low lane's sum is negative (the borrow); ok: the
// box's bound says both sums stayed in int32 (else NaN: never expected, sfa_host.cu retries first).
__device__ __forceinline__ void conv_pair(const void *acc, const uint8_t *flags, int det, float inv, int64_t e, float &v0,
                                          float &v1, bool ok = true) {
    if (det == 2) {
        const uint2 w = *reinterpret_cast<const uint2 *>(reinterpret_cast<const int *>(acc) + e);
        const uint16_t f = *reinterpret_cast<const uint16_t *>(flags + e);
        const int lo = (int)w.x, hi = (int)(w.y + (lo < 0 ? 1u : 0u));
        v0 = ok ? fix_value(lo, (uint8_t)(f & 0xffu), inv) : __int_as_float(0x7fc00000);
        v1 = ok ? fix_value(hi, (uint8_t)(f >> 8), inv) : __int_as_float(0x7fc00000);
    } else if (det) {
        const longlong2 a = *reinterpret_cast<const longlong2 *>(reinterpret_cast<const long long *>(acc) + e);
        const uint16_t f = *reinterpret_cast<const uint16_t *>(flags + e);
        v0 = fix_value(a.x, (uint8_t)(f & 0xffu), inv);
        v1 = fix_value(a.y, (uint8_t)(f >> 8), inv);
    } else {
        const float2 a = *reinterpret_cast<const float2 *>(reinterpret_cast<const float *>(acc) + e);
        v0 = a.x;
        v1 = a.y;
    }
}
template <typename T> __device__ __forceinline__ void conv_store2(T *dst, int64_t s, float v0, float v1) {
    if constexpr (sizeof(T) == 2) {
        if (s == 1 && !(reinterpret_cast<uintptr_t>(dst) & 3)) {
            *reinterpret_cast<uint32_t *>(dst) = sfa::Ty<T>::pack(v0, v1);
            return;
        }
    }
    {
        dst[0] = sfa::Ty<T>::from_f(v0);
        dst[s] = sfa::Ty<T>::from_f(v1);
    }
}

// The key-major backward's dQ accumulator [B, S1, N1, W] into dq (columns < D) / dq_rope (unit
// last strides, DR columns from column DP); W = DP + Dr rounded up to 64, DP = D rounded up to
// 64 (the kernel's boxes: the columns between are padding, not stored).
template <typename T>
__global__ void convert_dq_kernel(const void *acc, const uint8_t *flags, int det, const float *inv_scale, T *dq, T *dqr, int64_t B,
                                  int64_t S1, int64_t N1, int64_t sd0, int64_t sd1, int64_t sd2, int64_t sr0,
                                  int64_t sr1, int64_t sr2, const unsigned long long *gate, int W = sfa::DQK, int D = sfa::D,
                                  int DP = sfa::D, int DR = sfa::DR, const int4 *vtok = nullptr) {
    if (sfa::gate_word(gate) != ~0ull) return;  // under capture: the index check's word
    const int64_t rows = B * S1 * N1, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const bool narrow = rows < (1LL << 31);
    const float inv = det ? *inv_scale : 1.f;
    const int lane = threadIdx.x & 31;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        int64_t b, s, n;
        conv_row(r, S1, N1, narrow, b, s, n);
        if (vtok && vtok[s].x < 0) continue;  // varlen: a token past cu_seqlens_q[B] is not written
#pragma unroll 3
        for (int k = 0; k < W / 64; k++) {
            const int col = 2 * (lane + 32 * k);
            float v0, v1;
            conv_pair(acc, flags, det, inv, r * W + col, v0, v1);
            if (col < D) conv_store2(dq + b * sd0 + s * sd1 + n * sd2 + col, 1, v0, v1);
            else if (col >= DP && col - DP < DR) conv_store2(dqr + b * sr0 + s * sr1 + n * sr2 + (col - DP), 1, v0, v1);
        }
    }
}

// The columns of a dK accumulator row (576 wide) and where they go: [0, D) dk, [dp, dp + dr)
// dk_rope, [wk, wk + D) dv (sfa_bwd_kmaj.cu's separate V, wv = dp columns; wv 0: V is k's first
// D columns, dV folded in).  dp: D rounded up to 64, wk = dp + dr rounded up to 64 (the kernel's
// boxes; the columns between are padding, not stored).
struct DkCols {
    int D = sfa::D, dp = sfa::D, dr = sfa::DR, wk = sfa::DQK, wv = 0;
    void *dv = nullptr;
    int64_t sv[4] = {0, 0, 0, 0};
};

template <typename T>
__global__ void convert_dk_kernel(const void *acc, const uint8_t *flags, int det, const float *inv_scale, T *dk,
                                  T *dkr, int64_t B, int64_t S2, int64_t N2, int64_t sd0,
                                  int64_t sd1, int64_t sd2, int64_t sd3, int64_t sr0, int64_t sr1,
                                  int64_t sr2, int64_t sr3, const unsigned long long *gate,
                                  const unsigned long long *bound = nullptr, const DkCols dc = DkCols()) {
    if (sfa::gate_word(gate) != ~0ull) return;  // under capture: the index check's word
    const int64_t rows = B * S2 * N2, nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const bool narrow = rows < (1LL << 31);
    const float inv = det ? *inv_scale : 1.f;
    const int lane = threadIdx.x & 31;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        int64_t b, s, n;
        conv_row(r, S2, N2, narrow, b, s, n);
        const unsigned long long rb = det == 2 ? bound[r] : 0;  // packed int32: the row's bound
#pragma unroll 3
        for (int k = 0; k < (dc.wk + dc.wv) / 64; k++) {
            const int col = 2 * (lane + 32 * k);
            float v0, v1;
            conv_pair(acc, flags, det, inv, r * sfa::DQK + col, v0, v1, det != 2 || rb < (1ull << 31));
            if (col < dc.D) conv_store2(dk + b * sd0 + s * sd1 + n * sd2 + col * sd3, sd3, v0, v1);
            else if (col < dc.dp) continue;
            else if (col < dc.wk) {
                if (col - dc.dp < dc.dr) conv_store2(dkr + b * sr0 + s * sr1 + n * sr2 + (col - dc.dp) * sr3, sr3, v0, v1);
            }
            else if (col - dc.wk < dc.D)
                conv_store2(static_cast<T *>(dc.dv) + b * dc.sv[0] + s * dc.sv[1] + n * dc.sv[2] + (col - dc.wk) * dc.sv[3],
                            dc.sv[3], v0, v1);
        }
    }
}

// ---- the deterministic token-major backward in packed int32 (bwd_packed below) ------------------
// stats words after fix_scale_kernel's [0..8]: [9] 2^F, [10] 2^-F (floats), [11] F, [12] the retry
// word, [13] the probe's largest |v| (float bits), [14..15] its largest row bound (u64), [16..17]
// the full pass's (u64), [18..21] the probe's block counts (u64: its CTAs' blocks, those it ran),
// [22] the probe's 2^Fa (float), [23] Fa
enum { ST_P2F = 9, ST_P2INV = 10, ST_PF = 11, ST_RETRY = 12, ST_GMAX = 13, ST_PMAX = 14, ST_MMAX = 16, ST_PCNT = 18,
       ST_A2F = 22, ST_AF = 23 };

// *out = max(*out, max of x[0 .. n)): the rows' u64 bounds, or the probe's first pass's u32 row
// maxima (float bits >= 0 order as the values); integer maxima, so order-free
template <typename U> __global__ void max_kernel(const U *x, int64_t n, U *out) {
    U m = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        m = max(m, x[i]);
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0 && m) atomicMax(out, m);
}
// Fa placing the probe's largest |v| at 2^40 (the second pass's sums of up to 2^23 adds fit in
// 64 bits)
__global__ void probe_fa_kernel(unsigned *stats) {
    const float g = __uint_as_float(stats[ST_GMAX]);
    int e = 0;
    if (g > 0.f) frexpf(g, &e);  // g < 2^e
    int F = 40 - e;
    F = F > 120 ? 120 : F < -120 ? -120 : F;
    reinterpret_cast<float *>(stats)[ST_A2F] = exp2f((float)F);
    reinterpret_cast<int *>(stats)[ST_AF] = F;
}
__device__ __forceinline__ int ceil_log2(unsigned long long m) { return m <= 1 ? 0 : 64 - __clzll(m - 1); }
__device__ __forceinline__ void p32_set_f(unsigned *stats, int F) {
    F = F > 120 ? 120 : F < -120 ? -120 : F;
    reinterpret_cast<float *>(stats)[ST_P2F] = exp2f((float)F);
    reinterpret_cast<float *>(stats)[ST_P2INV] = exp2f((float)-F);
    reinterpret_cast<int *>(stats)[ST_PF] = F;
}
// F of the full pass: the probe's largest row bound (second pass, units of 2^-Fa), times the
// share of the adds it sampled, placed at 2^29 (a lane holds 2^31; a miss either way is fixed by
// the retry).  A probe that saw nothing: F = 0 (the retry sets it from the full pass's exact
// bound if needed).
__global__ void p32_pick_kernel(unsigned *stats, int pt, int shift) {
    const unsigned long long pm = *reinterpret_cast<const unsigned long long *>(stats + ST_PMAX);
    const unsigned long long *cnt = reinterpret_cast<const unsigned long long *>(stats + ST_PCNT);
    const double est = (double)pm * pt * (cnt[1] ? (double)cnt[0] / (double)cnt[1] : 1.0);  // units of 2^-Fa
    const int fa = reinterpret_cast<const int *>(stats)[ST_AF];
    p32_set_f(stats, (pm ? fa + 29 - (int)ceil(log2(est)) : 0) + shift);
}
// After the full pass: its largest bound M.  M >= 2^31: some lane may have left int32, so the
// pass is repeated with F lowered until M <= 2^29 (then M' <= 2^29 + adds per row: in range);
// 0 < M < 2^22: the sums use few bits of the lanes, so it is repeated with F raised (M' <= 2^29).
// Both decisions come from integer sums: the result stays bitwise reproducible.
__global__ void p32_retry_kernel(unsigned *stats) {
    const unsigned long long m = *reinterpret_cast<const unsigned long long *>(stats + ST_MMAX);
    const int sh = m >= (1ull << 31) || (m > 0 && m < (1ull << 22)) ? 29 - ceil_log2(m) : 0;
    reinterpret_cast<int *>(stats)[ST_RETRY] = sh != 0;
    if (sh) p32_set_f(stats, reinterpret_cast<const int *>(stats)[ST_PF] + sh);
}
__global__ void zero_if_kernel(unsigned long long *p, int64_t n, const int *run_if) {
    if (!*run_if) return;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) p[i] = 0;
}

// ---- fast-path eligibility -----------------------------------------------------------------------
// rows of unit last stride, 16-byte aligned (the packed route's test too: sfa_pack.h)
bool rows_aligned(const spattn_tensor *t) { return !t || spattn_sfa_pack_readable(t); }

// The Hopper kernels' shapes: fp16/bf16, D = 512, Dr = 64, shared key/value, rows of unit stride,
// 16-byte aligned.  Other valid inputs run on the simple kernels of sfa_ref.cu (fp32 arithmetic on
// CUDA cores, outputs converted): correct, not fast.
bool fast_shape(const spattn_sfa_problem *p, int backward) {
    if (p->dtype == SPATTN_DTYPE_F32 || p->D != sfa::D || p->Dr != sfa::DR || !p->shared_kv) return false;
    const spattn_tensor *ts[] = {p->q, p->q_rope, p->k, p->k_rope, p->o, p->dout, p->dq, p->dq_rope};
    for (int i = 0; i < 8; ++i) {
        if (!backward && i >= 5) continue;
        if (!rows_aligned(ts[i])) return false;
    }
    return true;
}

// The kernels' value width: D rounded up to whole 64-column boxes (Params::dn holds D itself)
int64_t dpad64(int64_t D) { return (D + 63) / 64 * 64; }
// The key-major backwards' dQ accumulator row: the value boxes, then the rope box (Mla: 576)
int64_t kmaj_w(const spattn_sfa_problem *p) { return dpad64(p->D) + dpad64(p->Dr); }
// The dK accumulator columns of the call's shape (Mla: the defaults; separate V: dv after the
// rope box, its strides set by the caller)
DkCols dk_cols(const spattn_sfa_problem *p) {
    DkCols dc;
    dc.D = (int)p->D;
    dc.dp = (int)dpad64(p->D);
    dc.dr = (int)p->Dr;
    dc.wk = (int)kmaj_w(p);
    dc.wv = p->shared_kv ? 0 : dc.dp;
    return dc;
}

// The Hopper forward kernels' shapes (sfa::FwdShape): SHAPE_MLA (fast_shape: both kernels, by H)
// or, on the small-head kernel for any H, fp16/bf16 with rows of unit stride, 16-byte aligned: a
// separate v with D 64, 128 (SHAPE_NSA: Dr 0) or 192 and Dr 0 or 64, or D 256 and Dr 0, or V = k's first D
// columns with D 128 / 256 and Dr 0 / 64; -1: the simple kernels.  D and Dr are taken rounded up
// to multiples of 64 (any D the API takes, a multiple of 8, and Dr <= 64: the last value box and
// the rope box partial, Params::dn / dr).
int fwd_shape(const spattn_sfa_problem *p) {
    if (fast_shape(p, 0)) return sfa::SHAPE_MLA;
    if (p->dtype == SPATTN_DTYPE_F32 || p->D % 8 || p->Dr % 8 || p->Dr > 64) return -1;
    const int64_t nbn = (p->D + 63) / 64, nbr = p->Dr ? 1 : 0;
    int shape = -1;
    if (!p->shared_kv) {
        shape = nbr == 0 && nbn == 2   ? sfa::SHAPE_NSA
                : nbr == 1 && nbn == 2 ? sfa::SHAPE_SEP_128_64
                : nbr == 0 && nbn == 1 ? sfa::SHAPE_SEP_64
                : nbr == 0 && nbn == 4 ? sfa::SHAPE_SEP_256
                : nbr == 1 && nbn == 1 ? sfa::SHAPE_SEP_64_64
                : nbr == 0 && nbn == 3 ? sfa::SHAPE_SEP_192
                : nbr == 1 && nbn == 3 ? sfa::SHAPE_SEP_192_64
                : nbr == 1 && nbn == 4 ? sfa::SHAPE_SEP_256_64
                                       : -1;
    } else {
        shape = nbr == 1 && nbn == 2   ? sfa::SHAPE_SHV_128_64
                : nbr == 0 && nbn == 2 ? sfa::SHAPE_SHV_128
                : nbr == 1 && nbn == 4 ? sfa::SHAPE_SHV_256_64
                : nbr == 0 && nbn == 4 ? sfa::SHAPE_SHV_256
                : nbr == 0 && nbn == 1 ? sfa::SHAPE_SHV_64
                : nbr == 1 && nbn == 1 ? sfa::SHAPE_SHV_64_64
                : nbr == 0 && nbn == 3 ? sfa::SHAPE_SHV_192
                : nbr == 1 && nbn == 3 ? sfa::SHAPE_SHV_192_64
                                       : -1;
    }
    if (shape < 0) return -1;
    const spattn_tensor *ts[] = {p->q, p->q_rope, p->k, p->k_rope, p->v, p->o};
    for (int i = 0; i < 6; ++i)
        if (!rows_aligned(ts[i])) return -1;
    return shape;
}

// The backward's shapes besides fast_shape's (Mla): the key-major kernel of sfa_bwd_kmaj.cu takes
// fp16/bf16 with every shape of fwd_shape but Mla: a separate v of D 64 / 128 / 192 (Dr 0 / 64) or 256, or V = k's first D
// columns with D 128 / 256 and Dr 0 / 64 (dV folded into dK), rows of unit stride,
// 16-byte aligned (the dq / dq_rope outputs too: the conversion stores pairs); -1: none (the call
// runs the simple kernels).  Whether the call's selection suits it: small_shape.
int kmaj_shape(const spattn_sfa_problem *p) {
    const int shape = fwd_shape(p);
    if (shape < 0 || shape == sfa::SHAPE_MLA) return -1;  // every other forward shape
    const spattn_tensor *ts[] = {p->dout, p->dq, p->dq_rope};
    for (int i = 0; i < 3; ++i)
        if (!rows_aligned(ts[i])) return -1;
    return shape;
}

// The forward kernel for a shape of fwd_shape (>= 0): heads per key head <= 32 or a separate-V
// shape: keys as the MMA rows (sfa_fwd_small.cu); more: heads as the rows, 64 per CTA (sfa_fwd.cu)
cudaError_t fwd_launch(const sfa::Params *kp, int shape, int bf16, cudaStream_t st) {
    return kp->H <= 32 || shape != sfa::SHAPE_MLA ? spattn_sfa_small_fwd_launch(kp, bf16, shape, st)
                                                 : spattn_sfa_fast_fwd_launch(kp, bf16, st);
}

// ---- the union pass of the forward (sfa_union.cu, sfa_fwd.cu's UN form) ------------------------
// The least density (selected keys / (union blocks x 64 x tokens of the group)) at which a group
// of 64 / H tokens runs as one 64-row tile over its union's contiguous blocks rather than as
// per-token gathers.  Measured (H200, 2026-12-03, sweeps of SPATTN_SFA_UNION_DENSITY over the
// public cases, whose groups' densities are about K / reachable keys): at H 4 / 8 / 16 the union
// kernel won down to the lowest density there (0.25: sfa05, sfa10, sfa02); at H 32 it lost at
// 0.25-0.33 (sfa03: 175-227 TFLOP/s against 263 gathered) and won at 0.5-0.67 (sfa16: 386 vs 308).
float union_min_density(int64_t H) { return H <= 4 ? 0.10f : H <= 8 ? 0.15f : H <= 16 ? 0.20f : 0.40f; }
constexpr size_t UNION_PLAN_SMEM = 96 * 1024;  // the plan's bitmaps [64 / H][ceil(S2 / 64)] words
constexpr size_t UNION_MAX_BYTES = (size_t)1 << 30;

struct UnionCfg {
    int ug = 0, lg2h = 0, ngroups = 0, cap = 0;
    float min_density = 0.f;
    size_t off_lst = 0, off_msk = 0, off_key = 0, bytes = 0;  // workspace: counts, lists, masks, keys
                                                              // (bytes 0: no union pass; off_key 0:
                                                              // no compaction)
};
// The union pass of a forward of fwd_shape `shape`: SHAPE_MLA with H = 4, 8, 16 or 32 heads per
// key head, sbs <= 64.  SPATTN_SFA_UNION=0 turns it off, =1 takes every group without a repeated key (tests),
// SPATTN_SFA_UNION_DENSITY=x sets the least density, SPATTN_SFA_UNION_NOFORK=1 runs the union kernel
// on the caller's stream before the gather kernel, SPATTN_SFA_UNION_COMPACT=0 keeps every group in
// contiguous blocks (measurements, tests).  The compacted keys take 256 bytes per block of
// capacity; past UNION_MAX_BYTES the pass runs without them.
// bwd: the backward's union form (sfa_bwd90.cu, UN): every group without a repeated key (with
// packing where it saves blocks, its density is at least 1 / ug: a per-token 64-row tile's use
// of its rows, and its adds are never more); SPATTN_SFA_BWD_UNION=0 turns it off (measurements).
// key_rows / max_blocks (the varlen calls, vl_union_cfg): the key space's size instead of S2,
// and a cap on a group's blocks (a group over more is left to the per-token kernel).
// The workspace layout of groups of ug tokens, at most cap blocks each (u.bytes stays 0 when it
// would exceed UNION_MAX_BYTES).
void union_layout(UnionCfg &u, const spattn_sfa_problem *p, int64_t ug, int64_t cap, float md) {
    const int64_t H = p->N1 / p->N2, ng = (p->S1 + ug - 1) / ug, groups = p->B * p->N2 * ng;
    auto al = [](size_t x) { return (x + 255) & ~(size_t)255; };
    const size_t a = al((size_t)groups * 4), l = al((size_t)groups * cap * 4);
    const size_t bytes = a + l + al((size_t)groups * cap * ug * 8);
    if (bytes > UNION_MAX_BYTES || ng > INT_MAX) return;
    const char *cmp = getenv("SPATTN_SFA_UNION_COMPACT");
    const size_t kb = al((size_t)groups * cap * 64 * 4);
    if (!(cmp && cmp[0] == '0') && bytes + kb <= UNION_MAX_BYTES) {
        u.off_key = bytes;
        u.bytes = bytes + kb;
    } else {
        u.bytes = bytes;
    }
    u.ug = (int)ug;
    while ((1 << u.lg2h) < H) u.lg2h++;
    u.ngroups = (int)ng;
    u.cap = (int)cap;
    u.min_density = md;
    u.off_lst = a;
    u.off_msk = a + l;
}
UnionCfg union_cfg(const spattn_sfa_problem *p, int shape, bool bwd = false, int64_t key_rows = -1,
                   int64_t max_blocks = -1) {
    UnionCfg u;
    const char *env = getenv(bwd ? "SPATTN_SFA_BWD_UNION" : "SPATTN_SFA_UNION"), *den = getenv("SPATTN_SFA_UNION_DENSITY");
    if ((env && env[0] == '0') || shape != sfa::SHAPE_MLA) return u;
    const int64_t H = p->N1 / p->N2, nkw = ((key_rows >= 0 ? key_rows : p->S2) + 63) / 64;
    if (H < 4 || H > 32 || (H & (H - 1)) || p->sbs > 64 || p->K > (1 << 24)) return u;
    const int64_t ug = 64 / H;
    if ((size_t)(ug * nkw * 8) > UNION_PLAN_SMEM) return u;
    float md = bwd || (env && env[0] == '1') ? 0.f : union_min_density(H);
    if (den && !bwd) md = (float)atof(den);
    // a group taken has blocks <= selected keys / (64 ug md) <= K sbs / (64 md)
    int64_t cap = nkw;
    if (md > 0.f) cap = std::min<int64_t>(nkw, (int64_t)((double)p->K * p->sbs / (64.0 * md)) + 1);
    if (max_blocks > 0) cap = std::min<int64_t>(cap, max_blocks);
    union_layout(u, p, ug, cap, md);
    return u;
}

// The group form of the forward (sfa_fwd_group.cu): the non-Mla shapes of D <= 128 (separate or
// shared V; NSA's D 128 among them) with H <= 32 heads per key head, sbs <= 64, dense calls;
// groups of ug tokens over the union plan's blocks (sfa_fwd_group.cu's group_gw: 16 / 8 / 4
// tokens at N = 8 / 16 / 32 heads).  A group is taken when its density (selected keys / (union
// blocks x 64 x ug)) reaches group_min_density: the form saves the gathers of the blocks its
// tokens share and pays per group.  Measured (H100, 2026-12-05, both kernels with the voted
// softmax of sfa_keyrows.cuh, every group taken vs none, medians of 10, two rounds): sfas01 (16
// heads, causal, density ~0.28) 1.35x (143 vs 106 TFLOP/s), sfas02 (32 heads) 1.12x, sfas03 (16
// heads, mode 0 over 256 blocks, ~0.13) 1.06x, sfas04 1.35x, sfas07 (V = k's first 128 columns,
// Dr 64, sbs 32) 1.17x, sfas08 (D 96) 1.31x: taken at 9-32 heads from 0.10, separate or shared v
// (below 0.13 not measured; 8 heads or fewer not measured: not taken).  SPATTN_SFA_GROUP=0 turns
// it off, =1 takes every group without a repeated key (tests); SPATTN_SFA_UNION_DENSITY=x sets the
// least density (measurements).
float group_min_density(int64_t H) { return H <= 8 ? 2.f : 0.10f; }
UnionCfg group_cfg(const spattn_sfa_problem *p, int shape) {
    UnionCfg u;
    const char *env = getenv("SPATTN_SFA_GROUP"), *den = getenv("SPATTN_SFA_UNION_DENSITY");
    const bool all = env && env[0] == '1';
    // a shape of fwd_shape other than Mla with at most two value boxes (the kernel's O^T registers)
    if ((env && env[0] == '0') || shape < 0 || shape == sfa::SHAPE_MLA || dpad64(p->D) > 128) return u;
    const int64_t H = p->N1 / p->N2, nkw = (p->S2 + 63) / 64, n = H <= 8 ? 8 : H <= 16 ? 16 : 32;
    const int64_t ug = 2 * (64 / n);
    float md = all ? 0.f : den ? (float)atof(den) : group_min_density(H);
    if (md > 1.f || H > 32 || p->sbs > 64 || p->K > (1 << 24) || (size_t)(ug * nkw * 8) > UNION_PLAN_SMEM) return u;
    // a selected entry (sbs <= 64, a power of two) lies in one 64-key block: a group's union has at
    // most ug K blocks, and a group taken at density md at most K sbs / (64 md) of them
    int64_t cap = std::min<int64_t>(nkw, ug * p->K);
    if (md > 0.f) cap = std::min<int64_t>(cap, (int64_t)((double)p->K * p->sbs / (64.0 * md)) + 1);
    union_layout(u, p, ug, cap, md);
    return u;
}
// The forward's grouped pass for fwd_shape `shape`: Mla's union form, or the group form
UnionCfg fwd_union_cfg(const spattn_sfa_problem *p, int shape) {
    return shape == sfa::SHAPE_MLA ? union_cfg(p, shape) : group_cfg(p, shape);
}

// Points kp's union fields at the union workspace ub laid out by u (the plan writes them, the
// union kernels read them).
void union_bind(const UnionCfg &u, void *ub, sfa::Params *kp) {
    const char *w = (const char *)ub;
    kp->ug = u.ug;
    kp->lg2h = u.lg2h;
    kp->lg2ug = 0;
    while ((1 << kp->lg2ug) < u.ug) kp->lg2ug++;
    kp->ungroups = u.ngroups;
    kp->ucap = u.cap;
    kp->ucnt = (const int *)w;
    kp->ublk = (const int *)(w + u.off_lst);
    kp->umask = (const unsigned long long *)(w + u.off_msk);
    kp->ukey = u.off_key ? (const int *)(w + u.off_key) : nullptr;
}

spattn_status limits_ok(const spattn_sfa_problem *p) {
    if (p->B * p->N2 > 65535 || p->S1 * ((p->N1 / p->N2 + 15) / 16) > 0x7fffffffLL ||
        p->S2 > (1LL << 30) || p->K * p->sbs > (1LL << 30))
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda: problem too large for the grid");
    return SPATTN_STATUS_SUCCESS;
}

// Scratch of the simple-kernel path, each part 256-byte aligned, off[RB_N] = the total.
// Forward: fp32 O and LSE (RB_DQ, RB_DQR).  Backward: fp32 dQ, dQ_rope, dK, dK_rope, dV, then the
// deterministic mode's int64 accumulators of dK, dK_rope, dV, their flag bytes, the count
// histogram and the stats (sized for both modes: a workspace query does not know the mode).
// krows: the key side's rows (default B S2); bins: the histogram's (default B N2 nblk).
enum { RB_DQ, RB_DQR, RB_DK, RB_DKR, RB_DV, RB_AK, RB_AKR, RB_AV, RB_FK, RB_FKR, RB_FV, RB_HIST, RB_STATS, RB_N };
size_t ref_parts(const spattn_sfa_problem *p, int backward, size_t off[RB_N + 1], int64_t krows = -1, int64_t bins = -1) {
    if (krows < 0) krows = p->B * p->S2;
    if (bins < 0) bins = p->B * p->N2 * p->nblk;
    const size_t nq = (size_t)p->B * p->S1 * p->N1, nk = (size_t)krows * p->N2, sep = !p->shared_kv;
    size_t sz[RB_N] = {0};
    if (!backward) {
        sz[RB_DQ] = nq * p->D * 4;
        sz[RB_DQR] = nq * 4;
    } else {
        const size_t n[3] = {nk * p->D, nk * p->Dr, sep ? nk * p->D : 0};  // dK, dK_rope, dV elements
        sz[RB_DQ] = nq * p->D * 4;
        sz[RB_DQR] = nq * p->Dr * 4;
        for (int i = 0; i < 3; i++) {
            sz[RB_DK + i] = n[i] * 4;
            sz[RB_AK + i] = n[i] * 8;
            sz[RB_FK + i] = n[i];
        }
        sz[RB_HIST] = (size_t)bins * 4;
        sz[RB_STATS] = 256;
    }
    size_t t = 0;
    for (int i = 0; i < RB_N; i++) {
        off[i] = t;
        t += (sz[i] + 255) & ~(size_t)255;
    }
    off[RB_N] = t;
    return t;
}

void fill_params(const spattn_sfa_problem *p, sfa::Params *k) {
    memset(k, 0, sizeof(*k));
    auto cp4 = [](int64_t *d, const spattn_tensor *t) {
        if (t)
            for (int i = 0; i < 4; ++i) d[i] = t->strides[i];
    };
    k->q = p->q->data;
    k->qr = p->q_rope ? p->q_rope->data : nullptr;
    k->k = p->k->data;
    k->kr = p->k_rope ? p->k_rope->data : nullptr;
    k->v = p->v ? p->v->data : nullptr;
    cp4(k->sv, p->v);
    cp4(k->sq, p->q);
    cp4(k->sqr, p->q_rope);
    cp4(k->sk, p->k);
    cp4(k->skr, p->k_rope);
    k->idx = (const int32_t *)p->idx->data;
    cp4(k->sidx, p->idx);
    if (p->o) {
        k->o = p->o->data;
        k->out_o = p->o->data;
        cp4(k->so, p->o);
    }
    if (p->lse)
        for (int i = 0; i < 3; ++i) k->slse[i] = p->lse->strides[i];
    if (p->dout) {
        k->dout = p->dout->data;
        cp4(k->sdo, p->dout);
    }
    if (p->dq) {
        k->dq = p->dq->data;
        cp4(k->sdq, p->dq);
    }
    if (p->dq_rope) {
        k->dqr = p->dq_rope->data;
        cp4(k->sdqr, p->dq_rope);
    }
    k->B = (int)p->B;
    k->S1 = (int)p->S1;
    k->S2 = (int)p->S2;
    k->N1 = (int)p->N1;
    k->N2 = (int)p->N2;
    k->H = (int)(p->N1 / p->N2);
    k->K = (int)p->K;
    k->sbs = (int)p->sbs;
    int l = 0;
    while ((1LL << l) < p->sbs) ++l;
    k->log2sbs = l;
    k->nblk = (int)p->nblk;
    k->mode = p->mode;
    k->scale = p->scale;
    k->scale_log2 = p->scale * 1.4426950408889634f;
    k->dn = (int)p->D;
    k->dr = (int)p->Dr;
}

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

// Backward workspace: [acc B*S2*N2*576 x 8 bytes][hist B*N2*nblk x 4][stats 256 bytes]
// [flags B*S2*N2*576 bytes: non-finite adds of the deterministic accumulator]
size_t bwd_ws_parts(const spattn_sfa_problem *p, size_t *acc, size_t *hist) {
    *acc = align256((size_t)p->B * p->S2 * p->N2 * sfa::DQK * 8);
    *hist = align256((size_t)p->B * p->N2 * p->nblk * 4);
    return *acc + *hist + 256 + align256((size_t)p->B * p->S2 * p->N2 * sfa::DQK);
}

// The key-major backward (sfa_bwd_small.cu) for H <= 32 (those the union form, union_cfg with bwd,
// does not take: H not 4, 8, 16, 32, or sbs > 64) when the rows select a good part of the
// keys they can reach (every visited 64-key block is computed whole: a row touching a block for
// one key pays for 64); its token lists must fit int32 counts and the multiplicities uint16, and
// its own buffers 4 GiB (bounded by shapes: a long dense-ish problem whose lists would not fit
// runs token-major instead of failing for memory).
struct SmallShape {
    int64_t nkb, s1w, nl, vmax, ww = 0;  // ww: sfa_bwd_kmaj.cu's window (32-token words)
};
// kmaj: a shape of kmaj_shape (sfa_bwd_kmaj.cu: any H, in chunks of 32 heads; no token-major
// kernel beside it), else the Mla shape (sfa_bwd_small.cu, H <= 32).
// sfa_bwd_kmaj.cu's CTA window (SmallShape::ww, words of 32 tokens) for a list's share e of
// tokens that visit it: about `steps` steps of 32 token-head rows on average, at most 8 MiB of fp32
// dQ rows of one key head (the resident CTAs run one window's lists of one (b, n2) at a time;
// their dQ adds must stay in L2), at most s1w.  Measured (H200, same call, time against windows
// of 32 steps): 64 steps 0.90-0.93x on sfas01 / 02 / 04, 128 steps 0.86-0.91x on sfas01 / 02
// (8 MiB windows), but sfas03 1.16-1.18x slower at 16 MiB (the cap keeps it at 8).
// SPATTN_SFA_KMAJ_STEPS: the target (measurements; default 128).
int64_t kmaj_window(const spattn_sfa_problem *p, double e, int64_t s1w) {
    const int64_t H = p->N1 / p->N2, hp = H <= 4 ? 4 : H <= 8 ? 8 : H <= 16 ? 16 : 32, tt = 32 / hp;
    const char *senv = getenv("SPATTN_SFA_KMAJ_STEPS");
    const double steps = senv && atoi(senv) > 0 ? atoi(senv) : 128.0;
    int64_t ww = (int64_t)ceil(steps * (double)tt / (32.0 * fmin(1.0, e)));
    const int64_t cap = (8ll << 20) / (32 * H * kmaj_w(p) * 4);
    ww = ww > cap ? cap : ww;
    ww = ww < 1 ? 1 : ww > 256 ? 256 : ww;
    return ww < s1w ? ww : s1w;
}
// The key-major forms' limits: int32 list counts and dQ row numbers (nq query rows) in the
// kernels, the main kernel's grid.y (windows), and small_parts' buffers (dQ accumulator rows W
// wide) within 4 GiB.
bool small_fits(const SmallShape &ss, int64_t nq, int64_t windows, int64_t W) {
    if (ss.nl >= (1LL << 31) || ss.vmax >= (1LL << 31) || nq >= (1LL << 31) || windows > 65535) return false;
    const double bytes = (double)nq * (W * 9 + 8) + (double)ss.nl * ss.s1w * 8 + (double)ss.nl * 16 + (double)ss.vmax * 132;
    return bytes <= 4.0 * (1ull << 30);
}
bool small_shape(const spattn_sfa_problem *p, bool det, SmallShape *ss, bool kmaj = false) {
    const int64_t H = p->N1 / p->N2;
    if ((!kmaj && H > 32) || p->K > 65535) return false;
    // fewer than 1 in 8 keys selected: a visited block's 64 keys are computed for a few; with
    // blocks of 16 or more keys a visit uses at least a quarter of them
    if (p->S2 > 8 * p->K * p->sbs && !(kmaj && p->sbs >= 16)) return false;
    if (!kmaj) {
        // 17-32 heads: token-major fills half of each 64-row MMA and pays one dK row of adds per
        // selected key, key-major computes whole 64-key blocks.  Token-major wins below ~0.55 of
        // the reachable keys selected with int64 adds, ~0.8 with fp32 adds (H200, 2026-12-01,
        // det / fast: sfa03 at 0.29: key-major 37 / 43, token-major 73 / 132 TFLOP/s; sfa11, dense:
        // key-major 113 / 138, token-major ~72 / ~132 from its pair rate).  Since the token-major
        // deterministic mode adds packed int32 (2026-12-04: about the fp32 adds' cost, sfa07 11.5 ms
        // vs 10.6) and key-major's stays int64 (113 at its best), deterministic calls take
        // token-major at H > 16; the fp32 test therefore takes every shape the deterministic one
        // does (bwd_ws_total).
        const double reach = p->mode == 3 ? fmax(1.0, (double)p->S2 - 0.5 * (double)p->S1) : (double)p->S2;
        if (H > 16 && (det || (double)p->K * p->sbs < 0.8 * reach)) return false;
    }
    ss->nkb = (p->S2 + 63) / 64;
    ss->s1w = (p->S1 + 31) / 32;
    ss->nl = p->B * p->N2 * ss->nkb;
    const int64_t per_row = ss->nkb < p->K * ((p->sbs + 63) / 64) ? ss->nkb : p->K * ((p->sbs + 63) / 64);
    ss->vmax = p->B * p->N2 * p->S1 * per_row;
    int64_t windows;  // the main kernel's grid y extent
    if (kmaj) {
        const double reach = p->mode == 3 ? fmax(64.0, (double)p->S2 - 0.5 * (double)p->S1) : (double)p->S2;
        ss->ww = kmaj_window(p, (double)per_row * 64.0 / reach, ss->s1w);
        windows = (ss->s1w + ss->ww - 1) / ss->ww;
        if ((H + 31) / 32 > 65535) return false;  // grid z: chunks of 32 heads
    } else {
        const int64_t hp = H <= 1 ? 1 : H <= 2 ? 2 : H <= 4 ? 4 : H <= 8 ? 8 : H <= 16 ? 16 : 32;
        windows = (p->S1 + 32 * (32 / hp) - 1) / (32 * (32 / hp));
    }
    return small_fits(*ss, p->B * p->S1 * p->N1, windows, kmaj ? kmaj_w(p) : sfa::DQK);
}
// Its buffers after the common ones: dQ accumulator, LSE2 + Delta, bitmap, word prefixes, list
// lengths and offsets, visit tokens, visit multiplicities, the dQ accumulator's non-finite flags,
// the lists' selected-key masks.  W: the dQ accumulator's row (kmaj_w).
constexpr int SMALL_PARTS = 10;
size_t small_parts(const spattn_sfa_problem *p, const SmallShape &ss, size_t off[SMALL_PARTS], int64_t W = sfa::DQK) {
    const size_t nq = (size_t)p->B * p->S1 * p->N1, words = (size_t)ss.nl * ss.s1w;
    const size_t sz[SMALL_PARTS] = {nq * W * 8, nq * 8, words * 4, words * 4, (size_t)ss.nl * 4, ((size_t)ss.nl + 1) * 4,
                                    (size_t)ss.vmax * 4, (size_t)ss.vmax * 128, nq * W, (size_t)ss.nl * 8};
    size_t t = 0;
    for (int i = 0; i < SMALL_PARTS; i++) {
        off[i] = t;
        t += align256(sz[i]);
    }
    return t;
}
// The key-major backward's buffers of small_parts at sw (offsets soff) as its lists (stats: the
// fixed-point stats of fix_scale_kernel; dv: the columns of o / dout).
sfa::SmallLists small_lists(unsigned char *sw, const size_t soff[SMALL_PARTS], const SmallShape &ss, size_t nq, bool det,
                            const unsigned *stats, int dv) {
    sfa::SmallLists L;
    L.dq_i64 = det ? (unsigned long long *)(sw + soff[0]) : nullptr;
    L.dq_f32 = det ? nullptr : (float *)(sw + soff[0]);
    L.dq_flags = (uint32_t *)(sw + soff[8]);
    L.fix_scale_q = (const float *)(stats + 7);
    L.lse2 = (float *)(sw + soff[1]);
    L.delta = L.lse2 + nq;
    L.bitmap = (uint32_t *)(sw + soff[2]);
    L.wpre = (uint32_t *)(sw + soff[3]);
    L.len = (int *)(sw + soff[4]);
    L.off = (int *)(sw + soff[5]);
    L.vtok = (int *)(sw + soff[6]);
    L.vmult = (uint32_t *)(sw + soff[7]);
    L.kused = (unsigned long long *)(sw + soff[9]);
    L.nkb = (int)ss.nkb;
    L.s1w = (int)ss.s1w;
    L.dv = dv;
    L.ww = (int)ss.ww;
    return L;
}
// The maxima of the key-major form's a-priori fixed-point bound (fix_scale_kernel's stats[0..3]);
// stats[1] bounds |k| (dQ) and |v| (dP): the larger of the two serves both.
template <typename T> void kmaj_maxabs(const spattn_sfa_problem *p, unsigned *stats, cudaStream_t st) {
    spattn_launch_maxabs<T>(p->q, stats + 0, st);
    if (p->Dr) spattn_launch_maxabs<T>(p->q_rope, stats + 0, st);
    spattn_launch_maxabs<T>(p->k, stats + 1, st);
    if (p->Dr) spattn_launch_maxabs<T>(p->k_rope, stats + 1, st);
    if (!p->shared_kv) spattn_launch_maxabs<T>(p->v, stats + 1, st);
    spattn_launch_maxabs<T>(p->o, stats + 2, st);
    spattn_launch_maxabs<T>(p->dout, stats + 3, st);
}

// The token-major backward's index rows sorted ascending (-1 last), when its accumulator is far
// larger than L2 (H200: 50 MB; dK / dV adds are 4-byte red ops into [rows][576]): the CTAs of a
// wave start together and move at about the same rate, so with sorted rows the keys they add
// into at any moment lie in a window of the rows instead of all of them, and the adds (and the
// key gathers) hit L2.  Only the order of a row's blocks changes (dQ sums in another fixed
// order: still deterministic); the union form builds its own ascending blocks.  Rows of up to
// SORT_MAX_K entries (one CTA's registers); SPATTN_SFA_BWD_SORT=0 / 1 forces it off / on.
// Measured (H200, 2026-12-04): sfa17 (72 MiB accumulator) 15.6 -> 10.7 ms fp32 adds, 16.8 ->
// 11.5 deterministic; sfa13 (36 MiB) no gain: the threshold sits between them.
constexpr int64_t SORT_MAX_K = 8192;  // 512 threads x 16 keys: CUB's exchange buffer 32 KB
// acc_rows: the accumulator's rows (B S2 N2; varlen: the key side's rows x N2).
size_t sort_bytes(const spattn_sfa_problem *p, int64_t acc_rows) {
    const char *env = getenv("SPATTN_SFA_BWD_SORT");
    if (p->K > SORT_MAX_K || p->nblk >= (1LL << 30) || (env && env[0] == '0')) return 0;  // keys in < 31 bits
    const bool big = (double)acc_rows * sfa::DQK * 4 >= 48.0 * (1 << 20);
    if (!big && !(env && env[0] == '1')) return 0;
    return align256((size_t)p->B * p->S1 * p->N2 * p->K * 4);
}
// One CTA per index row (grid-stride): a block radix sort (CUB) of its entries on the bits that
// hold 0 .. nblk - 1, with -1 (and any value outside [-1, nblk): the call is refused by the
// index check, the gated kernels write nothing, and nothing here reads out of bounds) as the
// largest key, so it sorts last; K is padded to 512 IPT with that key.  out: [B][S1][N2][K].
template <int IPT>
__global__ void __launch_bounds__(512) sort_idx_kernel(const int32_t *idx, int64_t s0, int64_t s1s, int64_t s2s,
                                                       int64_t s3, int64_t S1, int64_t N2, int K, int64_t nblk,
                                                       int bits, int64_t rows, int32_t *out) {
    using Sort = cub::BlockRadixSort<unsigned, 512, IPT>;
    __shared__ typename Sort::TempStorage tmp;
    const unsigned none = (1u << bits) - 1;  // > nblk - 1
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t n2 = r % N2, t = r / N2, s1 = t % S1, b = t / S1;
        const int32_t *row = idx + b * s0 + s1 * s1s + n2 * s2s;
        unsigned k[IPT];
#pragma unroll
        for (int i = 0; i < IPT; i++) {
            const int e = threadIdx.x * IPT + i;
            const int v = e < K ? __ldg(row + (int64_t)e * s3) : -1;
            k[i] = v >= 0 && v < nblk ? (unsigned)v : none;
        }
        Sort(tmp).SortBlockedToStriped(k, 0, bits);
        int32_t *o = out + r * K;
#pragma unroll
        for (int i = 0; i < IPT; i++) {
            const int e = i * 512 + threadIdx.x;
            if (e < K) o[e] = k[i] == none ? -1 : (int32_t)k[i];
        }
        __syncthreads();  // tmp is reused by the next row
    }
}
// Sorts p's index rows into buf and points kp at them.
cudaError_t sort_idx(const spattn_sfa_problem *p, sfa::Params *kp, int32_t *buf, cudaStream_t st) {
    const spattn_tensor *ix = p->idx;
    int bits = 1;
    while ((1ll << bits) - 1 < p->nblk) bits++;
    const int64_t rows = p->B * p->S1 * p->N2;
    const unsigned grid = (unsigned)(rows < 132 * 8 ? rows : 132 * 8);
#define SFA_SORT(IPT)                                                                                                  \
    sort_idx_kernel<IPT><<<grid, 512, 0, st>>>((const int32_t *)ix->data, ix->strides[0], ix->strides[1],            \
                                               ix->strides[2], ix->strides[3], p->S1, p->N2, (int)p->K, p->nblk,     \
                                               bits, rows, buf)
    if (p->K <= 512 * 2) SFA_SORT(2);
    else if (p->K <= 512 * 4) SFA_SORT(4);
    else SFA_SORT(16);
#undef SFA_SORT
    kp->idx = buf;
    kp->sidx[3] = 1;
    kp->sidx[2] = p->K;
    kp->sidx[1] = p->N2 * p->K;
    kp->sidx[0] = p->S1 * p->N2 * p->K;
    return cudaGetLastError();
}
size_t bwd_ws_total(const spattn_sfa_problem *p) {
    size_t a, h, off[SMALL_PARTS];
    const size_t need = bwd_ws_parts(p, &a, &h);
    if (!fast_shape(p, 1)) {  // a kmaj_shape: key-major only (the deterministic test takes the same shapes)
        SmallShape ss;
        return need + (small_shape(p, true, &ss, true) ? small_parts(p, ss, off, kmaj_w(p)) : 0);
    }
    // the union form where it applies (bwd_impl takes it first), else key-major when the fp32
    // test takes it (a superset of the deterministic one's shapes; same buffers)
    const size_t un = union_cfg(p, sfa::SHAPE_MLA, true).bytes;
    if (un) return need + un;
    SmallShape ss;
    const size_t sm = small_shape(p, false, &ss) ? small_parts(p, ss, off) : 0, so = sort_bytes(p, p->B * p->S2 * p->N2);
    return need + (sm > so ? sm : so);  // key-major's buffers, or the token-major's sorted rows
}

// A backward the key-major kernel of sfa_bwd_kmaj.cu runs: its shape and a selection it takes.
bool kmaj_fits(const spattn_sfa_problem *p) {
    SmallShape ss;
    return kmaj_shape(p) >= 0 && small_shape(p, true, &ss, true);
}

unsigned grid_for(int64_t n, int64_t per_block) {
    int64_t g = (n + per_block - 1) / per_block;
    if (g < 1) g = 1;
    if (g > 132 * 32) g = 132 * 32;
    return (unsigned)g;
}


// The count histogram of the fixed-point bound (hist [B N2 nblk], zeroed) and its maximum
// (stats[4]).
void launch_hist(const spattn_sfa_problem *p, unsigned *hist, unsigned *stats, cudaStream_t st) {
    const spattn_tensor *ix = p->idx;
    // per (b, n2): CTAs of 8 rows each, fewer when the bins outnumber the adds (each CTA
    // flushes up to nblk bins); the grid's y extent is B N2 (< 2^31 rows, checked earlier)
    const int hist_smem = p->nblk <= 12288;
    int64_t cx = (p->S1 + 7) / 8;
    const int64_t cap = hist_smem ? (p->S1 * p->K) / (16 * p->nblk) : 132 * 32;
    cx = cx < (cap < 1 ? 1 : cap) ? cx : (cap < 1 ? 1 : cap);
    cx = cx > 65535 ? 65535 : cx;
    hist_kernel<<<dim3((unsigned)(cx < 1 ? 1 : cx), (unsigned)(p->B * p->N2)), 256, hist_smem ? p->nblk * 4 : 0, st>>>(
        (const int32_t *)ix->data, ix->strides[0], ix->strides[1], ix->strides[2], ix->strides[3], p->S1, p->N2, p->K,
        p->nblk, hist_smem, hist);
    hist_max_kernel<<<grid_for(p->B * p->N2 * p->nblk, 256), 256, 0, st>>>(hist, p->B * p->N2 * p->nblk, stats);
}

// The deterministic token-major backward (and the union form's) in packed int32 fixed point
// (sfa_adds.cuh add_box_p32; accumulator region of bwd_ws_parts: int32 [rows][576], then the
// full pass's row bounds [rows], then the probe's two [rows], all zeroed by the caller):
//   1. the probe: the kernels on every pt-th CTA and every 16th block of each (about 1/16 - 1/100
//      of the work), twice: each row's largest |v| (for a scale), then each row's bound;
//   2. p32_pick_kernel: F from the probe's largest row bound (scaled to the whole);
//   3. the full pass, then p32_retry_kernel: out of int32 range (or using few of its bits)
//      -> F corrected from the exact bound, the accumulator zeroed and the pass repeated (its
//      CTAs exit at once when no retry is needed).
// Every decision is made on the device from integer sums: no host round trip, graph-capturable,
// and bitwise reproducible.  Returns the kernels' launch error.
// rows: the accumulator's rows of 576 (B S2 N2; varlen: the key side's rows x N2)
unsigned long long *p32_bounds(int64_t rows, unsigned char *ws) { return (unsigned long long *)(ws + rows * sfa::DQK * 4); }
template <class Pass>
cudaError_t bwd_packed(int64_t rows, sfa::Params *kp, unsigned char *ws, unsigned *stats, int64_t ctas, Pass pass,
                       cudaStream_t st) {
    const int64_t nb = rows;
    unsigned long long *mb = p32_bounds(rows, ws), *pbd = mb + nb;
    kp->acc_i64 = nullptr;
    kp->acc_p32 = (int *)ws;
    kp->acc_bound = mb;
    kp->fix_scale = (const float *)(stats + ST_P2F);
    // the probe: about one wave of CTAs (every pt-th), 1 block in 16 of each (4 waves cost 16 %
    // of the full pass on sfa04, 6.7 % on sfa17: a CTA's fixed cost is most of a probe CTA's)
    const int pt = (int)((ctas + 131) / 132);
    // first its rows' largest |v| (the scale of the second), then their bounds (the same blocks)
    sfa::Params pr = *kp;
    pr.acc_p32 = nullptr;
    pr.acc_bound = pbd;  // first pass: [rows] u32, each row's largest |v|
    pr.fix_scale = nullptr;
    pr.probe_pt = pt;
    pr.probe_pb = 16;
    pr.probe_cnt = (unsigned long long *)(stats + ST_PCNT);
    cudaError_t e = pass(&pr);
    if (e != cudaSuccess) return e;
    max_kernel<unsigned><<<grid_for(nb, 256), 256, 0, st>>>((const unsigned *)pbd, nb, stats + ST_GMAX);
    probe_fa_kernel<<<1, 1, 0, st>>>(stats);
    pr.acc_bound = pbd + nb;  // second pass: [rows] u64 bounds in units of 2^-Fa
    pr.fix_scale = (const float *)(stats + ST_A2F);
    pr.probe_cnt = nullptr;
    if ((e = cudaGetLastError()) != cudaSuccess || (e = pass(&pr)) != cudaSuccess) return e;
    max_kernel<unsigned long long><<<grid_for(nb, 256), 256, 0, st>>>(pbd + nb, nb, (unsigned long long *)(stats + ST_PMAX));
    // SPATTN_SFA_P32_SHIFT: a test hook (sfa_cuda_check), the probe's F moved by that many bits to
    // force the retry either way
    const char *sh = getenv("SPATTN_SFA_P32_SHIFT");
    p32_pick_kernel<<<1, 1, 0, st>>>(stats, pt, sh ? atoi(sh) : 0);
    if ((e = cudaGetLastError()) != cudaSuccess || (e = pass(kp)) != cudaSuccess) return e;
    max_kernel<unsigned long long><<<grid_for(nb, 256), 256, 0, st>>>(mb, nb, (unsigned long long *)(stats + ST_MMAX));
    p32_retry_kernel<<<1, 1, 0, st>>>(stats);
    const int *retry = (const int *)(stats + ST_RETRY);
    const int64_t nz = (rows * sfa::DQK * 4 + nb * 8) / 8;  // the int32 accumulator and the full pass's bounds
    zero_if_kernel<<<grid_for(nz, 256), 256, 0, st>>>((unsigned long long *)ws, nz, retry);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    sfa::Params rt = *kp;
    rt.run_if = retry;
    e = pass(&rt);
    // SPATTN_SFA_P32_TRACE: a debugging aid, the probe's numbers and the retry decision on stderr
    // (waits for the stream; not under capture)
    if (e == cudaSuccess && getenv("SPATTN_SFA_P32_TRACE") && !stream_capturing(st)) {
        unsigned h[24];
        if ((e = cudaMemcpyAsync(h, stats, sizeof h, cudaMemcpyDeviceToHost, st)) != cudaSuccess ||
            (e = cudaStreamSynchronize(st)) != cudaSuccess)
            return e;
        unsigned long long pm, mm, c0, c1;
        memcpy(&pm, h + ST_PMAX, 8);
        memcpy(&mm, h + ST_MMAX, 8);
        memcpy(&c0, h + ST_PCNT, 8);
        memcpy(&c1, h + ST_PCNT + 2, 8);
        fprintf(stderr, "sfa p32: rows %lld ctas %lld pt %d, probe max bound %llu (Fa %d, blocks %llu / %llu), "
                "full pass max bound %llu (2^%.1f), retry %d, F %d\n", (long long)rows, (long long)ctas, pt, pm,
                (int)h[ST_AF], c0, c1, mm, mm ? log2((double)mm) : 0.0, (int)h[ST_RETRY], (int)h[ST_PF]);
    }
    return e;
}

// One pass of the token-major backward (dense or varlen, q's form): the union kernel for the groups
// its plan took (un: the call has a plan), then the per-token kernel for the other tokens.
cudaError_t bwd_kernels(const sfa::Params *q, bool un, int bf16, cudaStream_t st) {
    const cudaError_t e = un ? spattn_sfa_union_bwd_launch(q, bf16, st) : cudaSuccess;
    return e == cudaSuccess ? spattn_sfa_bwd90_launch(q, bf16, st) : e;
}

// shape: SHAPE_MLA (fast_shape) or a kmaj_shape whose selection small_shape takes (the caller
// checked: only the key-major kernel runs those)
template <typename T>
spattn_status bwd_impl(const spattn_sfa_problem *p, const spattn_exec *ex, sfa::Params *kp, int shape) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    size_t acc_b, hist_b, soff[SMALL_PARTS];
    const size_t common = bwd_ws_parts(p, &acc_b, &hist_b);
    const bool kmaj = shape != sfa::SHAPE_MLA;
    const int64_t W = kmaj_w(p);  // the dQ accumulator's row (Mla: sfa::DQK)
    // H = 4 .. 32 heads per key head: the union form (groups of 64 / H tokens as 64-row tiles)
    // where it applies, else key-major when the rows are dense enough, else token-major
    const UnionCfg u = kmaj ? UnionCfg() : union_cfg(p, sfa::SHAPE_MLA, true);
    SmallShape ss;
    const bool small = !u.bytes && small_shape(p, ex->deterministic != 0, &ss, kmaj);
    if (kmaj && !small) return spattn_set_error(SPATTN_STATUS_INTERNAL, "sfa cuda backward: key-major shape refused");
    const size_t sortb = small || u.bytes ? 0 : sort_bytes(p, p->B * p->S2 * p->N2);
    const size_t need = common + (small ? small_parts(p, ss, soff, W) : u.bytes ? u.bytes : sortb);
    cuda_scratch scr;  // the caller's workspace or spattn's kept pool (scratch.h)
    const spattn_status ss0 = scr.get(ex, need, "sfa cuda backward");
    if (ss0 != SPATTN_STATUS_SUCCESS) return ss0;
    unsigned char *ws = (unsigned char *)scr.base;
    const bool det = ex->deterministic != 0;
    unsigned *hist = (unsigned *)(ws + acc_b);
    unsigned *stats = (unsigned *)(ws + acc_b + hist_b);
    uint8_t *flags = ws + acc_b + hist_b + 256;  // a byte per accumulator element
    unsigned char *sw = ws + common;  // the key-major backward's buffers
    const size_t nq = (size_t)p->B * p->S1 * p->N1;
    cudaError_t e = cudaMemsetAsync(ws, 0, det ? common : acc_b / 2, st);
    if (e == cudaSuccess && small) e = cudaMemsetAsync(sw + soff[0], 0, nq * W * (det ? 8 : 4), st);
    if (e == cudaSuccess && small && det) e = cudaMemsetAsync(sw + soff[8], 0, nq * W, st);
    if (e == cudaSuccess && det && small) {  // int64 fixed point's a-priori bound (the key-major form)
        kmaj_maxabs<T>(p, stats, st);
        launch_hist(p, hist, stats, st);
        fix_scale_kernel<<<1, 1, 0, st>>>(stats, p->scale, (int)p->D, (int)(p->N1 / p->N2));
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        if (det) {
            kp->acc_i64 = (unsigned long long *)ws;
            kp->acc_flags = (uint32_t *)flags;
            kp->fix_scale = (const float *)(stats + 5);
        } else {
            kp->acc_f32 = (float *)ws;
        }
        const int bf16 = p->dtype == SPATTN_DTYPE_BF16;
        if (small) {
            // H <= 32, dense enough selections: key-major (sfa_bwd_small.cu)
            const sfa::SmallLists L = small_lists(sw, soff, ss, nq, det, stats, (int)p->D);
            e = spattn_sfa_bwd_small_launch(kp, &L, bf16, shape, st);
            if (e == cudaSuccess) {
                const spattn_tensor *dq = p->dq, *dqr = p->Dr ? p->dq_rope : p->dq;  // Dr 0: no column goes there
                convert_dq_kernel<T><<<grid_for((int64_t)nq * 32, 256), 256, 0, st>>>(
                    sw + soff[0], sw + soff[8], det, (const float *)(stats + 8), (T *)dq->data, (T *)dqr->data, p->B, p->S1, p->N1,
                    dq->strides[0], dq->strides[1], dq->strides[2], dqr->strides[0], dqr->strides[1], dqr->strides[2], kp->gate,
                    (int)W, (int)p->D, (int)dpad64(p->D), (int)p->Dr);
                e = cudaGetLastError();
            }
        } else {
            // the union form: the plan (the indices were checked before the call), the groups it
            // takes, then the token-major kernel (sfa_bwd90.cu) for the tokens of the others (more
            // than 32 heads per key head, sparse selections, repeated keys)
            if (u.bytes) {
                union_bind(u, sw, kp);
                e = spattn_sfa_union_plan_launch(kp, u.min_density, nullptr, st);
            } else if (sortb) {
                e = sort_idx(p, kp, (int32_t *)sw, st);
            }
            auto pass = [&](const sfa::Params *q) { return bwd_kernels(q, u.bytes != 0, bf16, st); };
            if (e == cudaSuccess) {
                if (det) {
                    const int64_t ctas = (u.bytes ? kp->ungroups : 0) + (int64_t)p->S1 * ((p->N1 / p->N2 + 63) / 64);
                    e = bwd_packed(p->B * p->S2 * p->N2, kp, ws, stats, ctas * p->B * p->N2, pass, st);
                } else {
                    e = pass(kp);
                }
            }
        }
    }
    if (e == cudaSuccess) {
        const spattn_tensor *dk = p->dk, *dkr = p->Dr ? p->dk_rope : p->dk;  // Dr 0: no column goes there
        const bool packed = det && !small;
        DkCols dc = dk_cols(p);
        if (dc.wv) {
            dc.dv = p->dv->data;
            for (int i = 0; i < 4; i++) dc.sv[i] = p->dv->strides[i];
        }
        convert_dk_kernel<T><<<grid_for(p->B * p->S2 * p->N2 * 32, 256), 256, 0, st>>>(
            ws, flags, packed ? 2 : det, (const float *)(stats + (packed ? (int)ST_P2INV : 6)), (T *)dk->data,
            (T *)dkr->data, p->B, p->S2, p->N2, dk->strides[0], dk->strides[1], dk->strides[2], dk->strides[3],
            dkr->strides[0], dkr->strides[1], dkr->strides[2], dkr->strides[3], kp->gate,
            packed ? p32_bounds(p->B * p->S2 * p->N2, ws) : nullptr, dc);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda backward: %s",
                                cudaGetErrorString(e));
    return SPATTN_STATUS_SUCCESS;
}

size_t vl_workspace(const spattn_sfa_problem *p);

size_t vl_bwd_workspace(const spattn_sfa_problem *p);

}  // namespace

extern "C" size_t spattn_cuda_sfa_workspace(const spattn_sfa_problem *p, int backward) {
    size_t off[RB_N + 1];
    if (spattn_sfa_pad_route(p)) return spattn_sfa_pad_workspace(p, backward);
    if (p->seqs) return backward ? vl_bwd_workspace(p) : vl_workspace(p);
    if (!backward) {
        const int shape = fwd_shape(p);
        return shape >= 0 ? fwd_union_cfg(p, shape).bytes : ref_parts(p, 0, off);
    }
    if (!fast_shape(p, backward) && !(backward && kmaj_fits(p))) return ref_parts(p, backward, off);
    // a size query (spattn_sfa_workspace_size) sees no O, dO or dQ: one the Hopper kernels cannot
    // read sends the call to the simple kernels, so the query answers the larger need (as bsa's)
    const size_t fast = bwd_ws_total(p);
    if (p->dout) return fast;
    const size_t ref = ref_parts(p, 1, off);
    return fast > ref ? fast : ref;
}

namespace {

// The index check in two halves.  check_launch enqueues the scan, which leaves the first bad
// position (or ~0) in an 8-byte device word, then copies it to a pinned host word of the calling
// thread and records an event; check_finish waits on that event only (the scan and the copy, not
// the kernels gated on the word: they run on after the call returns, stream-ordered like any CUDA
// library call) and turns the word into a status.  Measured on the H200 (2026-12-02, sfa07-like,
// Python op): the call returns after 170 us instead of 2207 us; GPU time unchanged (A/B 0.998x).
// Because a gated kernel may still read its word when the thread's next call starts (on another
// stream, say), the word is per call: an 8-byte allocation from spattn's own stream-ordered pool
// (one per device, release threshold kept: the default pool gave memory back at every
// synchronisation and remapped it per call, ~60 us), freed in stream order after the gated work.
// Without a pool (device ordinal >= 64 or pool creation failed): a cudaMalloc'd word, the copy
// after the gated work and a stream synchronisation.
// Under stream capture (CUDA graphs) the word is a stream-ordered allocation of the graph itself
// and the verdict is not read back: the gated kernels write nothing for a bad index, without a
// status.
struct IdxCheck {
    unsigned long long *d_bad = nullptr, *h_bad = nullptr;
    enum { EARLY, OWNED, CAPTURED } mode = EARLY;
    cudaEvent_t ev = nullptr;  // EARLY: recorded after the copy of the verdict
};

// spattn's per-device side stream (a non-blocking stream for the union forward's fork, see
// Fork), made on first use (NULL: could not be made); the verdict words and the union forward's
// workspace come from spattn's kept pool (scratch.h).
cudaStream_t side_stream(int dev) {
    static std::mutex mu;
    static cudaStream_t side[64];
    static bool tried[64];
    if (dev < 0 || dev >= 64) return nullptr;
    std::lock_guard<std::mutex> lock(mu);
    if (!tried[dev]) {
        tried[dev] = true;
        cudaStream_t ss = nullptr;
        if (cudaStreamCreateWithFlags(&ss, cudaStreamNonBlocking) == cudaSuccess) side[dev] = ss;
        cudaGetLastError();
    }
    return side[dev];
}

// A fork of the calling stream onto spattn's side stream of the device and its join: work
// enqueued on `side` between fork_begin and fork_end runs after what `st` held at the fork and
// before what `st` gets after the join.  side == NULL: no fork (under stream capture, or a setup
// step failed): enqueue on `st`.
struct Fork {
    cudaStream_t side = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
};
void fork_begin(cudaStream_t st, Fork *f) {
    int dev = -1;
    cudaStream_t side;
    if (getenv("SPATTN_SFA_UNION_NOFORK") || stream_capturing(st) || cudaGetDevice(&dev) != cudaSuccess ||
        !(side = side_stream(dev)))
        goto none;
    for (int i = 0; i < 2; i++)
        if (cudaEventCreateWithFlags(&f->ev[i], cudaEventDisableTiming) != cudaSuccess) goto none;
    if (cudaEventRecord(f->ev[0], st) != cudaSuccess || cudaStreamWaitEvent(side, f->ev[0], 0) != cudaSuccess) goto none;
    f->side = side;
    return;
none:
    cudaGetLastError();
    for (int i = 0; i < 2; i++)
        if (f->ev[i]) cudaEventDestroy(f->ev[i]);
    f->ev[0] = f->ev[1] = nullptr;
    f->side = nullptr;
}
cudaError_t fork_end(cudaStream_t st, Fork *f) {
    if (!f->side) return cudaSuccess;
    cudaError_t e = cudaEventRecord(f->ev[1], f->side);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(st, f->ev[1], 0);
    if (e != cudaSuccess) {  // the join failed: wait on the host rather than return with work in flight
        cudaGetLastError();
        cudaStreamSynchronize(f->side);
    }
    for (int i = 0; i < 2; i++) cudaEventDestroy(f->ev[i]);  // released once they complete
    f->side = nullptr;
    return e;
}

// The pinned host word of this host thread (verdict.h: read by the thread's own call only, after its event).
spattn_status host_word(IdxCheck *c) {
    c->h_bad = spattn_verdict_host_word();
    if (!c->h_bad) return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda: cudaHostAlloc of the verdict word failed");
    return SPATTN_STATUS_SUCCESS;
}

// The verdict word of one call (see IdxCheck); its content is set by the scans.
spattn_status check_word(cudaStream_t st, IdxCheck *c) {
    cudaError_t e;
    if (stream_capturing(st)) {
        c->mode = IdxCheck::CAPTURED;
        if ((e = cudaMallocAsync((void **)&c->d_bad, 8, st)) != cudaSuccess) {
            cudaGetLastError();
            c->d_bad = nullptr;
            return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda: index check word under capture: %s",
                                    cudaGetErrorString(e));
        }
        return SPATTN_STATUS_SUCCESS;
    }
    spattn_status s0 = host_word(c);
    if (s0 != SPATTN_STATUS_SUCCESS) return s0;
    int dev = -1;
    CU_TRY(cudaGetDevice(&dev));
    cudaMemPool_t mp = spattn_kept_pool(dev);
    c->ev = spattn_verdict_event(dev);
    if (mp && c->ev && cudaMallocFromPoolAsync((void **)&c->d_bad, 8, mp, st) == cudaSuccess) {
        c->mode = IdxCheck::EARLY;
        return SPATTN_STATUS_SUCCESS;
    }
    cudaGetLastError();
    c->mode = IdxCheck::OWNED;
    CU_TRY(cudaMalloc((void **)&c->d_bad, 8));
    return SPATTN_STATUS_SUCCESS;
}

// After the scans, before the gated work: the early verdict on its way to the host.  On error the
// word is released (the call fails without waiting).
cudaError_t verdict_copy(cudaStream_t st, IdxCheck *c, cudaError_t e) {
    if (e == cudaSuccess && c->mode == IdxCheck::EARLY) {
        e = cudaMemcpyAsync(c->h_bad, c->d_bad, 8, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaEventRecord(c->ev, st);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (c->mode == IdxCheck::OWNED) cudaFree(c->d_bad);
        else cudaFreeAsync(c->d_bad, st);
        c->d_bad = nullptr;
    }
    return e;
}

// After the gated work (`prior`: the status of its launches): the word released in stream order
// and the verdict read (*bad = ~0: all good); under capture nothing is read (*bad = ~0).
cudaError_t verdict_wait(cudaStream_t st, IdxCheck *c, cudaError_t prior, unsigned long long *bad) {
    cudaError_t e = prior;
    *bad = ~0ull;
    if (c->mode == IdxCheck::CAPTURED) {
        cudaFreeAsync(c->d_bad, st);
        return e;
    }
    if (c->mode == IdxCheck::EARLY) {
        const cudaError_t e2 = cudaFreeAsync(c->d_bad, st);  // after the gated kernels, in stream order
        if (e == cudaSuccess) e = e2;
        if (e == cudaSuccess) e = cudaEventSynchronize(c->ev);  // the scans and the copy only
    } else {
        if (e == cudaSuccess) e = cudaMemcpyAsync(c->h_bad, c->d_bad, 8, cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        cudaFree(c->d_bad);
    }
    if (e == cudaSuccess) *bad = *c->h_bad;
    return e;
}

// `scan` (optional): a launch that leaves the first bad position in the word it is given, in place
// of check_idx_kernel (the union forward's plan reads every index anyway).
template <typename Scan = std::nullptr_t>
spattn_status check_launch(const spattn_sfa_problem *p, cudaStream_t st, IdxCheck *c, Scan scan = nullptr) {
    spattn_status s0 = check_word(st, c);
    if (s0 != SPATTN_STATUS_SUCCESS) return s0;
    const spattn_tensor *t = p->idx;
    cudaError_t e = cudaMemsetAsync(c->d_bad, 0xff, 8, st);
    if constexpr (!std::is_same<Scan, std::nullptr_t>::value) {
        if (e == cudaSuccess) e = scan(c->d_bad);
    } else if (e == cudaSuccess) {
        check_idx_kernel<<<grid_for(p->B * p->S1 * p->N2, 8), 256, 0, st>>>(
            (const int32_t *)t->data, t->strides[0], t->strides[1], t->strides[2], t->strides[3],
            p->B, p->S1, p->N2, p->K, p->nblk, c->d_bad);
        e = cudaGetLastError();
    }
    if ((e = verdict_copy(st, c, e)) != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda: index check failed: %s",
                                cudaGetErrorString(e));
    return SPATTN_STATUS_SUCCESS;
}

// `prior` is the status of what ran between the two halves (a launch error wins).
spattn_status check_finish(const spattn_sfa_problem *p, cudaStream_t st, IdxCheck *c, cudaError_t prior) {
    const spattn_tensor *t = p->idx;
    const bool captured = c->mode == IdxCheck::CAPTURED;
    unsigned long long bad = ~0ull;
    cudaError_t e = verdict_wait(st, c, prior, &bad);
    if (captured && e == cudaSuccess) return SPATTN_STATUS_SUCCESS;  // no read-back inside a graph
    // position [b, s, n, j] of the first bad value (row-major linear index)
    const int64_t j = (int64_t)(bad % p->K), r = (int64_t)(bad / p->K), n = r % p->N2, s = (r / p->N2) % p->S1,
                  b = r / p->N2 / p->S1;
    int32_t val = 0;
    if (e == cudaSuccess && bad != ~0ull) {
        const int32_t *src = (const int32_t *)t->data + b * t->strides[0] + s * t->strides[1] +
                             n * t->strides[2] + j * t->strides[3];
        e = cudaMemcpy(&val, src, 4, cudaMemcpyDeviceToHost);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(e == cudaErrorMemoryAllocation ? SPATTN_STATUS_OUT_OF_MEMORY
                                                               : SPATTN_STATUS_CUDA_ERROR,
                                "sfa cuda: %s", cudaGetErrorString(e));
    }
    if (bad != ~0ull) {
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                "indices: value at [%lld, %lld, %lld, %lld] must be -1 or in [0, "
                                "%lld) (ceil(S2/sbs) = ceil(%lld/%lld)), got %d",
                                (long long)b, (long long)s, (long long)n, (long long)j,
                                (long long)p->nblk, (long long)p->S2, (long long)p->sbs, val);
    }
    return SPATTN_STATUS_SUCCESS;
}

}  // namespace

extern "C" spattn_status spattn_cuda_sfa_check_indices(const spattn_sfa_problem *p,
                                                       const spattn_exec *ex) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    if (stream_capturing(st)) {
        // the Hopper backward checks on the device itself under capture, its writers gated on the
        // verdict (spattn_cuda_sfa_bwd); the simple kernels need the verdict first: not captured
        if (!p->seqs && p->dout && (fast_shape(p, 1) || kmaj_fits(p))) return SPATTN_STATUS_SUCCESS;
        return capture_refusal("this sfa call (a shape of the simple kernels)");
    }
    IdxCheck c;
    spattn_status s = check_launch(p, st, &c);
    if (s != SPATTN_STATUS_SUCCESS) return s;
    return check_finish(p, st, &c, cudaSuccess);
}

// The forward checks the indices itself, without a synchronisation in between: the scan and
// the kernel run back to back, and the kernel reads the scan's result first and writes nothing
// when an index is bad (so no output is written for bad input, and the check costs its scan
// only, not a host round trip before the launch).  One synchronisation at the end reports it.
namespace {


spattn_status ref_grid_ok(const spattn_sfa_problem *p) {
    const long long H = p->N1 / p->N2;
    if (p->B * p->S1 * p->N2 * ((H + 7) / 8) > 0x7fffffffLL)  // sfa_ref.cu: 8 heads per block
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda: problem too large for the grid");
    return SPATTN_STATUS_SUCCESS;
}

// Tests: SPATTN_SFA_REQUIRE_HOPPER=1 refuses a call the simple kernels would take (true: the error
// is set, the caller returns NOT_SUPPORTED before writing anything), so that a check of a Hopper
// kernel's shape cannot pass on them.
bool simple_refused(const char *what) {
    const char *g = getenv("SPATTN_SFA_REQUIRE_HOPPER");
    if (!(g && g[0] == '1')) return false;
    spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda %s: SPATTN_SFA_REQUIRE_HOPPER=1 and the call would run the simple kernels", what);
    return true;
}

// Shapes without a Hopper kernel: the reference kernels (fp32 arithmetic), then the outputs
// converted into the caller's tensors.  The indices are checked first (nothing written for bad
// input).
spattn_status ref_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    if (simple_refused("forward")) return SPATTN_STATUS_NOT_SUPPORTED;
    spattn_status s = ref_grid_ok(p);
    if (s == SPATTN_STATUS_SUCCESS) s = spattn_cuda_sfa_check_indices(p, ex);
    if (s != SPATTN_STATUS_SUCCESS) return s;
    size_t off[RB_N + 1];
    cuda_scratch w;
    if ((s = w.get(ex, ref_parts(p, 0, off), "sfa cuda")) != SPATTN_STATUS_SUCCESS) return s;
    float *o32 = reinterpret_cast<float *>(w.base + off[0]), *l32 = reinterpret_cast<float *>(w.base + off[1]);
    if ((s = spattn_cuda_ref_sfa_fwd(p, ex, o32, l32)) != SPATTN_STATUS_SUCCESS) return s;
    cudaError_t e = cvt::to_tensor(o32, p->o, w.st);
    if (e == cudaSuccess && p->lse) e = cvt::to_tensor3(l32, p->lse, w.st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda forward (simple kernels): %s", cudaGetErrorString(e));
    }
    return SPATTN_STATUS_SUCCESS;
}

// ---- the simple-kernel backward (shapes without a Hopper kernel) --------------------------------
// deterministic = 0: fp32 atomics into the fp32 dK / dK_rope / dV parts; deterministic = 1:
// int64 fixed point (exact integer adds: bitwise reproducible), its scale from the same bound as
// the Hopper path's (fix_scale_kernel) with |V| bounding |dP| / |O| (O is a convex combination
// of V rows; k does not enter dK's bound beyond P <= 1), then converted into the fp32 parts.

// stats[0..3] of the bound: max|q, q_rope|, max|v| twice (the |dP| and |O| bounds), max|dO|
template <typename T>
void ref_maxabs(const spattn_sfa_problem *p, unsigned *stats, cudaStream_t st) {
    const spattn_tensor *v = p->shared_kv ? p->k : p->v;
    spattn_launch_maxabs<T>(p->q, stats + 0, st);
    if (p->q_rope && p->Dr) spattn_launch_maxabs<T>(p->q_rope, stats + 0, st);
    spattn_launch_maxabs<T>(v, stats + 1, st);
    spattn_launch_maxabs<T>(v, stats + 2, st);
    spattn_launch_maxabs<T>(p->dout, stats + 3, st);
}

__global__ void fix_to_f32_kernel(const long long *acc, const uint8_t *flags, const float *inv_scale, float *out,
                                  int64_t n) {
    const float inv = *inv_scale;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fix_value(acc[i], flags[i], inv);
}

// The simple backward into the fp32 parts of ref_parts at base (p: the problem or the varlen
// views, tok their token table or NULL, krows the key side's rows).  hist(hist, stats) launches
// the count histogram of the deterministic bound.
template <typename T, typename Hist>
spattn_status ref_bwd_core(const spattn_sfa_problem *p, const spattn_exec *ex, char *base, const size_t *off,
                           const int4 *tok, int64_t krows, Hist hist) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    const bool det = ex->deterministic != 0, rope = p->Dr > 0, sep = !p->shared_kv;
    float *f[5];
    for (int i = 0; i < 5; i++) f[i] = reinterpret_cast<float *>(base + off[i]);
    const int64_t n[3] = {krows * p->N2 * p->D, rope ? krows * p->N2 * p->Dr : 0, sep ? krows * p->N2 * p->D : 0};
    unsigned *stats = reinterpret_cast<unsigned *>(base + off[RB_STATS]);
    sfa_ref_fix fix;
    memset(&fix, 0, sizeof fix);
    cudaError_t e = cudaSuccess;
    if (det) {
        e = cudaMemsetAsync(base + off[RB_AK], 0, off[RB_N] - off[RB_AK], st);
        if (e == cudaSuccess) {
            ref_maxabs<T>(p, stats, st);
            hist(reinterpret_cast<unsigned *>(base + off[RB_HIST]), stats);
            fix_scale_kernel<<<1, 1, 0, st>>>(stats, p->scale, (int)p->D, (int)(p->N1 / p->N2));
            e = cudaGetLastError();
        }
        for (int i = 0; i < 3; i++) {
            fix.acc[i] = n[i] ? reinterpret_cast<unsigned long long *>(base + off[RB_AK + i]) : nullptr;
            fix.flags[i] = reinterpret_cast<uint32_t *>(base + off[RB_FK + i]);
        }
        fix.scale = reinterpret_cast<const float *>(stats + 5);
    }
    if (e == cudaSuccess) {
        const spattn_status s = spattn_cuda_ref_sfa_bwd_into(p, ex, tok, krows, det ? &fix : nullptr, f[0], rope ? f[1] : nullptr,
                                                             f[2], rope ? f[3] : nullptr, sep ? f[4] : nullptr);
        if (s != SPATTN_STATUS_SUCCESS) return s;
        for (int i = 0; det && i < 3 && e == cudaSuccess; i++) {
            if (!n[i]) continue;
            fix_to_f32_kernel<<<grid_for(n[i], 256), 256, 0, st>>>(reinterpret_cast<const long long *>(fix.acc[i]),
                                                                   reinterpret_cast<const uint8_t *>(base + off[RB_FK + i]),
                                                                   reinterpret_cast<const float *>(stats + 6),
                                                                   f[2 + i], n[i]);
            e = cudaGetLastError();
        }
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda backward (simple kernels): %s", cudaGetErrorString(e));
    }
    return SPATTN_STATUS_SUCCESS;
}

template <typename Hist>
spattn_status ref_bwd_any(const spattn_sfa_problem *p, const spattn_exec *ex, char *base, const size_t *off,
                          const int4 *tok, int64_t krows, Hist hist) {
    if (p->dtype == SPATTN_DTYPE_F32) return ref_bwd_core<float>(p, ex, base, off, tok, krows, hist);
    if (p->dtype == SPATTN_DTYPE_F16) return ref_bwd_core<__half>(p, ex, base, off, tok, krows, hist);
    return ref_bwd_core<__nv_bfloat16>(p, ex, base, off, tok, krows, hist);
}

spattn_status ref_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    if (simple_refused("backward")) return SPATTN_STATUS_NOT_SUPPORTED;
    spattn_status s = ref_grid_ok(p);
    if (s != SPATTN_STATUS_SUCCESS) return s;
    size_t off[RB_N + 1];
    cuda_scratch w;
    if ((s = w.get(ex, ref_parts(p, 1, off), "sfa cuda")) != SPATTN_STATUS_SUCCESS) return s;
    s = ref_bwd_any(p, ex, w.base, off, nullptr, p->B * p->S2,
                    [&](unsigned *hist, unsigned *stats) { launch_hist(p, hist, stats, w.st); });
    if (s != SPATTN_STATUS_SUCCESS) return s;
    float *f[5];
    for (int i = 0; i < 5; i++) f[i] = reinterpret_cast<float *>(w.base + off[i]);
    const bool rope = p->Dr > 0, sep = !p->shared_kv;
    cudaError_t e = cvt::to_tensor(f[0], p->dq, w.st);
    if (e == cudaSuccess) e = cvt::to_tensor(f[2], p->dk, w.st);
    if (e == cudaSuccess && rope) e = cvt::to_tensor(f[1], p->dq_rope, w.st);
    if (e == cudaSuccess && rope) e = cvt::to_tensor(f[3], p->dk_rope, w.st);
    if (e == cudaSuccess && sep) e = cvt::to_tensor(f[4], p->dv, w.st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda backward (simple kernels): %s", cudaGetErrorString(e));
    }
    return SPATTN_STATUS_SUCCESS;
}

// ---- packed variable-length / paged forward (spattn_sfa_fwd_varlen) -----------------------------
// The prefix sums, the block table and the index values are checked on the device: they never
// come to the host (only the offending entries of a refused call are read back, for its message).
// Each failed check leaves a key in the gate word with atomicMin; the keys order the failures as
// the CPU's checks meet them (cu_seqlens_q, cu_seqlens_kv, block_table by row and slot, then the
// indices by position), so a refused call names the entry the CPU backend names.  The attention
// kernels are gated on that word (nothing written unless it is still ~0) and never read outside
// the tensors even when the layout is bad: the pre-pass gives a token with bad lengths no keys,
// and the gather masks a page id out of range.
constexpr unsigned long long VK_CUQ = 0, VK_CUKV = 1ull << 60, VK_TAB = 2ull << 60, VK_IDX = 3ull << 60;
constexpr unsigned long long VK_LOW = (1ull << 60) - 1;
constexpr int VL_BITS = 8 * 32768;  // page ids per round of the duplicate bitmap (32 KB of shared memory)

struct VlArgs {
    const int32_t *cu_q, *cu_kv;
    int64_t cq_s, ckv_s, B, Tq, Tkv /* -1 with pages */, max_q, max_kv;
    const int32_t *table;
    int64_t tab_s0, tab_s1, max_pages, page_size, num_pages;
    const int32_t *idx;
    int64_t si0, si1, si2, N2, K, sbs;
    int mode;
};

VlArgs vl_args(const spattn_sfa_problem *p) {
    const spattn_seqs *s = p->seqs;
    VlArgs a;
    a.cu_q = s->cu_q;
    a.cu_kv = s->cu_kv;
    a.cq_s = s->cu_q_st;
    a.ckv_s = s->cu_kv_st;
    a.B = s->B;
    a.Tq = s->Tq;
    a.Tkv = s->table ? -1 : s->Tkv;
    a.max_q = s->max_q;
    a.max_kv = s->max_kv;
    a.table = s->table;
    a.tab_s0 = s->tab_s0;
    a.tab_s1 = s->tab_s1;
    a.max_pages = s->max_pages;
    a.page_size = s->table ? s->page_size : 1;
    a.num_pages = s->num_pages;
    a.idx = (const int32_t *)p->idx->data;
    a.si0 = p->idx->strides[0];
    a.si1 = p->idx->strides[1];
    a.si2 = p->idx->strides[2];
    a.N2 = p->N2;
    a.K = p->K;
    a.sbs = p->sbs;
    a.mode = p->mode;
    return a;
}

// Entry b (0 .. B) of a prefix-sum array: cu[0] = 0, non-decreasing, lengths <= max, cu[B] <= T
// (T < 0: no bound).  Keys: b * 4 + (0: cu[0], 1: decreasing, 2: too long, 3: past T).
__device__ void vl_prefix_entry(const int32_t *cu, int64_t st, int64_t b, int64_t B, int64_t mx, int64_t T,
                                unsigned long long cat, unsigned long long *bad) {
    if (b == 0 && cu[0] != 0) atomicMin(bad, cat);
    if (b < B) {
        const int64_t x = cu[b * st], e = cu[(b + 1) * st];
        if (e < x) atomicMin(bad, cat + (unsigned long long)b * 4 + 1);
        else if (e - x > mx) atomicMin(bad, cat + (unsigned long long)b * 4 + 2);
    } else if (T >= 0 && cu[b * st] > T) {
        atomicMin(bad, cat + (unsigned long long)b * 4 + 3);
    }
}

// Prefix sums (one thread per entry) and the block table (one CTA per row): capacity, page ids in
// range, no id twice in a row.  Table keys per row r: r * (2 max_pages + 3) + 0 (capacity), or
// + 2 (j + 1) (slot j out of range), + 2 (j + 1) + 1 (slot j repeats an earlier slot).
__global__ void vl_seq_check_kernel(const VlArgs a, unsigned long long *bad) {
    extern __shared__ unsigned vl_bits[];  // VL_BITS / 32 words, with a table only
    __shared__ int s_lo, s_hi;
    const int64_t nth = (int64_t)gridDim.x * blockDim.x;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b <= a.B; b += nth) {
        vl_prefix_entry(a.cu_q, a.cq_s, b, a.B, a.max_q, a.Tq, VK_CUQ, bad);
        vl_prefix_entry(a.cu_kv, a.ckv_s, b, a.B, a.max_kv, a.Tkv, VK_CUKV, bad);
    }
    if (!a.table) return;
    const unsigned long long W = 2ull * (unsigned long long)a.max_pages + 3;
    for (int64_t r = blockIdx.x; r < a.B; r += gridDim.x) {  // uniform per CTA: barriers below are safe
        const unsigned long long rk = VK_TAB + (unsigned long long)r * W;
        const int64_t len = (int64_t)a.cu_kv[(r + 1) * a.ckv_s] - a.cu_kv[r * a.ckv_s];
        const int64_t need = len > 0 ? (len + a.page_size - 1) / a.page_size : 0;
        if (need > a.max_pages) {
            if (threadIdx.x == 0) atomicMin(bad, rk);
            continue;
        }
        const int32_t *row = a.table + r * a.tab_s0;
        if (threadIdx.x == 0) {
            s_lo = INT_MAX;
            s_hi = -1;
        }
        __syncthreads();
        for (int64_t j = threadIdx.x; j < need; j += blockDim.x) {
            const int32_t pg = row[j * a.tab_s1];
            if (pg < 0 || pg >= a.num_pages) {
                atomicMin(bad, rk + (unsigned long long)(j + 1) * 2);
            } else {
                atomicMin(&s_lo, pg);
                atomicMax(&s_hi, pg);
            }
        }
        __syncthreads();
        const int64_t lo = s_lo, hi = s_hi;
        // duplicates: a bitmap of the ids in [lo, hi], VL_BITS ids per round (one round unless the
        // row's ids spread over more than 262144 pages)
        int dup = 0;
        for (int64_t base = lo; base <= hi && !dup; base += VL_BITS) {
            for (int i = threadIdx.x; i < VL_BITS / 32; i += blockDim.x) vl_bits[i] = 0u;
            __syncthreads();
            int mine = 0;
            for (int64_t j = threadIdx.x; j < need; j += blockDim.x) {
                const int64_t pg = row[j * a.tab_s1];
                if (pg >= base && pg < base + VL_BITS && pg <= hi) {  // in range: lo >= 0, hi < num_pages
                    const unsigned off = (unsigned)(pg - base), m = 1u << (off & 31);
                    if (atomicOr(&vl_bits[off >> 5], m) & m) mine = 1;
                }
            }
            dup = __syncthreads_or(mine);
        }
        if (dup)  // the first slot that repeats an earlier one, as the CPU names it (refused calls only)
            for (int64_t j = threadIdx.x; j < need; j += blockDim.x) {
                const int32_t pg = row[j * a.tab_s1];
                if (pg < 0 || pg >= a.num_pages) continue;
                for (int64_t j2 = 0; j2 < j; j2++)
                    if (row[j2 * a.tab_s1] == pg) {
                        atomicMin(bad, rk + (unsigned long long)(j + 1) * 2 + 1);
                        break;
                    }
            }
        __syncthreads();  // s_lo, s_hi and the bitmap are reused by the next row
    }
}

// Token t's {sequence (-1: t >= cu_q[B]), first key row (packed keys; 0 with pages or no keys),
// key count, causal limit}: the last sequence starting at or before t (empty ones skipped), by a
// binary search that stays inside cu_q whatever it holds.  Lengths that do not fit (bad prefix
// sums or table capacity, which the checks refuse) give the token no keys, so the gather reads
// nothing for it.
__device__ int4 vl_token_info(const VlArgs &a, int64_t t) {
    if (t >= a.cu_q[a.B * a.cq_s]) return make_int4(-1, 0, 0, -1);
    int64_t lo = 0, hi = a.B - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) >> 1;
        if (a.cu_q[mid * a.cq_s] <= t) lo = mid;
        else hi = mid - 1;
    }
    const int64_t q0 = a.cu_q[lo * a.cq_s], lq = (int64_t)a.cu_q[(lo + 1) * a.cq_s] - q0, i = t - q0;
    int64_t kv0 = a.cu_kv[lo * a.ckv_s], lk = (int64_t)a.cu_kv[(lo + 1) * a.ckv_s] - kv0;
    const bool ok = i >= 0 && i < lq && lq <= a.max_q && lk >= 0 && lk <= a.max_kv &&
                    (a.table ? (lk + a.page_size - 1) / a.page_size <= a.max_pages
                             : kv0 >= 0 && kv0 + lk <= a.Tkv);
    if (!ok) lk = 0;
    if (lk == 0 || a.table) kv0 = 0;
    int64_t lim = a.mode == 3 ? lk - lq + i : lk - 1;  // right-down causal on the sequence's lengths
    lim = lim < lk - 1 ? lim : lk - 1;
    lim = lim < -1 ? -1 : lim;
    return make_int4((int)lo, (int)kv0, (int)lk, (int)lim);
}

// One warp per index row (t, n) of the packed tokens: the token's entry of `tok` (written by the
// n = 0 warp) and the row's values against the sequence's own block count; rows of tokens past
// cu_q[B] are not read.
__global__ void vl_tok_kernel(const VlArgs a, int4 *tok, unsigned long long *bad) {
    const int64_t rows = a.Tq * a.N2;
    const int lane = threadIdx.x & 31;
    const int64_t nwarps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += nwarps) {
        const int64_t t = r / a.N2, n = r % a.N2;
        const int4 info = vl_token_info(a, t);  // the same in every lane
        if (n == 0 && lane == 0) tok[t] = info;
        if (info.x < 0) continue;
        const int64_t nblk = ((int64_t)info.z + a.sbs - 1) / a.sbs;
        const int32_t *row = a.idx + t * a.si0 + n * a.si1;
        unsigned m = 0xffffffffu;  // first bad column seen by this lane
        for (int64_t j = lane; j < a.K; j += 32) {
            const int32_t x = row[j * a.si2];
            if (x < -1 || (int64_t)x >= nblk) {
                m = (unsigned)j;
                break;
            }
        }
        for (int o = 16; o > 0; o >>= 1) m = min(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0 && m != 0xffffffffu) atomicMin(bad, VK_IDX + (unsigned long long)r * a.K + m);
    }
}

cudaError_t vl_launch_checks(const spattn_sfa_problem *p, cudaStream_t st, int4 *tok, unsigned long long *d_bad) {
    const VlArgs a = vl_args(p);
    cudaError_t e = cudaMemsetAsync(d_bad, 0xff, 8, st);
    if (e != cudaSuccess) return e;
    const int64_t g = a.B > 1024 ? 1024 : a.B;  // one CTA per table row; B + 1 <= 1024 * 256 entries per pass
    vl_seq_check_kernel<<<(unsigned)g, 256, a.table ? VL_BITS / 8 : 0, st>>>(a, d_bad);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    vl_tok_kernel<<<grid_for(a.Tq * a.N2, 8), 256, 0, st>>>(a, tok, d_bad);
    return cudaGetLastError();
}

// Message of the failure `key` (the gate word); the offending entries are read back.
spattn_status vl_report(const spattn_sfa_problem *p, unsigned long long key, const int4 *tok) {
    const spattn_seqs *s = p->seqs;
    const unsigned long long low = key & VK_LOW, cat = key & ~VK_LOW;
    int32_t v[2] = {0, 0};
    auto rd = [](int32_t *dst, const int32_t *src) { return cudaMemcpy(dst, src, 4, cudaMemcpyDeviceToHost); };
    cudaError_t e = cudaSuccess;
    if (cat == VK_CUQ || cat == VK_CUKV) {
        const bool isq = cat == VK_CUQ;
        const char *name = isq ? "cu_seqlens_q" : "cu_seqlens_kv";
        const int32_t *cu = isq ? s->cu_q : s->cu_kv;
        const int64_t cst = isq ? s->cu_q_st : s->cu_kv_st, b = (int64_t)(low / 4);
        const int kind = (int)(low % 4);
        e = rd(&v[0], cu + b * cst);
        if (e == cudaSuccess && (kind == 1 || kind == 2)) e = rd(&v[1], cu + (b + 1) * cst);
        if (e == cudaSuccess) {
            if (kind == 0)
                return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "%s: [0] must be 0, got %d", name, v[0]);
            if (kind == 1)
                return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                        "%s: prefix sums must be non-decreasing, got [%lld] = %lld > [%lld] = %lld",
                                        name, (long long)b, (long long)v[0], (long long)(b + 1), (long long)v[1]);
            if (kind == 2)
                return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "%s: sequence %lld has length %lld > %s = %lld", name,
                                        (long long)b, (long long)v[1] - v[0], isq ? "max_seqlen_q" : "max_seqlen_kv",
                                        (long long)(isq ? s->max_q : s->max_kv));
            return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "%s: [B] = %lld exceeds the %lld tokens of %s", name,
                                    (long long)v[0], (long long)(isq ? s->Tq : s->Tkv), isq ? "q" : "k");
        }
    } else if (cat == VK_TAB) {
        const unsigned long long W = 2ull * (unsigned long long)s->max_pages + 3;
        const int64_t r = (int64_t)(low / W), code = (int64_t)(low % W);
        if (code == 0) {
            e = rd(&v[0], s->cu_kv + r * s->cu_kv_st);
            if (e == cudaSuccess) e = rd(&v[1], s->cu_kv + (r + 1) * s->cu_kv_st);
            if (e == cudaSuccess)
                return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                        "block_table: sequence %lld has %lld keys, more than max_pages * page_size = "
                                        "%lld * %lld",
                                        (long long)r, (long long)v[1] - v[0], (long long)s->max_pages,
                                        (long long)s->page_size);
        } else {
            const int64_t j = code / 2 - 1;
            e = rd(&v[0], s->table + r * s->tab_s0 + j * s->tab_s1);
            if (e == cudaSuccess && (code & 1))
                return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "block_table: page %d appears twice in row %lld", v[0],
                                        (long long)r);
            if (e == cudaSuccess)
                return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                        "block_table: [%lld, %lld] must be a page id in [0, %lld) (pages of k), got %d",
                                        (long long)r, (long long)j, (long long)s->num_pages, v[0]);
        }
    } else {
        const int64_t r = (int64_t)(low / p->K), j = (int64_t)(low % p->K), t = r / p->N2, n = r % p->N2;
        const spattn_tensor *ix = p->idx;
        int4 info = make_int4(0, 0, 0, 0);
        e = rd(&v[0], (const int32_t *)ix->data + t * ix->strides[0] + n * ix->strides[1] + j * ix->strides[2]);
        if (e == cudaSuccess) e = cudaMemcpy(&info, tok + t, sizeof info, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                    "indices: value at [%lld, %lld, %lld] (sequence %d) must be -1 or in [0, %lld) "
                                    "(ceil(Skv/sbs) = ceil(%d/%lld) of the sequence), got %d",
                                    (long long)t, (long long)n, (long long)j, info.x,
                                    ((long long)info.z + p->sbs - 1) / p->sbs, info.z, (long long)p->sbs, v[0]);
    }
    cudaGetLastError();
    return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda varlen: reading a refused entry: %s",
                            cudaGetErrorString(e));
}

// As check_finish, then the varlen verdict.
spattn_status vl_finish(const spattn_sfa_problem *p, cudaStream_t st, IdxCheck *c, const int4 *tok, cudaError_t prior) {
    unsigned long long bad = ~0ull;
    const cudaError_t e = verdict_wait(st, c, prior, &bad);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(e == cudaErrorMemoryAllocation ? SPATTN_STATUS_OUT_OF_MEMORY : SPATTN_STATUS_CUDA_ERROR,
                                "sfa cuda varlen: %s", cudaGetErrorString(e));
    }
    return bad == ~0ull ? SPATTN_STATUS_SUCCESS : vl_report(p, bad, tok);
}

// The varlen checks into a fresh verdict word, the verdict on its way to the host (check_launch's
// varlen form); vl_finish reads it.
spattn_status vl_check_launch(const spattn_sfa_problem *p, cudaStream_t st, int4 *tok, IdxCheck *c) {
    spattn_status r = check_word(st, c);
    if (r != SPATTN_STATUS_SUCCESS) return r;
    const cudaError_t e = verdict_copy(st, c, vl_launch_checks(p, st, tok, c->d_bad));
    if (e != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda varlen: checks failed: %s", cudaGetErrorString(e));
    return SPATTN_STATUS_SUCCESS;
}

// The varlen checks and their verdict, for the calls that need it before their kernels.
spattn_status vl_check_now(const spattn_sfa_problem *p, cudaStream_t st, int4 *tok) {
    IdxCheck c;
    spattn_status r = vl_check_launch(p, st, tok, &c);
    if (r != SPATTN_STATUS_SUCCESS) return r;
    return vl_finish(p, st, &c, tok, cudaSuccess);
}

// The problem over views the dense kernels index: B = 1, S1 = Tq, S2 = max_seqlen_kv; packed
// [T, H, D] tensors as [1, T, H, D] with batch stride 0; pages either as they are (simple
// kernels: page and row strides) or, for the Hopper kernels, as [1, num_pages * page_size, H, D]
// rows (their page stride is page_size rows: checked by vl_fast).
// The kernels' view of the sequences: the pre-pass's per-token info and the page table.
void set_vl(sfa::Params *kp, const int4 *tok, const spattn_seqs *s) {
    kp->vl.tok = tok;
    kp->vl.table = s->table;
    kp->vl.tab_s0 = s->tab_s0;
    kp->vl.tab_s1 = s->tab_s1;
    kp->vl.page_size = s->table ? (int)s->page_size : 1;
    kp->vl.num_pages = s->table ? (int)s->num_pages : 0;
    kp->vl.rows = (int)s->Tkv;  // < 2^31 (vl_limits)
}

struct VlView {
    spattn_sfa_problem p;
    spattn_tensor t[14];
};

spattn_tensor vl_tok_view(const spattn_tensor *t) {
    spattn_tensor v = *t;
    v.ndim = t->ndim + 1;
    for (int d = t->ndim; d > 0; d--) {
        v.shape[d] = t->shape[d - 1];
        v.strides[d] = t->strides[d - 1];
    }
    v.shape[0] = 1;
    v.strides[0] = 0;
    return v;
}

spattn_tensor vl_rows_view(const spattn_tensor *t) {
    spattn_tensor v = *t;
    v.shape[1] = t->shape[0] * t->shape[1];
    v.shape[0] = 1;
    v.strides[0] = 0;
    return v;
}

void vl_view(const spattn_sfa_problem *p, bool fast, VlView *w) {
    const bool paged = p->seqs->table != nullptr;
    w->p = *p;
    // the backward's tensors too (NULL in a forward): dout, dq, dq_rope; the key side dk, dk_rope, dv
    const spattn_tensor *src[14] = {p->q,  p->q_rope, p->k,  p->k_rope,  p->v,     p->idx,     p->o,
                                    p->lse, p->dout,  p->dq, p->dq_rope, p->dk,    p->dk_rope, p->dv};
    const spattn_tensor **dst[14] = {&w->p.q,   &w->p.q_rope, &w->p.k,  &w->p.k_rope,  &w->p.v,  &w->p.idx,     &w->p.o,
                                     &w->p.lse, &w->p.dout,   &w->p.dq, &w->p.dq_rope, &w->p.dk, &w->p.dk_rope, &w->p.dv};
    for (int i = 0; i < 14; i++) {
        if (!src[i]) continue;
        const bool kside = (i >= 2 && i <= 4) || i >= 11;
        w->t[i] = kside && paged ? (fast ? vl_rows_view(src[i]) : *src[i]) : vl_tok_view(src[i]);
        *dst[i] = &w->t[i];
    }
    w->p.B = 1;
    w->p.S1 = p->seqs->Tq;
}

// The Hopper kernels' shapes (fwd_shape, fast_shape) on the views; with pages, a page is
// page_size rows of k (and of k_rope, v) apart.
// Backward: the same on the backward's tensors (dk / dk_rope are converted with their own strides).
// Pages a Hopper kernel can read as rows: each key-side tensor's page stride page_size rows.
bool vl_fast_layout(const spattn_sfa_problem *p) {
    const spattn_seqs *s = p->seqs;
    if (s->table) {
        const spattn_tensor *ks[3] = {p->k, p->k_rope, p->v};
        for (int i = 0; i < 3; i++)
            if (ks[i] && ks[i]->strides[0] != s->page_size * ks[i]->strides[1]) return false;
    }
    return true;
}
bool vl_fast(const spattn_sfa_problem *p, const VlView &w, int backward = 0) {
    if (!vl_fast_layout(p)) return false;
    return backward ? fast_shape(&w.p, 1) : fwd_shape(&w.p) >= 0;
}

// Limits shared by the varlen forward and backward: the gate keys (a table row's keys and an
// index position stay below 2^60) and, for the Hopper kernels, int32 key-side rows (the gather's
// row numbers: packed rows, or page * page_size + row).
spattn_status vl_limits(const spattn_sfa_problem *p, const VlView &w, bool fast) {
    const spattn_seqs *s = p->seqs;
    if (s->B >= (1LL << 30) || (double)s->Tq * p->N2 * p->K >= 1e18 ||
        (double)s->B * (2.0 * s->max_pages + 3) >= 1e18)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda varlen: problem too large for the device checks");
    if (fast && s->Tkv >= (1LL << 31))
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "sfa cuda varlen: %lld key-side rows (the Hopper kernels take < 2^31)", (long long)s->Tkv);
    return fast ? limits_ok(&w.p) : ref_grid_ok(&w.p);
}

// The union form over the packed tokens (sfa_union.cu, sfa_fwd.cu / sfa_bwd90.cu with VL): groups
// of ug consecutive packed tokens of one sequence, blocks of 64 key-side rows.  Such a group
// touches at most ceil(max_seqlen_kv / 64) + 1 blocks of rows (packed: the sequence's rows are
// contiguous; paged: its compacted keys need no more): the cap, so a group past it (scattered
// pages without compaction) goes to the per-token kernel instead of sizing every group's lists
// for the whole key side.  shape: the forward's fwd_shape (the backward's is always the Mla one).
UnionCfg vl_union_cfg(const spattn_sfa_problem *p, const VlView &w, bool bwd, int shape = sfa::SHAPE_MLA) {
    const spattn_seqs *s = p->seqs;
    return union_cfg(&w.p, shape, bwd, s->Tkv, (s->max_kv + 63) / 64 + 2);
}

size_t vl_workspace(const spattn_sfa_problem *p) {
    VlView w;
    vl_view(p, true, &w);
    size_t off[RB_N + 1];
    const size_t tb = align256((size_t)p->seqs->Tq * sizeof(int4));
    return vl_fast(p, w) ? tb + vl_union_cfg(p, w, false, fwd_shape(&w.p)).bytes : tb + ref_parts(&w.p, 0, off);
}

// Simple-kernel results [Tq, N, D] / [Tq, N] (fp32, contiguous) into the caller's tensors,
// skipping tokens past cu_seqlens_q[B] (not written).
template <typename T> __device__ __forceinline__ T vl_cvt(float x);
template <> __device__ __forceinline__ float vl_cvt<float>(float x) { return x; }
template <> __device__ __forceinline__ __half vl_cvt<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 vl_cvt<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__global__ void vl_store_kernel(const float *src, T *dst, int64_t s0, int64_t s1, int64_t s2, int64_t N, int64_t D,
                                int64_t total, const int4 *tok) {
    for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < total; x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = x / (N * D), n = (x / D) % N, d = x % D;
        if (tok[t].x >= 0) dst[t * s0 + n * s1 + d * s2] = vl_cvt<T>(src[x]);
    }
}

cudaError_t vl_store(const float *src, const spattn_tensor *t, int64_t D, int dtype, const int4 *tok, cudaStream_t st) {
    const int64_t N = t->shape[1], total = t->shape[0] * N * D;
    const int64_t s2 = D > 1 ? t->strides[2] : 0;
    const unsigned g = grid_for(total, 256);
    if (dtype == SPATTN_DTYPE_F16)
        vl_store_kernel<__half><<<g, 256, 0, st>>>(src, (__half *)t->data, t->strides[0], t->strides[1], s2, N, D, total, tok);
    else if (dtype == SPATTN_DTYPE_BF16)
        vl_store_kernel<__nv_bfloat16><<<g, 256, 0, st>>>(src, (__nv_bfloat16 *)t->data, t->strides[0], t->strides[1], s2, N,
                                                           D, total, tok);
    else
        vl_store_kernel<float><<<g, 256, 0, st>>>(src, (float *)t->data, t->strides[0], t->strides[1], s2, N, D, total, tok);
    return cudaGetLastError();
}

spattn_status vl_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    if (stream_capturing((cudaStream_t)ex->stream)) return capture_refusal("the varlen sfa forward");
    const spattn_seqs *s = p->seqs;
    VlView w;
    vl_view(p, true, &w);
    const bool fast = vl_fast(p, w);
    if (!fast && simple_refused("varlen forward")) return SPATTN_STATUS_NOT_SUPPORTED;
    if (!fast) vl_view(p, false, &w);
    spattn_status r = vl_limits(p, w, fast);
    if (r != SPATTN_STATUS_SUCCESS) return r;
    size_t off[RB_N + 1];
    const size_t tb = align256((size_t)s->Tq * sizeof(int4));
    const int shape = fast ? fwd_shape(&w.p) : -1;
    const UnionCfg u = fast ? vl_union_cfg(p, w, false, shape) : UnionCfg{};
    cuda_scratch ws;
    if ((r = ws.get(ex, fast ? tb + u.bytes : tb + ref_parts(&w.p, 0, off), "sfa cuda")) != SPATTN_STATUS_SUCCESS) return r;
    int4 *tok = reinterpret_cast<int4 *>(ws.base);
    cudaStream_t st = ws.st;
    IdxCheck c;
    if ((r = vl_check_launch(p, st, tok, &c)) != SPATTN_STATUS_SUCCESS) return r;
    if (fast) {  // checks, then the kernels gated on their verdict; the call waits for the checks only
        sfa::Params kp;
        fill_params(&w.p, &kp);
        kp.out_lse = p->lse ? (float *)p->lse->data : nullptr;
        kp.o = nullptr;
        kp.gate = c.d_bad;
        set_vl(&kp, tok, s);
        const int bf16 = p->dtype == SPATTN_DTYPE_BF16;
        cudaError_t e = cudaSuccess;
        // H = 4 .. 32 (Mla): the union plan over the packed tokens (it reads the pre-pass's token
        // table and masks every value it reads, checked or not), the union kernel for its groups,
        // then the per-token kernel for the others (one stream: the dense call's fork is not
        // worth a second path here)
        if (u.bytes) {
            union_bind(u, ws.base + tb, &kp);
            e = spattn_sfa_union_plan_launch(&kp, u.min_density, nullptr, st);
            if (e == cudaSuccess) e = spattn_sfa_union_fwd_launch(&kp, bf16, st);
        }
        if (e == cudaSuccess) e = fwd_launch(&kp, shape, bf16, st);
        return vl_finish(p, st, &c, tok, e);
    }
    // simple kernels: the verdict first (they write fp32 scratch, converted afterwards)
    if ((r = vl_finish(p, st, &c, tok, cudaSuccess)) != SPATTN_STATUS_SUCCESS) return r;
    float *o32 = reinterpret_cast<float *>(ws.base + tb + off[0]), *l32 = reinterpret_cast<float *>(ws.base + tb + off[1]);
    if ((r = spattn_cuda_ref_sfa_fwd_varlen(&w.p, ex, tok, o32, l32)) != SPATTN_STATUS_SUCCESS) return r;
    cudaError_t e = vl_store(o32, p->o, p->D, p->dtype, tok, st);
    if (e == cudaSuccess && p->lse) e = vl_store(l32, p->lse, 1, SPATTN_DTYPE_F32, tok, st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda varlen forward (simple kernels): %s",
                                cudaGetErrorString(e));
    }
    return SPATTN_STATUS_SUCCESS;
}

// ---- packed variable-length / paged backward (spattn_sfa_bwd_varlen) ----------------------------
// The checks and the pre-pass of the forward, then the verdict (one synchronisation) BEFORE any
// write: the backward writes dq from its kernel and dk / dk_rope from the conversion, so the
// layout is settled first instead of gating every writer.  Then the dense backward's steps on the
// views (B = 1, S1 = Tq): zeroed accumulator; at H = 4 .. 32 the union form (vl_union_cfg: plan,
// union kernel) and the token-major kernel sfa_bwd90.cu in its VL form for the other tokens (the
// key-major sfa_bwd_small.cu is dense only), else the token-major kernel alone, over sorted index
// rows when a sequence's span is large (sort_bytes); deterministic in packed int32 as the dense
// calls (bwd_packed); the accumulator into dk / dk_rope.
// The accumulator has one row per key-side row (packed [Tkv, N2, 576], or the page rows
// [num_pages * page_size, N2, 576]): rows past cu_seqlens_kv[B], page rows no sequence uses and
// keys never selected get 0, a page shared by several sequences the sum of their contributions
// (integer adds in deterministic mode: bitwise reproducible whatever the order).
// Workspace: [tok Tq x 16][acc: rows N2 576 x 4 (fp32, or packed int32 and bwd_packed's bounds
// [3][rows N2] x 8)][stats 256][flags rows N2 576 x 1][sorted index rows, sort_bytes][union form].

// Bins of the count histogram the fixed-point bound needs (the largest number of index entries
// that can reach one accumulator row): packed keys: (n2, sequence-local block), merged over the
// sequences (a row belongs to one sequence, so its count is at most its bin's); pages: (page, n2),
// an entry counting once for every page its block touches (sequences may share pages).
int64_t vl_hist_bins(const spattn_sfa_problem *p) {
    const spattn_seqs *s = p->seqs;
    return s->table ? s->num_pages * p->N2 : p->nblk * p->N2;
}

// w: the fast views (vl_view(.., true)); *u: the call's union form (bytes 0: none).
size_t vl_bwd_parts(const spattn_sfa_problem *p, const VlView &w, size_t off[6], UnionCfg *u) {
    const spattn_seqs *s = p->seqs;
    const int64_t rows = s->Tkv * p->N2;
    const size_t cells = (size_t)rows * sfa::DQK;
    *u = vl_union_cfg(p, w, true);
    // sorted index rows (token-major only) when one sequence's accumulator rows (max_seqlen_kv of
    // them) exceed the threshold: the CTAs running together are mostly one sequence's tokens, so
    // that span, not the whole key side, is what has to stay in L2 (H200: sorting on the total
    // showed no gain on sfav07, 32 sequences in a 75 MB accumulator)
    const int64_t span = (s->max_kv < s->Tkv ? s->max_kv : s->Tkv) * p->N2;
    const size_t sz[6] = {(size_t)s->Tq * sizeof(int4), cells * 4 + (size_t)rows * 24, 256, cells,
                          u->bytes ? 0 : sort_bytes(&w.p, span), u->bytes};
    size_t t = 0;
    for (int i = 0; i < 6; i++) {
        off[i] = t;
        t += align256(sz[i]);
    }
    return t;
}

// The simple kernels' varlen backward: views with pages as they are (vl_view(.., false)), the
// accumulator rows = the key side's rows (packed Tkv, or num_pages * page_size page rows).
int64_t vl_krows(const spattn_sfa_problem *p) {
    const spattn_seqs *s = p->seqs;
    return s->table ? s->num_pages * s->page_size : s->Tkv;
}
size_t vl_ref_bwd_parts(const spattn_sfa_problem *p, const VlView &w, size_t off[RB_N + 1]) {
    return align256((size_t)p->seqs->Tq * sizeof(int4)) + ref_parts(&w.p, 1, off, vl_krows(p), vl_hist_bins(p));
}

bool vl_kmaj_shape(const spattn_sfa_problem *p, const VlView &w, SmallShape *ss);
size_t vl_kmaj_parts(const spattn_sfa_problem *p, const VlView &w, const SmallShape &ss, size_t off[5], size_t soff[SMALL_PARTS]);
size_t vl_bwd_workspace(const spattn_sfa_problem *p) {
    VlView w;
    vl_view(p, true, &w);
    size_t off[RB_N + 1];
    UnionCfg u;
    if (vl_fast(p, w, 1)) return vl_bwd_parts(p, w, off, &u);
    SmallShape ss;
    size_t ko[5], ks[SMALL_PARTS];
    if (vl_fast_layout(p) && vl_kmaj_shape(p, w, &ss)) return vl_kmaj_parts(p, w, ss, ko, ks);
    vl_view(p, false, &w);
    return vl_ref_bwd_parts(p, w, off);
}

// One thread per index entry of the tokens [0, cu_q[B]) (values checked: -1 or a block of the
// sequence's keys); stats[4] = the largest bin count.
__global__ void vl_hist_kernel(const VlArgs a, const int4 *tok, int64_t nblk, unsigned *hist, unsigned *stats) {
    const int64_t total = a.Tq * a.N2 * a.K;
    unsigned mx = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i % a.K, r = i / a.K, n = r % a.N2, t = r / a.N2;
        const int4 info = tok[t];
        if (info.x < 0) continue;
        const int64_t x = a.idx[t * a.si0 + n * a.si1 + j * a.si2];
        if (x < 0 || x * a.sbs >= info.z) continue;  // padding (a checked value is inside the keys)
        if (!a.table) {
            if (x >= nblk) continue;
            mx = max(mx, atomicAdd(&hist[n * nblk + x], 1u) + 1);
            continue;
        }
        const int64_t k0 = x * a.sbs, k1 = min(k0 + a.sbs, (int64_t)info.z) - 1;
        for (int64_t sl = k0 / a.page_size; sl <= k1 / a.page_size; sl++) {
            const int64_t pg = a.table[info.x * a.tab_s0 + sl * a.tab_s1];
            if (pg < 0 || pg >= a.num_pages) continue;  // checked already; no access outside hist
            mx = max(mx, atomicAdd(&hist[pg * a.N2 + n], 1u) + 1);
        }
    }
    atomicMax(&stats[4], mx);
}

template <typename T>
spattn_status vl_bwd_impl(const spattn_sfa_problem *p, const spattn_exec *ex, const VlView &w) {
    const spattn_seqs *s = p->seqs;
    size_t off[6];
    UnionCfg u;
    const size_t need = vl_bwd_parts(p, w, off, &u);
    spattn_status r;
    cuda_scratch ws;
    if ((r = ws.get(ex, need, "sfa cuda")) != SPATTN_STATUS_SUCCESS) return r;
    cudaStream_t st = ws.st;
    int4 *tok = reinterpret_cast<int4 *>(ws.base + off[0]);
    unsigned char *acc = reinterpret_cast<unsigned char *>(ws.base + off[1]);
    unsigned *stats = reinterpret_cast<unsigned *>(ws.base + off[2]);
    uint8_t *flags = reinterpret_cast<uint8_t *>(ws.base + off[3]);
    const bool det = ex->deterministic != 0, sorted = off[5] > off[4];
    const int64_t rows = s->Tkv * p->N2;  // accumulator rows of 576
    const size_t cells = (size_t)rows * sfa::DQK;
    // the layout and the index values, verdict first: nothing is written for a refused call
    if ((r = vl_check_now(p, st, tok)) != SPATTN_STATUS_SUCCESS) return r;
    // deterministic: the packed int32 accumulator, its bounds, the stats and the flags; else the fp32 one
    cudaError_t e = cudaMemsetAsync(acc, 0, det ? off[4] - off[1] : cells * 4, st);
    sfa::Params kp;
    fill_params(&w.p, &kp);
    kp.out_o = nullptr;
    kp.lse_in = (const float *)p->lse->data;
    set_vl(&kp, tok, s);
    // H = 4 .. 32: the union form's plan (the indices were checked: no folded check), then its
    // groups and the per-token kernel for the tokens of the others; else sorted rows if large
    if (e == cudaSuccess && u.bytes) {
        union_bind(u, ws.base + off[5], &kp);
        e = spattn_sfa_union_plan_launch(&kp, u.min_density, nullptr, st);
    } else if (e == cudaSuccess && sorted) {
        e = sort_idx(&w.p, &kp, reinterpret_cast<int32_t *>(ws.base + off[4]), st);
    }
    const int bf16 = p->dtype == SPATTN_DTYPE_BF16;
    auto pass = [&](const sfa::Params *q) { return bwd_kernels(q, u.bytes != 0, bf16, st); };
    if (e == cudaSuccess) {
        if (det) {
            kp.acc_flags = (uint32_t *)flags;
            const int64_t ctas = ((u.bytes ? kp.ungroups : 0) + s->Tq * ((p->N1 / p->N2 + 63) / 64)) * p->N2;
            e = bwd_packed(rows, &kp, acc, stats, ctas, pass, st);
        } else {
            kp.acc_f32 = (float *)acc;
            e = pass(&kp);
        }
    }
    if (e == cudaSuccess) {
        // accumulator rows = the key side's rows: packed dk [Tkv, N2, D] as [1, Tkv, N2, D]; pages
        // [num_pages, page_size, N2, D] as they are (row page * page_size + r of the accumulator)
        const spattn_tensor *dk = p->dk, *dkr = p->dk_rope;
        const bool pg = s->table != nullptr;
        const int64_t B = pg ? s->num_pages : 1, S = pg ? s->page_size : s->Tkv;
        int64_t sd[4], sr[4];
        for (int i = 0; i < 4; i++) {
            sd[i] = pg ? dk->strides[i] : i == 0 ? 0 : dk->strides[i - 1];
            sr[i] = pg ? dkr->strides[i] : i == 0 ? 0 : dkr->strides[i - 1];
        }
        convert_dk_kernel<T><<<grid_for(rows * 32, 256), 256, 0, st>>>(
            acc, flags, det ? 2 : 0, (const float *)(stats + (int)ST_P2INV), (T *)dk->data, (T *)dkr->data, B, S, p->N2,
            sd[0], sd[1], sd[2], sd[3], sr[0], sr[1], sr[2], sr[3], nullptr, det ? p32_bounds(rows, acc) : nullptr);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda varlen backward: %s", cudaGetErrorString(e));
    }
    return SPATTN_STATUS_SUCCESS;
}

// ---- the varlen backward of the separate-V shapes: sfa_bwd_kmaj.cu over key-side rows ----------
// The lists of sfa_bwd_small.cu over (n2, 64-row block of the key side: packed Tkv rows, or
// num_pages * page_size page rows), the packed tokens as one batch (vl_view), each index entry's
// sequence-local keys turned into key-side rows through the token's vl.tok entry (and the block
// table).  A block may hold keys of two sequences (or pages of two): the multiplicities mask what
// a token did not select.  Sizes: as small_shape's with S2 = the key-side rows for the lists and
// max_seqlen_kv for a token's reach.
bool vl_kmaj_shape(const spattn_sfa_problem *p, const VlView &w, SmallShape *ss) {
    const spattn_seqs *s = p->seqs;
    if (kmaj_shape(&w.p) < 0 || p->K > 65535) return false;
    const int64_t krows = vl_krows(p), H = p->N1 / p->N2, maxkv = s->max_kv;
    if (maxkv > 8 * p->K * p->sbs && p->sbs < 16) return false;  // sparse small blocks: the simple kernels
    ss->nkb = (krows + 63) / 64;
    ss->s1w = (s->Tq + 31) / 32;
    ss->nl = p->N2 * ss->nkb;
    // blocks an entry's keys reach: packed rows are contiguous, at most ceil(sbs / 64) + 1
    // blocks; pages: each page run of the entry in at most ceil(ps / 64) + 1 blocks
    const int64_t ps = s->table ? s->page_size : 0;
    int64_t per_entry = ps ? ((p->sbs + ps - 1) / ps + 1) * ((ps + 63) / 64 + 1) : (p->sbs + 63) / 64 + 1;
    per_entry = per_entry < p->sbs ? per_entry : p->sbs;
    const int64_t per_row = ss->nkb < p->K * per_entry ? ss->nkb : p->K * per_entry;
    ss->vmax = p->N2 * s->Tq * per_row;
    const double reach = p->mode == 3 ? fmax(64.0, 0.5 * (double)maxkv) : (double)maxkv;
    ss->ww = kmaj_window(p, (double)(p->K * ((p->sbs + 63) / 64)) * 64.0 / reach, ss->s1w);
    if (krows >= (1LL << 31) || (H + 31) / 32 > 65535) return false;
    return small_fits(*ss, s->Tq * p->N1, (ss->s1w + ss->ww - 1) / ss->ww, kmaj_w(p));
}
// Its workspace: [tokens Tq int4][acc rows x 576 x 8][hist bins x 4][stats 256][flags rows x 576]
// then small_parts' buffers (of the view with S1 = Tq).
size_t vl_kmaj_parts(const spattn_sfa_problem *p, const VlView &w, const SmallShape &ss, size_t off[5], size_t soff[SMALL_PARTS]) {
    const int64_t rows = vl_krows(p) * p->N2;
    const size_t sz[5] = {(size_t)p->seqs->Tq * sizeof(int4), (size_t)rows * sfa::DQK * 8, (size_t)vl_hist_bins(p) * 4, 256,
                          (size_t)rows * sfa::DQK};
    size_t t = 0;
    for (int i = 0; i < 5; i++) {
        off[i] = t;
        t += align256(sz[i]);
    }
    return t + small_parts(&w.p, ss, soff, kmaj_w(p));
}

template <typename T>
spattn_status vl_kmaj_bwd(const spattn_sfa_problem *p, const spattn_exec *ex, const VlView &w, const SmallShape &ss) {
    const spattn_seqs *s = p->seqs;
    size_t off[5], soff[SMALL_PARTS];
    const size_t need = vl_kmaj_parts(p, w, ss, off, soff);
    spattn_status r;
    cuda_scratch ws;
    if ((r = ws.get(ex, need, "sfa cuda")) != SPATTN_STATUS_SUCCESS) return r;
    cudaStream_t st = ws.st;
    unsigned char *base = (unsigned char *)ws.base;
    int4 *tok = reinterpret_cast<int4 *>(base + off[0]);
    unsigned char *acc = base + off[1], *sw = base + off[4] + align256((size_t)vl_krows(p) * p->N2 * sfa::DQK);
    unsigned *hist = reinterpret_cast<unsigned *>(base + off[2]), *stats = reinterpret_cast<unsigned *>(base + off[3]);
    uint8_t *flags = base + off[4];
    const bool det = ex->deterministic != 0;
    const int64_t krows = vl_krows(p), rows = krows * p->N2, W = kmaj_w(p);
    const size_t nq = (size_t)s->Tq * p->N1;
    // the layout and the index values, verdict first: nothing is written for a refused call
    if ((r = vl_check_now(p, st, tok)) != SPATTN_STATUS_SUCCESS) return r;
    cudaError_t e = cudaMemsetAsync(base + off[1], 0, det ? off[4] + rows * sfa::DQK - off[1] : (size_t)rows * sfa::DQK * 4, st);
    if (e == cudaSuccess) e = cudaMemsetAsync(sw + soff[0], 0, nq * W * (det ? 8 : 4), st);
    if (e == cudaSuccess && det) e = cudaMemsetAsync(sw + soff[8], 0, nq * W, st);
    if (e == cudaSuccess && det) {  // int64 fixed point's a-priori bound, as bwd_impl's key-major form
        kmaj_maxabs<T>(&w.p, stats, st);
        const VlArgs a = vl_args(p);
        vl_hist_kernel<<<grid_for(a.Tq * a.N2 * a.K, 256), 256, 0, st>>>(a, tok, p->nblk, hist, stats);
        fix_scale_kernel<<<1, 1, 0, st>>>(stats, p->scale, (int)p->D, (int)(p->N1 / p->N2));
        e = cudaGetLastError();
    }
    const int shape = kmaj_shape(&w.p), bf16 = p->dtype == SPATTN_DTYPE_BF16;
    if (e == cudaSuccess) {
        sfa::Params kp;
        fill_params(&w.p, &kp);
        kp.out_o = nullptr;
        kp.lse_in = (const float *)w.p.lse->data;
        set_vl(&kp, tok, s);
        kp.S2 = (int)krows;  // the kernel's keys are key-side rows (the lists' kernels read each token's own)
        if (det) {
            kp.acc_i64 = (unsigned long long *)acc;
            kp.acc_flags = (uint32_t *)flags;
            kp.fix_scale = (const float *)(stats + 5);
        } else {
            kp.acc_f32 = (float *)acc;
        }
        const sfa::SmallLists L = small_lists(sw, soff, ss, nq, det, stats, (int)p->D);
        e = spattn_sfa_bwd_small_launch(&kp, &L, bf16, shape, st);
        if (e == cudaSuccess) {
            const spattn_tensor *dq = w.p.dq, *dqr = p->Dr ? w.p.dq_rope : w.p.dq;
            convert_dq_kernel<T><<<grid_for((int64_t)nq * 32, 256), 256, 0, st>>>(
                sw + soff[0], sw + soff[8], det, (const float *)(stats + 8), (T *)dq->data, (T *)dqr->data, 1, s->Tq, p->N1,
                dq->strides[0], dq->strides[1], dq->strides[2], dqr->strides[0], dqr->strides[1], dqr->strides[2], nullptr,
                (int)W, (int)p->D, (int)dpad64(p->D), (int)p->Dr, tok);
            e = cudaGetLastError();
        }
    }
    if (e == cudaSuccess) {
        // accumulator rows = the key side's rows (as vl_bwd_impl): packed [Tkv, N2, D] as
        // [1, Tkv, N2, D]; pages [num_pages, page_size, N2, D] as they are
        const bool pg = s->table != nullptr;
        const spattn_tensor *dk = p->dk, *dkr = p->Dr ? p->dk_rope : p->dk;
        const int64_t B = pg ? s->num_pages : 1, S = pg ? s->page_size : s->Tkv;
        int64_t sd[4], sr[4];
        DkCols dc = dk_cols(p);
        for (int i = 0; i < 4; i++) {
            sd[i] = pg ? dk->strides[i] : i == 0 ? 0 : dk->strides[i - 1];
            sr[i] = pg ? dkr->strides[i] : i == 0 ? 0 : dkr->strides[i - 1];
            if (dc.wv) dc.sv[i] = pg ? p->dv->strides[i] : i == 0 ? 0 : p->dv->strides[i - 1];
        }
        if (dc.wv) dc.dv = p->dv->data;
        convert_dk_kernel<T><<<grid_for(rows * 32, 256), 256, 0, st>>>(
            acc, flags, det ? 1 : 0, (const float *)(stats + 6), (T *)dk->data, (T *)dkr->data, B, S, p->N2, sd[0], sd[1],
            sd[2], sd[3], sr[0], sr[1], sr[2], sr[3], nullptr, nullptr, dc);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda varlen backward (key-major): %s", cudaGetErrorString(e));
    }
    return SPATTN_STATUS_SUCCESS;
}

// Shapes without a Hopper kernel: the checks and their verdict first (as vl_bwd_impl), then the
// simple kernels over the views (fp32 scratch, deterministic or fp32 atomics as the dense
// ref_bwd), dq / dq_rope stored for the tokens before cu_seqlens_q[B], every key-side row of dk /
// dk_rope / dv written (0 where no selected key adds).
spattn_status vl_ref_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    if (simple_refused("varlen backward")) return SPATTN_STATUS_NOT_SUPPORTED;
    const spattn_seqs *s = p->seqs;
    VlView w;
    vl_view(p, false, &w);
    spattn_status r = vl_limits(p, w, false);
    if (r != SPATTN_STATUS_SUCCESS) return r;
    size_t off[RB_N + 1];
    const size_t tb = align256((size_t)s->Tq * sizeof(int4));
    cuda_scratch ws;
    if ((r = ws.get(ex, vl_ref_bwd_parts(p, w, off), "sfa cuda")) != SPATTN_STATUS_SUCCESS) return r;
    int4 *tok = reinterpret_cast<int4 *>(ws.base);
    char *base = ws.base + tb;
    cudaStream_t st = ws.st;
    if ((r = vl_check_now(p, st, tok)) != SPATTN_STATUS_SUCCESS) return r;
    const VlArgs a = vl_args(p);
    r = ref_bwd_any(&w.p, ex, base, off, tok, vl_krows(p), [&](unsigned *hist, unsigned *stats) {
        vl_hist_kernel<<<grid_for(a.Tq * a.N2 * a.K, 256), 256, 0, st>>>(a, tok, p->nblk, hist, stats);
    });
    if (r != SPATTN_STATUS_SUCCESS) return r;
    float *f[5];
    for (int i = 0; i < 5; i++) f[i] = reinterpret_cast<float *>(base + off[i]);
    cudaError_t e = vl_store(f[0], p->dq, p->D, p->dtype, tok, st);
    if (e == cudaSuccess) e = cvt::to_tensor(f[2], w.p.dk, st);
    if (e == cudaSuccess && p->Dr) e = vl_store(f[1], p->dq_rope, p->Dr, p->dtype, tok, st);
    if (e == cudaSuccess && p->Dr) e = cvt::to_tensor(f[3], w.p.dk_rope, st);
    if (e == cudaSuccess && !p->shared_kv) e = cvt::to_tensor(f[4], w.p.dv, st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda varlen backward (simple kernels): %s",
                                cudaGetErrorString(e));
    }
    return SPATTN_STATUS_SUCCESS;
}

spattn_status vl_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    if (stream_capturing((cudaStream_t)ex->stream)) return capture_refusal("the varlen sfa backward");
    VlView w;
    vl_view(p, true, &w);
    if (!vl_fast(p, w, 1)) {  // the other Hopper shapes: key-major, else the simple kernels
        SmallShape ss;
        if (!vl_fast_layout(p) || !vl_kmaj_shape(p, w, &ss)) return vl_ref_bwd(p, ex);
        spattn_status r = vl_limits(p, w, true);
        if (r != SPATTN_STATUS_SUCCESS) return r;
        return p->dtype == SPATTN_DTYPE_BF16 ? vl_kmaj_bwd<__nv_bfloat16>(p, ex, w, ss) : vl_kmaj_bwd<__half>(p, ex, w, ss);
    }
    spattn_status r = vl_limits(p, w, true);
    if (r != SPATTN_STATUS_SUCCESS) return r;
    return p->dtype == SPATTN_DTYPE_BF16 ? vl_bwd_impl<__nv_bfloat16>(p, ex, w) : vl_bwd_impl<__half>(p, ex, w);
}

}  // namespace

extern "C" spattn_status spattn_cuda_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    if (spattn_sfa_pad_route(p)) return spattn_sfa_pad_fwd(p, ex);  // before the varlen split: it takes both
    if (p->seqs) return vl_fwd(p, ex);
    const int shape = fwd_shape(p);
    if (shape < 0) return ref_fwd(p, ex);
    spattn_status s = limits_ok(p);
    if (s != SPATTN_STATUS_SUCCESS) return s;
    cudaStream_t st = (cudaStream_t)ex->stream;
    sfa::Params kp;
    fill_params(p, &kp);
    kp.out_lse = p->lse ? (float *)p->lse->data : nullptr;
    kp.o = nullptr;
    const int bf16 = p->dtype == SPATTN_DTYPE_BF16;
    const UnionCfg u = fwd_union_cfg(p, shape);
    char *ub = nullptr;
    bool pooled = false;
    if (u.bytes) {  // the caller's workspace, else spattn's kept pool (a graph's own memory under capture)
        if (ex->workspace) ub = (char *)ex->workspace;
        else if (spattn_stream_alloc((void **)&ub, u.bytes, st) == cudaSuccess)
            pooled = true;
        else
            ub = nullptr;
        cudaGetLastError();
    }
    if (ub) union_bind(u, ub, &kp);  // no memory: the gather kernels take every token
    // The index check: with the union pass, its plan checks every value it reads (one pass over
    // the indices instead of two: ~7 us on sfa01's ~190, H200)
    IdxCheck c;
    auto plan = [&](unsigned long long *bad) { return spattn_sfa_union_plan_launch(&kp, u.min_density, bad, st); };
    s = ub ? check_launch(p, st, &c, plan) : check_launch(p, st, &c);
    if (s != SPATTN_STATUS_SUCCESS) {
        if (pooled) cudaFreeAsync(ub, st);
        return s;
    }
    kp.gate = c.d_bad;
    // The union kernel on a side stream, forked after the plan and joined before the call ends:
    // the two kernels write disjoint rows, and run one after the other each left its tail of
    // idle SMs (H200: forked 0.96x the time on sfa01, 0.97-0.98x sfa02).  Serial under capture (the side
    // stream is shared by the host threads) or when the fork cannot be set up.
    Fork fk;
    cudaError_t e = cudaSuccess;
    if (ub) {
        fork_begin(st, &fk);
        e = shape == sfa::SHAPE_MLA ? spattn_sfa_union_fwd_launch(&kp, bf16, fk.side ? fk.side : st)
                                    : spattn_sfa_group_fwd_launch(&kp, bf16, shape, fk.side ? fk.side : st);
    }
    if (e == cudaSuccess) e = fwd_launch(&kp, shape, bf16, st);
    const cudaError_t ej = fork_end(st, &fk);
    if (e == cudaSuccess) e = ej;
    if (pooled) cudaFreeAsync(ub, st);  // after the kernels, in stream order
    return check_finish(p, st, &c, e);
}

extern "C" spattn_status spattn_cuda_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    if (spattn_sfa_pad_route(p)) return spattn_sfa_pad_bwd(p, ex);
    if (p->seqs) return vl_bwd(p, ex);
    const int shape = fast_shape(p, 1) ? sfa::SHAPE_MLA : kmaj_fits(p) ? kmaj_shape(p) : -1;
    if (shape < 0) return ref_bwd(p, ex);
    spattn_status s = limits_ok(p);
    if (s != SPATTN_STATUS_SUCCESS) return s;
    sfa::Params kp;
    fill_params(p, &kp);
    kp.out_o = nullptr;
    kp.lse_in = (const float *)p->lse->data;
    // under stream capture (CUDA graphs) no verdict can come back before the kernels: the scan
    // runs in the graph and every writer of dq / dq_rope / dk / dk_rope reads its word first (a bad
    // index at replay leaves them unwritten, without a status), as the forward's kernels do
    cudaStream_t st = (cudaStream_t)ex->stream;
    IdxCheck c;
    const bool cap = stream_capturing(st);
    if (cap) {
        if ((s = check_launch(p, st, &c)) != SPATTN_STATUS_SUCCESS) return s;
        kp.gate = c.d_bad;
    }
    s = p->dtype == SPATTN_DTYPE_BF16 ? bwd_impl<__nv_bfloat16>(p, ex, &kp, shape) : bwd_impl<__half>(p, ex, &kp, shape);
    if (cap) {
        const spattn_status s2 = check_finish(p, st, &c, cudaSuccess);  // frees the word in the graph
        if (s == SPATTN_STATUS_SUCCESS) s = s2;
    }
    return s;
}
