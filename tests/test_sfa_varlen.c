/*
 * Packed variable-length sfa on the CPU (spattn_sfa_fwd_varlen / _bwd_varlen) against the fp64
 * reference on random awkward batches: empty and one-token sequences, sequences with queries
 * but no keys, mode 0 and 3 (causal on each sequence's own lengths), sbs 1 / 2 / 4 with
 * partial last blocks, padding and duplicates in the index rows, GQA, rope as column views
 * of one [.., D+Dr] buffer, shared and separate v, every dtype, padded token strides.  Also:
 * bitwise equality with one dense call per sequence and across thread counts, and paged keys
 * (shuffled block table, page sizes 1 / 2 / 16, sometimes a page shared by two sequences)
 * against the reference and bitwise equal to the packed call.
 */
#include "cpu/sfa_cpu.h" /* sfa_tile_bytes: a small budget forces several index chunks */
#include "varlen_testkit.h"

/* Several index chunks per row (small tile budget): the tiling of the max_seqlen plan then
 * differs from a dense call's, so sequences are compared with the reference only. */
static int g_chunked;

typedef struct sv_case {
    int64_t B, N1, N2, D, Dr, K, sbs, maxl;
    int32_t mode, shared, dt;
} sv_case;

/* Column view [.., lo, lo + w) of a [T, H, C] buffer. */
static spattn_tensor cols(const vt_buf *b, int64_t lo, int64_t w) {
    spattn_tensor t = b->t;
    t.data = (char *)t.data + lo * (int64_t)spattn_dtype_size((spattn_dtype)t.dtype);
    t.shape[t.ndim - 1] = w;
    return t;
}

/* A sequence's rows [t0, t0+L) of a [T, H, C] tensor as a dense [1, L, H, C] view. */
static spattn_tensor rows4(const spattn_tensor *t, int64_t t0, int64_t L) {
    spattn_tensor v = *t;
    v.data = (char *)t->data + t0 * t->strides[0] * (int64_t)spattn_dtype_size((spattn_dtype)t->dtype);
    v.ndim = 4;
    v.shape[0] = 1;
    v.shape[1] = L;
    v.shape[2] = t->shape[1];
    v.shape[3] = t->shape[2];
    v.strides[0] = 0;
    v.strides[1] = t->strides[0];
    v.strides[2] = t->strides[1];
    v.strides[3] = t->strides[2];
    return v;
}

typedef struct sv_out {
    vt_buf o, lse, dq, dk, dv; /* dq / dk: [.., D+Dr] buffers, split into views */
} sv_out;

static void out_free(sv_out *o) {
    vt_free(&o->o);
    vt_free(&o->lse);
    vt_free(&o->dq);
    vt_free(&o->dk);
    if (o->dv.mem) vt_free(&o->dv);
}

typedef struct sv_in {
    const sv_case *c;
    vt_buf qc, kc, v, g;
    spattn_tensor idx;
    spattn_varlen vl;
} sv_in;

/* fwd then bwd (o, lse of the fwd); k side from `kc` / `v` (packed or pages). */
static spattn_status run(const sv_in *in, const vt_buf *kc, const vt_buf *v, const spattn_varlen *vl,
                         int threads, sv_out *out, const char *desc) {
    const sv_case *c = in->c;
    const int64_t Tq = in->qc.t.shape[0], N1 = c->N1, D = c->D, Dr = c->Dr, Dq = D + Dr;
    int64_t so[3] = {Tq, N1, D}, sl[2] = {Tq, N1}, sq[3] = {Tq, N1, Dq};
    int64_t sk[SPATTN_MAX_DIMS];
    memcpy(sk, kc->t.shape, sizeof sk);
    out->o = vt_alloc(c->dt, 3, so, 0);
    out->lse = vt_alloc(SPATTN_DTYPE_F32, 2, sl, 0);
    out->dq = vt_alloc(c->dt, 3, sq, 0);
    out->dk = vt_alloc(c->dt, kc->t.ndim, sk, 0);
    sk[kc->t.ndim - 1] = D;
    memset(&out->dv, 0, sizeof out->dv);
    if (!c->shared) out->dv = vt_alloc(c->dt, kc->t.ndim, sk, 0);
    spattn_tensor q = cols(&in->qc, 0, D), qr = cols(&in->qc, D, Dr);
    spattn_tensor k = cols(kc, 0, D), kr = cols(kc, D, Dr);
    spattn_tensor dq = cols(&out->dq, 0, D), dqr = cols(&out->dq, D, Dr);
    spattn_tensor dk = cols(&out->dk, 0, D), dkr = cols(&out->dk, D, Dr);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = threads;
    const spattn_tensor *vp = c->shared ? NULL : &v->t, *dvp = c->shared ? NULL : &out->dv.t;
    spattn_status st = spattn_sfa_fwd_varlen(&q, Dr ? &qr : NULL, &k, Dr ? &kr : NULL, vp, &in->idx,
                                             c->sbs, c->mode, 0.0, vl, &out->o.t, &out->lse.t, &opt);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: fwd status %d (%s)", desc, st, spattn_last_error());
    if (st) return st;
    st = spattn_sfa_bwd_varlen(&q, Dr ? &qr : NULL, &k, Dr ? &kr : NULL, vp, &out->o.t, &in->g.t,
                               &out->lse.t, &in->idx, c->sbs, c->mode, 0.0, vl, &dq,
                               Dr ? &dqr : NULL, &dk, Dr ? &dkr : NULL, dvp, &opt);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: bwd status %d (%s)", desc, st, spattn_last_error());
    return st;
}

/* Against the reference over rows < cu_q[B] (q side) and every k-side row. */
static void check_ref(const sv_in *in, const sv_out *out, const spattn_ref_seqs *rs,
                      const double *kd, const double *vd, const double *qd, const double *gd,
                      const char *desc, const char *what) {
    const sv_case *c = in->c;
    const int64_t N1 = c->N1, N2 = c->N2, D = c->D, Dq = c->D + c->Dr, K = c->K, Tk = rs->Tkv;
    const int64_t rows = rs->cu_q[rs->B], Tq = in->qc.t.shape[0];
    spattn_ref_sfa_shape s = {rs->B, 0, 0, N1, N2, D, c->Dr, K, c->sbs, c->mode, c->shared};
    double *o = calloc((size_t)(Tq * N1 * D), 8), *l = calloc((size_t)(Tq * N1), 8);
    double *dq = calloc((size_t)(Tq * N1 * Dq), 8), *dk = calloc((size_t)(Tk * N2 * Dq), 8);
    double *dv = c->shared ? NULL : calloc((size_t)(Tk * N2 * D), 8);
    const int32_t *idx = (const int32_t *)in->idx.data;
    const double scale = 1.0 / sqrt((double)Dq);
    spattn_ref_sfa_varlen_fwd(&s, rs, qd, kd, vd, idx, scale, o, l);
    spattn_ref_sfa_varlen_bwd(&s, rs, qd, kd, vd, idx, scale, gd, dq, dk, dv);
    double *x = malloc(sizeof(double) * (Tq * N1 * Dq + Tk * N2 * Dq + 8));
    double tol = vt_tol(c->dt), e;
    vt_read(&out->o, x);
    e = vt_err(x, o, rows * N1 * D);
    TU_CHECK(e <= tol, "%s (%s): o error %g", desc, what, e);
    vt_read(&out->lse, x);
    e = vt_err_lse(x, l, rows * N1);
    TU_CHECK(e <= 1e-5, "%s (%s): lse error %g", desc, what, e);
    vt_read(&out->dq, x);
    e = vt_err(x, dq, rows * N1 * Dq);
    TU_CHECK(e <= 2 * tol, "%s (%s): dq error %g", desc, what, e);
    vt_read(&out->dk, x);
    e = vt_err(x, dk, Tk * N2 * Dq);
    TU_CHECK(e <= 2 * tol, "%s (%s): dk error %g", desc, what, e);
    if (dv) {
        vt_read(&out->dv, x);
        e = vt_err(x, dv, Tk * N2 * D);
        TU_CHECK(e <= 2 * tol, "%s (%s): dv error %g", desc, what, e);
    }
    free(o);
    free(l);
    free(dq);
    free(dk);
    free(dv);
    free(x);
}

static void one_case(const sv_case *c, tu_rng *r) {
    char desc[220];
    snprintf(desc, sizeof desc,
             "B=%lld N1=%lld N2=%lld D=%lld Dr=%lld K=%lld sbs=%lld maxl=%lld mode=%d shared=%d %s",
             (long long)c->B, (long long)c->N1, (long long)c->N2, (long long)c->D, (long long)c->Dr,
             (long long)c->K, (long long)c->sbs, (long long)c->maxl, c->mode, c->shared,
             spattn_dtype_name((spattn_dtype)c->dt));
    const int64_t B = c->B, N1 = c->N1, N2 = c->N2, D = c->D, Dq = c->D + c->Dr, K = c->K;
    int32_t *cuq = malloc((size_t)(B + 1) * 4), *cuk = malloc((size_t)(B + 1) * 4);
    vt_lengths(r, B, c->maxl, cuq);
    vt_lengths(r, B, c->maxl, cuk);
    int64_t mq = vt_maxlen(cuq, B) + tu_range(r, 0, 2), mk = vt_maxlen(cuk, B) + tu_range(r, 0, 2);
    if (mq < 1) mq = 1;
    if (mk < 1) mk = 1;
    int64_t Tq = cuq[B] + tu_range(r, 0, 2), Tk = cuk[B] + tu_range(r, 0, 2);
    if (Tq < 1) Tq = 1;
    if (Tk < 1) Tk = 1;
    int64_t pad = tu_range(r, 0, 1) * 8;
    sv_in in;
    memset(&in, 0, sizeof in);
    in.c = c;
    in.qc = vt_alloc(c->dt, 3, (int64_t[]){Tq, N1, Dq}, pad);
    in.kc = vt_alloc(c->dt, 3, (int64_t[]){Tk, N2, Dq}, pad);
    in.v = vt_alloc(c->dt, 3, (int64_t[]){Tk, N2, D}, 0);
    in.g = vt_alloc(c->dt, 3, (int64_t[]){Tq, N1, D}, 0);
    double *qd = malloc(sizeof(double) * Tq * N1 * Dq), *kd = malloc(sizeof(double) * Tk * N2 * Dq);
    double *vd = malloc(sizeof(double) * Tk * N2 * D), *gd = malloc(sizeof(double) * Tq * N1 * D);
    vt_randn(r, &in.qc, qd);
    vt_randn(r, &in.kc, kd);
    vt_randn(r, &in.v, vd);
    vt_randn(r, &in.g, gd);
    /* indices: sequence-local blocks, -1 anywhere, sometimes duplicates; rows past cu_q[B]
     * hold garbage (never read) */
    int32_t *idx = malloc(sizeof(int32_t) * Tq * N2 * K);
    for (int64_t i = 0; i < Tq * N2 * K; i++) idx[i] = 12345;
    for (int64_t b = 0; b < B; b++) {
        int64_t nblk = (cuk[b + 1] - cuk[b] + c->sbs - 1) / c->sbs;
        for (int64_t i = cuq[b]; i < cuq[b + 1]; i++)
            for (int64_t n = 0; n < N2; n++)
                for (int64_t j = 0; j < K; j++) {
                    int32_t x = nblk > 0 && tu_uniform(r) < 0.8 ? (int32_t)tu_range(r, 0, nblk - 1) : -1;
                    idx[(i * N2 + n) * K + j] = x;
                }
    }
    in.idx = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 3, (int64_t[]){Tq, N2, K}, NULL);
    spattn_tensor cq = spattn_tensor_make(cuq, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    spattn_tensor ck = spattn_tensor_make(cuk, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    in.vl.cu_seqlens_q = &cq;
    in.vl.cu_seqlens_kv = &ck;
    in.vl.max_seqlen_q = mq;
    in.vl.max_seqlen_kv = mk;

    sv_out o2, o1;
    memset(&o2, 0, sizeof o2);
    memset(&o1, 0, sizeof o1);
    if (run(&in, &in.kc, &in.v, &in.vl, 2, &o2, desc) || run(&in, &in.kc, &in.v, &in.vl, 1, &o1, desc))
        goto done;
    TU_CHECK(vt_same_bytes(&o2.o, &o1.o) && vt_same_bytes(&o2.lse, &o1.lse) &&
                 vt_same_bytes(&o2.dq, &o1.dq) && vt_same_bytes(&o2.dk, &o1.dk) &&
                 (c->shared || vt_same_bytes(&o2.dv, &o1.dv)),
             "%s: results differ between 2 threads and 1", desc);
    spattn_ref_seqs rs = {B, cuq, cuk, NULL, 0, 0, Tk};
    check_ref(&in, &o2, &rs, kd, vd, qd, gd, desc, "packed");

    /* one dense call per sequence (queries and keys present): bitwise the same rows */
    for (int64_t b = 0; b < B && !g_chunked; b++) {
        int64_t Lq = cuq[b + 1] - cuq[b], Lk = cuk[b + 1] - cuk[b];
        if (Lq == 0 || Lk == 0) continue;
        spattn_tensor q = cols(&in.qc, 0, D), qr = cols(&in.qc, D, c->Dr);
        spattn_tensor k = cols(&in.kc, 0, D), kr = cols(&in.kc, D, c->Dr);
        spattn_tensor qb = rows4(&q, cuq[b], Lq), qrb = rows4(&qr, cuq[b], Lq);
        spattn_tensor kb = rows4(&k, cuk[b], Lk), krb = rows4(&kr, cuk[b], Lk);
        spattn_tensor vb = rows4(&in.v.t, cuk[b], Lk), gb = rows4(&in.g.t, cuq[b], Lq);
        spattn_tensor ib = rows4(&in.idx, cuq[b], Lq);
        int64_t so[4] = {1, Lq, N1, D}, sl[3] = {1, Lq, N1}, sqq[4] = {1, Lq, N1, Dq};
        int64_t skk[4] = {1, Lk, N2, Dq}, svv[4] = {1, Lk, N2, D};
        vt_buf ob = vt_alloc(c->dt, 4, so, 0), lb = vt_alloc(SPATTN_DTYPE_F32, 3, sl, 0);
        vt_buf dqb = vt_alloc(c->dt, 4, sqq, 0), dkb = vt_alloc(c->dt, 4, skk, 0);
        vt_buf dvb = vt_alloc(c->dt, 4, svv, 0);
        spattn_tensor dq = cols(&dqb, 0, D), dqr = cols(&dqb, D, c->Dr);
        spattn_tensor dk = cols(&dkb, 0, D), dkr = cols(&dkb, D, c->Dr);
        const int has_r = c->Dr > 0;
        spattn_status st = spattn_sfa_fwd(&qb, has_r ? &qrb : NULL, &kb, has_r ? &krb : NULL,
                                          c->shared ? NULL : &vb, &ib, c->sbs, c->mode, 0.0, &ob.t, &lb.t);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: dense fwd of seq %lld: %s", desc, (long long)b, spattn_last_error());
        st = spattn_sfa_bwd(&qb, has_r ? &qrb : NULL, &kb, has_r ? &krb : NULL, c->shared ? NULL : &vb,
                            &ob.t, &gb, &lb.t, &ib, c->sbs, c->mode, 0.0, &dq, has_r ? &dqr : NULL,
                            &dk, has_r ? &dkr : NULL, c->shared ? NULL : &dvb.t);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: dense bwd of seq %lld: %s", desc, (long long)b, spattn_last_error());
        size_t es = spattn_dtype_size((spattn_dtype)c->dt);
        int same = !memcmp(ob.mem, (char *)o2.o.mem + cuq[b] * N1 * D * es, (size_t)(Lq * N1 * D) * es) &&
                   !memcmp(lb.mem, (char *)o2.lse.mem + cuq[b] * N1 * 4, (size_t)(Lq * N1) * 4) &&
                   !memcmp(dqb.mem, (char *)o2.dq.mem + cuq[b] * N1 * Dq * es, (size_t)(Lq * N1 * Dq) * es) &&
                   !memcmp(dkb.mem, (char *)o2.dk.mem + cuk[b] * N2 * Dq * es, (size_t)(Lk * N2 * Dq) * es) &&
                   (c->shared || !memcmp(dvb.mem, (char *)o2.dv.mem + cuk[b] * N2 * D * es, (size_t)(Lk * N2 * D) * es));
        TU_CHECK(same, "%s: sequence %lld differs from its dense call", desc, (long long)b);
        vt_free(&ob);
        vt_free(&lb);
        vt_free(&dqb);
        vt_free(&dkb);
        vt_free(&dvb);
    }

    /* paged keys */
    {
        static const int64_t kPs[3] = {1, 2, 16};
        int64_t ps = kPs[tu_range(r, 0, 2)], maxp = (mk + ps - 1) / ps + tu_range(r, 0, 1), P;
        int32_t *tab = vt_table(r, cuk, B, ps, maxp, &P);
        int share = B >= 2 && cuk[1] > 0 && cuk[2] > cuk[1] && tu_uniform(r) < 0.4;
        if (share) tab[maxp] = tab[0]; /* sequence 1's first page is sequence 0's */
        vt_buf kp = vt_alloc(c->dt, 4, (int64_t[]){P, ps, N2, Dq}, 0);
        vt_buf vpg = vt_alloc(c->dt, 4, (int64_t[]){P, ps, N2, D}, 0);
        double *kpd = malloc(sizeof(double) * P * ps * N2 * Dq), *vpd = malloc(sizeof(double) * P * ps * N2 * D);
        vt_to_pages(kd, cuk, B, tab, maxp, ps, N2, Dq, kpd, P);
        vt_to_pages(vd, cuk, B, tab, maxp, ps, N2, D, vpd, P);
        if (share) /* the shared page holds sequence 0's keys */
            for (int64_t j = 0; j < ps && j < cuk[1]; j++) {
                int64_t row = (int64_t)tab[0] * ps + j;
                memcpy(kpd + row * N2 * Dq, kd + j * N2 * Dq, sizeof(double) * N2 * Dq);
                memcpy(vpd + row * N2 * D, vd + j * N2 * D, sizeof(double) * N2 * D);
            }
        vt_write(&kp, kpd);
        vt_write(&vpg, vpd);
        vt_read(&kp, kpd); /* rounded */
        vt_read(&vpg, vpd);
        spattn_tensor tt = spattn_tensor_make(tab, SPATTN_DTYPE_I32, 2, (int64_t[]){B, maxp}, NULL);
        spattn_varlen pv = in.vl;
        pv.block_table = &tt;
        sv_out op;
        memset(&op, 0, sizeof op);
        if (!run(&in, &kp, &vpg, &pv, 2, &op, desc)) {
            spattn_ref_seqs prs = {B, cuq, cuk, tab, maxp, ps, P * ps};
            check_ref(&in, &op, &prs, kpd, vpd, qd, gd, desc, share ? "paged, shared page" : "paged");
            if (!share)
                TU_CHECK(vt_same_bytes(&op.o, &o2.o) && vt_same_bytes(&op.lse, &o2.lse) &&
                             vt_same_bytes(&op.dq, &o2.dq),
                         "%s: paged (page_size %lld) differs from packed", desc, (long long)ps);
        }
        out_free(&op);
        vt_free(&kp);
        vt_free(&vpg);
        free(kpd);
        free(vpd);
        free(tab);
    }
done:
    out_free(&o2);
    out_free(&o1);
    vt_free(&in.qc);
    vt_free(&in.kc);
    vt_free(&in.v);
    vt_free(&in.g);
    free(qd);
    free(kd);
    free(vd);
    free(gd);
    free(idx);
    free(cuq);
    free(cuk);
}

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(1415));
    const int quick = vt_quick();
    const int ncase = quick ? 12 : 40;
    for (int i = 0; i < ncase; i++) {
        sv_case c;
        c.B = tu_range(&r, 1, 5);
        c.N2 = tu_range(&r, 1, 2);
        c.N1 = c.N2 * (int64_t[]){1, 2, 4}[tu_range(&r, 0, 2)];
        c.D = (int64_t[]){8, 16, 32}[tu_range(&r, 0, quick ? 1 : 2)];
        c.Dr = tu_range(&r, 0, 1) * 8;
        c.K = tu_range(&r, 1, 6);
        c.sbs = (int64_t[]){1, 2, 4}[tu_range(&r, 0, 2)];
        c.maxl = tu_range(&r, 1, quick ? 24 : 64);
        c.mode = tu_range(&r, 0, 1) ? 3 : 0;
        c.shared = (int32_t)tu_range(&r, 0, 1);
        c.dt = vt_dtype(&r);
        one_case(&c, &r);
    }
    sv_case one = {3, 2, 1, 8, 8, 2, 1, 1, 3, 1, SPATTN_DTYPE_F32}; /* S = 1 everywhere */
    one_case(&one, &r);
    /* backward in several index chunks per row (E < K), packed and paged */
    const size_t budget0 = sfa_tile_bytes;
    sfa_tile_bytes = 2048;
    g_chunked = 1;
    for (int i = 0; i < (quick ? 3 : 8); i++) {
        sv_case c = {tu_range(&r, 1, 4), 4, 2, 16, 8, 12, (int64_t[]){1, 4}[tu_range(&r, 0, 1)],
                     tu_range(&r, 8, 48), 3, (int32_t)tu_range(&r, 0, 1), SPATTN_DTYPE_F32};
        one_case(&c, &r);
    }
    g_chunked = 0;
    sfa_tile_bytes = budget0;
    return tu_summary("test_sfa_varlen");
}
