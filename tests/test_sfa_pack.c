/*
 * The MLA column map of src/core/sfa_pack.h (what src/cuda/sfa_pad.cu runs on the GPU's MLA
 * kernels): each problem is packed into MLA's columns by the planner, run through the CPU
 * backend as the MLA problem (D 512 + Dr 64, v = k's first 512 columns), its outputs unpacked,
 * and checked against the fp64 reference of the original problem (eco tolerances).  The copies
 * here are host loops of what sfa_pad.cu's kernels do; the planner's decisions (parts in place,
 * zero rows, buffers, the workspace layout) are the ones the GPU uses.  Shapes: shared v up to
 * D 512 and D + Dr 576, separate v with 2 D + Dr <= 576, every layout of sfa_testutil.h (padded
 * rows, S / N swapped, inner stride 2: the copies' element-wise path), fp32 / fp16 / bf16, padding,
 * duplicates, empty rows, both modes.
 */
#include "core/seqs.h"
#include "core/sfa_pack.h"
#include "sfa_testutil.h"

/* the packed rows of group x <-> its caller tensors (back: the outputs' columns out of the
   buffer into the caller's tensors; else the inputs into the buffer, zeros where no tensor) */
/* element offset of row r (over the leading dimensions) of t */
static int64_t row_off(const spattn_tensor *t, int64_t r) {
    int64_t off = 0;
    for (int d = t->ndim - 2; d >= 0; d--) {
        off += r % t->shape[d] * t->strides[d];
        r /= t->shape[d];
    }
    return off;
}

static void host_copy(const spattn_sfa_pack_group *x, unsigned char *base, size_t esz, int back) {
    const int bw = x->b1 - x->b0;
    for (int64_t r = 0; r < x->rows; r++) {
        for (int c = x->b0; c < x->b1; c++) {
            unsigned char *buf = base + x->off + ((size_t)r * bw + (size_t)(c - x->b0)) * esz;
            int hit = -1;
            for (int i = 0; i < x->nseg; i++)
                if (x->seg[i].t && c >= x->seg[i].col0 && c < x->seg[i].col0 + x->seg[i].w) hit = i;
            if (hit < 0) {
                if (!back) memset(buf, 0, esz);
                continue;
            }
            const spattn_tensor *t = x->seg[hit].t;
            unsigned char *e = (unsigned char *)t->data +
                               (size_t)(row_off(t, r) + (c - x->seg[hit].col0) * t->strides[t->ndim - 1]) * esz;
            if (!back) memcpy(buf, e, esz);
            else if (spattn_sfa_pack_copied(x, hit)) memcpy(e, buf, esz);
        }
    }
}

/* the original problem, as sfa_api.c's checks fill it */
static spattn_sfa_problem problem_of(st_problem *P, int backward) {
    const st_shape *s = &P->s;
    spattn_sfa_problem p;
    memset(&p, 0, sizeof p);
    p.q = &P->q;
    p.q_rope = s->Dr ? &P->qr : NULL;
    p.k = &P->k;
    p.k_rope = s->Dr ? &P->kr : NULL;
    p.v = s->shared_kv ? NULL : &P->v;
    p.idx = &P->idx;
    p.o = &P->o;
    p.lse = &P->lse;
    if (backward) {
        p.dout = &P->dout;
        p.dq = &P->dq;
        p.dq_rope = s->Dr ? &P->dqr : NULL;
        p.dk = &P->dk;
        p.dk_rope = s->Dr ? &P->dkr : NULL;
        p.dv = s->shared_kv ? NULL : &P->dv;
    }
    p.B = s->B;
    p.S1 = s->S1;
    p.S2 = s->S2;
    p.N1 = s->N1;
    p.N2 = s->N2;
    p.D = s->D;
    p.Dr = s->Dr;
    p.K = s->K;
    p.sbs = s->sbs;
    p.nblk = (s->S2 + s->sbs - 1) / s->sbs;
    p.mode = s->mode;
    p.shared_kv = s->shared_kv;
    p.scale = (float)(1.0 / sqrt((double)(s->D + s->Dr)));
    p.dtype = s->dtype;
    return p;
}

/* One pass (forward, or deterministic backward) of problem p through the packed MLA problem on
   the CPU */
static spattn_status run_packed_p(const spattn_sfa_problem *p, int backward, spattn_sfa_pack *d) {
    spattn_sfa_pack_plan(p, backward, d);
    const size_t esz = st_esize(p->dtype);
    unsigned char *base = aligned_alloc(256, (d->bytes + 255) / 256 * 256);
    memset(base, 0x7f, d->bytes); /* garbage: every buffered column must be written */
    spattn_sfa_pack_bind(d, base);
    memset(base + d->zero_off, 0, SPATTN_PACK_ZERO_BYTES);
    /* inputs; a varlen call's outputs too (sfa_pad.cu: rows the kernels leave unwritten stay) */
    for (int i = 0; i < SPATTN_PACK_NG; i++)
        if (d->g[i].used && (!d->g[i].out || p->seqs) && d->g[i].b1 > d->g[i].b0) host_copy(&d->g[i], base, esz, 0);
    spattn_exec ex;
    memset(&ex, 0, sizeof ex);
    ex.deterministic = 1;
    spattn_status st = backward ? spattn_cpu_sfa_bwd(&d->pp, &ex) : spattn_cpu_sfa_fwd(&d->pp, &ex);
    if (st == SPATTN_STATUS_SUCCESS)
        for (int i = 0; i < SPATTN_PACK_NG; i++)
            if (d->g[i].used && d->g[i].out && d->g[i].b1 > d->g[i].b0) host_copy(&d->g[i], base, esz, 1);
    free(base);
    return st;
}
static spattn_status run_packed(st_problem *P, int backward, spattn_sfa_pack *d) {
    spattn_sfa_problem p = problem_of(P, backward);
    return run_packed_p(&p, backward, d);
}

static void run_case(int ci, const st_shape *s, uint64_t seed) {
    char name[256];
    snprintf(name, sizeof name, "case %d: B%lld S1=%lld S2=%lld N1=%lld N2=%lld D=%lld Dr=%lld K=%lld sbs=%lld mode=%d shared=%d %s concat=%d layout=%d",
             ci, (long long)s->B, (long long)s->S1, (long long)s->S2, (long long)s->N1, (long long)s->N2,
             (long long)s->D, (long long)s->Dr, (long long)s->K, (long long)s->sbs, s->mode, s->shared_kv,
             spattn_dtype_name((spattn_dtype)s->dtype), s->concat, s->layout);
    tu_rng r;
    tu_seed(&r, seed);
    st_problem P;
    st_make(&P, s, &r);
    st_golden g;
    st_golden_make(&g, s, &P);
    {
        spattn_sfa_problem p = problem_of(&P, 0);
        TU_CHECK(spattn_sfa_pack_fits(&p, 1), "%s: fits the MLA columns", name);
    }
    spattn_sfa_pack d;
    st_poison(&P.o);
    st_poison(&P.lse);
    spattn_status st = run_packed(&P, 0, &d);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: packed fwd status %d (%s)", name, st, spattn_last_error());
    TU_CHECK(st_check_fwd(&P, s, &g), "%s: packed forward vs reference", name);
    /* a size query (no o) sizes at least what the call uses */
    {
        spattn_sfa_problem q = problem_of(&P, 0);
        q.o = NULL;
        spattn_sfa_pack dq;
        spattn_sfa_pack_plan(&q, 0, &dq);
        TU_CHECK(dq.bytes >= d.bytes, "%s: forward query %zu >= call %zu bytes", name, dq.bytes, d.bytes);
    }
    st_poison(&P.dq);
    st_poison(&P.dk);
    if (s->Dr) {
        st_poison(&P.dqr);
        st_poison(&P.dkr);
    }
    if (!s->shared_kv) st_poison(&P.dv);
    st = run_packed(&P, 1, &d);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: packed bwd status %d (%s)", name, st, spattn_last_error());
    TU_CHECK(st_check_bwd(&P, s, &g), "%s: packed backward vs reference", name);
    {
        spattn_sfa_problem q = problem_of(&P, 1);
        q.o = q.dout = q.dq = q.dq_rope = q.dk = q.dk_rope = q.dv = NULL;
        spattn_sfa_pack dq;
        spattn_sfa_pack_plan(&q, 1, &dq);
        TU_CHECK(dq.bytes >= d.bytes, "%s: backward query %zu >= call %zu bytes", name, dq.bytes, d.bytes);
    }
    st_golden_free(&g);
    st_free(&P);
}

/* The planner's decisions where they are known: shared v, D 512 without rope, contiguous rows:
   q / k / o / dout / dq / dk in place, the rope inputs the zero row, nothing copied back; then
   buffered rows of 512 and 576 columns */
static void check_plans(void) {
    st_shape s;
    memset(&s, 0, sizeof s);
    s.B = 1, s.S1 = 3, s.S2 = 20, s.N1 = 2, s.N2 = 1, s.D = 512, s.Dr = 0, s.K = 4, s.sbs = 4, s.mode = 3;
    s.shared_kv = 1, s.dtype = SPATTN_DTYPE_BF16;
    tu_rng r;
    tu_seed(&r, 5);
    st_problem P;
    st_make(&P, &s, &r);
    spattn_sfa_problem p = problem_of(&P, 1);
    spattn_sfa_pack d;
    spattn_sfa_pack_plan(&p, 1, &d);
    const spattn_sfa_pack_group *g = d.g;
    TU_CHECK(g[SPATTN_PACK_GQ].state[0] == SPATTN_PACK_INPLACE && g[SPATTN_PACK_GQ].state[1] == SPATTN_PACK_ZERO &&
                 g[SPATTN_PACK_GK].state[0] == SPATTN_PACK_INPLACE && g[SPATTN_PACK_GK].state[1] == SPATTN_PACK_ZERO &&
                 g[SPATTN_PACK_GO].state[0] == SPATTN_PACK_INPLACE && g[SPATTN_PACK_GDO].state[0] == SPATTN_PACK_INPLACE &&
                 g[SPATTN_PACK_GDQ].state[0] == SPATTN_PACK_INPLACE && g[SPATTN_PACK_GDQ].state[1] == SPATTN_PACK_BUF &&
                 g[SPATTN_PACK_GDK].state[0] == SPATTN_PACK_INPLACE && g[SPATTN_PACK_GDK].state[1] == SPATTN_PACK_BUF,
             "D 512 without rope: in place, zero rope, dropped rope outputs");
    TU_CHECK(!spattn_sfa_pack_needs_copy_back(&d), "D 512 without rope: nothing copied back");
    TU_CHECK(d.pp.q == &P.q || d.pp.q->data == P.q.data, "D 512: q handed over in place");
    TU_CHECK(d.pp.q_rope && d.pp.q_rope->strides[0] == 0 && d.pp.q_rope->strides[2] == 0 && d.pp.q_rope->shape[3] == 64,
             "D 512 without rope: q_rope a zero row of stride 0");
    st_free(&P);
    /* D 384 + 64: all of q's columns in the value part (the rope part zero); D 480 + 64: both
       parts buffered, one 576-wide row */
    s.D = 384, s.Dr = 64, s.concat = 1;
    st_make(&P, &s, &r);
    p = problem_of(&P, 1);
    spattn_sfa_pack_plan(&p, 1, &d);
    TU_CHECK(g[SPATTN_PACK_GQ].state[0] == SPATTN_PACK_BUF && g[SPATTN_PACK_GQ].state[1] == SPATTN_PACK_ZERO &&
                 g[SPATTN_PACK_GQ].b0 == 0 && g[SPATTN_PACK_GQ].b1 == 512 && g[SPATTN_PACK_GO].b1 == 512 &&
                 g[SPATTN_PACK_GDQ].b1 == 576,
             "D 384 + 64: q' buffered in 512-wide rows, its rope part zero; dQ' 576 wide");
    TU_CHECK(spattn_sfa_pack_needs_copy_back(&d), "D 384 + 64: outputs copied back");
    st_free(&P);
    s.D = 480, s.Dr = 64;
    st_make(&P, &s, &r);
    p = problem_of(&P, 1);
    spattn_sfa_pack_plan(&p, 1, &d);
    unsigned char *base = aligned_alloc(256, (d.bytes + 255) / 256 * 256);
    spattn_sfa_pack_bind(&d, base);
    TU_CHECK(g[SPATTN_PACK_GQ].state[0] == SPATTN_PACK_BUF && g[SPATTN_PACK_GQ].state[1] == SPATTN_PACK_BUF &&
                 g[SPATTN_PACK_GQ].b0 == 0 && g[SPATTN_PACK_GQ].b1 == 576,
             "D 480 + 64: q' in 576-wide buffered rows");
    TU_CHECK(d.pp.q_rope->strides[2] == 576 && (char *)d.pp.q_rope->data == (char *)d.pp.q->data + 512 * 2,
             "D 480 + 64: the rope part at column 512 of the buffered rows");
    free(base);
    st_free(&P);
}

/* ---- varlen: packed or paged keys, empty sequences, tokens past cu_seqlens_q[B] ------------ */
typedef struct {
    void *mem;
    spattn_tensor t;
} vbuf;
static vbuf vmake(int32_t dt, int nd, const int64_t *shape, tu_rng *r, int fill) {
    vbuf b;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    b.mem = malloc((size_t)(n ? n : 1) * st_esize(dt) + 16);
    b.t = spattn_tensor_make(b.mem, (spattn_dtype)dt, nd, shape, NULL);
    for (int64_t i = 0; i < n; i++) spattn_store_f32(b.mem, dt, i, fill ? (float)tu_normal(r) : NAN);
    return b;
}
/* equal, both NaN (unwritten in both) or within the dtype's eco tolerance */
static int close_all(const char *what, const spattn_tensor *a, const spattn_tensor *b, int32_t dt) {
    double at, rt;
    st_tol(dt, &at, &rt);
    int64_t n = 1, bad = 0;
    for (int i = 0; i < a->ndim; i++) n *= a->shape[i];
    for (int64_t i = 0; i < n; i++) {
        const double x = spattn_load_f32(a->data, a->dtype, i), y = spattn_load_f32(b->data, b->dtype, i);
        if (x == y || (isnan(x) && isnan(y))) continue; /* equal (-inf LSE of a row without keys), or unwritten */
        if (!(fabs(x - y) <= at + rt * fabs(y))) {
            if (getenv("PACK_DEBUG")) fprintf(stderr, "    %s[%lld]: packed %g direct %g\n", what, (long long)i, x, y);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "  %s: %lld of %lld elements differ\n", what, (long long)bad, (long long)n);
    return bad == 0;
}

/* One varlen problem (3 sequences, the second without query tokens, two token rows past
   cu_seqlens_q[B]; keys packed or in shuffled pages of ps rows) run directly and packed into the
   MLA columns on the CPU, forward then deterministic backward: the same outputs (eco), the rows
   past cu_seqlens_q[B] unwritten (NaN) in both */
static void run_varlen_case(int ci, int shared, int64_t D, int64_t Dr, int32_t dt, int64_t ps, tu_rng *r) {
    enum { NS = 3 };
    const int64_t N1 = 4, N2 = 2, K = 6, sbs = 4;
    int32_t cu_q[NS + 1] = {0}, cu_kv[NS + 1] = {0};
    int64_t max_q = 0, max_kv = 0, pages = 0, max_pages = 0;
    for (int b = 0; b < NS; b++) {
        const int64_t lq = b == 1 ? 0 : tu_range(r, 1, 5), lk = tu_range(r, 1, 40);
        cu_q[b + 1] = cu_q[b] + (int32_t)lq;
        cu_kv[b + 1] = cu_kv[b] + (int32_t)lk;
        max_q = lq > max_q ? lq : max_q;
        max_kv = lk > max_kv ? lk : max_kv;
        const int64_t np = ps ? (lk + ps - 1) / ps : 0;
        pages += np;
        max_pages = np > max_pages ? np : max_pages;
    }
    const int64_t Tq = cu_q[NS] + 2;
    int32_t table[NS * 40];
    const int64_t num_pages = pages + 1, Tkv = ps ? num_pages * ps : cu_kv[NS];
    if (ps) { /* pages handed out in a shuffled order, one spare */
        int32_t perm[NS * 40 + 1];
        for (int i = 0; i < num_pages; i++) perm[i] = i;
        for (int i = (int)num_pages - 1; i > 0; i--) {
            const int j = (int)tu_range(r, 0, i), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        int next = 0;
        for (int b = 0; b < NS; b++)
            for (int j = 0; j < max_pages; j++)
                table[b * max_pages + j] = j < (cu_kv[b + 1] - cu_kv[b] + ps - 1) / ps ? perm[next++] : 0;
    }
    const int64_t sq[3] = {Tq, N1, D}, sqr[3] = {Tq, N1, Dr}, sl[2] = {Tq, N1}, si[3] = {Tq, N2, K};
    const int64_t sk3[3] = {Tkv, N2, D}, skr3[3] = {Tkv, N2, Dr};
    const int64_t sk4[4] = {num_pages, ps, N2, D}, skr4[4] = {num_pages, ps, N2, Dr};
    const int knd = ps ? 4 : 3;
    const int64_t *skk = ps ? sk4 : sk3, *skkr = ps ? skr4 : skr3;
    vbuf q = vmake(dt, 3, sq, r, 1), qr = vmake(dt, 3, sqr, r, 1), k = vmake(dt, knd, skk, r, 1),
         kr = vmake(dt, knd, skkr, r, 1), v = vmake(dt, knd, skk, r, 1), dout = vmake(dt, 3, sq, r, 1);
    vbuf o[2], lse[2], dq[2], dqr[2], dk[2], dkr[2], dv[2];
    for (int w = 0; w < 2; w++) {
        o[w] = vmake(dt, 3, sq, r, 0);
        lse[w] = vmake(SPATTN_DTYPE_F32, 2, sl, r, 0);
        dq[w] = vmake(dt, 3, sq, r, 0);
        dqr[w] = vmake(dt, 3, sqr, r, 0);
        dk[w] = vmake(dt, knd, skk, r, 0);
        dkr[w] = vmake(dt, knd, skkr, r, 0);
        dv[w] = vmake(dt, knd, skk, r, 0);
    }
    int32_t *idx = malloc((size_t)(Tq * N2 * K) * 4);
    for (int64_t t = 0; t < Tq; t++) {
        int b = 0;
        while (b < NS && t >= cu_q[b + 1]) b++;
        const int64_t nblk = b < NS ? (cu_kv[b + 1] - cu_kv[b] + sbs - 1) / sbs : 0;
        for (int64_t j = 0; j < N2 * K; j++)
            idx[t * N2 * K + j] = nblk && tu_uniform(r) > 0.2 ? (int32_t)tu_range(r, 0, nblk - 1) : -1;
    }
    spattn_tensor tidx = spattn_tensor_make(idx, SPATTN_DTYPE_I32, 3, si, NULL);
    spattn_seqs seqs;
    memset(&seqs, 0, sizeof seqs);
    seqs.B = NS;
    seqs.cu_q = cu_q;
    seqs.cu_kv = cu_kv;
    seqs.cu_q_st = seqs.cu_kv_st = 1;
    seqs.Tq = Tq;
    seqs.Tkv = Tkv;
    seqs.max_q = max_q;
    seqs.max_kv = max_kv;
    if (ps) {
        seqs.table = table;
        seqs.tab_s0 = max_pages;
        seqs.tab_s1 = 1;
        seqs.max_pages = max_pages;
        seqs.page_size = ps;
        seqs.num_pages = num_pages;
    }
    char name[200];
    snprintf(name, sizeof name, "varlen case %d: shared=%d D=%lld Dr=%lld %s page_size=%lld", ci, shared,
             (long long)D, (long long)Dr, spattn_dtype_name((spattn_dtype)dt), (long long)ps);
    for (int backward = 0; backward < 2; backward++) {
        for (int w = 0; w < 2; w++) { /* 0: the problem itself, 1: packed into the MLA columns */
            spattn_sfa_problem p;
            memset(&p, 0, sizeof p);
            p.q = &q.t;
            p.q_rope = Dr ? &qr.t : NULL;
            p.k = &k.t;
            p.k_rope = Dr ? &kr.t : NULL;
            p.v = shared ? NULL : &v.t;
            p.idx = &tidx;
            p.o = &o[backward ? 0 : w].t; /* the backward reads the direct forward's o and lse */
            p.lse = &lse[backward ? 0 : w].t;
            if (backward) {
                p.dout = &dout.t;
                p.dq = &dq[w].t;
                p.dq_rope = Dr ? &dqr[w].t : NULL;
                p.dk = &dk[w].t;
                p.dk_rope = Dr ? &dkr[w].t : NULL;
                p.dv = shared ? NULL : &dv[w].t;
            }
            p.B = NS;
            p.S1 = max_q;
            p.S2 = max_kv;
            p.N1 = N1;
            p.N2 = N2;
            p.D = D;
            p.Dr = Dr;
            p.K = K;
            p.sbs = sbs;
            p.nblk = (max_kv + sbs - 1) / sbs;
            p.mode = ci % 2 ? 3 : 0;
            p.shared_kv = shared;
            p.scale = (float)(1.0 / sqrt((double)(D + Dr)));
            p.dtype = dt;
            p.seqs = &seqs;
            spattn_exec ex;
            memset(&ex, 0, sizeof ex);
            ex.deterministic = 1;
            spattn_sfa_pack d;
            const spattn_status st = w ? run_packed_p(&p, backward, &d)
                                       : backward ? spattn_cpu_sfa_bwd(&p, &ex) : spattn_cpu_sfa_fwd(&p, &ex);
            TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: %s %s status %d (%s)", name, w ? "packed" : "direct",
                     backward ? "bwd" : "fwd", st, spattn_last_error());
        }
        if (!backward) {
            TU_CHECK(close_all("o", &o[1].t, &o[0].t, dt) && close_all("lse", &lse[1].t, &lse[0].t, SPATTN_DTYPE_F32),
                     "%s: packed forward = direct forward (rows past cu_seqlens_q unwritten in both)", name);
        } else {
            int ok = close_all("dq", &dq[1].t, &dq[0].t, dt) && close_all("dk", &dk[1].t, &dk[0].t, dt);
            if (Dr) ok = ok && close_all("dq_rope", &dqr[1].t, &dqr[0].t, dt) && close_all("dk_rope", &dkr[1].t, &dkr[0].t, dt);
            if (!shared) ok = ok && close_all("dv", &dv[1].t, &dv[0].t, dt);
            TU_CHECK(ok, "%s: packed backward = direct backward", name);
        }
    }
    vbuf *all[] = {&q, &qr, &k, &kr, &v, &dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]->mem);
    for (int w = 0; w < 2; w++) {
        vbuf *outs[] = {&o[w], &lse[w], &dq[w], &dqr[w], &dk[w], &dkr[w], &dv[w]};
        for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) free(outs[i]->mem);
    }
    free(idx);
}

int main(void) {
    const uint64_t seed = tu_test_seed(0x5fa9ac);
    check_plans();
    const int F32 = SPATTN_DTYPE_F32, F16 = SPATTN_DTYPE_F16, BF = SPATTN_DTYPE_BF16;
    /* shared / separate, D, Dr, dtype, concat, layout */
    const int fixed[][6] = {
        {1, 512, 0, BF, 0, 0},  {1, 384, 64, F32, 1, 1}, {1, 320, 32, BF, 0, 3}, {1, 128, 128, F32, 0, 2},
        {1, 448, 128, F16, 1, 0}, {1, 512, 8, F32, 0, 0}, {1, 8, 0, F32, 0, 1},  {0, 288, 0, F32, 0, 0},
        {0, 200, 96, BF, 0, 1}, {0, 128, 64, F32, 1, 0}, {0, 256, 64, F16, 0, 2}, {1, 320, 256, BF, 0, 0},
    };
    int ci = 0;
    for (size_t c = 0; c < sizeof fixed / sizeof fixed[0]; c++, ci++) {
        st_shape s;
        memset(&s, 0, sizeof s);
        s.B = 2, s.S1 = 6, s.S2 = 70, s.N2 = 2, s.N1 = 6, s.K = 10, s.sbs = 4, s.mode = ci % 3 ? 3 : 0;
        s.shared_kv = fixed[c][0], s.D = fixed[c][1], s.Dr = fixed[c][2], s.dtype = fixed[c][3];
        s.concat = fixed[c][4], s.layout = fixed[c][5];
        s.dup_p = 0.1, s.pad_p = 0.2, s.empty_p = 0.1;
        run_case(ci, &s, seed + (uint64_t)ci);
    }
    /* random shapes of the map */
    tu_rng r;
    tu_seed(&r, seed ^ 0x9ac4ull);
    const int dts[] = {F32, F16, BF}, sbss[] = {1, 2, 4, 16, 64};
    for (int c = 0; c < (st_quick() ? 6 : 20); c++, ci++) {
        st_shape s;
        memset(&s, 0, sizeof s);
        s.B = tu_range(&r, 1, 2);
        s.S1 = tu_range(&r, 1, 12);
        s.S2 = tu_range(&r, 1, 90);
        s.N2 = tu_range(&r, 1, 2);
        s.N1 = s.N2 * tu_range(&r, 1, 5);
        s.shared_kv = (int32_t)tu_range(&r, 0, 1);
        s.D = 8 * tu_range(&r, 1, s.shared_kv ? 64 : 36);
        const int64_t room = s.shared_kv ? 576 - s.D : 576 - 2 * s.D;  /* the API: Dr <= 256 */
        s.Dr = 8 * tu_range(&r, 0, (room < 256 ? room : 256) / 8);
        s.sbs = sbss[tu_range(&r, 0, 4)];
        s.K = tu_range(&r, 1, 2 + (s.S2 + s.sbs - 1) / s.sbs);
        s.mode = tu_range(&r, 0, 3) ? 3 : 0;
        s.dtype = dts[tu_range(&r, 0, 2)];
        s.concat = (int)tu_range(&r, 0, 1);
        s.layout = (int)tu_range(&r, 0, s.concat ? 2 : 3);
        s.dup_p = tu_uniform(&r) * 0.2;
        s.pad_p = tu_uniform(&r) * 0.3;
        s.empty_p = tu_uniform(&r) * 0.2;
        run_case(ci, &s, seed + (uint64_t)ci);
    }
    /* varlen: shared / separate, D, Dr, dtype, page size (0: packed keys) */
    const int vcases[][5] = {{1, 512, 0, BF, 16}, {1, 384, 64, F32, 0}, {0, 288, 0, F32, 4}, {1, 128, 128, F16, 1},
                             {0, 200, 96, F32, 0}, {1, 320, 32, BF, 4}};
    for (size_t c = 0; c < sizeof vcases / sizeof vcases[0]; c++, ci++)
        run_varlen_case(ci, vcases[c][0], vcases[c][1], vcases[c][2], vcases[c][3], vcases[c][4], &r);
    return tu_summary("test_sfa_pack");
}
