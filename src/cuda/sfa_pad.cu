// Shared-V sfa shapes wider than the small-head kernels' (256 < D <= 512, Dr <= 64, fp16/bf16,
// dense calls) on the DeepSeek (Mla) kernels: the call runs as the Mla shape (D 512 + Dr 64) on
// zero-padded operands, then the outputs' first D / Dr columns are copied back.
//
// Why it is exact: a zero column of Q and K adds nothing to S; V = k's first 512 columns, so O's
// columns past D are P times zeros (never stored); in the backward dQ = dS K, dK = dS^T Q + P^T dO
// have zero columns past D / Dr, and Delta = rowsum(dO O) gains nothing from zero columns.
// Why here and not in the kernels: the Mla kernels (sfa_fwd.cu, sfa_union.cu, sfa_bwd90.cu,
// sfa_bwd_small.cu) hold no per-column tests (their SASS is the verified one); the copies cost
// one pass over q / k (and o / dout / dq / dk in the backward) against the attention's
// K (D + Dr + D) flops per (token, head), and nothing at all where D = 512 and Dr = 0 (q and k
// used as they are, the rope part a zero row read with stride 0).
// Each operand is used in place when it already is the padded width (512 or 64) with rows the
// kernels can read (unit last stride, 16-byte aligned); an output that is not gets a scratch
// buffer and the copy back after the call (not under stream capture: the copy could not be
// gated on the device index check, so such calls refuse capture as the simple kernels do).
#include <stdlib.h>
#include <string.h>

#include "../core/internal.h"
#include "scratch.h"
#include "sfa_common.cuh"

namespace {

// A tensor's rows: up to three leading dimensions (shape, strides) and the last one (w
// elements, stride sl).
struct Rows {
    const unsigned char *src;
    unsigned char *dst;
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
    return r;
}
__host__ __device__ inline int64_t nrows(const Rows &r) { return r.n[0] * r.n[1] * r.n[2]; }

__device__ __forceinline__ int64_t row_off(const Rows &r, int64_t row) {
    const int64_t i2 = row % r.n[2], t = row / r.n[2];
    return (t / r.n[1]) * r.s[0] + (t % r.n[1]) * r.s[1] + i2 * r.s[2];
}

// dst [rows][W] (dense, 16-byte aligned) = src rows (w elements, any strides), zero past w; one
// thread per 16-byte chunk of dst (w and W multiples of 8: a chunk lies wholly inside or past w).
// vec: src rows of unit stride, 16-byte aligned (a 16-byte load per chunk).
template <typename T> __global__ void pad_rows_kernel(Rows r, int W, bool vec) {
    const int cpr = W / 8;
    const int64_t total = nrows(r) * cpr;
    const T *src = reinterpret_cast<const T *>(r.src);
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = x / cpr;
        const int c = (int)(x - row * cpr);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (c * 8 < r.w) {
            const T *s = src + row_off(r, row) + (int64_t)c * 8 * r.sl;
            if (vec) {
                v = __ldg(reinterpret_cast<const uint4 *>(s));
            } else {
                T e[8];
#pragma unroll
                for (int i = 0; i < 8; i++) e[i] = s[i * r.sl];
                memcpy(&v, e, 16);
            }
        }
        *reinterpret_cast<uint4 *>(r.dst + (row * W + (int64_t)c * 8) * sizeof(T)) = v;
    }
}

// dst rows (the caller's tensor: w elements, any strides) = the first w columns of src [rows][W];
// vec: dst rows of unit stride, 16-byte aligned.
template <typename T> __global__ void unpad_rows_kernel(Rows r, int W, bool vec) {
    const int cpr = (int)(r.w / 8);
    const int64_t total = nrows(r) * cpr;
    T *dst = reinterpret_cast<T *>(r.dst);
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = x / cpr;
        const int c = (int)(x - row * cpr);
        const uint4 v = *reinterpret_cast<const uint4 *>(r.src + (row * W + (int64_t)c * 8) * sizeof(T));
        T *d = dst + row_off(r, row) + (int64_t)c * 8 * r.sl;
        if (vec) {
            *reinterpret_cast<uint4 *>(d) = v;
        } else {
            T e[8];
            memcpy(e, &v, 16);
#pragma unroll
            for (int i = 0; i < 8; i++) d[i * r.sl] = e[i];
        }
    }
}

unsigned grid_of(int64_t n) {
    int64_t g = (n + 255) / 256;
    return (unsigned)(g < 1 ? 1 : g > 132 * 16 ? 132 * 16 : g);
}

// Unit last stride and 16-byte aligned rows: the kernels read the tensor in place
bool readable(const spattn_tensor *t) {
    const int lead = t->ndim - 1;
    if (t->strides[lead] != 1 || ((uintptr_t)t->data) % 16) return false;
    for (int d = 0; d < lead; ++d)
        if (t->strides[d] % 8) return false;
    return true;
}

// The operands of the padded call: the inputs Q, QR, K, KR, O (the forward's output), DO, then
// the backward's outputs; PZERO: the zero row of a missing rope part (Dr = 0)
enum { PQ, PQR, PK, PKR, PO, PDO, PDQ, PDQR, PDK, PDKR, PZERO, PN };

struct Pad {
    spattn_sfa_problem pp;          // the Mla-shaped problem the kernels run
    spattn_tensor t[PN];            // its substituted tensors
    const spattn_tensor *user[PN];  // the caller's tensor of each slot (NULL: none)
    int width[PN];                  // the padded width of each slot (512 or 64)
    bool copy[PN];                  // a buffer in the workspace: an input copied in, an output copied back
    bool zero[PN];                  // the zero row, stride 0 (q_rope / k_rope when Dr = 0)
    size_t off[PN + 1];             // workspace layout (256-byte aligned parts; off[PN] = bytes)
};

// A dense [B, S, N, w] view (data bound later); zero_stride: every stride 0 but the last
spattn_tensor dense4(const spattn_tensor *dtype_of, int64_t B, int64_t S, int64_t N, int64_t w, bool zero_stride) {
    spattn_tensor v = *dtype_of;
    v.ndim = 4;
    const int64_t sh[4] = {B, S, N, w};
    int64_t s = 1;
    for (int d = 3; d >= 0; d--) {
        v.shape[d] = sh[d];
        v.strides[d] = d == 3 ? 1 : zero_stride ? 0 : s;
        s *= sh[d];
    }
    v.data = nullptr;
    return v;
}

// The padded problem and the workspace layout (data pointers bound by bind()).  A call has its
// outputs (forward: o; backward: dq); a size query has none of o, dout, dq, dk (and their rope
// parts): it sizes a copy for each of them (the largest need), as the Mla query answers its own.
void plan(const spattn_sfa_problem *p, bool backward, Pad *d) {
    memset(d, 0, sizeof *d);
    d->pp = *p;
    d->pp.D = sfa::D;
    d->pp.Dr = sfa::DR;
    const bool call = backward ? p->dq != nullptr : p->o != nullptr;
    const spattn_tensor *src[PZERO] = {p->q,  p->q_rope,  p->k,  p->k_rope,  p->o,
                                       p->dout, p->dq, p->dq_rope, p->dk, p->dk_rope};
    const spattn_tensor **dst[PZERO] = {&d->pp.q,    &d->pp.q_rope, &d->pp.k,  &d->pp.k_rope,  &d->pp.o,
                                        &d->pp.dout, &d->pp.dq,     &d->pp.dq_rope, &d->pp.dk, &d->pp.dk_rope};
    const int nslots = backward ? PZERO : PDO;  // the forward: q, k (and rope parts), o
    size_t o = 0;
    for (int i = 0; i < nslots; i++) {
        const bool rope = i == PQR || i == PKR || i == PDQR || i == PDKR;
        const bool kside = i == PK || i == PKR || i == PDK || i == PDKR;
        const bool out = i >= PDQ || (i == PO && !backward);
        const int64_t S = kside ? p->S2 : p->S1, N = kside ? p->N2 : p->N1;
        d->off[i] = o;
        d->width[i] = rope ? sfa::DR : sfa::D;
        d->user[i] = src[i];
        if (rope && !out && p->Dr == 0) {
            d->zero[i] = true;
            d->t[i] = dense4(p->q, p->B, S, N, sfa::DR, true);
            *dst[i] = &d->t[i];
            continue;
        }
        if (src[i] && src[i]->shape[3] == d->width[i] && readable(src[i])) {
            d->t[i] = *src[i];
        } else {
            d->copy[i] = true;
            d->t[i] = dense4(p->q, p->B, S, N, d->width[i], false);
            o += ((size_t)p->B * S * N * d->width[i] * 2 + 255) & ~(size_t)255;  // fp16 / bf16
        }
        // substituted where the caller has the tensor, and for a call's dropped rope outputs (Dr 0)
        if (src[i] || (call && out && rope)) *dst[i] = &d->t[i];
    }
    d->off[PZERO] = o;
    if (p->Dr == 0) o += 256;  // one zero row of 64 elements (128 bytes)
    d->off[PN] = o;
}

void bind(Pad *d, unsigned char *base) {
    for (int i = 0; i < PZERO; i++)
        if (d->copy[i]) d->t[i].data = base + d->off[i];
        else if (d->zero[i]) d->t[i].data = base + d->off[PZERO];
}

bool needs_copy_back(const Pad &d, bool backward) {
    for (int i = backward ? PDQ : PO; i <= (backward ? PDKR : PO); i++)
        if (d.copy[i] && d.user[i]) return true;
    return false;
}

// the inputs' copies (forward: q, k and their rope parts; backward: also o and dout)
template <typename T> cudaError_t copy_in(const Pad &d, bool backward, cudaStream_t st) {
    for (int i = PQ; i <= (backward ? PDO : PKR); i++) {
        if (!d.copy[i]) continue;
        Rows r = rows_of(d.user[i]);
        r.src = static_cast<const unsigned char *>(d.user[i]->data);
        r.dst = static_cast<unsigned char *>(d.t[i].data);
        pad_rows_kernel<T><<<grid_of(nrows(r) * d.width[i] / 8), 256, 0, st>>>(r, d.width[i], readable(d.user[i]));
    }
    return cudaGetLastError();
}

// the outputs' first D / Dr columns into the caller's tensors (Dr 0: the rope scratch dropped)
template <typename T> cudaError_t copy_back(const Pad &d, bool backward, cudaStream_t st) {
    for (int i = backward ? PDQ : PO; i <= (backward ? PDKR : PO); i++) {
        if (!d.copy[i] || !d.user[i]) continue;
        Rows r = rows_of(d.user[i]);
        r.src = static_cast<const unsigned char *>(d.t[i].data);
        r.dst = static_cast<unsigned char *>(d.user[i]->data);
        unpad_rows_kernel<T><<<grid_of(nrows(r) * (r.w / 8)), 256, 0, st>>>(r, d.width[i], readable(d.user[i]));
    }
    return cudaGetLastError();
}

}  // namespace

extern "C" spattn_status spattn_cuda_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex);
extern "C" spattn_status spattn_cuda_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex);
extern "C" size_t spattn_cuda_sfa_workspace(const spattn_sfa_problem *p, int backward);

// A dense fp16 / bf16 call with V = k's first D columns, 256 < D <= 512 and Dr <= 64 (multiples
// of 8), other than the Mla shape itself: it runs padded to Mla.  Not yet run on a GPU: only with
// SPATTN_SFA_UNRUN_SHAPES=1 (else the simple kernels take it).
extern "C" int spattn_sfa_pad_route(const spattn_sfa_problem *p) {
    if (p->seqs || !p->shared_kv || p->dtype == SPATTN_DTYPE_F32) return 0;
    if (p->D <= 256 || p->D > sfa::D || p->D % 8 || p->Dr > sfa::DR || p->Dr % 8) return 0;
    if (p->D == sfa::D && p->Dr == sfa::DR) return 0;
    const char *g = getenv("SPATTN_SFA_UNRUN_SHAPES");
    return g && g[0] == '1';
}

// The padded call's buffers, then the Mla call's own workspace
extern "C" size_t spattn_sfa_pad_workspace(const spattn_sfa_problem *p, int backward) {
    Pad d;
    plan(p, backward != 0, &d);
    return d.off[PN] + spattn_cuda_sfa_workspace(&d.pp, backward);
}

static spattn_status pad_call(const spattn_sfa_problem *p, const spattn_exec *ex, bool backward) {
    cudaStream_t st = (cudaStream_t)ex->stream;
    Pad d;
    plan(p, backward, &d);
    if (needs_copy_back(d, backward) && stream_capturing(st))
        return capture_refusal(backward ? "sfa cuda backward of D < 512 or 0 < Dr < 64 (padded)"
                                        : "sfa cuda forward of D < 512 or 0 < Dr < 64 (padded)");
    const size_t own = d.off[PN];
    cuda_scratch scr;  // the caller's workspace (own bytes first, then the Mla call's) or the pool
    spattn_exec ex2 = *ex;
    if (ex->workspace) {
        scr.base = static_cast<char *>(ex->workspace);
        ex2.workspace = ex->workspace_size > own ? scr.base + own : nullptr;
        ex2.workspace_size = ex->workspace_size > own ? ex->workspace_size - own : 0;
    } else {
        const spattn_status s = scr.get(ex, own, backward ? "sfa cuda backward (padded)" : "sfa cuda forward (padded)");
        if (s != SPATTN_STATUS_SUCCESS) return s;
    }
    bind(&d, reinterpret_cast<unsigned char *>(scr.base));
    const bool bf16 = p->dtype == SPATTN_DTYPE_BF16;
    cudaError_t e = p->Dr == 0 ? cudaMemsetAsync(scr.base + d.off[PZERO], 0, 128, st) : cudaSuccess;
    if (e == cudaSuccess) e = bf16 ? copy_in<__nv_bfloat16>(d, backward, st) : copy_in<__half>(d, backward, st);
    if (e != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda (padded): %s", cudaGetErrorString(e));
    spattn_status s = backward ? spattn_cuda_sfa_bwd(&d.pp, &ex2) : spattn_cuda_sfa_fwd(&d.pp, &ex2);
    if (s != SPATTN_STATUS_SUCCESS) return s;  // e.g. a bad index: nothing was written, nothing is copied
    e = bf16 ? copy_back<__nv_bfloat16>(d, backward, st) : copy_back<__half>(d, backward, st);
    if (e != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "sfa cuda (padded): %s", cudaGetErrorString(e));
    return SPATTN_STATUS_SUCCESS;
}

extern "C" spattn_status spattn_sfa_pad_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    return pad_call(p, ex, false);
}
extern "C" spattn_status spattn_sfa_pad_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    return pad_call(p, ex, true);
}
