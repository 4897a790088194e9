/*
 * Tensor descriptors of a case over a set of buffers (host or device) and the public API
 * calls on them: the one place that knows how a case maps onto spattn_*_fwd/bwd, shared by the
 * CPU and CUDA paths of verify and bench.
 */
#ifndef SPATTN_CLI_CALL_H
#define SPATTN_CLI_CALL_H

#include <stddef.h>

#include "cases.h"
#include "spattn.h"

/* The buffers of one case.  sfa dq and dk are concatenated [.., D+Dr] buffers, so that dq and
 * dq_rope (dk and dk_rope) are two strided views of one allocation, like q and k. */
enum { SP_B_Q, SP_B_K, SP_B_V, SP_B_DOUT, SP_B_MASK, SP_B_IDX, SP_B_O, SP_B_LSE, SP_B_DQ,
       SP_B_DK, SP_B_DV, SP_B_COUNT };

/* Bytes of each buffer (0 when the case has none, e.g. v with shared key/value). */
void sp_buffer_sizes(const sp_case *c, size_t bytes[SP_B_COUNT]);

typedef struct sp_tensors {
    spattn_tensor q, qr, k, kr, v, dout, mask, idx, o, lse, dq, dqr, dk, dkr, dv;
    int has_rope, has_v;
    spattn_bsa_plan *plan; /* bsa: when set, the calls go through the plan (sp_plan_make) */
} sp_tensors;

/* A row-major view of `ndim` dims with innermost rows of `width` elements (width >= the last
 * dim; device_id 0). */
spattn_tensor sp_view(void *data, int32_t dtype, int32_t dev, int ndim, const int64_t *shape,
                      int64_t width);
void sp_tensors_make(const sp_case *c, void *const buf[SP_B_COUNT], int32_t device_type,
                     sp_tensors *t);
/* bsa: makes t->plan from the case's mask (nothing for sfa); sp_plan_free releases it. */
spattn_status sp_plan_make(const sp_case *c, sp_tensors *t, const spattn_options *opt);
void sp_plan_free(sp_tensors *t);
spattn_status sp_call_fwd(const sp_case *c, const sp_tensors *t, const spattn_options *opt);
spattn_status sp_call_bwd(const sp_case *c, const sp_tensors *t, const spattn_options *opt);
/* The softmax scale the operator uses by default (1/sqrt(D) or 1/sqrt(D+Dr)). */
double sp_softmax_scale(const sp_case *c);

#endif
