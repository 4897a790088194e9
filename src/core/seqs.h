/*
 * Packed variable-length batches and paged keys (the _varlen entry points): the validated
 * sequence layout shared by the core and the backends, and per-sequence views.
 *
 * A varlen problem keeps its tensors packed ([T, N, D]; k/v may be pages) and points to one
 * spattn_seqs.  A backend either indexes through it (spattn_seq_*) or runs each sequence's
 * work item on spattn_*_seq_at: sequence b as a dense problem over strided views whose batch
 * stride is 0, so kernels keep indexing with the real b (the mask, the block table and
 * seqs keep theirs) and sequence-local positions.
 */
#ifndef SPATTN_SEQS_H
#define SPATTN_SEQS_H

#include "internal.h"

typedef struct spattn_seqs {
    int64_t B;                  /* sequences */
    const int32_t *cu_q, *cu_kv; /* prefix sums [B+1] (host memory once the values are read) */
    int64_t cu_q_st, cu_kv_st;  /* their strides */
    int64_t Tq;                 /* rows of the packed query side */
    int64_t Tkv;                /* rows of the key side: packed tokens, or num_pages * page_size */
    int64_t max_q, max_kv;
    const int32_t *table;       /* block_table [B, max_pages]; NULL: no pages */
    int64_t tab_s0, tab_s1, max_pages, page_size, num_pages;
} spattn_seqs;

static inline int64_t spattn_seq_q0(const spattn_seqs *s, int64_t b) {
    return s->cu_q[b * s->cu_q_st];
}
static inline int64_t spattn_seq_len_q(const spattn_seqs *s, int64_t b) {
    return (int64_t)s->cu_q[(b + 1) * s->cu_q_st] - s->cu_q[b * s->cu_q_st];
}
static inline int64_t spattn_seq_kv0(const spattn_seqs *s, int64_t b) {
    return s->cu_kv[b * s->cu_kv_st];
}
static inline int64_t spattn_seq_len_kv(const spattn_seqs *s, int64_t b) {
    return (int64_t)s->cu_kv[(b + 1) * s->cu_kv_st] - s->cu_kv[b * s->cu_kv_st];
}
/* Row of key j of sequence b on the key side: row j % page_size of its page with pages
 * (row index into [num_pages * page_size]), else the packed row. */
static inline int64_t spattn_seq_kv_row(const spattn_seqs *s, int64_t b, int64_t j) {
    if (!s->table) return spattn_seq_kv0(s, b) + j;
    int64_t pg = s->table[b * s->tab_s0 + (j / s->page_size) * s->tab_s1];
    return pg * s->page_size + j % s->page_size;
}
/* Element offset of [page of key j of sequence b, its row in the page, head h, 0] in a paged
 * tensor [num_pages, page_size, H, D]. */
static inline int64_t spattn_seq_page_off(const spattn_seqs *s, const spattn_tensor *t,
                                          int64_t b, int64_t j, int64_t h) {
    int64_t pg = s->table[b * s->tab_s0 + (j / s->page_size) * s->tab_s1];
    return pg * t->strides[0] + (j % s->page_size) * t->strides[1] + h * t->strides[2];
}
/* Sequence containing packed query row t (< cu_q[B]); binary search. */
int64_t spattn_seq_of_q(const spattn_seqs *s, int64_t t);

/* Shape stage: the descriptor, and the shapes, dtypes and devices of cu_seqlens_q / kv and
 * block_table against q (Tq = rows of q).  k_paged: k comes as pages [num_pages, page_size,
 * N2, D] (num_pages, page_size given).  Reads no values. */
spattn_status spattn_seqs_check_shapes(const spattn_varlen *vl, const spattn_tensor *q,
                                       int64_t Tq, int64_t Tkv, int k_paged, int64_t num_pages,
                                       int64_t page_size, spattn_seqs *s);
/* Value stage (CPU tensors): prefix sums (start 0, non-decreasing, lengths <= max, end <= T)
 * and the block table (capacity, page ids in range, no page twice in a row). */
spattn_status spattn_seqs_check_values(const spattn_seqs *s);
/* Refuses CUDA tensors: the CUDA kernels do not take the varlen forms yet. */
spattn_status spattn_seqs_not_on_cuda(const char *op);

/* Tokens [t0, t0+len) of a packed [T, H, D] tensor as a 4-d view with batch stride 0:
 * [1, H, len, D] (bnsd = 1) or [1, len, H, D] (bnsd = 0). */
spattn_tensor spattn_packed_view4(const spattn_tensor *t, int64_t t0, int64_t len, int bnsd);

/* Block size (bx or by) of a sequence of S tokens: a block longer than a non-empty sequence
 * is the whole sequence, as the dense call on that sequence clamps it (bsa_api.c), so that
 * the sequence gets the dense call's tiles (not those of max_seqlen's clamp). */
static inline int64_t spattn_seq_blk(int64_t blk, int64_t S) { return S > 0 && S < blk ? S : blk; }

/* Sequence b of a varlen problem as a dense one-batch problem (see the top of this file),
 * bx / by clamped to its lengths (spattn_seq_blk).  Paged k / v stay the paged tensors:
 * index them with spattn_seq_kv_row. */
typedef struct spattn_bsa_seq {
    spattn_bsa_problem p;
    spattn_tensor t[9];
} spattn_bsa_seq;
void spattn_bsa_seq_at(const spattn_bsa_problem *p, int64_t b, spattn_bsa_seq *out);

typedef struct spattn_sfa_seq {
    spattn_sfa_problem p;
    spattn_tensor t[14];
} spattn_sfa_seq;
void spattn_sfa_seq_at(const spattn_sfa_problem *p, int64_t b, spattn_sfa_seq *out);

#endif
