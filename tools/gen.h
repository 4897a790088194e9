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
    /* Varlen cases (gen_varlen.c): q, dout, idx are packed over Tq tokens and k, v over Tkv
     * ([T, heads, width] instead of a batch dimension); cu_q / cu_kv [B+1]; with pages,
     * kpage / vpage [num_pages, page, heads, width] hold k / v scattered through table
     * [B, max_pages] (rows no sequence uses are NaN: they must not reach any sum). */
    int32_t *cu_q, *cu_kv, *table;
    int64_t Tq, Tkv, num_pages, max_pages;
    void *kpage, *vpage;
    int64_t nkpage, nvpage;
} sp_inputs;

/* Generates every input of the case (varlen cases: sp_inputs_make_varlen).  Returns 0, or -1
 * with a message (out of memory). */
int sp_inputs_make(const sp_case *c, sp_inputs *in, char *err, size_t errlen);
void sp_inputs_free(sp_inputs *in);

/* The generators on their own (for tests). mask: [B,N,nbx,nby]; idx: [B,S1,N2,K]. */
void sp_gen_mask(const sp_case *c, uint8_t *mask);
int sp_gen_indices(const sp_case *c, int32_t *idx); /* -1 on out of memory */
/* n standard normal values rounded to dtype, stored as dtype. */
void sp_gen_normal(uint64_t seed, int stream, int32_t dtype, void *dst, int64_t n);

/* ---- varlen cases (gen_varlen.c; cases/README.md "Varlen and paged cases") ---- */
int sp_inputs_make_varlen(const sp_case *c, sp_inputs *in, char *err, size_t errlen);
/* mask [B, N, ceil(Sq/bx), ceil(Skv/by)] (Sq, Skv = max_seqlen) / idx [Tq, N2, K]. */
void sp_gen_mask_varlen(const sp_case *c, uint8_t *mask);
int sp_gen_indices_varlen(const sp_case *c, int32_t *idx);
/* block_table [B, max_pages] (-1 in unused slots); returns num_pages (0 on out of memory). */
int64_t sp_gen_pages(const sp_case *c, int32_t *table, int64_t max_pages);
/* Pages a sequence table needs: max over b of ceil(Skv_b / page), at least 1. */
int64_t sp_max_pages(const sp_case *c);
/* Token counts Tq = cu_q[B], Tkv = cu_kv[B], and the rows of the key side: Tkv, or with pages
 * num_pages * page (num_pages = sum_b ceil(Skv_b / page) + 1 spare page no sequence uses). */
void sp_varlen_rows(const sp_case *c, int64_t *Tq, int64_t *Tkv, int64_t *kv_rows);
double sp_pairs_varlen(const sp_case *c, const sp_inputs *in); /* sfa cases */
/* Tokens of block `blk` (size bs) of a side of L tokens: 0 past the end. */
int64_t sp_block_len(int64_t blk, int64_t bs, int64_t L);
double sp_pairs_estimate_varlen(const sp_case *c); /* sfa cases */

/* Attended pairs, counted exactly from the generated mask / indices. */
double sp_pairs(const sp_case *c, const sp_inputs *in);
/* Estimated pairs from the shape alone (progress estimates; no inputs needed). */
double sp_pairs_estimate(const sp_case *c);
/* FLOPs of one pass (backward = 0: forward) for `pairs` attended pairs. */
double sp_flops(const sp_case *c, double pairs, int backward);

/* Element counts of the outputs: o, lse, dq (sfa: [..,D+Dr]), dk (sfa: [..,D+Dr]), dv.
 * Varlen: over Tq query tokens and the key side's rows (sp_varlen_rows). */
void sp_output_sizes(const sp_case *c, int64_t *no, int64_t *nlse, int64_t *ndq, int64_t *ndk,
                     int64_t *ndv);

/* fp32 value of element i of a dtype buffer. */
float sp_load(const void *buf, int32_t dtype, int64_t i);

#endif
