/*
 * The sfa shapes a backend runs on its DeepSeek (MLA: D 512 + Dr 64, v = k's first 512 columns)
 * kernels by packing the caller's columns into MLA's (src/cuda/sfa_pad.cu does the copies).
 * Pure C, so the CPU tests can check the column map itself (tests/test_sfa_pack.c: the packed
 * problem through the CPU backend against the original).
 *
 * The column map (c: one of the 576 score columns; the first 512 are also the value columns):
 *   shared v:   q' = [q | q_rope | 0],      k' = [k | k_rope | 0],      dO' = [dO | 0], O' = [O | 0]
 *   separate v: q' = [0 | q | q_rope | 0],  k' = [v | k | k_rope | 0],  dO' = [dO | 0], O' = [O | 0]
 * and the outputs: dQ' = [(dS v: dropped) | dq | dq_rope | ..], dK' = [dv | dk | dk_rope | ..]
 * (shared: [dk | dk_rope | ..], dV folded into dk as in MLA).  Exact: S = q' k'^T = q k^T +
 * q_rope k_rope^T; O = P k'[:, :512] holds P v in its first D columns; dK' = dS^T q' + P^T dO'
 * holds P^T dO (= dV) where q' is zero and dS^T q (+ P^T dO when shared) where dO' is zero or
 * folded; dQ' = dS k'; Delta = rowsum(dO' O') gains nothing from zero columns.
 */
#ifndef SPATTN_SFA_PACK_H
#define SPATTN_SFA_PACK_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPATTN_PACK_D 512   /* MLA's value / nope width */
#define SPATTN_PACK_DR 64   /* its rope width */
#define SPATTN_PACK_ZERO_BYTES 2048 /* the zero row (512 elements of up to 4 bytes: either part) */

/* A caller tensor's columns [col0, col0 + w) of a packed row (t NULL: absent, e.g. the outputs
 * in a size query) */
typedef struct {
    const spattn_tensor *t;
    int32_t col0, w;
} spattn_sfa_pack_seg;

enum { SPATTN_PACK_INPLACE, SPATTN_PACK_ZERO, SPATTN_PACK_BUF };
/* The groups: q', k', O', dO', dQ', dK' */
enum { SPATTN_PACK_GQ, SPATTN_PACK_GK, SPATTN_PACK_GO, SPATTN_PACK_GDO, SPATTN_PACK_GDQ, SPATTN_PACK_GDK,
       SPATTN_PACK_NG };

/* One operand of the packed call: up to three caller tensors in a row of MLA's parts (value
 * [0, 512), rope [512, 576)); each part is used in place (one caller tensor fills it exactly, rows
 * of unit last stride and 16-byte aligned), read as the zero row with stride 0 (an input part no
 * caller column falls in), or buffered: columns [b0, b1) of every row in a dense workspace buffer
 * at `off` (both parts in one 576-wide row when both are buffered). */
typedef struct {
    spattn_sfa_pack_seg seg[3];
    int32_t nseg, nparts; /* nparts 1: the value part only (O', dO') */
    int32_t out;          /* written by the kernels: copied back */
    int32_t used;         /* in this call (the forward: q', k', O') */
    int32_t subst;        /* handed to the MLA problem (a size query keeps its absent tensors NULL) */
    const spattn_tensor *like; /* the rows' leading shape (q's or k's: dense [B, S, N], packed
                                  [T, N] or paged [pages, page_size, N]) */
    int64_t rows;         /* the product of those dimensions */
    int32_t state[2];
    int32_t b0, b1;       /* buffered columns (b0 == b1: no buffer) */
    size_t off;
    spattn_tensor t[2];   /* the parts' tensors handed to the MLA problem */
} spattn_sfa_pack_group;

typedef struct {
    spattn_sfa_problem pp; /* the MLA problem: its tensors point into g[].t (do not copy the struct) */
    spattn_sfa_pack_group g[SPATTN_PACK_NG];
    size_t zero_off, bytes; /* the zero row; the workspace this part needs */
} spattn_sfa_pack;

/* 1 when the shape's columns fit MLA's: fp16 / bf16 (any_dtype: fp32 too, the CPU tests), D
 * and Dr multiples of 8, shared v with D <= 512 and D + Dr <= 576, or a separate v with
 * 2 D + Dr <= 576; dense or _varlen calls (packed or paged: the views keep the caller's leading
 * dimensions, so pages stay pages) */
int spattn_sfa_pack_fits(const spattn_sfa_problem *p, int any_dtype);
/* The packed problem, the parts' states and the workspace layout.  A call has its outputs
 * (forward: o; backward: dq); a size query has none of o, dout, dq, dk, dv and sizes a buffer for
 * each of them (the largest need). */
void spattn_sfa_pack_plan(const spattn_sfa_problem *p, int backward, spattn_sfa_pack *d);
/* Rows of unit last stride, 16-byte aligned (a kernel reads them in place, 16 bytes at a time) */
int spattn_sfa_pack_readable(const spattn_tensor *t);
/* Points the buffered and zero parts' tensors into the workspace at base */
void spattn_sfa_pack_bind(spattn_sfa_pack *d, unsigned char *base);
/* 1 when segment s of group x is a caller tensor the kernels do not read / write in place */
int spattn_sfa_pack_copied(const spattn_sfa_pack_group *x, int s);
/* 1 when some output must be copied back after the call */
int spattn_sfa_pack_needs_copy_back(const spattn_sfa_pack *d);

#ifdef __cplusplus
}
#endif
#endif
