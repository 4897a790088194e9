/*
 * Input generation for a case, exactly as cases/README.md "Generating a case's inputs" says,
 * and the work count of cases/README.md "Counting work".
 */
#ifndef SPATTN_CLI_GEN_H
#define SPATTN_CLI_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "cases.h"

/* Host copies of a case's inputs.  Float tensors hold the case's dtype (fp16/bf16 bits or
 * fp32).  bsa: q [B,N,Sq,D], k, v [B,Nkv,Skv,D], dout [B,N,Sq,D], mask [B,N,nbx,nby].
 * sfa: q [B,S1,N1,D+Dr] (nope and rope concatenated), k [B,S2,N2,D+Dr], v [B,S2,N2,D] or NULL
 * (shared key/value), dout [B,S1,N1,D], idx [B,S1,N2,K]. */
typedef struct sp_inputs {
    int32_t dtype;
    size_t esize;
    void *q, *k, *v, *dout;
    int64_t nq, nk, nv, ndout; /* element counts */
    uint8_t *mask;
    int64_t nmask, nbx, nby;
    int32_t *idx;
    int64_t nidx;
} sp_inputs;

/* Generates every input of the case.  Returns 0, or -1 with a message (out of memory). */
int sp_inputs_make(const sp_case *c, sp_inputs *in, char *err, size_t errlen);
void sp_inputs_free(sp_inputs *in);

/* The generators on their own (for tests). mask: [B,N,nbx,nby]; idx: [B,S1,N2,K]. */
void sp_gen_mask(const sp_case *c, uint8_t *mask);
int sp_gen_indices(const sp_case *c, int32_t *idx); /* -1 on out of memory */
/* n standard normal values rounded to dtype, stored as dtype. */
void sp_gen_normal(uint64_t seed, int stream, int32_t dtype, void *dst, int64_t n);

/* Attended pairs, counted exactly from the generated mask / indices. */
double sp_pairs(const sp_case *c, const sp_inputs *in);
/* Estimated pairs from the shape alone (progress estimates; no inputs needed). */
double sp_pairs_estimate(const sp_case *c);
/* FLOPs of one pass (backward = 0: forward) for `pairs` attended pairs. */
double sp_flops(const sp_case *c, double pairs, int backward);

/* Element counts of the outputs: o, lse, dq (sfa: [..,D+Dr]), dk (sfa: [..,D+Dr]), dv. */
void sp_output_sizes(const sp_case *c, int64_t *no, int64_t *nlse, int64_t *ndq, int64_t *ndk,
                     int64_t *ndv);

/* fp32 value of element i of a dtype buffer. */
float sp_load(const void *buf, int32_t dtype, int64_t i);

#endif
