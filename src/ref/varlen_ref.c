/* fp64 references of the packed variable-length / paged forms: per sequence, gather into a
 * dense one-batch problem, run the dense reference, scatter back (see ref_varlen.h). */
#include <stdlib.h>
#include <string.h>

#include "ref_varlen.h"

int64_t spattn_ref_kv_row(const spattn_ref_seqs *s, int64_t b, int64_t j) {
    if (!s->table) return s->cu_kv[b] + j;
    return (int64_t)s->table[b * s->max_pages + j / s->page_size] * s->page_size + j % s->page_size;
}

static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* rows [T, H, W] <-> dense: bnsd [H, L, W] or bsnd [L, H, W]; row of token t: rowof(t). */
typedef struct side { const spattn_ref_seqs *s; int64_t b; int kv; } side;
static int64_t row_of(side sd, int64_t t) {
    return sd.kv ? spattn_ref_kv_row(sd.s, sd.b, t) : sd.s->cu_q[sd.b] + t;
}
static void gather(side sd, const double *src, int64_t L, int64_t H, int64_t W, int bnsd, double *dst) {
    for (int64_t t = 0; t < L; t++)
        for (int64_t h = 0; h < H; h++)
            memcpy(dst + (bnsd ? (h * L + t) : (t * H + h)) * W, src + (row_of(sd, t) * H + h) * W,
                   (size_t)W * sizeof(double));
}
/* dst rows (+)= dense */
static void scatter(side sd, const double *src, int64_t L, int64_t H, int64_t W, int bnsd,
                    double *dst, int add) {
    for (int64_t t = 0; t < L; t++)
        for (int64_t h = 0; h < H; h++) {
            double *d = dst + (row_of(sd, t) * H + h) * W;
            const double *x = src + (bnsd ? (h * L + t) : (t * H + h)) * W;
            for (int64_t w = 0; w < W; w++) d[w] = add ? d[w] + x[w] : x[w];
        }
}

static void bsa_seq(const spattn_ref_bsa_shape *s, const spattn_ref_seqs *sq, int64_t b,
                    const double *q, const double *k, const double *v, const uint8_t *mask,
                    double scale, const double *dout, double *o, double *lse, double *dq,
                    double *dk, double *dv) {
    int64_t Lq = sq->cu_q[b + 1] - sq->cu_q[b], Lk = sq->cu_kv[b + 1] - sq->cu_kv[b];
    int64_t N = s->N, Nkv = s->Nkv, D = s->D;
    if (Lq == 0) return; /* dk / dv: zero */
    spattn_ref_bsa_shape d = *s;
    d.B = 1;
    d.Sq = Lq;
    d.Skv = Lk;
    side qs = {sq, b, 0}, ks = {sq, b, 1};
    int64_t nbx = (Lq + s->bx - 1) / s->bx, nby = (Lk + s->by - 1) / s->by;
    int64_t NBX = (s->Sq + s->bx - 1) / s->bx, NBY = (s->Skv + s->by - 1) / s->by;
    uint8_t *m = calloc((size_t)(N * nbx * nby + 1), 1);
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < nbx; i++)
            for (int64_t j = 0; j < nby; j++)
                m[(n * nbx + i) * nby + j] = mask[((b * N + n) * NBX + i) * NBY + j];
    double *qd = dalloc(N * Lq * D), *kd = dalloc(Nkv * Lk * D), *vd = dalloc(Nkv * Lk * D);
    gather(qs, q, Lq, N, D, 1, qd);
    gather(ks, k, Lk, Nkv, D, 1, kd);
    gather(ks, v, Lk, Nkv, D, 1, vd);
    if (!dout) {
        double *od = dalloc(N * Lq * D), *ld = dalloc(N * Lq);
        spattn_ref_bsa_fwd(&d, qd, kd, vd, m, scale, od, ld);
        scatter(qs, od, Lq, N, D, 1, o, 0);
        if (lse) scatter(qs, ld, Lq, N, 1, 1, lse, 0);
        free(od);
        free(ld);
    } else {
        double *gd = dalloc(N * Lq * D), *dqd = dalloc(N * Lq * D);
        double *dkd = dalloc(Nkv * Lk * D), *dvd = dalloc(Nkv * Lk * D);
        gather(qs, dout, Lq, N, D, 1, gd);
        spattn_ref_bsa_bwd(&d, qd, kd, vd, m, scale, gd, dqd, dkd, dvd);
        scatter(qs, dqd, Lq, N, D, 1, dq, 0);
        scatter(ks, dkd, Lk, Nkv, D, 1, dk, 1);
        scatter(ks, dvd, Lk, Nkv, D, 1, dv, 1);
        free(gd);
        free(dqd);
        free(dkd);
        free(dvd);
    }
    free(m);
    free(qd);
    free(kd);
    free(vd);
}

void spattn_ref_bsa_varlen_fwd(const spattn_ref_bsa_shape *s, const spattn_ref_seqs *sq,
                               const double *q, const double *k, const double *v,
                               const uint8_t *mask, double scale, double *o, double *lse) {
    for (int64_t b = 0; b < sq->B; b++)
        bsa_seq(s, sq, b, q, k, v, mask, scale, NULL, o, lse, NULL, NULL, NULL);
}

void spattn_ref_bsa_varlen_bwd(const spattn_ref_bsa_shape *s, const spattn_ref_seqs *sq,
                               const double *q, const double *k, const double *v,
                               const uint8_t *mask, double scale, const double *dout, double *dq,
                               double *dk, double *dv) {
    memset(dk, 0, (size_t)(sq->Tkv * s->Nkv * s->D) * sizeof(double));
    memset(dv, 0, (size_t)(sq->Tkv * s->Nkv * s->D) * sizeof(double));
    for (int64_t b = 0; b < sq->B; b++)
        bsa_seq(s, sq, b, q, k, v, mask, scale, dout, NULL, NULL, dq, dk, dv);
}

static void sfa_seq(const spattn_ref_sfa_shape *s, const spattn_ref_seqs *sq, int64_t b,
                    const double *q, const double *k, const double *v, const int32_t *idx,
                    double scale, const double *dout, double *o, double *lse, double *dq,
                    double *dk, double *dv) {
    int64_t Lq = sq->cu_q[b + 1] - sq->cu_q[b], Lk = sq->cu_kv[b + 1] - sq->cu_kv[b];
    int64_t N1 = s->N1, N2 = s->N2, D = s->D, Dq = s->D + s->Dr, K = s->K;
    if (Lq == 0) return;
    spattn_ref_sfa_shape d = *s;
    d.B = 1;
    d.S1 = Lq;
    d.S2 = Lk;
    side qs = {sq, b, 0}, ks = {sq, b, 1};
    double *qd = dalloc(Lq * N1 * Dq), *kd = dalloc(Lk * N2 * Dq);
    double *vd = s->shared_kv ? NULL : dalloc(Lk * N2 * D);
    int32_t *id = malloc((size_t)(Lq * N2 * K) * sizeof(int32_t));
    memcpy(id, idx + sq->cu_q[b] * N2 * K, (size_t)(Lq * N2 * K) * sizeof(int32_t));
    gather(qs, q, Lq, N1, Dq, 0, qd);
    gather(ks, k, Lk, N2, Dq, 0, kd);
    if (vd) gather(ks, v, Lk, N2, D, 0, vd);
    if (!dout) {
        double *od = dalloc(Lq * N1 * D), *ld = dalloc(Lq * N1);
        spattn_ref_sfa_fwd(&d, qd, kd, vd, id, scale, od, ld);
        scatter(qs, od, Lq, N1, D, 0, o, 0);
        if (lse) scatter(qs, ld, Lq, N1, 1, 0, lse, 0);
        free(od);
        free(ld);
    } else {
        double *gd = dalloc(Lq * N1 * D), *dqd = dalloc(Lq * N1 * Dq), *dkd = dalloc(Lk * N2 * Dq);
        double *dvd = vd ? dalloc(Lk * N2 * D) : NULL;
        gather(qs, dout, Lq, N1, D, 0, gd);
        spattn_ref_sfa_bwd(&d, qd, kd, vd, id, scale, gd, dqd, dkd, dvd);
        scatter(qs, dqd, Lq, N1, Dq, 0, dq, 0);
        scatter(ks, dkd, Lk, N2, Dq, 0, dk, 1);
        if (dvd) scatter(ks, dvd, Lk, N2, D, 0, dv, 1);
        free(gd);
        free(dqd);
        free(dkd);
        free(dvd);
    }
    free(qd);
    free(kd);
    free(vd);
    free(id);
}

void spattn_ref_sfa_varlen_fwd(const spattn_ref_sfa_shape *s, const spattn_ref_seqs *sq,
                               const double *q, const double *k, const double *v,
                               const int32_t *idx, double scale, double *o, double *lse) {
    for (int64_t b = 0; b < sq->B; b++)
        sfa_seq(s, sq, b, q, k, v, idx, scale, NULL, o, lse, NULL, NULL, NULL);
}

void spattn_ref_sfa_varlen_bwd(const spattn_ref_sfa_shape *s, const spattn_ref_seqs *sq,
                               const double *q, const double *k, const double *v,
                               const int32_t *idx, double scale, const double *dout, double *dq,
                               double *dk, double *dv) {
    memset(dk, 0, (size_t)(sq->Tkv * s->N2 * (s->D + s->Dr)) * sizeof(double));
    if (dv) memset(dv, 0, (size_t)(sq->Tkv * s->N2 * s->D) * sizeof(double));
    for (int64_t b = 0; b < sq->B; b++)
        sfa_seq(s, sq, b, q, k, v, idx, scale, dout, NULL, NULL, dq, dk, dv);
}
