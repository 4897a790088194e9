// The simple sfa kernels (sfa_ref.cu) as the API's path for shapes without a Hopper kernel
// (sfa_host.cu).  Their golden use goes through src/core/internal.h.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "../core/internal.h"

// Deterministic dK/dV: int64 fixed-point accumulators (value * *scale rounded) of dk, dk_rope,
// dv (in that order; [krows, N2, D] / [.., Dr] / [.., D], zeroed by the caller) with a flag byte
// per element for non-finite values (fixed_point.cuh).
struct sfa_ref_fix {
    unsigned long long *acc[3];
    uint32_t *flags[3];
    const float *scale;
};

// The backward of the simple kernels: dq [B S1 N1, D], dq_rope [.., Dr] (fp32, contiguous);
// dk / dk_rope / dv [krows, N2, ..] fp32 (fp32 atomics; unused, and not written, with fix).
// tok != NULL: the varlen form over the views of sfa_host.cu (B = 1, S1 = Tq; krows = the key
// side's rows: packed Tkv, or num_pages * page_size with the table of p->seqs).
extern "C" spattn_status spattn_cuda_ref_sfa_bwd_into(const spattn_sfa_problem *p, const spattn_exec *ex,
                                                     const int4 *tok, int64_t krows, const sfa_ref_fix *fix,
                                                     float *dq, float *dq_rope, float *dk, float *dk_rope, float *dv);
