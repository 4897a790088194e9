/*
 * fp64 reference implementations, written straight from the formulas in cases/README.md.
 * Naive and obviously correct; for tests and `spattn verify` only (not part of libspattn).
 * All arrays are contiguous row-major doubles in the operator's layout.
 */
#ifndef SPATTN_REF_H
#define SPATTN_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spattn_ref_bsa_shape {
    int64_t B, N, Nkv, Sq, Skv, D, bx, by; /* N % Nkv == 0 */
} spattn_ref_bsa_shape;

/* q [B,N,Sq,D], k/v [B,Nkv,Skv,D], mask [B,N,ceil(Sq/bx),ceil(Skv/by)] -> o [B,N,Sq,D],
 * lse [B,N,Sq] (-inf for rows with no key; o = 0 there).  scale is used as given. */
void spattn_ref_bsa_fwd(const spattn_ref_bsa_shape *s, const double *q, const double *k,
                        const double *v, const uint8_t *mask, double scale, double *o,
                        double *lse);
/* Gradients for dL/dO = dout: dq [B,N,Sq,D], dk/dv [B,Nkv,Skv,D].  P and O are recomputed
 * in fp64 (the golden does not depend on the implementation's forward outputs). */
void spattn_ref_bsa_bwd(const spattn_ref_bsa_shape *s, const double *q, const double *k,
                        const double *v, const uint8_t *mask, double scale, const double *dout,
                        double *dq, double *dk, double *dv);

typedef struct spattn_ref_sfa_shape {
    int64_t B, S1, S2, N1, N2, D, Dr, K, sbs;
    int32_t mode;      /* 0 or 3 */
    int32_t shared_kv; /* 1: v is k[..., :D] and dv is added into dk[..., :D] */
} spattn_ref_sfa_shape;

/* q [B,S1,N1,D+Dr] (nope and rope concatenated), k [B,S2,N2,D+Dr], v [B,S2,N2,D] (ignored
 * when shared_kv), idx [B,S1,N2,K] int32 -> o [B,S1,N1,D], lse [B,S1,N1]. */
void spattn_ref_sfa_fwd(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                        const double *v, const int32_t *idx, double scale, double *o,
                        double *lse);
/* dq [B,S1,N1,D+Dr], dk [B,S2,N2,D+Dr], dv [B,S2,N2,D] (NULL when shared_kv). */
void spattn_ref_sfa_bwd(const spattn_ref_sfa_shape *s, const double *q, const double *k,
                        const double *v, const int32_t *idx, double scale, const double *dout,
                        double *dq, double *dk, double *dv);

#ifdef __cplusplus
}
#endif
#endif
