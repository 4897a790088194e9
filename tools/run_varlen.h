/*
 * verify and bench of varlen / paged cases (c->varlen): the spattn_*_varlen entry points on
 * packed (and paged) tensors, on the CPU or on CUDA device copies; the golden is always the
 * fp64 reference of src/ref/ref_varlen.h on the host (the CUDA reference kernels have no
 * varlen form).  A backend that refuses the call (SPATTN_STATUS_NOT_SUPPORTED: CUDA today)
 * makes the case fail with that status and the library's message.
 */
#ifndef SPATTN_CLI_RUN_VARLEN_H
#define SPATTN_CLI_RUN_VARLEN_H

#include "call.h"
#include "run.h"

/* Descriptors of a varlen case over buffers indexed by SP_B_* (SP_B_K / SP_B_V: the key side
 * as the case passes it, packed rows or pages) plus the prefix sums and the block table. */
typedef struct sp_vl_tensors {
    sp_tensors t;
    spattn_tensor cu_q, cu_kv, table;
    int paged;
} sp_vl_tensors;

void sp_vl_tensors_make(const sp_case *c, const sp_inputs *in, void *const buf[SP_B_COUNT],
                        void *cu_q, void *cu_kv, void *table, int32_t device_type,
                        sp_vl_tensors *t);
spattn_status sp_vl_call_fwd(const sp_case *c, const sp_vl_tensors *t, const spattn_options *opt);
spattn_status sp_vl_call_bwd(const sp_case *c, const sp_vl_tensors *t, const spattn_options *opt);

/* verify (backend SPATTN_BACKEND_CPU or _CUDA): as sp_verify_cpu (every varlen case, paged
 * bsa included, has both passes; deterministic applies to the backward call). */
int sp_verify_varlen(const sp_case *c, const sp_inputs *in, int passes, int backend, int threads,
                     int deterministic, sp_verify_out *out);
/* bench: as sp_bench_cpu (no plans: varlen calls take the mask directly). */
int sp_bench_varlen(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                    int backend, int threads, int deterministic, double *ms, int *status,
                    char *msg, size_t msglen);

#endif
