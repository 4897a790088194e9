// CUDA merge of two attention states (spattn_merge_attention_states, semantics in
// include/spattn.h).  Deliberately simple: one warp per row, fp32 math, any strides, dtypes
// chosen per tensor at run time.  Memory-bound; good enough for split-KV / ring merging.
// Build: part of libspattn when CUDA is on (CMake globs src/cuda/*.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "../core/merge.h"

namespace {

struct MergeView {
    const void *data;
    int32_t dtype;
    int64_t strides[SPATTN_MAX_DIMS];
};

struct MergeArgs {
    MergeView o1, o2, lse1, lse2;
    void *o;
    int32_t o_dtype;
    int64_t o_strides[SPATTN_MAX_DIMS];
    float *lse;  // may be null
    int64_t lse_strides[SPATTN_MAX_DIMS];
    int32_t nr;
    int64_t rshape[SPATTN_MAX_DIMS];
    int64_t rows, D;
};

__device__ __forceinline__ float load_f(const void *p, int32_t dt, int64_t i) {
    if (dt == SPATTN_DTYPE_F16) return __half2float(static_cast<const __half *>(p)[i]);
    if (dt == SPATTN_DTYPE_BF16) return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    return static_cast<const float *>(p)[i];
}

__device__ __forceinline__ void store_f(void *p, int32_t dt, int64_t i, float x) {
    if (dt == SPATTN_DTYPE_F16) static_cast<__half *>(p)[i] = __float2half_rn(x);
    else if (dt == SPATTN_DTYPE_BF16) static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(x);
    else static_cast<float *>(p)[i] = x;
}

__device__ __forceinline__ int64_t row_off(const MergeArgs &a, const int64_t *st, int64_t r) {
    int64_t off = 0;
    for (int i = a.nr - 1; i >= 0; i--) {
        int64_t idx = r % a.rshape[i];
        r /= a.rshape[i];
        off += idx * st[i];
    }
    return off;
}

__global__ void merge_kernel(MergeArgs a) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    const int nd = a.nr;  // index of the D dimension
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < a.rows; r += warps) {
        float l1 = static_cast<const float *>(a.lse1.data)[row_off(a, a.lse1.strides, r)];
        float l2 = static_cast<const float *>(a.lse2.data)[row_off(a, a.lse2.strides, r)];
        int64_t b1 = row_off(a, a.o1.strides, r), b2 = row_off(a, a.o2.strides, r), bo = row_off(a, a.o_strides, r);
        float w1 = 0.f, w2 = 0.f, out_lse;
        bool nan_row = isnan(l1) || isnan(l2);
        float m = fmaxf(l1, l2);
        if (nan_row) {
            out_lse = NAN;
        } else if (m == -INFINITY) {
            out_lse = -INFINITY;
        } else {
            w1 = l1 == -INFINITY ? 0.f : expf(l1 - m);
            w2 = l2 == -INFINITY ? 0.f : expf(l2 - m);
            float s = w1 + w2;
            out_lse = m + logf(s);
            w1 /= s;
            w2 /= s;
        }
        // All lanes read their elements of the row before any lane writes (in place is allowed
        // only for the identical view, so element d is read and written by the same lane).
        for (int64_t d = lane; d < a.D; d += 32) {
            float x;
            if (nan_row) {
                x = NAN;
            } else {
                x = 0.f;
                if (w1 != 0.f) x += w1 * load_f(a.o1.data, a.o1.dtype, b1 + d * a.o1.strides[nd]);
                if (w2 != 0.f) x += w2 * load_f(a.o2.data, a.o2.dtype, b2 + d * a.o2.strides[nd]);
            }
            store_f(a.o, a.o_dtype, bo + d * a.o_strides[nd], x);
        }
        __syncwarp();  // every lane has read lse1/lse2 of this row (lse may be lse1 in place)
        if (a.lse && lane == 0) a.lse[row_off(a, a.lse_strides, r)] = out_lse;
    }
}

void fill_view(MergeView *v, const spattn_tensor *t) {
    v->data = t->data;
    v->dtype = t->dtype;
    for (int i = 0; i < SPATTN_MAX_DIMS; i++) v->strides[i] = t->strides[i];
}

}  // namespace

extern "C" spattn_status spattn_cuda_merge(const spattn_merge_problem *p, const spattn_exec *ex) {
    MergeArgs a;
    fill_view(&a.o1, p->o1);
    fill_view(&a.o2, p->o2);
    fill_view(&a.lse1, p->lse1);
    fill_view(&a.lse2, p->lse2);
    a.o = p->o->data;
    a.o_dtype = p->o->dtype;
    a.lse = p->lse ? static_cast<float *>(p->lse->data) : nullptr;
    for (int i = 0; i < SPATTN_MAX_DIMS; i++) {
        a.o_strides[i] = p->o->strides[i];
        a.lse_strides[i] = p->lse ? p->lse->strides[i] : 0;
        a.rshape[i] = p->rshape[i];
    }
    a.nr = p->nr;
    a.rows = p->rows;
    a.D = p->D;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaSetDevice(p->o1->device_id) != cudaSuccess) {
        cudaGetLastError();
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "merge: cannot select cuda:%d", p->o1->device_id);
    }
    const int threads = 256, rows_per_block = threads / 32;
    int64_t blocks = (p->rows + rows_per_block - 1) / rows_per_block;
    if (blocks > 65535LL * 16) blocks = 65535LL * 16;  // grid-stride loop covers the rest
    merge_kernel<<<(unsigned)blocks, threads, 0, static_cast<cudaStream_t>(ex->stream)>>>(a);
    cudaError_t err = cudaGetLastError();
    cudaSetDevice(dev);
    if (err != cudaSuccess)
        return spattn_set_error(SPATTN_STATUS_CUDA_ERROR, "merge kernel launch: %s", cudaGetErrorString(err));
    return SPATTN_STATUS_SUCCESS;
}
