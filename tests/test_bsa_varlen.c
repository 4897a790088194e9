/*
 * Packed variable-length bsa on the CPU (spattn_bsa_fwd_varlen / _bwd_varlen) against the fp64
 * reference on random awkward batches: empty and one-token sequences, lengths not multiples of
 * bx / by (partial blocks), padding rows past cu[B], empty mask rows, GQA, every dtype, a
 * padded token stride, LSE as the transpose of an [N, Tq] buffer.  Also: bitwise equality
 * with one dense call per sequence and across thread counts, and paged K/V (shuffled block
 * table, page sizes 1 / 3 / 16) bitwise equal to the packed forward.
 */
#include "varlen_testkit.h"

static const int64_t kBlk[] = {1, 3, 16, 48, 80, 128}; /* 80, 128: longer than many sequences */

typedef struct bv_case {
    int64_t B, N, Nkv, D, bx, by, maxl;
    int32_t dt;
} bv_case;

typedef struct bv_run {
    vt_buf o, lse, dq, dk, dv;
} bv_run;

static void run_free(bv_run *r) {
    vt_free(&r->o);
    vt_free(&r->lse);
    vt_free(&r->dq);
    vt_free(&r->dk);
    vt_free(&r->dv);
}

static void one_case(const bv_case *c, tu_rng *r) {
    char desc[200];
    snprintf(desc, sizeof desc, "B=%lld N=%lld Nkv=%lld D=%lld bx=%lld by=%lld maxl=%lld %s",
             (long long)c->B, (long long)c->N, (long long)c->Nkv, (long long)c->D, (long long)c->bx,
             (long long)c->by, (long long)c->maxl, spattn_dtype_name((spattn_dtype)c->dt));
    const int64_t B = c->B, N = c->N, Nkv = c->Nkv, D = c->D;
    int32_t *cuq = malloc((size_t)(B + 1) * 4), *cuk = malloc((size_t)(B + 1) * 4);
    vt_lengths(r, B, c->maxl, cuq);
    vt_lengths(r, B, c->maxl, cuk);
    int64_t mq = vt_maxlen(cuq, B) + tu_range(r, 0, 2), mk = vt_maxlen(cuk, B) + tu_range(r, 0, 2);
    if (mq < 1) mq = 1;
    if (mk < 1) mk = 1;
    int64_t Tq = cuq[B] + tu_range(r, 0, 2), Tk = cuk[B] + tu_range(r, 0, 2);
    if (Tq < 1) Tq = 1;
    if (Tk < 1) Tk = 1;
    int64_t nbx = (mq + c->bx - 1) / c->bx, nby = (mk + c->by - 1) / c->by;
    int64_t pad = tu_range(r, 0, 1) * 8;
    int64_t sq[3] = {Tq, N, D}, sk[3] = {Tk, Nkv, D}, sm[4] = {B, N, nbx, nby};
    vt_buf q = vt_alloc(c->dt, 3, sq, pad), k = vt_alloc(c->dt, 3, sk, pad);
    vt_buf v = vt_alloc(c->dt, 3, sk, 0), g = vt_alloc(c->dt, 3, sq, pad);
    vt_buf m = vt_alloc(SPATTN_DTYPE_U8, 4, sm, 0);
    double *qd = malloc(sizeof(double) * Tq * N * D), *kd = malloc(sizeof(double) * Tk * Nkv * D);
    double *vd = malloc(sizeof(double) * Tk * Nkv * D), *gd = malloc(sizeof(double) * Tq * N * D);
    vt_randn(r, &q, qd);
    vt_randn(r, &k, kd);
    vt_randn(r, &v, vd);
    vt_randn(r, &g, gd);
    uint8_t *md = (uint8_t *)m.mem;
    for (int64_t i = 0; i < B * N * nbx * nby; i++) md[i] = tu_uniform(r) < 0.6;
    for (int64_t i = 0; i < B * N * nbx; i += 3) memset(md + i * nby, 0, (size_t)nby); /* empty rows */

    spattn_tensor cq = spattn_tensor_make(cuq, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    spattn_tensor ck = spattn_tensor_make(cuk, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &cq;
    vl.cu_seqlens_kv = &ck;
    vl.max_seqlen_q = mq;
    vl.max_seqlen_kv = mk;
    const double scale = 1.0 / sqrt((double)D);

    /* runs with 2 and 1 threads */
    bv_run run[2];
    for (int t = 0; t < 2; t++) {
        bv_run *R = &run[t];
        R->o = vt_alloc(c->dt, 3, sq, 0);
        int64_t sl[2] = {N, Tq};
        R->lse = vt_alloc(SPATTN_DTYPE_F32, 2, sl, 0); /* [N, Tq] memory, passed transposed */
        spattn_tensor lt = R->lse.t;
        lt.shape[0] = Tq;
        lt.shape[1] = N;
        lt.strides[0] = 1;
        lt.strides[1] = Tq;
        R->dq = vt_alloc(c->dt, 3, sq, 0);
        R->dk = vt_alloc(c->dt, 3, sk, 0);
        R->dv = vt_alloc(c->dt, 3, sk, 0);
        spattn_options opt;
        spattn_options_init(&opt);
        opt.num_threads = t == 0 ? 2 : 1;
        spattn_status st = spattn_bsa_fwd_varlen(&q.t, &k.t, &v.t, &m.t, c->bx, c->by, 0.0, &vl,
                                                 &R->o.t, &lt, &opt);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: fwd status %d (%s)", desc, st, spattn_last_error());
        st = spattn_bsa_bwd_varlen(&q.t, &k.t, &v.t, &R->o.t, &g.t, &lt, &m.t, c->bx, c->by, 0.0,
                                   &vl, &R->dq.t, &R->dk.t, &R->dv.t, &opt);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: bwd status %d (%s)", desc, st, spattn_last_error());
        R->lse.t = lt;
    }
    TU_CHECK(vt_same_bytes(&run[0].o, &run[1].o) && vt_same_bytes(&run[0].lse, &run[1].lse) &&
                 vt_same_bytes(&run[0].dq, &run[1].dq) && vt_same_bytes(&run[0].dk, &run[1].dk) &&
                 vt_same_bytes(&run[0].dv, &run[1].dv),
             "%s: results differ between 2 threads and 1", desc);

    /* against the fp64 reference (rows < cu[B]; rows past it untouched / dk, dv zero) */
    spattn_ref_bsa_shape rs = {B, N, Nkv, mq, mk, D, c->bx, c->by};
    spattn_ref_seqs rq = {B, cuq, cuk, NULL, 0, 0, Tk};
    int64_t nq = Tq * N * D, nk = Tk * Nkv * D;
    double *o_ref = calloc((size_t)nq, 8), *l_ref = calloc((size_t)(Tq * N), 8);
    double *dq_ref = calloc((size_t)nq, 8), *dk_ref = calloc((size_t)nk, 8), *dv_ref = calloc((size_t)nk, 8);
    spattn_ref_bsa_varlen_fwd(&rs, &rq, qd, kd, vd, md, scale, o_ref, l_ref);
    spattn_ref_bsa_varlen_bwd(&rs, &rq, qd, kd, vd, md, scale, gd, dq_ref, dk_ref, dv_ref);
    double *x = malloc(sizeof(double) * (nq > nk ? nq : nk) + 8);
    const int64_t rq_n = (int64_t)cuq[B] * N * D, tol_dt = 0;
    (void)tol_dt;
    double tol = vt_tol(c->dt);
    vt_read(&run[0].o, x);
    double e = vt_err(x, o_ref, rq_n);
    TU_CHECK(e <= tol, "%s: o error %g", desc, e);
    vt_read(&run[0].lse, x);
    e = vt_err_lse(x, l_ref, (int64_t)cuq[B] * N);
    TU_CHECK(e <= 1e-5, "%s: lse error %g", desc, e);
    vt_read(&run[0].dq, x);
    e = vt_err(x, dq_ref, rq_n);
    TU_CHECK(e <= 2 * tol, "%s: dq error %g", desc, e);
    vt_read(&run[0].dk, x);
    e = vt_err(x, dk_ref, nk);
    TU_CHECK(e <= 2 * tol, "%s: dk error %g", desc, e);
    vt_read(&run[0].dv, x);
    e = vt_err(x, dv_ref, nk);
    TU_CHECK(e <= 2 * tol, "%s: dv error %g", desc, e);
    /* o rows past cu_q[B] are not written: still the poison */
    {
        size_t es = spattn_dtype_size((spattn_dtype)c->dt);
        const unsigned char *tail = (const unsigned char *)run[0].o.mem + (size_t)cuq[B] * N * D * es;
        int ok = 1;
        for (int64_t i = 0; i < (Tq - cuq[B]) * N * D * (int64_t)es; i++) ok &= tail[i] == 0xA5;
        TU_CHECK(ok, "%s: o rows past cu_seqlens_q[B] were written", desc);
    }

    /* one dense call per sequence: bitwise the same rows */
    for (int64_t b = 0; b < B; b++) {
        int64_t Lq = cuq[b + 1] - cuq[b], Lk = cuk[b + 1] - cuk[b];
        if (Lq == 0 || Lk == 0) continue;
        size_t es = spattn_dtype_size((spattn_dtype)c->dt);
        spattn_tensor qb = {(char *)q.t.data + cuq[b] * q.t.strides[0] * (int64_t)es, 1, 0, c->dt, 4,
                            {1, N, Lq, D}, {0, q.t.strides[1], q.t.strides[0], 1}};
        spattn_tensor gb = qb;
        gb.data = (char *)g.t.data + cuq[b] * g.t.strides[0] * (int64_t)es;
        gb.strides[1] = g.t.strides[1];
        gb.strides[2] = g.t.strides[0];
        spattn_tensor kb = {(char *)k.t.data + cuk[b] * k.t.strides[0] * (int64_t)es, 1, 0, c->dt, 4,
                            {1, Nkv, Lk, D}, {0, k.t.strides[1], k.t.strides[0], 1}};
        spattn_tensor vb = kb;
        vb.data = (char *)v.t.data + cuk[b] * v.t.strides[0] * (int64_t)es;
        vb.strides[1] = v.t.strides[1];
        vb.strides[2] = v.t.strides[0];
        int64_t lbx = (Lq + c->bx - 1) / c->bx, lby = (Lk + c->by - 1) / c->by;
        spattn_tensor mb = {md + b * N * nbx * nby, 1, 0, SPATTN_DTYPE_U8, 4, {1, N, lbx, lby},
                            {0, nbx * nby, nby, 1}};
        int64_t so[4] = {1, N, Lq, D}, sl[3] = {1, N, Lq}, skv[4] = {1, Nkv, Lk, D};
        vt_buf ob = vt_alloc(c->dt, 4, so, 0), lb = vt_alloc(SPATTN_DTYPE_F32, 3, sl, 0);
        vt_buf dqb = vt_alloc(c->dt, 4, so, 0), dkb = vt_alloc(c->dt, 4, skv, 0), dvb = vt_alloc(c->dt, 4, skv, 0);
        spattn_status st = spattn_bsa_fwd(&qb, &kb, &vb, &mb, c->bx, c->by, 0.0, &ob.t, &lb.t);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: dense fwd of seq %lld: %s", desc, (long long)b, spattn_last_error());
        st = spattn_bsa_bwd(&qb, &kb, &vb, &ob.t, &gb, &lb.t, &mb, c->bx, c->by, 0.0, &dqb.t, &dkb.t, &dvb.t);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: dense bwd of seq %lld: %s", desc, (long long)b, spattn_last_error());
        int same = 1;
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < Lq; i++) {
                same &= !memcmp((char *)ob.mem + ((n * Lq + i) * D) * es,
                                (char *)run[0].o.mem + (((cuq[b] + i) * N + n) * D) * es, (size_t)D * es);
                same &= !memcmp((char *)dqb.mem + ((n * Lq + i) * D) * es,
                                (char *)run[0].dq.mem + (((cuq[b] + i) * N + n) * D) * es, (size_t)D * es);
                float a = ((float *)lb.mem)[n * Lq + i], l2 = ((float *)run[0].lse.mem)[n * Tq + cuq[b] + i];
                same &= !memcmp(&a, &l2, 4);
            }
        for (int64_t h = 0; h < Nkv; h++)
            for (int64_t j = 0; j < Lk; j++) {
                same &= !memcmp((char *)dkb.mem + ((h * Lk + j) * D) * es,
                                (char *)run[0].dk.mem + (((cuk[b] + j) * Nkv + h) * D) * es, (size_t)D * es);
                same &= !memcmp((char *)dvb.mem + ((h * Lk + j) * D) * es,
                                (char *)run[0].dv.mem + (((cuk[b] + j) * Nkv + h) * D) * es, (size_t)D * es);
            }
        TU_CHECK(same, "%s: sequence %lld differs from its dense call", desc, (long long)b);
        vt_free(&ob);
        vt_free(&lb);
        vt_free(&dqb);
        vt_free(&dkb);
        vt_free(&dvb);
    }

    /* paged K/V: bitwise the packed forward */
    {
        static const int64_t kPs[3] = {1, 3, 16};
        int64_t ps = kPs[tu_range(r, 0, 2)], maxp = (mk + ps - 1) / ps + tu_range(r, 0, 1), P;
        int32_t *tab = vt_table(r, cuk, B, ps, maxp, &P);
        int64_t spg[4] = {P, ps, Nkv, D};
        vt_buf kp = vt_alloc(c->dt, 4, spg, 0), vp = vt_alloc(c->dt, 4, spg, 0);
        double *pg = malloc(sizeof(double) * P * ps * Nkv * D);
        vt_to_pages(kd, cuk, B, tab, maxp, ps, Nkv, D, pg, P);
        vt_write(&kp, pg);
        vt_to_pages(vd, cuk, B, tab, maxp, ps, Nkv, D, pg, P);
        vt_write(&vp, pg);
        spattn_tensor tt = spattn_tensor_make(tab, SPATTN_DTYPE_I32, 2, (int64_t[]){B, maxp}, NULL);
        spattn_varlen pv = vl;
        pv.block_table = &tt;
        vt_buf op = vt_alloc(c->dt, 3, sq, 0);
        spattn_tensor lt = run[1].lse.t;
        vt_buf lp = vt_alloc(SPATTN_DTYPE_F32, 2, (int64_t[]){N, Tq}, 0);
        lt.data = lp.mem;
        spattn_status st = spattn_bsa_fwd_varlen(&q.t, &kp.t, &vp.t, &m.t, c->bx, c->by, 0.0, &pv,
                                                 &op.t, &lt, NULL);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: paged fwd status %d (%s)", desc, st, spattn_last_error());
        TU_CHECK(vt_same_bytes(&op, &run[0].o) && vt_same_bytes(&lp, &run[0].lse),
                 "%s: paged (page_size %lld) forward differs from the packed one", desc, (long long)ps);
        vt_free(&kp);
        vt_free(&vp);
        vt_free(&op);
        vt_free(&lp);
        free(pg);
        free(tab);
    }

    run_free(&run[0]);
    run_free(&run[1]);
    vt_free(&q);
    vt_free(&k);
    vt_free(&v);
    vt_free(&g);
    vt_free(&m);
    free(qd);
    free(kd);
    free(vd);
    free(gd);
    free(o_ref);
    free(l_ref);
    free(dq_ref);
    free(dk_ref);
    free(dv_ref);
    free(x);
    free(cuq);
    free(cuk);
}

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(1414));
    const int quick = vt_quick();
    const int ncase = quick ? 12 : 40;
    for (int i = 0; i < ncase; i++) {
        bv_case c;
        c.B = tu_range(&r, 1, 5);
        c.Nkv = tu_range(&r, 1, 2);
        c.N = c.Nkv * tu_range(&r, 1, 2);
        c.D = (int64_t[]){8, 16, 64}[tu_range(&r, 0, quick ? 1 : 2)];
        c.bx = kBlk[tu_range(&r, 0, 5)];
        c.by = kBlk[tu_range(&r, 0, 5)];
        c.maxl = tu_range(&r, 1, quick ? 40 : 100);
        c.dt = vt_dtype(&r);
        one_case(&c, &r);
    }
    /* blocks of 128 over sequences of up to 100 tokens: each sequence shorter than the block
     * is one tile of its own length (up to 96 rows), wider than max_seqlen's 50-row tiles, as
     * the dense call on it (the per-thread regions must hold them) */
    for (int i = 0; i < 2; i++) {
        bv_case wide = {4, 2, 1, 16, 128, 128, 100, i ? SPATTN_DTYPE_BF16 : SPATTN_DTYPE_F32};
        one_case(&wide, &r);
    }
    /* S = 1 everywhere */
    bv_case one = {3, 2, 1, 8, 1, 1, 1, SPATTN_DTYPE_F32};
    one_case(&one, &r);
    return tu_summary("test_bsa_varlen");
}
