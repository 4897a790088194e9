/*
 * Internal interface between the core (validation, dispatch) and the backends (src/cpu,
 * src/cuda).  The core validates every argument, fills a problem struct and calls the backend;
 * a backend may assume every check listed in bsa_api.c / sfa_api.c has passed.
 */
#ifndef SPATTN_INTERNAL_H
#define SPATTN_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "spattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------------------------- */
/* Records a formatted message as the thread's last error and returns `status`. */
spattn_status spattn_set_error(spattn_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void spattn_clear_error(void);

/* ---- execution context handed to backends ------------------------------------------------ */
typedef struct spattn_exec {
    int32_t num_threads;   /* CPU: 0 = OpenMP default (the backend resolves it) */
    void *stream;          /* cudaStream_t */
    void *workspace;       /* caller's workspace (already checked to be large enough) or NULL */
    size_t workspace_size;
    int32_t deterministic;
} spattn_exec;

/* ---- problems (validated) ---------------------------------------------------------------- */
/* Packed variable-length batch / paged keys of a _varlen call (src/core/seqs.h); NULL in the
 * problems of dense calls. */
struct spattn_seqs;

typedef struct spattn_bsa_problem {
    /* Tensors as the caller described them; the ones a pass does not use are NULL. */
    const spattn_tensor *q, *k, *v, *mask, *o, *lse, *dout, *dq, *dk, *dv;
    int64_t B, N, Nkv;        /* N query heads, Nkv key/value heads, N % Nkv == 0 */
    int64_t Sq, Skv, D;
    int64_t bx, by, nbx, nby; /* nbx = ceil(Sq/bx), nby = ceil(Skv/by) */
    float scale;              /* resolved (never 0) */
    int32_t dtype;            /* of q, k, v, o, dout, dq, dk, dv */
    /* _varlen calls: tensors packed [T, N, D] (k, v may be pages), B = sequences, Sq / Skv =
     * max_seqlen_q / kv, nbx / nby of the mask; backends must go through seqs.h. */
    const struct spattn_seqs *seqs;
    /* _plan calls: the plan (mask = its copy); NULL otherwise.  Backends may use its schedules. */
    const struct spattn_bsa_plan *plan;
} spattn_bsa_problem;

/* A bsa plan (src/core/bsa_plan.c): shapes, an owned copy of the block mask on the plan's
 * device, and the backend's schedules (CUDA: src/cuda/bsa_plan.cu; CPU: none). */
struct spattn_bsa_plan {
    int32_t device_type, device_id;
    int64_t B, N, Nkv, Sq, Skv, bx, by, nbx, nby;
    spattn_tensor mask;  /* [B, N, nbx, nby], owned: contiguous (CUDA), or stride 0 where the
                            caller's mask broadcasts (CPU, see bsa_plan.c) */
    void *mask_mem;      /* the CPU copy's allocation (mask.data may point inside it) */
    void *cuda;          /* backend part, owned */
};

typedef struct spattn_sfa_problem {
    const spattn_tensor *q, *q_rope, *k, *k_rope, *v, *idx, *o, *lse, *dout;
    const spattn_tensor *dq, *dq_rope, *dk, *dk_rope, *dv;
    int64_t B, S1, S2, N1, N2, D, Dr, K;
    int64_t sbs;              /* power of two, 1 .. 128 */
    int64_t nblk;             /* ceil(S2 / sbs): valid index values are -1 .. nblk-1 */
    int32_t mode;             /* 0 or 3 */
    int32_t shared_kv;        /* 1 when v == NULL (v is the first D columns of k) */
    float scale;              /* resolved */
    int32_t dtype;
    /* _varlen calls (see spattn_bsa_problem): S1 / S2 = max_seqlen_q / kv, nblk of S2 */
    const struct spattn_seqs *seqs;
} spattn_sfa_problem;

/* ---- backends ---------------------------------------------------------------------------- */
/* CPU (src/cpu).  Workspace functions return bytes for `num_threads` threads. */
size_t spattn_cpu_bsa_workspace(const spattn_bsa_problem *p, int backward, int num_threads);
spattn_status spattn_cpu_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex);
spattn_status spattn_cpu_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex);
size_t spattn_cpu_sfa_workspace(const spattn_sfa_problem *p, int backward, int num_threads);
spattn_status spattn_cpu_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex);
spattn_status spattn_cpu_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex);
/* "avx512" | "avx2" | "generic" */
const char *spattn_cpu_isa_name(void);

/* CUDA (src/cuda; src/core/cuda_stub.c when built without CUDA). */
int spattn_cuda_backend_available(void);
size_t spattn_cuda_bsa_workspace(const spattn_bsa_problem *p, int backward);
spattn_status spattn_cuda_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex);
spattn_status spattn_cuda_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex);
/* Packed variable-length forward and backward (p->seqs without a table; device prefix sums,
 * checked on the device before any write: SPATTN_STATUS_BAD_INDEX with the CPU's message).
 * Synchronize.  The backward runs fp16 / bf16, D <= 128, TMA-readable views only (others
 * SPATTN_STATUS_NOT_SUPPORTED before anything runs; workspace 0). */
size_t spattn_cuda_bsa_varlen_workspace(const spattn_bsa_problem *p, int backward);
spattn_status spattn_cuda_bsa_fwd_varlen(const spattn_bsa_problem *p, const spattn_exec *ex);
spattn_status spattn_cuda_bsa_bwd_varlen(const spattn_bsa_problem *p, const spattn_exec *ex);
size_t spattn_cuda_sfa_workspace(const spattn_sfa_problem *p, int backward);
/* Scans the index tensor on the device; SPATTN_STATUS_BAD_INDEX (with a message naming the
 * first bad position and value) when any value lies outside [-1, nblk).  Synchronizes. */
spattn_status spattn_cuda_sfa_check_indices(const spattn_sfa_problem *p, const spattn_exec *ex);
/* Checks the index values itself (as spattn_cuda_sfa_check_indices, same status and message; the
 * kernel is gated on the scan's result so nothing is written for a bad index).  Synchronizes. */
spattn_status spattn_cuda_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex);
spattn_status spattn_cuda_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex);
/* Fills plan->mask (a device copy of `mask`) and plan->cuda (schedules) on ex->stream, then
 * synchronizes it; frees what it made on failure.  _free releases both (NULL-safe). */
spattn_status spattn_cuda_bsa_plan_make(struct spattn_bsa_plan *plan, const spattn_tensor *mask,
                                        const spattn_exec *ex);
void spattn_cuda_bsa_plan_free(struct spattn_bsa_plan *plan);

/* Deliberately simple CUDA reference kernels: the golden of `spattn verify --backend cuda`
 * (independent of the fast kernels; fp32 accumulation, no tiling tricks).  They read the
 * problem's input tensors (device pointers with strides) and write CONTIGUOUS fp32 device
 * buffers shaped like the real outputs (o [B,N,Sq,D], lse [B,N,Sq], ...; sfa: dq [B,S1,N1,D],
 * dq_rope [B,S1,N1,Dr] or NULL, dk [B,S2,N2,D] (dV added in when shared_kv), dk_rope, dv or
 * NULL).  The backward recomputes P itself.  Stream = ex->stream; they synchronize it. */
spattn_status spattn_cuda_ref_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex,
                                      float *o, float *lse);
spattn_status spattn_cuda_ref_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex,
                                      float *dq, float *dk, float *dv);
spattn_status spattn_cuda_ref_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex,
                                      float *o, float *lse);
spattn_status spattn_cuda_ref_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex,
                                      float *dq, float *dq_rope, float *dk, float *dk_rope,
                                      float *dv);

/* The bsa entry points with an optional plan (bsa_api.c; plan == NULL: the plain calls). */
spattn_status spattn_bsa_fwd_planned(const spattn_tensor *q, const spattn_tensor *k,
                                     const spattn_tensor *v, const spattn_tensor *block_mask,
                                     int64_t bx, int64_t by, double scale, const spattn_tensor *o,
                                     const spattn_tensor *lse, const spattn_options *opt,
                                     const struct spattn_bsa_plan *plan);
spattn_status spattn_bsa_bwd_planned(const spattn_tensor *q, const spattn_tensor *k,
                                     const spattn_tensor *v, const spattn_tensor *o,
                                     const spattn_tensor *dout, const spattn_tensor *lse,
                                     const spattn_tensor *block_mask, int64_t bx, int64_t by,
                                     double scale, const spattn_tensor *dq, const spattn_tensor *dk,
                                     const spattn_tensor *dv, const spattn_options *opt,
                                     const struct spattn_bsa_plan *plan);
spattn_status spattn_bsa_workspace_planned(const spattn_tensor *q, const spattn_tensor *k,
                                           const spattn_tensor *v, const spattn_tensor *block_mask,
                                           int64_t bx, int64_t by, int32_t backward,
                                           const spattn_options *opt, size_t *bytes,
                                           const struct spattn_bsa_plan *plan);

/* ---- tensor helpers (src/core/tensor.c) -------------------------------------------------- */
/* Element offset of a multi-index. */
static inline int64_t spattn_offset4(const spattn_tensor *t, int64_t i0, int64_t i1, int64_t i2,
                                     int64_t i3) {
    return i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2] + i3 * t->strides[3];
}
static inline int64_t spattn_offset3(const spattn_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    return i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2];
}
int64_t spattn_numel(const spattn_tensor *t);
int spattn_is_float_dtype(int32_t dtype);

#ifdef __cplusplus
}
#endif

#endif
