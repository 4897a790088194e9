/*
 * Internal interface of spattn_merge_attention_states (src/core/merge_api.c validates, then
 * src/cpu/merge_cpu.c or src/cuda/merge.cu runs it).
 */
#ifndef SPATTN_MERGE_H
#define SPATTN_MERGE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A validated merge: R = ndim - 1 row dimensions (shape rshape), D columns.  Every tensor keeps
 * the caller's strides; lse may be NULL.  o may be the very view o1 or o2 (in place), lse the
 * very view lse1 or lse2: a backend reads both inputs of a row element before writing it. */
typedef struct spattn_merge_problem {
    const spattn_tensor *o1, *lse1, *o2, *lse2, *o, *lse;
    int32_t nr;                        /* number of row dimensions, 1 .. SPATTN_MAX_DIMS - 1 */
    int64_t rshape[SPATTN_MAX_DIMS];   /* row dimensions */
    int64_t rows;                      /* product of rshape */
    int64_t D;
} spattn_merge_problem;

spattn_status spattn_cpu_merge(const spattn_merge_problem *p, const spattn_exec *ex);
#ifdef SPATTN_HAVE_CUDA
spattn_status spattn_cuda_merge(const spattn_merge_problem *p, const spattn_exec *ex);
#endif

#ifdef __cplusplus
}
#endif
#endif
