// Deliberately simple CUDA reference kernels for block-sparse attention: the golden of
// `spattn verify --backend cuda`.  One CTA per query row (forward, dQ) or per key row (dK, dV),
// scores kept in shared memory, fp32 arithmetic, every dtype and stride, no tiling tricks, no
// schedule: the block mask is read for every pair.  Independent of the fast kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "../core/internal.h"
extern "C" {
#include "../core/seqs.h"
}
#include "scratch.h"

namespace {

struct RefT {  // a strided [B, H, S, D] tensor of any float dtype
    const void *p;
    long long s0, s1, s2, s3;
    int dtype;
    // paged K / V (varlen forward; NULL otherwise): row s is row s % ps (stride s2) of page
    // tab[(s / ps) * tab_s1] (stride pg); the batch index then does not move the base (s0 = 0)
    const int32_t *tab;
    long long tab_s1, pg;
    int ps;
};

struct RefP {
    RefT q, k, v, dout;
    const uint8_t *mask;
    long long m0, m1, m2, m3;
    int B, N, Nkv, G, Sq, Skv, D, bx, by;
    float scale;
};

__device__ float ld(const RefT &t, int b, int h, int s, int d) {
    long long off = (long long)b * t.s0 + (long long)h * t.s1 + (long long)d * t.s3;
    if (t.tab) off += (long long)t.tab[(long long)(s / t.ps) * t.tab_s1] * t.pg + (long long)(s % t.ps) * t.s2;
    else off += (long long)s * t.s2;
    if (t.dtype == SPATTN_DTYPE_F16) return __half2float(reinterpret_cast<const __half *>(t.p)[off]);
    if (t.dtype == SPATTN_DTYPE_BF16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16 *>(t.p)[off]);
    return reinterpret_cast<const float *>(t.p)[off];
}

__device__ bool attended(const RefP &p, int b, int n, int i, int j) {
    return p.mask[(long long)b * p.m0 + (long long)n * p.m1 + (long long)(i / p.bx) * p.m2 +
                  (long long)(j / p.by) * p.m3] != 0;
}

__device__ float dot(const RefT &a, int b, int ha, int ia, const RefT &c, int hc, int jc, int D) {
    float s = 0.f;
    for (int d = 0; d < D; d++) s += ld(a, b, ha, ia, d) * ld(c, b, hc, jc, d);
    return s;
}

// Block-wide reductions (blockDim.x == 128).
__device__ float block_max(float x, float *red) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    return fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
}
__device__ float block_sum(float x, float *red) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    return (red[0] + red[1]) + (red[2] + red[3]);
}

constexpr int kThreads = 128;

// Score arrays in shared memory are padded to whole 16-byte groups: the compiler reads them with
// vector loads (LDS.96/128) and an array ending inside a group was read past its end
// (compute-sanitizer memcheck, Skv = 333: issue 16 defect 10).
__host__ __device__ inline int pad4(int n) { return (n + 3) & ~3; }

// Scores of query row (b, n, i) into sp[] (-inf where masked); returns the row max.
__device__ float row_scores(const RefP &p, int b, int n, int i, float *sp, float *red) {
    const int hk = n / p.G;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < p.Skv; j += kThreads) {
        float s = -INFINITY;
        if (attended(p, b, n, i, j)) s = p.scale * dot(p.q, b, n, i, p.k, hk, j, p.D);
        sp[j] = s;
        mx = fmaxf(mx, s);
    }
    return block_max(mx, red);
}

// One query row's softmax and P V (o_at(d, x) stores column d; set_lse(x) the LSE).
template <typename OAt, typename SetLse>
__device__ void fwd_row(const RefP &p, int b, int n, int i, float *sp, float *red, OAt o_at, SetLse set_lse) {
    const int hk = n / p.G;
    const float mx = row_scores(p, b, n, i, sp, red);
    if (mx == -INFINITY) {
        for (int d = threadIdx.x; d < p.D; d += kThreads) o_at(d, 0.f);
        if (threadIdx.x == 0) set_lse(-INFINITY);
        return;
    }
    float l = 0.f;
    for (int j = threadIdx.x; j < p.Skv; j += kThreads) {
        float e = sp[j] == -INFINITY ? 0.f : expf(sp[j] - mx);
        sp[j] = e;
        l += e;
    }
    l = block_sum(l, red);  // includes a barrier: sp[] complete
    for (int d = threadIdx.x; d < p.D; d += kThreads) {
        float acc = 0.f;
        for (int j = 0; j < p.Skv; j++)
            if (sp[j] != 0.f) acc += sp[j] * ld(p.v, b, hk, j, d);
        o_at(d, acc / l);
    }
    if (threadIdx.x == 0) set_lse(mx + logf(l));
}

__global__ void ref_fwd_kernel(RefP p, float *o, float *lse) {
    extern __shared__ float sp[];
    __shared__ float red[4];
    const int i = blockIdx.x, n = blockIdx.y, b = blockIdx.z;
    const long long row = ((long long)b * p.N + n) * p.Sq + i;
    fwd_row(
        p, b, n, i, sp, red, [&](int d, float x) { o[row * p.D + d] = x; }, [&](float x) { lse[row] = x; });
}

// Packed variable-length forward: one CTA per (row i of max_seqlen_q, head n, sequence b).  The
// sequence's q / k / v rows as dense views (base moved to its first row; the [1, H, T, D] views
// have batch stride 0, so any b indexes them), its own lengths, the mask at batch b; O and LSE go
// straight into the caller's tensors (`out`: [1, N, T, D] and [1, N, T] views).  Paged K / V
// (tab != NULL): k / v keep the pool's base and index rows through the sequence's table row
// (keys < Skv_b only, whose slots the table check has validated).
struct RefOut {
    void *o;
    long long s1, s2, s3;
    int dtype;
    float *lse;
    long long l1, l2;
};

__device__ const void *rows_from(const RefT &t, long long r) {
    const int es = t.dtype == SPATTN_DTYPE_F32 ? 4 : 2;
    return static_cast<const char *>(t.p) + r * t.s2 * es;
}

__global__ void ref_fwd_varlen_kernel(RefP p, RefOut out, const int4 *seq, const unsigned long long *err,
                                      const int32_t *tab, long long tab_s0) {
    extern __shared__ float sp[];
    __shared__ float red[4];
    const int i = blockIdx.x, n = blockIdx.y, b = blockIdx.z;
    if (*err != ~0ull) return;  // bad prefix sums: nothing is written
    const int4 sq = seq[b];
    if (i >= sq.y) return;
    p.q.p = rows_from(p.q, sq.x);
    if (tab) {
        p.k.tab = tab + (long long)b * tab_s0;
        p.v.tab = p.k.tab;
    } else {
        p.k.p = rows_from(p.k, sq.z);
        p.v.p = rows_from(p.v, sq.z);
    }
    p.Sq = sq.y;
    p.Skv = sq.w;
    const long long row = (long long)sq.x + i;
    auto put = [&](int d, float x) {
        const long long off = (long long)n * out.s1 + row * out.s2 + (long long)d * out.s3;
        if (out.dtype == SPATTN_DTYPE_F16) static_cast<__half *>(out.o)[off] = __float2half_rn(x);
        else if (out.dtype == SPATTN_DTYPE_BF16) static_cast<__nv_bfloat16 *>(out.o)[off] = __float2bfloat16_rn(x);
        else static_cast<float *>(out.o)[off] = x;
    };
    float *lse = out.lse ? out.lse + (long long)n * out.l1 + row * out.l2 : nullptr;
    fwd_row(p, b, n, i, sp, red, put, [&](float x) {
        if (lse) *lse = x;
    });
}

// Per query row: LSE, P, dP, Delta = sum_j P dP, dS, dQ.  Saves LSE and Delta for the key pass.
__global__ void ref_dq_kernel(RefP p, float *dq, float *lse_out, float *delta_out) {
    extern __shared__ float sp[];  // P [Skv], then dP [Skv]
    float *sdp = sp + pad4(p.Skv);
    __shared__ float red[4];
    const int i = blockIdx.x, n = blockIdx.y, b = blockIdx.z, hk = n / p.G;
    const long long row = ((long long)b * p.N + n) * p.Sq + i;
    const float mx = row_scores(p, b, n, i, sp, red);
    if (mx == -INFINITY) {
        for (int d = threadIdx.x; d < p.D; d += kThreads) dq[row * p.D + d] = 0.f;
        if (threadIdx.x == 0) {
            lse_out[row] = -INFINITY;
            delta_out[row] = 0.f;
        }
        return;
    }
    float l = 0.f;
    for (int j = threadIdx.x; j < p.Skv; j += kThreads) l += sp[j] == -INFINITY ? 0.f : expf(sp[j] - mx);
    l = block_sum(l, red);
    const float L = mx + logf(l);
    float dl = 0.f;
    for (int j = threadIdx.x; j < p.Skv; j += kThreads) {
        float pj = sp[j] == -INFINITY ? 0.f : expf(sp[j] - L);
        float dpj = pj != 0.f ? dot(p.dout, b, n, i, p.v, hk, j, p.D) : 0.f;
        sp[j] = pj;
        sdp[j] = dpj;
        dl += pj * dpj;
    }
    const float delta = block_sum(dl, red);
    for (int j = threadIdx.x; j < p.Skv; j += kThreads) sdp[j] = sp[j] * (sdp[j] - delta);
    __syncthreads();
    for (int d = threadIdx.x; d < p.D; d += kThreads) {
        float acc = 0.f;
        for (int j = 0; j < p.Skv; j++)
            if (sp[j] != 0.f) acc += sdp[j] * ld(p.k, b, hk, j, d);
        dq[row * p.D + d] = p.scale * acc;
    }
    if (threadIdx.x == 0) {
        lse_out[row] = L;
        delta_out[row] = delta;
    }
}

// Per key row (b, kv head, j): dV = sum over the group's heads and rows of P dO; dK = scale *
// sum of dS Q.
__global__ void ref_dkdv_kernel(RefP p, const float *lse, const float *delta, float *dk, float *dv) {
    extern __shared__ float sp[];  // P [Sq], then dS [Sq]
    float *sds = sp + pad4(p.Sq);
    const int j = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const long long krow = ((long long)b * p.Nkv + hk) * p.Skv + j;
    float accv[2] = {0.f, 0.f}, acck[2] = {0.f, 0.f};  // D <= 256 = 2 * kThreads
    for (int hg = 0; hg < p.G; hg++) {
        const int n = hk * p.G + hg;
        const long long rbase = ((long long)b * p.N + n) * p.Sq;
        __syncthreads();
        for (int i = threadIdx.x; i < p.Sq; i += kThreads) {
            float pi = 0.f, dsi = 0.f;
            if (attended(p, b, n, i, j)) {
                float s = p.scale * dot(p.q, b, n, i, p.k, hk, j, p.D);
                pi = expf(s - lse[rbase + i]);
                float dpi = dot(p.dout, b, n, i, p.v, hk, j, p.D);
                dsi = pi * (dpi - delta[rbase + i]);
            }
            sp[i] = pi;
            sds[i] = dsi;
        }
        __syncthreads();
        for (int x = 0; x < 2; x++) {
            const int d = threadIdx.x + x * kThreads;
            if (d >= p.D) break;
            for (int i = 0; i < p.Sq; i++) {
                if (sp[i] == 0.f && sds[i] == 0.f) continue;
                accv[x] += sp[i] * ld(p.dout, b, n, i, d);
                acck[x] += sds[i] * ld(p.q, b, n, i, d);
            }
        }
    }
    for (int x = 0; x < 2; x++) {
        const int d = threadIdx.x + x * kThreads;
        if (d < p.D) {
            dv[krow * p.D + d] = accv[x];
            dk[krow * p.D + d] = p.scale * acck[x];
        }
    }
}

RefT view(const spattn_tensor *t) {
    RefT r;
    r.p = t->data;
    r.s0 = t->strides[0];
    r.s1 = t->strides[1];
    r.s2 = t->strides[2];
    r.s3 = t->strides[3];
    r.dtype = t->dtype;
    r.tab = nullptr;
    r.tab_s1 = r.pg = 0;
    r.ps = 1;
    return r;
}
// Pages [num_pages, page_size, H, D] as a paged RefT (the table row is set per sequence).
RefT paged_view(const spattn_tensor *t, long long tab_s1, long long ps) {
    RefT r = view(t);
    r.s0 = 0;
    r.s1 = t->strides[2];
    r.s2 = t->strides[1];
    r.s3 = t->strides[3];
    r.pg = t->strides[0];
    r.tab_s1 = tab_s1;
    r.ps = (int)ps;
    return r;
}

RefP make(const spattn_bsa_problem *pb) {
    RefP p;
    p.q = view(pb->q);
    p.k = view(pb->k);
    p.v = view(pb->v);
    if (pb->dout) p.dout = view(pb->dout);
    else p.dout = p.q;
    p.mask = static_cast<const uint8_t *>(pb->mask->data);
    p.m0 = pb->mask->strides[0];
    p.m1 = pb->mask->strides[1];
    p.m2 = pb->mask->strides[2];
    p.m3 = pb->mask->strides[3];
    p.B = (int)pb->B;
    p.N = (int)pb->N;
    p.Nkv = (int)pb->Nkv;
    p.G = (int)(pb->N / pb->Nkv);
    p.Sq = (int)pb->Sq;
    p.Skv = (int)pb->Skv;
    p.D = (int)pb->D;
    p.bx = (int)pb->bx;
    p.by = (int)pb->by;
    p.scale = pb->scale;
    return p;
}

spattn_status cuda_fail(cudaError_t e, const char *what) {
    return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "bsa cuda ref: %s: %s", what, cudaGetErrorString(e));
}

const size_t kMaxSmem = 200 * 1024;  // dynamic shared memory the reference asks for

}  // namespace

extern "C" spattn_status spattn_cuda_ref_bsa_fwd(const spattn_bsa_problem *pb, const spattn_exec *ex, float *o,
                                                 float *lse) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    RefP p = make(pb);
    const size_t smem = (size_t)pad4(p.Skv) * sizeof(float);
    if (smem > kMaxSmem)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "bsa cuda ref: Skv=%d exceeds the reference's limit %zu",
                                p.Skv, kMaxSmem / sizeof(float));
    cudaError_t e = cudaFuncSetAttribute(ref_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxSmem);
    if (e != cudaSuccess) return cuda_fail(e, "cudaFuncSetAttribute");
    ref_fwd_kernel<<<dim3(p.Sq, p.N, p.B), kThreads, smem, st>>>(p, o, lse);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_fail(e, "ref_fwd_kernel launch");
    if ((e = cudaStreamSynchronize(st)) != cudaSuccess) return cuda_fail(e, "ref_fwd_kernel");
    return SPATTN_STATUS_SUCCESS;
}

extern "C" spattn_status spattn_cuda_ref_bsa_fwd_varlen(const spattn_bsa_problem *pb, const spattn_exec *ex,
                                                        const int4 *seq, const unsigned long long *err) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    RefP p = make(pb);
    const size_t smem = (size_t)pad4(p.Skv) * sizeof(float);
    if (smem > kMaxSmem)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa cuda ref: max_seqlen_kv=%d exceeds the reference's limit %zu", p.Skv,
                                kMaxSmem / sizeof(float));
    if (p.B > 65535 || p.N > 65535)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa cuda ref: B=%d sequences / N=%d heads exceed the reference's grid (65535)", p.B,
                                p.N);
    const spattn_seqs *sq = pb->seqs;
    if (sq->table) {  // k / v are the page tensors (the views keep them)
        p.k = paged_view(pb->k, sq->tab_s1, sq->page_size);
        p.v = paged_view(pb->v, sq->tab_s1, sq->page_size);
    }
    RefOut out = {};
    out.o = pb->o->data;
    out.s1 = pb->o->strides[1];
    out.s2 = pb->o->strides[2];
    out.s3 = pb->o->strides[3];
    out.dtype = pb->o->dtype;
    if (pb->lse) {
        out.lse = static_cast<float *>(pb->lse->data);
        out.l1 = pb->lse->strides[1];
        out.l2 = pb->lse->strides[2];
    }
    cudaError_t e =
        cudaFuncSetAttribute(ref_fwd_varlen_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxSmem);
    if (e != cudaSuccess) return cuda_fail(e, "cudaFuncSetAttribute");
    ref_fwd_varlen_kernel<<<dim3(p.Sq, p.N, p.B), kThreads, smem, st>>>(p, out, seq, err, sq->table,
                                                                          sq->table ? sq->tab_s0 : 0);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_fail(e, "ref_fwd_varlen_kernel launch");
    if ((e = cudaStreamSynchronize(st)) != cudaSuccess) return cuda_fail(e, "ref_fwd_varlen_kernel");
    return SPATTN_STATUS_SUCCESS;
}

extern "C" spattn_status spattn_cuda_ref_bsa_bwd(const spattn_bsa_problem *pb, const spattn_exec *ex, float *dq,
                                                 float *dk, float *dv) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    RefP p = make(pb);
    const size_t smem_q = 2 * (size_t)pad4(p.Skv) * sizeof(float), smem_k = 2 * (size_t)pad4(p.Sq) * sizeof(float);
    if (smem_q > kMaxSmem || smem_k > kMaxSmem)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "bsa cuda ref: Sq=%d / Skv=%d exceed the reference's backward limit %zu", p.Sq,
                                p.Skv, kMaxSmem / (2 * sizeof(float)));
    cudaError_t e;
    if ((e = cudaFuncSetAttribute(ref_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxSmem)) !=
            cudaSuccess ||
        (e = cudaFuncSetAttribute(ref_dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxSmem)) !=
            cudaSuccess)
        return cuda_fail(e, "cudaFuncSetAttribute");
    float *scratch = nullptr;
    const size_t rows = (size_t)p.B * p.N * p.Sq;
    if ((e = spattn_stream_alloc((void **)&scratch, 2 * rows * sizeof(float), st)) != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY, "bsa cuda ref: stream-ordered allocation (%zu): %s",
                                2 * rows * sizeof(float), cudaGetErrorString(e));
    ref_dq_kernel<<<dim3(p.Sq, p.N, p.B), kThreads, smem_q, st>>>(p, dq, scratch, scratch + rows);
    e = cudaGetLastError();
    if (e == cudaSuccess) {
        ref_dkdv_kernel<<<dim3(p.Skv, p.Nkv, p.B), kThreads, smem_k, st>>>(p, scratch, scratch + rows, dk, dv);
        e = cudaGetLastError();
    }
    cudaFreeAsync(scratch, st);
    cudaError_t e2 = cudaStreamSynchronize(st);
    if (e != cudaSuccess) return cuda_fail(e, "ref backward launch");
    if (e2 != cudaSuccess) return cuda_fail(e2, "ref backward");
    return SPATTN_STATUS_SUCCESS;
}
