// Deliberately simple CUDA reference kernels for sfa (the golden of `spattn verify --backend
// cuda`).  Independent of the fast kernels: plain fp32 arithmetic on CUDA cores, one warp per
// selected key for the dot products, no tensor cores, no tiling tricks, fp32 atomics for dK/dV.
// Any D, Dr, dtype (fp16/bf16/fp32), strides, shared or separate v.  Outputs are CONTIGUOUS
// fp32 device buffers (see src/core/internal.h).  The backward recomputes P, O and Delta itself.
// The API's simple-kernel path (shapes without a Hopper kernel, sfa_host.cu) runs them too, the
// backward there also in its varlen / paged form and, when deterministic, with int64 fixed-point
// dK/dV adds instead of fp32 atomics (sfa_ref.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../core/internal.h"
#include "../core/seqs.h"
#include "sfa_adds.cuh"
#include "sfa_ref.h"

namespace {

__device__ __forceinline__ float ldf(const float *p) { return *p; }
__device__ __forceinline__ float ldf(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ float ldf(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

struct RefArgs {
    const void *q, *qr, *k, *kr, *v, *dout;
    const int32_t *idx;
    int64_t sq[4], sqr[4], sk[4], skr[4], sv[4], sdo[4], sidx[4];
    int64_t B, S1, S2, N1, N2, D, Dr, K, sbs, nblk;
    int mode, shared_kv;
    float scale;
    // varlen forward (spattn_sfa_fwd_varlen): B = 1, S1 = Tq, packed tensors as views with batch
    // stride 0; tok per token {sequence (-1: skipped), first key row, keys, causal limit} (the
    // device pre-pass of sfa_host.cu); with pages k / k_rope / v keep their page strides and a
    // key's row comes from the table.  tok == NULL: a dense call.
    const int4 *tok;
    const int32_t *table;
    int64_t tab_s0, tab_s1, page_size;
    // backward: int64 fixed-point accumulators of dk, dk_rope, dv (acc[0] NULL: fp32 atomics)
    sfa_ref_fix fix;
};

// key of virtual slot v of the index row, or -1 (padding, out of range, past S2, past the
// causal limit `lim`: S2 - S1 + s1 in mode 3, S2 - 1 in mode 0, the sequence's own with varlen)
__device__ int64_t ref_key(const RefArgs &a, const int32_t *row, int64_t v, int64_t lim) {
    int64_t e = v / a.sbs;
    int32_t bi = row[e * a.sidx[3]];
    if (bi < 0 || bi >= a.nblk) return -1;
    int64_t key = (int64_t)bi * a.sbs + v % a.sbs;
    if (key >= a.S2 || key > lim) return -1;
    return key;
}

constexpr int HC = 8;   // heads per block
constexpr int CH = 32;  // slots per chunk
constexpr int NTH = 128;

// Shared memory: sq[HC][D+Dr], sdo[HC][D], sacc[HC][D+Dr] (O in the forward part, dQ later),
// sp[HC][CH], sds[HC][CH], skey[CH], sm[HC], sl[HC], sdelta[HC], red[4][HC][2]
template <typename T>
__global__ void ref_kernel(const RefArgs a, int backward, float *o, float *lse, float *dq,
                           float *dqr, float *dk, float *dkr, float *dv) {
    extern __shared__ float sm_[];
    const int64_t DQ = a.D + a.Dr;
    float *sq = sm_;
    float *sdo = sq + HC * DQ;
    float *sacc = sdo + HC * a.D;
    float *sp = sacc + HC * DQ;
    float *sds = sp + HC * CH;
    int64_t *skey = reinterpret_cast<int64_t *>(sds + HC * CH);
    float *smx = reinterpret_cast<float *>(skey + CH);
    float *sl = smx + HC;
    float *sdelta = sl + HC;
    float *red = sdelta + HC;  // [4][HC][2]

    const int H = (int)(a.N1 / a.N2);
    const int nchunk = (H + HC - 1) / HC;
    int64_t bid = blockIdx.x;
    const int hc = (int)(bid % nchunk);
    bid /= nchunk;
    const int64_t n2 = bid % a.N2;
    bid /= a.N2;
    const int64_t s1 = bid % a.S1, b = bid / a.S1;
    int4 tk = make_int4(0, 0, 0, 0);
    if (a.tok) {
        tk = a.tok[s1];
        if (tk.x < 0) return;  // past cu_seqlens_q[B]: not computed, not written
    }
    const int64_t lim = a.tok ? (int64_t)tk.w : a.mode == 3 ? a.S2 - a.S1 + s1 : a.S2 - 1;
    // element offset of key `key`'s row in a k-side tensor of strides st (without head, column)
    auto krow = [&](int64_t key, const int64_t *st) -> int64_t {
        if (a.table) {
            const int64_t pg = a.table[tk.x * a.tab_s0 + (key / a.page_size) * a.tab_s1];
            return pg * st[0] + (key % a.page_size) * st[1];
        }
        return b * st[0] + (tk.y + key) * st[1];
    };
    const int h0 = hc * HC, nh = min(HC, H - h0);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t *row = a.idx + b * a.sidx[0] + s1 * a.sidx[1] + n2 * a.sidx[2];
    const int64_t nslot = a.K * a.sbs;
    const T *Q = (const T *)a.q, *QR = (const T *)a.qr, *Kp = (const T *)a.k, *KR = (const T *)a.kr;
    const T *V = (const T *)(a.shared_kv ? a.k : a.v);
    const int64_t *svs = a.shared_kv ? a.sk : a.sv;
    const T *DO = (const T *)a.dout;

    for (int64_t i = tid; i < HC * DQ; i += NTH) {
        int h = (int)(i / DQ);
        int64_t d = i % DQ;
        float x = 0.f;
        if (h < nh) {
            int64_t head = n2 * H + h0 + h;
            x = d < a.D ? ldf(Q + b * a.sq[0] + s1 * a.sq[1] + head * a.sq[2] + d * a.sq[3])
                        : ldf(QR + b * a.sqr[0] + s1 * a.sqr[1] + head * a.sqr[2] + (d - a.D) * a.sqr[3]);
        }
        sq[i] = x;
        sacc[i] = 0.f;
    }
    if (backward)
        for (int64_t i = tid; i < HC * a.D; i += NTH) {
            int h = (int)(i / a.D);
            int64_t d = i % a.D;
            int64_t head = n2 * H + h0 + h;
            sdo[i] = h < nh ? ldf(DO + b * a.sdo[0] + s1 * a.sdo[1] + head * a.sdo[2] + d * a.sdo[3]) : 0.f;
        }
    __syncthreads();

    // score of head h with key (all lanes of the warp return it)
    auto score = [&](int h, int64_t key) {
        float acc = 0.f;
        for (int64_t d = lane; d < DQ; d += 32) {
            float kv = d < a.D ? ldf(Kp + krow(key, a.sk) + n2 * a.sk[2] + d * a.sk[3])
                               : ldf(KR + krow(key, a.skr) + n2 * a.skr[2] + (d - a.D) * a.skr[3]);
            acc += sq[h * DQ + d] * kv;
        }
        for (int o2 = 16; o2 > 0; o2 >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o2);
        return acc * a.scale;
    };

    // ---- pass 1: row max and sum (online, per warp, then combined) ----
    float m[HC], l[HC];
    for (int h = 0; h < HC; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.f;
    }
    for (int64_t v = warp; v < nslot; v += NTH / 32) {
        int64_t key = ref_key(a, row, v, lim);
        if (key < 0) continue;
        for (int h = 0; h < nh; ++h) {
            float s = score(h, key);
            if (s == -INFINITY) continue;  // a masked pair (exp(-inf - -inf) would be NaN)
            // NaN propagates (fmaxf would drop it); +inf gives l = exp(inf - inf) = NaN
            float mn = (s != s || m[h] != m[h]) ? NAN : fmaxf(m[h], s);
            l[h] = l[h] * expf(m[h] - mn) + expf(s - mn);
            m[h] = mn;
        }
    }
    if (lane == 0)
        for (int h = 0; h < HC; ++h) {
            red[(warp * HC + h) * 2] = m[h];
            red[(warp * HC + h) * 2 + 1] = l[h];
        }
    __syncthreads();
    if (tid < HC) {
        float M = -INFINITY, L = 0.f;
        for (int w = 0; w < 4; ++w) {
            const float mw = red[(w * HC + tid) * 2];
            M = (mw != mw || M != M) ? NAN : fmaxf(M, mw);
        }
        if (M != M)
            L = NAN;  // a NaN score: the row is NaN (spec), never a row without keys
        else if (M > -INFINITY)
            for (int w = 0; w < 4; ++w) {
                float mw = red[(w * HC + tid) * 2];
                if (mw > -INFINITY) L += red[(w * HC + tid) * 2 + 1] * expf(mw - M);
            }
        smx[tid] = M;
        sl[tid] = L;
    }
    __syncthreads();

    // ---- pass 2: O = P V (into sacc[h][0..D)) ----
    for (int64_t c0 = 0; c0 < nslot; c0 += CH) {
        for (int j = warp; j < CH; j += NTH / 32) {
            int64_t key = c0 + j < nslot ? ref_key(a, row, c0 + j, lim) : -1;
            if (lane == 0) skey[j] = key;
            for (int h = 0; h < HC; ++h) {
                float pv = 0.f;
                if (key >= 0 && h < nh && sl[h] != 0.f) pv = expf(score(h, key) - smx[h]) / sl[h];
                if (lane == 0) sp[h * CH + j] = pv;
            }
        }
        __syncthreads();
        for (int j = 0; j < CH; ++j) {
            int64_t key = skey[j];
            if (key < 0) continue;
            for (int64_t d = tid; d < a.D; d += NTH) {
                float vv = ldf(V + krow(key, svs) + n2 * svs[2] + d * svs[3]);
                for (int h = 0; h < nh; ++h) sacc[h * DQ + d] += sp[h * CH + j] * vv;
            }
        }
        __syncthreads();
    }
    if (!backward) {
        for (int64_t i = tid; i < (int64_t)nh * a.D; i += NTH) {
            int h = (int)(i / a.D);
            int64_t d = i % a.D;
            int64_t head = n2 * H + h0 + h;
            o[((b * a.S1 + s1) * a.N1 + head) * a.D + d] = sacc[h * DQ + d];
        }
        if (tid < nh && lse) {
            int64_t head = n2 * H + h0 + tid;
            lse[(b * a.S1 + s1) * a.N1 + head] = sl[tid] != 0.f ? smx[tid] + logf(sl[tid]) : -INFINITY;
        }
        return;
    }
    // Delta = rowsum(dO * O) with the recomputed O
    for (int h = 0; h < nh; ++h) {
        float part = 0.f;
        for (int64_t d = tid; d < a.D; d += NTH) part += sdo[h * a.D + d] * sacc[h * DQ + d];
        for (int o2 = 16; o2 > 0; o2 >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o2);
        if (lane == 0) red[warp * HC + h] = part;
        __syncthreads();
        if (tid == 0) sdelta[h] = red[h] + red[HC + h] + red[2 * HC + h] + red[3 * HC + h];
        __syncthreads();
    }
    for (int64_t i = tid; i < HC * DQ; i += NTH) sacc[i] = 0.f;  // now dQ
    __syncthreads();
    // accumulator row of a key: the batch's (dense), the packed key row, or the page row
    auto arow = [&](int64_t key) -> int64_t {
        if (a.table) return (int64_t)a.table[tk.x * a.tab_s0 + (key / a.page_size) * a.tab_s1] * a.page_size + key % a.page_size;
        return b * a.S2 + tk.y + key;
    };
    // fp32 atomics, or exact integer adds (order-free: bitwise reproducible) with flags for
    // non-finite values (sfa_adds.cuh)
    const float fs = a.fix.acc[0] ? *a.fix.scale : 1.f;
    auto add = [&](int which, float *f32, int64_t i, float v) {
        if (a.fix.acc[0]) sfa::add_fix(a.fix.acc[which], a.fix.flags[which], i, v, fs);
        else atomicAdd(f32 + i, v);
    };

    // ---- pass 3: dS, dQ, dK, dV ----
    for (int64_t c0 = 0; c0 < nslot; c0 += CH) {
        for (int j = warp; j < CH; j += NTH / 32) {
            int64_t key = c0 + j < nslot ? ref_key(a, row, c0 + j, lim) : -1;
            if (lane == 0) skey[j] = key;
            for (int h = 0; h < HC; ++h) {
                float pv = 0.f, dsv = 0.f;
                if (key >= 0 && h < nh && sl[h] != 0.f) {
                    pv = expf(score(h, key) - smx[h]) / sl[h];
                    float dp = 0.f;
                    for (int64_t d = lane; d < a.D; d += 32)
                        dp += sdo[h * a.D + d] * ldf(V + krow(key, svs) + n2 * svs[2] + d * svs[3]);
                    for (int o2 = 16; o2 > 0; o2 >>= 1) dp += __shfl_xor_sync(0xffffffffu, dp, o2);
                    dsv = pv * (dp - sdelta[h]);
                }
                if (lane == 0) {
                    sp[h * CH + j] = pv;
                    sds[h * CH + j] = dsv;
                }
            }
        }
        __syncthreads();
        for (int j = 0; j < CH; ++j) {
            int64_t key = skey[j];
            if (key < 0) continue;
            for (int64_t d = tid; d < DQ; d += NTH) {
                float kv = d < a.D ? ldf(Kp + krow(key, a.sk) + n2 * a.sk[2] + d * a.sk[3])
                                   : ldf(KR + krow(key, a.skr) + n2 * a.skr[2] + (d - a.D) * a.skr[3]);
                float gk = 0.f;
                for (int h = 0; h < nh; ++h) {
                    float ds = sds[h * CH + j];
                    sacc[h * DQ + d] += a.scale * ds * kv;
                    gk += a.scale * ds * sq[h * DQ + d];
                }
                const int64_t kr = arow(key) * a.N2 + n2;
                if (d < a.D) {
                    float gv = 0.f;
                    for (int h = 0; h < nh; ++h) gv += sp[h * CH + j] * sdo[h * a.D + d];
                    if (a.shared_kv) {
                        add(0, dk, kr * a.D + d, gk + gv);
                    } else {
                        add(0, dk, kr * a.D + d, gk);
                        add(2, dv, kr * a.D + d, gv);
                    }
                } else {
                    add(1, dkr, kr * a.Dr + (d - a.D), gk);
                }
            }
        }
        __syncthreads();
    }
    for (int64_t i = tid; i < (int64_t)nh * DQ; i += NTH) {
        int h = (int)(i / DQ);
        int64_t d = i % DQ;
        int64_t head = n2 * H + h0 + h;
        int64_t r = (b * a.S1 + s1) * a.N1 + head;
        if (d < a.D)
            dq[r * a.D + d] = sacc[i];
        else
            dqr[r * a.Dr + (d - a.D)] = sacc[i];
    }
}

void fill(const spattn_sfa_problem *p, RefArgs *a) {
    auto cp4 = [](int64_t *d, const spattn_tensor *t) {
        for (int i = 0; i < 4; ++i) d[i] = t ? t->strides[i] : 0;
    };
    a->q = p->q->data;
    a->qr = p->q_rope ? p->q_rope->data : nullptr;
    a->k = p->k->data;
    a->kr = p->k_rope ? p->k_rope->data : nullptr;
    a->v = p->v ? p->v->data : nullptr;
    a->dout = p->dout ? p->dout->data : nullptr;
    a->idx = (const int32_t *)p->idx->data;
    cp4(a->sq, p->q);
    cp4(a->sqr, p->q_rope);
    cp4(a->sk, p->k);
    cp4(a->skr, p->k_rope);
    cp4(a->sv, p->v);
    cp4(a->sdo, p->dout);
    cp4(a->sidx, p->idx);
    a->B = p->B;
    a->S1 = p->S1;
    a->S2 = p->S2;
    a->N1 = p->N1;
    a->N2 = p->N2;
    a->D = p->D;
    a->Dr = p->Dr;
    a->K = p->K;
    a->sbs = p->sbs;
    a->nblk = p->nblk;
    a->mode = p->mode;
    a->shared_kv = p->shared_kv;
    a->scale = p->scale;
    a->tok = nullptr;
    a->table = nullptr;
    a->tab_s0 = a->tab_s1 = 0;
    a->page_size = 1;
}

// krows: accumulator rows of dk / dk_rope / dv (B S2 dense; varlen: the key side's rows)
spattn_status run(const spattn_sfa_problem *p, const spattn_exec *ex, int backward, float *o,
                  float *lse, float *dq, float *dqr, float *dk, float *dkr, float *dv,
                  const int4 *tok = nullptr, int64_t krows = -1, const sfa_ref_fix *fix = nullptr) {
    RefArgs a;
    fill(p, &a);
    memset(&a.fix, 0, sizeof a.fix);
    if (fix) a.fix = *fix;
    if (krows < 0) krows = p->B * p->S2;
    if (tok) {
        a.tok = tok;
        const spattn_seqs *s = p->seqs;
        if (s->table) {
            a.table = s->table;
            a.tab_s0 = s->tab_s0;
            a.tab_s1 = s->tab_s1;
            a.page_size = s->page_size;
        }
    }
    cudaStream_t st = (cudaStream_t)ex->stream;
    const int64_t DQ = p->D + p->Dr;
    size_t smem = sizeof(float) * (size_t)(HC * DQ + HC * p->D + HC * DQ + 2 * HC * CH) +
                  sizeof(int64_t) * CH + sizeof(float) * (3 * HC + 8 * HC);
    const int64_t H = p->N1 / p->N2;
    const int64_t nblocks = p->B * p->S1 * p->N2 * ((H + HC - 1) / HC);
    cudaError_t e = cudaSuccess;
    if (backward && !a.fix.acc[0]) {  // (the fixed-point accumulators come zeroed)
        e = cudaMemsetAsync(dk, 0, sizeof(float) * krows * p->N2 * p->D, st);
        if (e == cudaSuccess && dkr && p->Dr)
            e = cudaMemsetAsync(dkr, 0, sizeof(float) * krows * p->N2 * p->Dr, st);
        if (e == cudaSuccess && dv)
            e = cudaMemsetAsync(dv, 0, sizeof(float) * krows * p->N2 * p->D, st);
    }
#define SFA_REF_LAUNCH(T)                                                                       \
    do {                                                                                        \
        if (e == cudaSuccess)                                                                   \
            e = cudaFuncSetAttribute(ref_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                     (int)smem);                                                \
        if (e == cudaSuccess) {                                                                 \
            ref_kernel<T><<<(unsigned)nblocks, NTH, smem, st>>>(a, backward, o, lse, dq, dqr, dk, \
                                                                dkr, dv);                       \
            e = cudaGetLastError();                                                             \
        }                                                                                       \
    } while (0)
    if (p->dtype == SPATTN_DTYPE_F32)
        SFA_REF_LAUNCH(float);
    else if (p->dtype == SPATTN_DTYPE_F16)
        SFA_REF_LAUNCH(__half);
    else
        SFA_REF_LAUNCH(__nv_bfloat16);
#undef SFA_REF_LAUNCH
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda reference %s: %s",
                                backward ? "backward" : "forward", cudaGetErrorString(e));
    return SPATTN_STATUS_SUCCESS;
}

}  // namespace

extern "C" spattn_status spattn_cuda_ref_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex,
                                                 float *o, float *lse) {
    return run(p, ex, 0, o, lse, nullptr, nullptr, nullptr, nullptr, nullptr);
}

extern "C" spattn_status spattn_cuda_ref_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex,
                                                 float *dq, float *dq_rope, float *dk,
                                                 float *dk_rope, float *dv) {
    return run(p, ex, 1, nullptr, nullptr, dq, dq_rope, dk, dk_rope, dv);
}

// Varlen forward (sfa_host.cu): p over views (B = 1, S1 = Tq, see RefArgs), p->seqs the call's
// layout (device pointers), tok the pre-pass's per-token table; o [Tq, N1, D], lse [Tq, N1]
// (rows of tokens past cu_seqlens_q[B] are not written).
extern "C" spattn_status spattn_cuda_ref_sfa_fwd_varlen(const spattn_sfa_problem *p, const spattn_exec *ex,
                                                        const int4 *tok, float *o, float *lse) {
    return run(p, ex, 0, o, lse, nullptr, nullptr, nullptr, nullptr, nullptr, tok);
}

// The API's simple-kernel backward (sfa_ref.h).
extern "C" spattn_status spattn_cuda_ref_sfa_bwd_into(const spattn_sfa_problem *p, const spattn_exec *ex,
                                                     const int4 *tok, int64_t krows, const sfa_ref_fix *fix,
                                                     float *dq, float *dq_rope, float *dk, float *dk_rope, float *dv) {
    return run(p, ex, 1, nullptr, nullptr, dq, dq_rope, dk, dk_rope, dv, tok, krows, fix);
}
