/*
 * Running one case for `verify`: the implementation under test through the public API, the
 * golden from independent code (fp64 reference on the CPU, the simple CUDA reference kernels
 * on the GPU), both reduced to named fp32 / fp64 host arrays that the eco criterion compares.
 */
#ifndef SPATTN_CLI_RUN_H
#define SPATTN_CLI_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "cases.h"
#include "eco.h"
#include "gen.h"

enum { SP_PASS_FWD = 1, SP_PASS_BWD = 2 };

/* One output tensor of a case: implementation values (fp32) beside the golden (fp64). */
typedef struct sp_named {
    char name[16];   /* "o", "lse", "dq", "dq_rope", "dk", "dk_rope", "dv" */
    int pass;        /* SP_PASS_FWD or SP_PASS_BWD */
    int32_t dtype;   /* decides the tolerance (lse: fp32) */
    int64_t n, rows, cols; /* n = rows * cols */
    float *actual;
    double *golden;
    sp_eco eco;
} sp_named;

typedef struct sp_verify_out {
    sp_named t[8];
    int nt;
    double fwd_ms, bwd_ms, ref_ms; /* implementation forward / backward, golden (both) */
    int status;                    /* SPATTN_STATUS_SUCCESS or the failing call's status */
    char msg[1024];                /* why, when status != 0 */
} sp_verify_out;

/* passes: SP_PASS_FWD | SP_PASS_BWD (the backward always runs our forward first).
 * deterministic: spattn_options.deterministic of the backward call (0 or 1; the forward keeps
 * the default).
 * Returns 0 when the comparison ran (out->t filled), -1 when a call failed (out->status,
 * out->msg).  Call sp_verify_out_free afterwards either way. */
int sp_verify_cpu(const sp_case *c, const sp_inputs *in, int passes, int threads,
                  int deterministic, sp_verify_out *out);
int sp_verify_cuda(const sp_case *c, const sp_inputs *in, int passes, int deterministic,
                   sp_verify_out *out);
void sp_verify_out_free(sp_verify_out *out);

/* Benchmark one pass (SP_PASS_FWD or SP_PASS_BWD) of a case: `warmup` untimed calls, then
 * `repeats` timed ones into ms[].  The backward gets O and LSE from one forward first.
 * Returns 0, or -1 with status/msg filled. */
/* reuse_plan (bsa): one spattn_bsa_plan made before the calls and used by all of them; after
 * the timed calls the pass runs once more through the plain entry point and *plan_same says
 * whether the outputs matched bit for bit (1) or not (0); -1 when no plan was used. */
/* cpu_ms (may be NULL): the process CPU time of each timed call (all threads together). */
/* deterministic: spattn_options.deterministic of the calls made for SP_PASS_BWD (the timed
 * backward calls, the plain call of the plan check and the plan's workspace query); the
 * forward calls (SP_PASS_FWD, and the one that makes O and LSE) keep the default. */
int sp_bench_cpu(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                 int threads, int reuse_plan, int deterministic, double *ms, double *cpu_ms,
                 int *plan_same, int *status, char *msg, size_t msglen);
int sp_bench_cuda(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                  int reuse_plan, int deterministic, double *ms, int *plan_same, int *status,
                  char *msg, size_t msglen);
/* Name of the GPU (CUDA builds with a device) into buf; 0 on success. */
int sp_cuda_device_name(char *buf, size_t n);

/* ---- helpers shared by the CPU and CUDA paths (run_common.c) ---- */
/* Adds a named tensor whose actual values are columns [col0, col0+cols) of `rows` rows of
 * `width` elements of a dtype buffer.  golden is filled later.  Returns the entry or NULL. */
sp_named *sp_named_add(sp_verify_out *out, const char *name, int pass, int32_t dtype,
                       const void *buf, int64_t rows, int64_t width, int64_t col0, int64_t cols);
/* Golden values from a fp64 / fp32 buffer laid out like the actual one.  Returns -1 on OOM. */
int sp_named_golden_d(sp_named *t, const double *src, int64_t width, int64_t col0);
/* The golden of every named tensor in out from the fp64 reference (verify_cpu.c), dense or
 * varlen / paged (c->varlen) on the same rounded inputs.  -1 (out->status set) on OOM. */
int sp_verify_golden(const sp_case *c, const sp_inputs *in, int passes, sp_verify_out *out);
int sp_named_golden_f(sp_named *t, const float *src, int64_t width, int64_t col0);
/* Adds the named tensors of `passes` from the implementation's host output buffers (indexed
 * by SP_B_*: o, lse, dq, dk, dv).  Returns -1 (status set) on out of memory. */
int sp_add_outputs(const sp_case *c, void *const buf[], int passes, sp_verify_out *out);
/* Applies the eco criterion to every named tensor. */
void sp_verify_compare(sp_verify_out *out);
/* Sets status and "what: STATUS_NAME: last error" as the message; returns -1. */
int sp_fail_status(sp_verify_out *out, int status, const char *what);
double sp_now_ms(void);

#endif
