// The sfa shapes no narrower Hopper kernel takes, run on the DeepSeek (Mla) kernels through the
// column map of src/core/sfa_pack.h: an fp16 / bf16 call (dense, packed or paged) whose score
// columns fit Mla's 576 and whose values its 512 (v = k's first D columns with D <= 512 and
// D + Dr <= 576, or a separate v with 2 D + Dr <= 576), other than the shapes of the small-head / key-major kernels (D <= 256,
// Dr <= 64) and Mla itself, runs as the Mla problem on operands packed into Mla's columns; this
// file copies them in and the outputs' columns back.  The Mla kernels (sfa_fwd.cu, sfa_union.cu,
// sfa_bwd90.cu, sfa_bwd_small.cu) hold no per-column tests: their SASS stays the verified one.
// A part used in place or read as the zero row costs nothing (shared v, D 512 without rope:
// nothing copied at all); copies back are not allowed under stream capture (the copy could not be
// gated on the device index check, so such a call refuses capture as the simple kernels do).
#include <stdlib.h>
#include <string.h>

#include "../core/internal.h"
#include "scratch.h"
#include "../core/sfa_pack.h"
#include "sfa_common.cuh"

namespace {

constexpr int MAXSEG = 3;  // caller tensors packed into one row
static_assert(SPATTN_PACK_D == sfa::D && SPATTN_PACK_DR == sfa::DR, "the column map is the Mla kernels'");

// A tensor's rows: up to three leading dimensions (shape, strides) and the last one (w
// elements, stride sl).
struct Rows {
    const unsigned char *p;
    int64_t n[3], s[3], sl, w;
};
Rows rows_of(const spattn_tensor *t) {
    Rows r;
    memset(&r, 0, sizeof r);
    const int lead = t->ndim - 1;
    for (int d = 0; d < 3; d++) {
        const int i = d - (3 - lead);  // right-aligned: missing leading dimensions are 1
        r.n[d] = i >= 0 ? t->shape[i] : 1;
        r.s[d] = i >= 0 ? t->strides[i] : 0;
    }
    r.sl = t->strides[lead];
    r.w = t->shape[lead];
    r.p = static_cast<const unsigned char *>(t->data);
    return r;
}
__device__ __forceinline__ int64_t row_off(const Rows &r, int64_t row) {
    const int64_t i2 = row % r.n[2], t = row / r.n[2];
    return (t / r.n[1]) * r.s[0] + (t % r.n[1]) * r.s[1] + i2 * r.s[2];
}

// The caller tensors of one packed row: tensor i's columns at [col0[i], col0[i] + r[i].w) of the
// row's column space; vec[i]: its rows of unit stride, 16-byte aligned (16-byte accesses).
struct Pack {
    Rows r[MAXSEG];
    int col0[MAXSEG];
    bool vec[MAXSEG];
    int nseg;
    int64_t rows;
    unsigned char *buf;  // [rows][bw] elements, dense: the row's columns [b0, b0 + bw)
    int b0, bw;
};

// buf = the packed rows (columns of no tensor zero); one thread per 16-byte chunk (every column
// boundary a multiple of 8: a chunk lies wholly in one tensor or in none)
template <typename T> __global__ void pack_kernel(Pack k) {
    const int cpr = k.bw / 8;
    const int64_t total = k.rows * cpr;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = x / cpr;
        const int c = k.b0 + 8 * (int)(x - row * cpr);
        uint4 v = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < MAXSEG; i++) {
            if (i >= k.nseg || c < k.col0[i] || c >= k.col0[i] + k.r[i].w) continue;
            const T *s = reinterpret_cast<const T *>(k.r[i].p) + row_off(k.r[i], row) + (int64_t)(c - k.col0[i]) * k.r[i].sl;
            if (k.vec[i]) {
                v = __ldg(reinterpret_cast<const uint4 *>(s));
            } else {
                T e[8];
#pragma unroll
                for (int j = 0; j < 8; j++) e[j] = s[j * k.r[i].sl];
                memcpy(&v, e, 16);
            }
        }
        *reinterpret_cast<uint4 *>(k.buf + (row * k.bw + (c - k.b0)) * sizeof(T)) = v;
    }
}

// The caller tensors' columns out of the packed rows (the inverse of pack_kernel; tensors with
// col0 < 0 skipped: written in place by the kernels); one thread per 16-byte chunk of them
template <typename T> __global__ void unpack_kernel(Pack k) {
    int64_t cpr = 0;
    for (int i = 0; i < k.nseg; i++) cpr += k.col0[i] >= 0 ? k.r[i].w / 8 : 0;
    const int64_t total = k.rows * cpr;
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = x / cpr;
        int64_t c = x - row * cpr;
        int i = 0;
        for (; i < MAXSEG - 1; i++) {  // the tensor of chunk c of the row
            const int64_t n = k.col0[i] >= 0 && i < k.nseg ? k.r[i].w / 8 : 0;
            if (c < n) break;
            c -= n;
        }
        const uint4 v = *reinterpret_cast<const uint4 *>(k.buf + (row * k.bw + k.col0[i] - k.b0 + 8 * c) * sizeof(T));
        T *d = const_cast<T *>(reinterpret_cast<const T *>(k.r[i].p)) + row_off(k.r[i], row) + 8 * c * k.r[i].sl;
        if (k.vec[i]) {
            *reinterpret_cast<uint4 *>(d) = v;
        } else {
            T e[8];
            memcpy(e, &v, 16);
#pragma unroll
            for (int j = 0; j < 8; j++) d[j * k.r[i].sl] = e[j];
        }
    }
}

unsigned grid_of(int64_t n) {
    const int64_t g = (n + 255) / 256;
    return (unsigned)(g < 1 ? 1 : g > 132 * 16 ? 132 * 16 : g);
}

using Group = spattn_sfa_pack_group;

// back: the copy back (tensors the kernels wrote in place marked col0 = -1, unpack_kernel skips
// them); else the copy in (a tensor in place lies outside the buffered columns)
Pack pack_of(const Group &x, unsigned char *base, bool back) {
    Pack k;
    memset(&k, 0, sizeof k);
    k.nseg = x.nseg;
    k.rows = x.rows;
    k.buf = base + x.off;
    k.b0 = x.b0;
    k.bw = x.b1 - x.b0;
    for (int s = 0; s < x.nseg; s++) {
        k.col0[s] = !back || spattn_sfa_pack_copied(&x, s) ? x.seg[s].col0 : -1;
        if (!x.seg[s].t) continue;
        k.r[s] = rows_of(x.seg[s].t);
        k.vec[s] = spattn_sfa_pack_readable(x.seg[s].t);
    }
    return k;
}

// the inputs' buffers (the forward: q', k'; the backward: also o', dout'); outs: the outputs'
// too (a varlen call: the kernels leave the rows of tokens past cu_seqlens_q[B] unwritten, so
// their buffers start as the caller's rows and the copy back leaves those rows as they were)
template <typename T> cudaError_t copy_in(const spattn_sfa_pack &d, unsigned char *base, bool outs, cudaStream_t st) {
    for (int i = 0; i < SPATTN_PACK_NG; i++) {
        const Group &x = d.g[i];
        if (!x.used || (x.out && !outs) || x.b1 == x.b0) continue;  // no buffer: in place or zero
        const Pack k = pack_of(x, base, false);
        pack_kernel<T><<<grid_of(k.rows * k.bw / 8), 256, 0, st>>>(k);
    }
    return cudaGetLastError();
}

// the outputs' columns into the caller's tensors (columns of no caller tensor dropped)
template <typename T> cudaError_t copy_back(const spattn_sfa_pack &d, unsigned char *base, cudaStream_t st) {
    for (int i = 0; i < SPATTN_PACK_NG; i++) {
        const Group &x = d.g[i];
        if (!x.used || !x.out || x.b1 == x.b0) continue;
        const Pack k = pack_of(x, base, true);
        int64_t cpr = 0;
        for (int s = 0; s < k.nseg; s++) cpr += k.col0[s] >= 0 ? k.r[s].w / 8 : 0;
        if (cpr) unpack_kernel<T><<<grid_of(k.rows * cpr), 256, 0, st>>>(k);
    }
    return cudaGetLastError();
}

}  // namespace

extern "C" spattn_status spattn_cuda_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex);
extern "C" spattn_status spattn_cuda_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex);
extern "C" size_t spattn_cuda_sfa_workspace(const spattn_sfa_problem *p, int backward);

// An fp16 / bf16 call of the column map above that no other Hopper kernel takes (those take
// D <= 256 with Dr <= 64, and Mla).
extern "C" int spattn_sfa_pad_route(const spattn_sfa_problem *p) {
    return spattn_sfa_pack_fits(p, 0) && !(p->D <= 256 && p->Dr <= 64) &&
           !(p->shared_kv && p->D == sfa::D && p->Dr == sfa::DR);
}

// The packed call's buffers, then the Mla call's own workspace.  Always the size query's answer
// (o, dout and the outputs as if absent: a buffer for each), also when the API checks a call's
// caller workspace: the answer holds for any layout of those tensors (spattn.h), and a workspace
// one byte short of it is refused whatever the call's layout would have needed (the call itself
// uses its exact layout, the Mla call the rest).
extern "C" size_t spattn_sfa_pad_workspace(const spattn_sfa_problem *p, int backward) {
    spattn_sfa_problem q = *p;
    q.o = q.dout = q.dq = q.dq_rope = q.dk = q.dk_rope = q.dv = nullptr;
    spattn_sfa_pack d;
    spattn_sfa_pack_plan(&q, backward, &d);
    return d.bytes + spattn_cuda_sfa_workspace(&d.pp, backward);
}

static spattn_status pad_call(const spattn_sfa_problem *p, const spattn_exec *ex, bool backward) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    spattn_sfa_pack d;
    spattn_sfa_pack_plan(p, backward, &d);
    // a _varlen call refuses capture itself (it reads its checks back), but only after the copies
    // in: refuse first, so that nothing is enqueued
    if ((p->seqs || spattn_sfa_pack_needs_copy_back(&d)) && stream_capturing(st))
        return capture_refusal(backward ? "sfa cuda backward on packed Mla columns (a _varlen call, or a shape other than D 512 without rope)"
                                        : "sfa cuda forward on packed Mla columns (a _varlen call, or a shape other than D 512 without rope)");
    cuda_scratch scr;  // the caller's workspace (this part first, then the Mla call's) or the pool
    spattn_exec ex2 = *ex;
    if (ex->workspace) {
        scr.base = static_cast<char *>(ex->workspace);
        ex2.workspace = ex->workspace_size > d.bytes ? scr.base + d.bytes : nullptr;
        ex2.workspace_size = ex->workspace_size > d.bytes ? ex->workspace_size - d.bytes : 0;
    } else {
        const spattn_status s = scr.get(ex, d.bytes, backward ? "sfa cuda backward (packed)" : "sfa cuda forward (packed)");
        if (s != SPATTN_STATUS_SUCCESS) return s;
    }
    unsigned char *base = reinterpret_cast<unsigned char *>(scr.base);
    spattn_sfa_pack_bind(&d, base);
    const bool bf16 = p->dtype == SPATTN_DTYPE_BF16;
    cudaError_t e = cudaMemsetAsync(base + d.zero_off, 0, SPATTN_PACK_ZERO_BYTES, st);
    const bool vl = p->seqs != nullptr;
    if (e == cudaSuccess) e = bf16 ? copy_in<__nv_bfloat16>(d, base, vl, st) : copy_in<__half>(d, base, vl, st);
    if (e != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda (packed): %s", cudaGetErrorString(e));
    const spattn_status s = backward ? spattn_cuda_sfa_bwd(&d.pp, &ex2) : spattn_cuda_sfa_fwd(&d.pp, &ex2);
    if (s != SPATTN_STATUS_SUCCESS) return s;  // e.g. a bad index: nothing was written, nothing is copied
    e = bf16 ? copy_back<__nv_bfloat16>(d, base, st) : copy_back<__half>(d, base, st);
    if (e != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda (packed): %s", cudaGetErrorString(e));
    return SPATTN_STATUS_SUCCESS;
}

extern "C" spattn_status spattn_sfa_pad_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    return pad_call(p, ex, false);
}
extern "C" spattn_status spattn_sfa_pad_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    return pad_call(p, ex, true);
}
