/*
 * fp64 reference of block-sparse attention, straight from the formulas of cases/README.md.
 * Rows (and, for dK/dV, keys) are independent, so OpenMP splits them without any reduction
 * across threads: the result does not depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>

#include "ref.h"

#include "ref_dot.h"

static inline int attended(const spattn_ref_bsa_shape *s, const uint8_t *mask, int64_t b,
                           int64_t n, int64_t i, int64_t j) {
    /* ceil without overflow for block sizes near INT64_MAX */
    int64_t nbx = s->Sq / s->bx + (s->Sq % s->bx != 0), nby = s->Skv / s->by + (s->Skv % s->by != 0);
    return mask[((b * s->N + n) * nbx + i / s->bx) * nby + j / s->by] != 0;
}

/* Scores of row (b, n, i) into sc[0..Skv) (-inf where not attended); returns the row's LSE
 * and leaves P = exp(sc - lse) in sc.  Non-finite values follow IEEE arithmetic on the dense
 * formula over the attended keys: a NaN or +inf score makes LSE and every attended P NaN; a
 * row with no attended key, or only -inf scores, gets LSE = -inf and P = 0. */
static double row_probs(const spattn_ref_bsa_shape *s, const double *q, const double *k,
                        const uint8_t *mask, double scale, int64_t b, int64_t n, int64_t i,
                        double *sc) {
    int64_t D = s->D, h = n / (s->N / s->Nkv);
    const double *qi = q + ((b * s->N + n) * s->Sq + i) * D;
    const double *kb = k + (b * s->Nkv + h) * s->Skv * D;
    double m = -INFINITY;
    int nan = 0;
    for (int64_t j = 0; j < s->Skv; j++) {
        sc[j] = attended(s, mask, b, n, i, j) ? scale * dot(qi, kb + j * D, D) : -INFINITY;
        if (isnan(sc[j])) nan = 1;
        if (sc[j] > m) m = sc[j];
    }
    if (m == -INFINITY && !nan) {
        for (int64_t j = 0; j < s->Skv; j++) sc[j] = 0.0;
        return -INFINITY;
    }
    double l = 0.0;
    for (int64_t j = 0; j < s->Skv; j++) l += sc[j] == -INFINITY ? 0.0 : exp(sc[j] - m);
    double lse = m + log(l);
    for (int64_t j = 0; j < s->Skv; j++) sc[j] = sc[j] == -INFINITY ? 0.0 : exp(sc[j] - lse);
    return lse;
}

/* o_i = sum_j P_ij v_j over the attended keys (an underflowed P = 0 still meets v_j: 0 * NaN
 * is NaN in the dense formula too); nothing for a row that attends nothing. */
static void row_out(const spattn_ref_bsa_shape *s, const uint8_t *mask, const double *v,
                    int64_t b, int64_t n, int64_t i, double lse, const double *p, double *oi) {
    int64_t D = s->D, h = n / (s->N / s->Nkv);
    const double *vb = v + (b * s->Nkv + h) * s->Skv * D;
    for (int64_t d = 0; d < D; d++) oi[d] = 0.0;
    if (lse == -INFINITY) return;
    for (int64_t j = 0; j < s->Skv; j++) {
        if (p[j] == 0.0 && !attended(s, mask, b, n, i, j)) continue; /* mask test only at P = 0 */
        for (int64_t d = 0; d < D; d++) oi[d] += p[j] * vb[j * D + d];
    }
}

void spattn_ref_bsa_fwd(const spattn_ref_bsa_shape *s, const double *q, const double *k,
                        const double *v, const uint8_t *mask, double scale, double *o,
                        double *lse) {
    int64_t rows = s->B * s->N * s->Sq;
#pragma omp parallel
    {
        double *sc = malloc((size_t)s->Skv * sizeof *sc);
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = r % s->Sq, n = (r / s->Sq) % s->N, b = r / (s->Sq * s->N);
            double l = row_probs(s, q, k, mask, scale, b, n, i, sc);
            if (lse) lse[r] = l;
            row_out(s, mask, v, b, n, i, l, sc, o + r * s->D);
        }
        free(sc);
    }
}

void spattn_ref_bsa_bwd(const spattn_ref_bsa_shape *s, const double *q, const double *k,
                        const double *v, const uint8_t *mask, double scale, const double *dout,
                        double *dq, double *dk, double *dv) {
    int64_t D = s->D, rows = s->B * s->N * s->Sq, G = s->N / s->Nkv;
    double *lse = malloc((size_t)rows * sizeof *lse);
    double *delta = malloc((size_t)rows * sizeof *delta);
    /* Pass 1, per query row: LSE, Delta = dO . O (O recomputed), dQ = scale * sum_j dS_ij k_j. */
#pragma omp parallel
    {
        double *sc = malloc((size_t)s->Skv * sizeof *sc);
        double *oi = malloc((size_t)D * sizeof *oi);
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = r % s->Sq, n = (r / s->Sq) % s->N, b = r / (s->Sq * s->N), h = n / G;
            lse[r] = row_probs(s, q, k, mask, scale, b, n, i, sc);
            row_out(s, mask, v, b, n, i, lse[r], sc, oi);
            const double *doi = dout + r * D;
            delta[r] = dot(doi, oi, D);
            const double *kb = k + (b * s->Nkv + h) * s->Skv * D;
            const double *vb = v + (b * s->Nkv + h) * s->Skv * D;
            double *dqi = dq + r * D;
            for (int64_t d = 0; d < D; d++) dqi[d] = 0.0;
            for (int64_t j = 0; j < s->Skv; j++) {
                if (lse[r] == -INFINITY || (sc[j] == 0.0 && !attended(s, mask, b, n, i, j))) continue;
                double ds = sc[j] * (dot(doi, vb + j * D, D) - delta[r]);
                for (int64_t d = 0; d < D; d++) dqi[d] += scale * ds * kb[j * D + d];
            }
        }
        free(sc);
        free(oi);
    }
    /* Pass 2, per key: dV_j = sum P_ij dO_i, dK_j = scale * sum dS_ij q_i over the group's
     * query heads and all rows. */
    int64_t keys = s->B * s->Nkv * s->Skv;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t c = 0; c < keys; c++) {
        int64_t j = c % s->Skv, h = (c / s->Skv) % s->Nkv, b = c / (s->Skv * s->Nkv);
        const double *kj = k + c * D, *vj = v + c * D;
        double *dkj = dk + c * D, *dvj = dv + c * D;
        for (int64_t d = 0; d < D; d++) dkj[d] = dvj[d] = 0.0;
        for (int64_t n = h * G; n < (h + 1) * G; n++) {
            for (int64_t i = 0; i < s->Sq; i++) {
                int64_t r = (b * s->N + n) * s->Sq + i;
                if (lse[r] == -INFINITY || !attended(s, mask, b, n, i, j)) continue;
                const double *qi = q + r * D, *doi = dout + r * D;
                double p = exp(scale * dot(qi, kj, D) - lse[r]);
                double ds = p * (dot(doi, vj, D) - delta[r]);
                for (int64_t d = 0; d < D; d++) {
                    dvj[d] += p * doi[d];
                    dkj[d] += scale * ds * qi[d];
                }
            }
        }
    }
    free(lse);
    free(delta);
}
