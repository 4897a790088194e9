/*
 * Paged K/V in the bsa backward on the CPU (spattn_bsa_bwd_varlen with vl.block_table) against
 * the fp64 reference (src/ref/ref_varlen.h) on random awkward batches: page sizes that divide
 * nothing (1, 3, 5, 16, 48), shuffled tables with spare pages and garbage in unused slots,
 * pages shared by several sequences (their dK/dV rows get the sum), empty sequences on either
 * side, GQA, partial blocks, every dtype.  Every page row no sequence uses holds NaN, so a
 * kernel that lets one into a sum fails.  Also: bitwise the same for 1, 2 and 3 threads;
 * without shared pages bitwise the packed backward (dq, and dk / dv row for row); rows no
 * sequence uses are exactly +0; dq rows past cu_seqlens_q[B] untouched; a caller workspace of
 * the queried size gives the same bits and one byte less is refused before any write.
 */
#include "varlen_testkit.h"

static const int64_t kBlk[] = {1, 3, 16, 48, 80, 128}; /* 80, 128: longer than many sequences */
static const int64_t kPs[] = {1, 3, 5, 16, 48};

typedef struct pb_case {
    int64_t B, N, Nkv, D, bx, by, maxl, ps;
    int32_t dt;
    int share; /* let later sequences reuse pages of earlier ones */
} pb_case;

typedef struct pb_out {
    vt_buf dq, dk, dv;
} pb_out;

static void out_free(pb_out *o) {
    vt_free(&o->dq);
    vt_free(&o->dk);
    vt_free(&o->dv);
}

/* Table [B, maxp]: fresh ids from a shuffled list (plus 1..3 spare pages), or with `share` a
 * random prefix of slots copied from an earlier sequence's row (a shared prompt); unused slots
 * hold garbage (never read).  Returns the table; *np = pages. */
static int32_t *make_table(tu_rng *r, const int32_t *cuk, int64_t B, int64_t ps, int64_t maxp,
                           int share, int64_t *np) {
    int64_t *need = malloc(sizeof(int64_t) * (size_t)B), *shared = calloc((size_t)B, sizeof(int64_t));
    int64_t *from = malloc(sizeof(int64_t) * (size_t)B), fresh = 0;
    for (int64_t b = 0; b < B; b++) {
        need[b] = (cuk[b + 1] - cuk[b] + ps - 1) / ps;
        from[b] = -1;
        if (share && b > 0 && need[b] > 0 && tu_range(r, 0, 2) > 0) {
            int64_t a = tu_range(r, 0, b - 1);
            int64_t m = need[a] < need[b] ? need[a] : need[b];
            if (m > 0) {
                from[b] = a;
                shared[b] = tu_range(r, 1, m);
            }
        }
        fresh += need[b] - shared[b];
    }
    int64_t P = fresh + tu_range(r, 1, 3);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)P);
    for (int64_t i = 0; i < P; i++) perm[i] = (int32_t)i;
    for (int64_t i = P - 1; i > 0; i--) {
        int64_t j = tu_range(r, 0, i);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *tab = malloc(sizeof(int32_t) * (size_t)(B * maxp));
    int64_t u = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < maxp; s++) {
            int32_t id = s % 2 ? 1 << 30 : -5; /* garbage in unused slots */
            if (s < shared[b]) id = tab[from[b] * maxp + s];
            else if (s < need[b]) id = perm[u++];
            tab[b * maxp + s] = id;
        }
    free(perm);
    free(need);
    free(shared);
    free(from);
    *np = P;
    return tab;
}

static void one_case(const pb_case *c, tu_rng *r) {
    char desc[240];
    snprintf(desc, sizeof desc,
             "B=%lld N=%lld Nkv=%lld D=%lld bx=%lld by=%lld maxl=%lld page=%lld share=%d %s",
             (long long)c->B, (long long)c->N, (long long)c->Nkv, (long long)c->D,
             (long long)c->bx, (long long)c->by, (long long)c->maxl, (long long)c->ps, c->share,
             spattn_dtype_name((spattn_dtype)c->dt));
    const int64_t B = c->B, N = c->N, Nkv = c->Nkv, D = c->D, ps = c->ps;
    int32_t *cuq = malloc((size_t)(B + 1) * 4), *cuk = malloc((size_t)(B + 1) * 4);
    vt_lengths(r, B, c->maxl, cuq);
    vt_lengths(r, B, c->maxl, cuk);
    int64_t mq = vt_maxlen(cuq, B) + tu_range(r, 0, 2), mk = vt_maxlen(cuk, B) + tu_range(r, 0, 2);
    if (mq < 1) mq = 1;
    if (mk < 1) mk = 1;
    int64_t Tq = cuq[B] + tu_range(r, 0, 2);
    if (Tq < 1) Tq = 1;
    int64_t maxp = (vt_maxlen(cuk, B) + ps - 1) / ps + tu_range(r, 0, 1), P;
    if (maxp < 1) maxp = 1;
    int32_t *tab = make_table(r, cuk, B, ps, maxp, c->share, &P);
    const int64_t rows = P * ps;
    char *used = calloc((size_t)rows, 1);
    int any_shared = 0;
    {
        int32_t *users = calloc((size_t)P, sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) {
            int64_t lk = cuk[b + 1] - cuk[b];
            for (int64_t s = 0; s < (lk + ps - 1) / ps; s++) any_shared |= ++users[tab[b * maxp + s]] > 1;
            for (int64_t j = 0; j < lk; j++) used[(int64_t)tab[b * maxp + j / ps] * ps + j % ps] = 1;
        }
        free(users);
    }

    /* inputs: q, dout packed; k, v pages with NaN in every row no sequence uses */
    int64_t nbx = (mq + c->bx - 1) / c->bx, nby = (mk + c->by - 1) / c->by;
    int64_t pad = tu_range(r, 0, 1) * 8;
    int64_t sq[3] = {Tq, N, D}, sp[4] = {P, ps, Nkv, D}, sm[4] = {B, N, nbx, nby};
    vt_buf q = vt_alloc(c->dt, 3, sq, pad), g = vt_alloc(c->dt, 3, sq, 0);
    vt_buf kp = vt_alloc(c->dt, 4, sp, pad), vp = vt_alloc(c->dt, 4, sp, 0);
    vt_buf m = vt_alloc(SPATTN_DTYPE_U8, 4, sm, 0);
    const int64_t nq = Tq * N * D, nk = rows * Nkv * D, rw = Nkv * D;
    double *qd = malloc(sizeof(double) * nq), *gd = malloc(sizeof(double) * nq);
    double *kd = malloc(sizeof(double) * nk), *vd = malloc(sizeof(double) * nk);
    vt_randn(r, &q, qd);
    vt_randn(r, &g, gd);
    for (int64_t i = 0; i < nk; i++) {
        kd[i] = used[i / rw] ? tu_normal(r) : NAN;
        vd[i] = used[i / rw] ? tu_normal(r) : NAN;
    }
    vt_write(&kp, kd);
    vt_write(&vp, vd);
    vt_read(&kp, kd); /* the rounded values the library sees */
    vt_read(&vp, vd);
    uint8_t *md = (uint8_t *)m.mem;
    for (int64_t i = 0; i < B * N * nbx * nby; i++) md[i] = tu_uniform(r) < 0.6;
    for (int64_t i = 0; i < B * N * nbx; i += 3) memset(md + i * nby, 0, (size_t)nby);

    spattn_tensor cq = spattn_tensor_make(cuq, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    spattn_tensor ck = spattn_tensor_make(cuk, SPATTN_DTYPE_I32, 1, (int64_t[]){B + 1}, NULL);
    spattn_tensor tt = spattn_tensor_make(tab, SPATTN_DTYPE_I32, 2, (int64_t[]){B, maxp}, NULL);
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &cq;
    vl.cu_seqlens_kv = &ck;
    vl.max_seqlen_q = mq;
    vl.max_seqlen_kv = mk;
    vl.block_table = &tt;
    const double scale = 1.0 / sqrt((double)D);

    /* the forward's O and LSE */
    vt_buf o = vt_alloc(c->dt, 3, sq, 0), lse = vt_alloc(SPATTN_DTYPE_F32, 2, (int64_t[]){Tq, N}, 0);
    spattn_status st = spattn_bsa_fwd_varlen(&q.t, &kp.t, &vp.t, &m.t, c->bx, c->by, 0.0, &vl,
                                             &o.t, &lse.t, NULL);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: paged fwd status %d (%s)", desc, st, spattn_last_error());

    /* backward with 1, 2 and 3 threads: bitwise the same */
    pb_out run[3];
    for (int t = 0; t < 3; t++) {
        run[t].dq = vt_alloc(c->dt, 3, sq, 0);
        run[t].dk = vt_alloc(c->dt, 4, sp, 0);
        run[t].dv = vt_alloc(c->dt, 4, sp, pad);
        spattn_options opt;
        spattn_options_init(&opt);
        opt.num_threads = t + 1;
        st = spattn_bsa_bwd_varlen(&q.t, &kp.t, &vp.t, &o.t, &g.t, &lse.t, &m.t, c->bx, c->by, 0.0,
                                   &vl, &run[t].dq.t, &run[t].dk.t, &run[t].dv.t, &opt);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: paged bwd (%d threads) status %d (%s)", desc,
                 t + 1, st, spattn_last_error());
    }
    for (int t = 1; t < 3; t++)
        TU_CHECK(vt_same_bytes(&run[0].dq, &run[t].dq) && vt_same_bytes(&run[0].dk, &run[t].dk) &&
                     vt_same_bytes(&run[0].dv, &run[t].dv),
                 "%s: paged bwd with %d threads differs from 1 thread", desc, t + 1);

    /* against the fp64 reference */
    spattn_ref_bsa_shape rs = {B, N, Nkv, mq, mk, D, c->bx, c->by};
    spattn_ref_seqs rq = {B, cuq, cuk, tab, maxp, ps, rows};
    double *dq_ref = calloc((size_t)nq, 8), *dk_ref = calloc((size_t)nk, 8), *dv_ref = calloc((size_t)nk, 8);
    spattn_ref_bsa_varlen_bwd(&rs, &rq, qd, kd, vd, md, scale, gd, dq_ref, dk_ref, dv_ref);
    double *x = malloc(sizeof(double) * (size_t)(nq > nk ? nq : nk));
    const double tol = 2 * vt_tol(c->dt);
    vt_read(&run[0].dq, x);
    double e = vt_err(x, dq_ref, (int64_t)cuq[B] * N * D);
    TU_CHECK(e <= tol, "%s: dq error %g", desc, e);
    vt_read(&run[0].dk, x);
    e = vt_err(x, dk_ref, nk);
    TU_CHECK(e <= tol, "%s: dk error %g", desc, e);
    vt_read(&run[0].dv, x);
    e = vt_err(x, dv_ref, nk);
    TU_CHECK(e <= tol, "%s: dv error %g", desc, e);

    /* rows no sequence uses: exactly +0 (also the spare pages); dq past cu_q[B]: untouched */
    {
        const size_t es = spattn_dtype_size((spattn_dtype)c->dt);
        int zero = 1, poison = 1;
        for (int64_t row = 0; row < rows; row++) {
            if (used[row]) continue;
            for (int64_t h = 0; h < Nkv; h++)
                for (int64_t d = 0; d < D; d++) {
                    float a = spattn_load_f32(run[0].dk.t.data, c->dt,
                                              vt_off(&run[0].dk.t, (row * Nkv + h) * D + d));
                    float b2 = spattn_load_f32(run[0].dv.t.data, c->dt,
                                               vt_off(&run[0].dv.t, (row * Nkv + h) * D + d));
                    zero &= a == 0.0f && !signbit(a) && b2 == 0.0f && !signbit(b2);
                }
        }
        const unsigned char *tail = (const unsigned char *)run[0].dq.mem + (size_t)cuq[B] * N * D * es;
        for (int64_t i = 0; i < (Tq - cuq[B]) * N * D * (int64_t)es; i++) poison &= tail[i] == 0xA5;
        TU_CHECK(zero, "%s: dk / dv rows no sequence uses are not +0", desc);
        TU_CHECK(poison, "%s: dq rows past cu_seqlens_q[B] were written", desc);
    }

    /* no shared page: bitwise the packed backward on the same keys */
    if (!any_shared) {
        int64_t Tk = cuk[B] + tu_range(r, 0, 1);
        if (Tk < 1) Tk = 1;
        int64_t sk[3] = {Tk, Nkv, D};
        vt_buf k = vt_alloc(c->dt, 3, sk, 0), v = vt_alloc(c->dt, 3, sk, 0);
        double *pk = calloc((size_t)(Tk * rw), 8), *pv = calloc((size_t)(Tk * rw), 8);
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < cuk[b + 1] - cuk[b]; j++) {
                int64_t row = (int64_t)tab[b * maxp + j / ps] * ps + j % ps;
                memcpy(pk + (cuk[b] + j) * rw, kd + row * rw, sizeof(double) * (size_t)rw);
                memcpy(pv + (cuk[b] + j) * rw, vd + row * rw, sizeof(double) * (size_t)rw);
            }
        vt_write(&k, pk);
        vt_write(&v, pv);
        vt_buf dq = vt_alloc(c->dt, 3, sq, 0), dk = vt_alloc(c->dt, 3, sk, 0), dv = vt_alloc(c->dt, 3, sk, 0);
        spattn_varlen pl = vl;
        pl.block_table = NULL;
        st = spattn_bsa_bwd_varlen(&q.t, &k.t, &v.t, &o.t, &g.t, &lse.t, &m.t, c->bx, c->by, 0.0, &pl,
                                   &dq.t, &dk.t, &dv.t, NULL);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: packed bwd status %d (%s)", desc, st, spattn_last_error());
        int same = vt_same_bytes(&dq, &run[0].dq);
        const size_t es = spattn_dtype_size((spattn_dtype)c->dt);
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < cuk[b + 1] - cuk[b]; j++) {
                int64_t row = (int64_t)tab[b * maxp + j / ps] * ps + j % ps;
                for (int64_t h = 0; h < Nkv; h++) {
                    const char *a = (const char *)dk.mem + es * (size_t)vt_off(&dk.t, ((cuk[b] + j) * Nkv + h) * D);
                    const char *a2 = (const char *)dv.mem + es * (size_t)vt_off(&dv.t, ((cuk[b] + j) * Nkv + h) * D);
                    const char *p1 = (const char *)run[0].dk.mem + es * (size_t)vt_off(&run[0].dk.t, (row * Nkv + h) * D);
                    const char *p2 = (const char *)run[0].dv.mem + es * (size_t)vt_off(&run[0].dv.t, (row * Nkv + h) * D);
                    same &= !memcmp(a, p1, es * (size_t)D) && !memcmp(a2, p2, es * (size_t)D);
                }
            }
        TU_CHECK(same, "%s: paged backward differs from the packed one (no shared page)", desc);
        vt_free(&k);
        vt_free(&v);
        vt_free(&dq);
        vt_free(&dk);
        vt_free(&dv);
        free(pk);
        free(pv);
    }

    /* caller workspace: the queried size gives the same bits, one byte less is refused */
    {
        spattn_options opt;
        spattn_options_init(&opt);
        opt.num_threads = 2;
        size_t need = 0;
        st = spattn_bsa_varlen_workspace_size(&q.t, &kp.t, &vp.t, &m.t, c->bx, c->by, &vl, 1, &opt, &need);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS && need > 0, "%s: workspace query: %s", desc, spattn_last_error());
        void *ws = malloc(need);
        pb_out w;
        w.dq = vt_alloc(c->dt, 3, sq, 0);
        w.dk = vt_alloc(c->dt, 4, sp, 0);
        w.dv = vt_alloc(c->dt, 4, sp, pad);
        opt.workspace = ws;
        opt.workspace_size = need - 1;
        st = spattn_bsa_bwd_varlen(&q.t, &kp.t, &vp.t, &o.t, &g.t, &lse.t, &m.t, c->bx, c->by, 0.0,
                                   &vl, &w.dq.t, &w.dk.t, &w.dv.t, &opt);
        int untouched = 1;
        for (int64_t i = 0; i < w.dk.nbytes; i++) untouched &= ((unsigned char *)w.dk.mem)[i] == 0xA5;
        TU_CHECK(st == SPATTN_STATUS_WORKSPACE_TOO_SMALL && untouched,
                 "%s: workspace one byte short: status %d, dk %s", desc, st, untouched ? "untouched" : "WRITTEN");
        opt.workspace_size = need;
        memset(ws, 0x5A, need); /* the kernel must not rely on zeroed scratch */
        st = spattn_bsa_bwd_varlen(&q.t, &kp.t, &vp.t, &o.t, &g.t, &lse.t, &m.t, c->bx, c->by, 0.0,
                                   &vl, &w.dq.t, &w.dk.t, &w.dv.t, &opt);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS && vt_same_bytes(&w.dq, &run[0].dq) &&
                     vt_same_bytes(&w.dk, &run[0].dk) && vt_same_bytes(&w.dv, &run[0].dv),
                 "%s: caller workspace: status %d (%s) or different bits", desc, st, spattn_last_error());
        out_free(&w);
        free(ws);
    }

    for (int t = 0; t < 3; t++) out_free(&run[t]);
    vt_free(&q);
    vt_free(&g);
    vt_free(&kp);
    vt_free(&vp);
    vt_free(&m);
    vt_free(&o);
    vt_free(&lse);
    free(qd);
    free(gd);
    free(kd);
    free(vd);
    free(dq_ref);
    free(dk_ref);
    free(dv_ref);
    free(x);
    free(used);
    free(tab);
    free(cuq);
    free(cuk);
}

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(1415));
    const int quick = vt_quick();
    const int ncase = quick ? 16 : 48;
    for (int i = 0; i < ncase; i++) {
        pb_case c;
        c.B = tu_range(&r, 1, 6);
        c.Nkv = tu_range(&r, 1, 2);
        c.N = c.Nkv * tu_range(&r, 1, 3);
        c.D = (int64_t[]){8, 16, 64}[tu_range(&r, 0, quick ? 1 : 2)];
        c.bx = kBlk[tu_range(&r, 0, 5)];
        c.by = kBlk[tu_range(&r, 0, 5)];
        c.maxl = tu_range(&r, 1, quick ? 40 : 100);
        c.ps = kPs[tu_range(&r, 0, 4)];
        c.dt = vt_dtype(&r);
        c.share = (int)tu_range(&r, 0, 1);
        one_case(&c, &r);
    }
    /* one token everywhere; a shared prompt over many sequences with pages of one row */
    pb_case one = {3, 2, 1, 8, 1, 1, 1, 1, SPATTN_DTYPE_F32, 1};
    one_case(&one, &r);
    pb_case many = {12, 4, 2, 16, 16, 16, 70, 16, SPATTN_DTYPE_BF16, 1};
    one_case(&many, &r);
    return tu_summary("test_bsa_paged_bwd");
}
