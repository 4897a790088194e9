/*
 * fp64 references of the packed variable-length and paged forms (cases/README.md, "Packed
 * variable-length batches and paged keys").  Each sequence is gathered into a dense one-batch
 * problem and run through the dense reference (ref.h): the definition of the semantics.
 * Arrays are contiguous doubles; the key side is packed rows [Tkv, Nkv, *] or pages
 * [num_pages, page_size, Nkv, *] (= rows [num_pages * page_size, Nkv, *]).
 */
#ifndef SPATTN_REF_VARLEN_H
#define SPATTN_REF_VARLEN_H

#include <stdint.h>

#include "ref.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spattn_ref_seqs {
    int64_t B;
    const int32_t *cu_q, *cu_kv; /* [B+1] prefix sums */
    const int32_t *table;        /* block_table [B, max_pages] (contiguous), or NULL */
    int64_t max_pages, page_size;
    int64_t Tkv;                 /* rows of the key side (for zeroing the gradients) */
} spattn_ref_seqs;

/* Key-side row of key j of sequence b. */
int64_t spattn_ref_kv_row(const spattn_ref_seqs *s, int64_t b, int64_t j);

/* bsa, s->Sq / s->Skv = max_seqlen_q / kv (they size the mask [B, N, ceil(Sq/bx),
 * ceil(Skv/by)]); q [Tq, N, D] -> o [Tq, N, D], lse [Tq, N].  Rows past cu_q[B] untouched. */
void spattn_ref_bsa_varlen_fwd(const spattn_ref_bsa_shape *s, const spattn_ref_seqs *sq,
                               const double *q, const double *k, const double *v,
                               const uint8_t *mask, double scale, double *o, double *lse);
/* dq [Tq, N, D] (rows past cu_q[B] untouched), dk / dv [Tkv, Nkv, D] or pages (all rows
 * written: unused rows 0, shared pages sum their sequences' contributions). */
void spattn_ref_bsa_varlen_bwd(const spattn_ref_bsa_shape *s, const spattn_ref_seqs *sq,
                               const double *q, const double *k, const double *v,
                               const uint8_t *mask, double scale, const double *dout, double *dq,
                               double *dk, double *dv);

/* sfa, s->S1 / S2 unused (per sequence); q [Tq, N1, D+Dr], k [Tkv, N2, D+Dr], v [Tkv, N2, D]
 * (ignored when shared_kv), idx [Tq, N2, K] -> o [Tq, N1, D], lse [Tq, N1]. */
void spattn_ref_sfa_varlen_fwd(const spattn_ref_sfa_shape *s, const spattn_ref_seqs *sq,
                               const double *q, const double *k, const double *v,
                               const int32_t *idx, double scale, double *o, double *lse);
/* dq [Tq, N1, D+Dr], dk [Tkv, N2, D+Dr], dv [Tkv, N2, D] (NULL when shared_kv); every key-side
 * row written (shared pages sum their sequences' contributions). */
void spattn_ref_sfa_varlen_bwd(const spattn_ref_sfa_shape *s, const spattn_ref_seqs *sq,
                               const double *q, const double *k, const double *v,
                               const int32_t *idx, double scale, const double *dout, double *dq,
                               double *dk, double *dv);

#ifdef __cplusplus
}
#endif
#endif
