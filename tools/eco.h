/*
 * The "eco" acceptance criterion of cases/README.md: per element
 * |actual - golden| <= atol + rtol * |golden|; a tensor passes iff matched_ratio >= 0.99 and
 * max |actual - golden| <= limit.  NaN matches only NaN, Inf only Inf of the same sign.
 */
#ifndef SPATTN_CLI_ECO_H
#define SPATTN_CLI_ECO_H

#include <stdint.h>

typedef struct sp_tol {
    double atol, rtol, limit;
} sp_tol;

typedef struct sp_eco {
    int64_t total, matched;
    double matched_ratio;  /* matched / total (1 for an empty tensor) */
    double max_abs;        /* max |a - g| over the elements; +inf when a NaN/Inf does not match */
    double rel_l2;         /* ||a - g|| / ||g|| over the elements where both are finite */
    int64_t nonfinite_mismatch; /* elements failing the NaN / Inf rule */
    int64_t worst;         /* index of the element with the largest error (-1 when none) */
    int pass;
} sp_eco;

/* Tolerances of a tensor of this dtype (fp16, bf16; fp32 is the LSE row). */
sp_tol sp_tol_for(int32_t dtype);
/* 1 when one element passes. */
int sp_eco_element_ok(double actual, double golden, sp_tol tol);
/* Compares n elements. */
void sp_eco_compare(const float *actual, const double *golden, int64_t n, sp_tol tol, sp_eco *r);

#endif
