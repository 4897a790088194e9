/*
 * sfa varlen with a generous max_seqlen_kv (callers such as vLLM / flash-attn pass an upper
 * bound): max_seqlen_kv = 2^27 on a few real keys must not cost memory proportional to it.
 * The CPU backward used to size its per-thread duplicate marks from max_seqlen_kv (128 MiB per
 * thread here, 4 GB with 32 threads).  For packed and paged keys, both modes, shared and
 * separate v, with and without rope, 1..3 threads:
 *   - spattn_sfa_varlen_workspace_size (forward and backward) stays small (< 64 MB);
 *   - the calls succeed, with the library's allocation and with a caller workspace of exactly
 *     the queried size (one byte less is refused);
 *   - o, lse, dq, dq_rope, dk, dk_rope, dv are bitwise those of max_seqlen_kv = the real max.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "spattn.h"
#include "testutil.h"

#define BIG_MAX ((int64_t)1 << 27)
#define WS_LIMIT ((size_t)64 << 20)

typedef struct buf {
    spattn_tensor t;
    void *mem;
    size_t bytes;
} buf;

static buf mk(spattn_dtype dt, int nd, const int64_t *shape) {
    buf b;
    int64_t st[SPATTN_MAX_DIMS], n = 1;
    for (int i = nd - 1; i >= 0; i--) {
        st[i] = n;
        n *= shape[i];
    }
    b.bytes = (size_t)n * (dt == SPATTN_DTYPE_I32 || dt == SPATTN_DTYPE_F32 ? 4 : 2);
    b.mem = malloc(b.bytes ? b.bytes : 1);
    memset(b.mem, 0xA5, b.bytes);
    b.t = spattn_tensor_make(b.mem, dt, nd, shape, st);
    return b;
}
static void fill(buf *b, tu_rng *r) {
    float *x = (float *)b->mem;
    for (size_t i = 0; i < b->bytes / 4; i++) x[i] = (float)(2.0 * tu_uniform(r) - 1.0);
}

typedef struct outs {
    buf o, lse, dq, dqr, dk, dkr, dv;
} outs;

typedef struct prob {
    int64_t B, N1, N2, D, Dr, K, sbs;
    int32_t mode;
    int shared, paged;
    buf q, qr, k, kr, v, g, idx, cuq, cukv, table;
    int64_t Tq, maxq, maxk;
} prob;

static void outs_make(const prob *p, outs *u) {
    int64_t so[3] = {p->Tq, p->N1, p->D}, sr[3] = {p->Tq, p->N1, p->Dr > 0 ? p->Dr : 8};
    int64_t sl[2] = {p->Tq, p->N1};
    u->o = mk(SPATTN_DTYPE_F32, 3, so);
    u->lse = mk(SPATTN_DTYPE_F32, 2, sl);
    u->dq = mk(SPATTN_DTYPE_F32, 3, so);
    u->dqr = mk(SPATTN_DTYPE_F32, 3, sr);
    int64_t sk[4];
    memcpy(sk, p->k.t.shape, sizeof sk);
    u->dk = mk(SPATTN_DTYPE_F32, p->k.t.ndim, sk);
    u->dv = mk(SPATTN_DTYPE_F32, p->k.t.ndim, sk);
    sk[p->k.t.ndim - 1] = p->Dr > 0 ? p->Dr : 8;
    u->dkr = mk(SPATTN_DTYPE_F32, p->k.t.ndim, sk);
}
static void outs_free(outs *u) {
    buf *b[] = {&u->o, &u->lse, &u->dq, &u->dqr, &u->dk, &u->dkr, &u->dv};
    for (int i = 0; i < 7; i++) free(b[i]->mem);
}
static int outs_same(const prob *p, const outs *a, const outs *b) {
    int same = !memcmp(a->o.mem, b->o.mem, a->o.bytes) && !memcmp(a->lse.mem, b->lse.mem, a->lse.bytes) &&
               !memcmp(a->dq.mem, b->dq.mem, a->dq.bytes) && !memcmp(a->dk.mem, b->dk.mem, a->dk.bytes);
    if (p->Dr) same = same && !memcmp(a->dqr.mem, b->dqr.mem, a->dqr.bytes) &&
                      !memcmp(a->dkr.mem, b->dkr.mem, a->dkr.bytes);
    if (!p->shared) same = same && !memcmp(a->dv.mem, b->dv.mem, a->dv.bytes);
    return same;
}

static spattn_varlen vl_of(const prob *p, int64_t maxk) {
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &p->cuq.t;
    vl.cu_seqlens_kv = &p->cukv.t;
    vl.max_seqlen_q = p->maxq;
    vl.max_seqlen_kv = maxk;
    vl.block_table = p->paged ? &p->table.t : NULL;
    return vl;
}

static spattn_status wsize(const prob *p, int64_t maxk, int bwd, int threads, size_t *bytes) {
    spattn_varlen vl = vl_of(p, maxk);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = threads;
    return spattn_sfa_varlen_workspace_size(&p->q.t, p->Dr ? &p->qr.t : NULL, &p->k.t,
                                            p->Dr ? &p->kr.t : NULL, p->shared ? NULL : &p->v.t,
                                            &p->idx.t, p->sbs, p->mode, &vl, bwd, &opt, bytes);
}

/* fwd then bwd; ws_mode 0: library allocates, 1: caller workspace of exactly the queried size,
 * 2: one byte less (both calls must be refused; returns the bwd status). */
static spattn_status run(const prob *p, int64_t maxk, int threads, int ws_mode, outs *u) {
    spattn_varlen vl = vl_of(p, maxk);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.num_threads = threads;
    const spattn_tensor *qr = p->Dr ? &p->qr.t : NULL, *kr = p->Dr ? &p->kr.t : NULL;
    const spattn_tensor *v = p->shared ? NULL : &p->v.t, *dv = p->shared ? NULL : &u->dv.t;
    const spattn_tensor *dqr = p->Dr ? &u->dqr.t : NULL, *dkr = p->Dr ? &u->dkr.t : NULL;
    void *ws = NULL;
    size_t bytes = 0;
    if (ws_mode) {
        TU_CHECK(wsize(p, maxk, 0, threads, &bytes) == SPATTN_STATUS_SUCCESS, "fwd size: %s",
                 spattn_last_error());
        if (ws_mode == 2) bytes--;
        ws = malloc(bytes);
        opt.workspace = ws;
        opt.workspace_size = bytes;
    }
    spattn_status st = spattn_sfa_fwd_varlen(&p->q.t, qr, &p->k.t, kr, v, &p->idx.t, p->sbs,
                                             p->mode, 0.0, &vl, &u->o.t, &u->lse.t, &opt);
    if (ws_mode == 2) {
        TU_CHECK(st != SPATTN_STATUS_SUCCESS, "fwd accepted a workspace one byte short");
        free(ws);
        /* the backward needs o / lse: run the forward with the library's workspace */
        opt.workspace = NULL;
        opt.workspace_size = 0;
        st = spattn_sfa_fwd_varlen(&p->q.t, qr, &p->k.t, kr, v, &p->idx.t, p->sbs, p->mode, 0.0,
                                   &vl, &u->o.t, &u->lse.t, &opt);
        ws = NULL;
    }
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "fwd (max_seqlen_kv %lld, %d threads, ws %d): %s",
             (long long)maxk, threads, ws_mode, spattn_last_error());
    free(ws);
    ws = NULL;
    if (st) return st;
    if (ws_mode) {
        TU_CHECK(wsize(p, maxk, 1, threads, &bytes) == SPATTN_STATUS_SUCCESS, "bwd size: %s",
                 spattn_last_error());
        if (ws_mode == 2) bytes--;
        ws = malloc(bytes);
        opt.workspace = ws;
        opt.workspace_size = bytes;
    }
    st = spattn_sfa_bwd_varlen(&p->q.t, qr, &p->k.t, kr, v, &u->o.t, &p->g.t, &u->lse.t, &p->idx.t,
                               p->sbs, p->mode, 0.0, &vl, &u->dq.t, dqr, &u->dk.t, dkr, dv, &opt);
    free(ws);
    if (ws_mode == 2) {
        TU_CHECK(st != SPATTN_STATUS_SUCCESS, "bwd accepted a workspace one byte short");
        return st;
    }
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "bwd (max_seqlen_kv %lld, %d threads, ws %d): %s",
             (long long)maxk, threads, ws_mode, spattn_last_error());
    return st;
}

static void one_case(tu_rng *r, int paged, int shared, int32_t mode, int64_t Dr, int quick) {
    prob p;
    memset(&p, 0, sizeof p);
    p.B = tu_range(r, 1, 4);
    p.N2 = tu_range(r, 1, 2);
    p.N1 = p.N2 * tu_range(r, 1, 2);
    p.D = 8 * tu_range(r, 1, quick ? 1 : 2);
    p.Dr = Dr;
    p.K = tu_range(r, 1, 4);
    p.sbs = (int64_t[]){1, 2}[tu_range(r, 0, 1)]; /* <= every real max: same tiling */
    p.mode = mode;
    p.shared = shared;
    p.paged = paged;
    int64_t lq[4], lk[4], Tq = 0, Tk = 0, maxq = 1, maxk = 2;
    for (int64_t b = 0; b < p.B; b++) {
        lq[b] = tu_range(r, 0, 5);
        lk[b] = tu_range(r, 0, 9);
        if (b == 0 && lk[b] < 2) lk[b] = 2;
        Tq += lq[b];
        Tk += lk[b];
        if (lq[b] > maxq) maxq = lq[b];
        if (lk[b] > maxk) maxk = lk[b];
    }
    if (Tq == 0) {
        lq[0] = 1;
        Tq = 1;
    }
    p.Tq = Tq + tu_range(r, 0, 2); /* rows past cu_q[B] */
    p.maxq = maxq;
    p.maxk = maxk;
    int64_t b1[1] = {p.B + 1};
    p.cuq = mk(SPATTN_DTYPE_I32, 1, b1);
    p.cukv = mk(SPATTN_DTYPE_I32, 1, b1);
    int32_t *cq = (int32_t *)p.cuq.mem, *ck = (int32_t *)p.cukv.mem;
    cq[0] = ck[0] = 0;
    for (int64_t b = 0; b < p.B; b++) {
        cq[b + 1] = cq[b] + (int32_t)lq[b];
        ck[b + 1] = ck[b] + (int32_t)lk[b];
    }
    const int64_t Dk = p.D, Drk = Dr > 0 ? Dr : 8;
    if (paged) {
        const int64_t ps = 4, maxp = (maxk + ps - 1) / ps, np = p.B * maxp + 1;
        int64_t st[2] = {p.B, maxp}, sk[4] = {np, ps, p.N2, Dk}, skr[4] = {np, ps, p.N2, Drk};
        p.table = mk(SPATTN_DTYPE_I32, 2, st);
        int32_t *tb = (int32_t *)p.table.mem;
        int32_t perm[64]; /* np <= 4 * 3 + 1: shuffled pages, every slot its own page */
        for (int64_t i = 0; i < np; i++) perm[i] = (int32_t)i;
        for (int64_t i = np - 1; i > 0; i--) {
            int64_t j = tu_range(r, 0, i);
            int32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int64_t i = 0; i < p.B * maxp; i++) tb[i] = perm[i];
        p.k = mk(SPATTN_DTYPE_F32, 4, sk);
        p.v = mk(SPATTN_DTYPE_F32, 4, sk);
        p.kr = mk(SPATTN_DTYPE_F32, 4, skr);
    } else {
        int64_t T = Tk + tu_range(r, 0, 2);
        int64_t sk[3] = {T, p.N2, Dk}, skr[3] = {T, p.N2, Drk};
        p.k = mk(SPATTN_DTYPE_F32, 3, sk);
        p.v = mk(SPATTN_DTYPE_F32, 3, sk);
        p.kr = mk(SPATTN_DTYPE_F32, 3, skr);
    }
    int64_t sq[3] = {p.Tq, p.N1, p.D}, sqr[3] = {p.Tq, p.N1, Drk}, si[3] = {p.Tq, p.N2, p.K};
    p.q = mk(SPATTN_DTYPE_F32, 3, sq);
    p.qr = mk(SPATTN_DTYPE_F32, 3, sqr);
    p.g = mk(SPATTN_DTYPE_F32, 3, sq);
    p.idx = mk(SPATTN_DTYPE_I32, 3, si);
    buf *fl[] = {&p.q, &p.qr, &p.g, &p.k, &p.v, &p.kr};
    for (int i = 0; i < 6; i++) fill(fl[i], r);
    int32_t *ix = (int32_t *)p.idx.mem;
    for (int64_t b = 0; b < p.B; b++) {
        int64_t nb = (lk[b] + p.sbs - 1) / p.sbs;
        for (int64_t i = cq[b]; i < cq[b + 1]; i++)
            for (int64_t e = 0; e < p.N2 * p.K; e++)
                ix[i * p.N2 * p.K + e] = nb == 0 || tu_range(r, 0, 5) == 0
                                             ? -1
                                             : (int32_t)tu_range(r, 0, nb - 1); /* dups allowed */
    }
    for (int64_t i = cq[p.B] * p.N2 * p.K; i < p.Tq * p.N2 * p.K; i++) ix[i] = 0x7fffffff;

    char desc[160];
    snprintf(desc, sizeof desc, "paged %d shared %d mode %d Dr %lld B %lld K %lld sbs %lld maxk %lld",
             paged, shared, mode, (long long)Dr, (long long)p.B, (long long)p.K, (long long)p.sbs,
             (long long)maxk);
    outs ref;
    outs_make(&p, &ref);
    run(&p, maxk, 1, 0, &ref);
    for (int threads = 1; threads <= 3; threads++) {
        for (int bwd = 0; bwd <= 1; bwd++) {
            size_t big = 0, real = 0;
            TU_CHECK(wsize(&p, BIG_MAX, bwd, threads, &big) == SPATTN_STATUS_SUCCESS, "%s: size %s",
                     desc, spattn_last_error());
            TU_CHECK(wsize(&p, maxk, bwd, threads, &real) == SPATTN_STATUS_SUCCESS, "%s: size %s",
                     desc, spattn_last_error());
            TU_CHECK(big < WS_LIMIT, "%s: %s workspace for max_seqlen_kv 2^27, %d threads: %zu bytes "
                     "(real max: %zu)", desc, bwd ? "bwd" : "fwd", threads, big, real);
            if (threads == 1 && bwd && !paged && !shared && !mode && Dr == 0)
                printf("%s: bwd workspace, 1 thread: %zu bytes for max_seqlen_kv 2^27, %zu for the "
                       "real max\n", desc, big, real);
        }
        for (int ws_mode = 0; ws_mode <= (quick && threads > 1 ? 1 : 2); ws_mode++) {
            outs u;
            outs_make(&p, &u);
            spattn_status st = run(&p, BIG_MAX, threads, ws_mode, &u);
            if (ws_mode < 2 && st == SPATTN_STATUS_SUCCESS)
                TU_CHECK(outs_same(&p, &ref, &u),
                         "%s: max_seqlen_kv 2^27 (%d threads, ws %d) differs from the real max",
                         desc, threads, ws_mode);
            outs_free(&u);
        }
    }
    outs_free(&ref);
    buf *all[] = {&p.q, &p.qr, &p.k, &p.kr, &p.v, &p.g, &p.idx, &p.cuq, &p.cukv};
    for (int i = 0; i < 9; i++) free(all[i]->mem);
    if (paged) free(p.table.mem);
}

int main(void) {
    tu_rng r;
    tu_seed(&r, tu_test_seed(2727));
    const int quick = getenv("SPATTN_TEST_QUICK") != NULL;
    const int reps = quick ? 1 : 3;
    for (int rep = 0; rep < reps; rep++)
        for (int paged = 0; paged <= 1; paged++)
            for (int shared = 0; shared <= 1; shared++)
                for (int mode = 0; mode <= 1; mode++)
                    one_case(&r, paged, shared, mode ? SPATTN_SFA_MODE_CAUSAL : SPATTN_SFA_MODE_NONE,
                             (rep + paged + shared) % 2 ? 8 : 0, quick);
    return tu_summary("test_sfa_varlen_bigmax");
}
