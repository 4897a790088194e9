/*
 * fp64 dot product shared by the references: four partial sums let the compiler overlap (and
 * vectorize) the multiply-adds without reassociation licence; still an fp64 sum, far more
 * precise than anything under test.  An includer may define REF_DOT_ATTR first (e.g. to add
 * function multiversioning); the default is plain `static`.
 */
#ifndef SPATTN_REF_DOT_H
#define SPATTN_REF_DOT_H

#include <stdint.h>

#ifndef REF_DOT_ATTR
#define REF_DOT_ATTR static
#endif

REF_DOT_ATTR double dot(const double *a, const double *b, int64_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t d = 0;
    for (; d + 4 <= n; d += 4) {
        s0 += a[d] * b[d];
        s1 += a[d + 1] * b[d + 1];
        s2 += a[d + 2] * b[d + 2];
        s3 += a[d + 3] * b[d + 3];
    }
    for (; d < n; d++) s0 += a[d] * b[d];
    return (s0 + s1) + (s2 + s3);
}

#endif
