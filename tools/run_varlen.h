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

/* Buffers of a varlen case indexed by SP_B_* (host, or device copies), with the prefix sums
 * and the block table. */
typedef struct sp_vl_bufs {
    void *b[SP_B_COUNT];
    size_t bytes[SP_B_COUNT];
    void *cu_q, *cu_kv, *table;
    size_t cu_bytes, table_bytes;
    int owns_inputs; /* device copies: every buffer is ours to free */
} sp_vl_bufs;

/* Host buffers: inputs point into `in` (key side: the pages when c->page), outputs calloc'd
 * (sizes from sp_output_sizes).  Returns 0, or -1 when out of memory (free it either way). */
int sp_vl_host_bufs(const sp_case *c, const sp_inputs *in, sp_vl_bufs *h);
void sp_vl_host_bufs_free(sp_vl_bufs *h);
#ifdef SPATTN_HAVE_CUDA
/* Device copies of every host buffer (outputs zeroed); -1 with "CUDA: ..." in msg. */
int sp_vl_dev_bufs(const sp_vl_bufs *h, sp_vl_bufs *d, char *msg, size_t msglen);
void sp_vl_dev_bufs_free(sp_vl_bufs *d);
#endif

/* verify (backend SPATTN_BACKEND_CPU or _CUDA): as sp_verify_cpu (every varlen case, paged
 * bsa included, has both passes; deterministic applies to the backward call). */
int sp_verify_varlen(const sp_case *c, const sp_inputs *in, int passes, int backend, int threads,
                     int deterministic, sp_verify_out *out);
/* bench: as sp_bench_cpu (no plans: varlen calls take the mask directly). */
int sp_bench_varlen(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                    int backend, int threads, int deterministic, double *ms, int *status,
                    char *msg, size_t msglen);

/* bench --varlen-baselines (bench_varlen.c): the same work without varlen support, for one
 * pass of a varlen case.  loop: one dense call per sequence with queries and keys, on views
 * into the packed tensors; blockdiag: one dense call over all tokens (bsa: the mask blocks on
 * the diagonal, padded to whole blocks when sequences start off the block grid; sfa: indices
 * shifted to global keys).  Both are timed as sp_bench_varlen and their outputs compared with a
 * packed call's (eco criterion). */
typedef struct sp_vl_base {
    double loop_ms[3], diag_ms[3]; /* median, min, max; NaN when not run */
    int loop_calls;                /* dense calls per loop */
    int diag_run;                  /* 0: skipped (note says why) */
    int diag_padded;               /* 1: sequences padded to whole blocks (bsa) */
    double diag_pairs;             /* attended pairs of the block-diagonal call (padding included) */
    int same;                      /* 1: both within the criterion of the packed call's outputs */
    char mismatch[512];            /* which variant and tensor differ, when !same */
    char note[320];                /* skipped / padded / paged, else "" */
} sp_vl_base;

/* ms: scratch of `repeats` values.  Returns 0 when both variants ran (res->same tells whether
 * they matched), -1 when a call failed (status, msg) or memory ran out (msg). */
int sp_bench_varlen_base(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                         int backend, int threads, int deterministic, double *ms,
                         sp_vl_base *res, int *status, char *msg, size_t msglen);

#endif
