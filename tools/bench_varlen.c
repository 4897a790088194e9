/*
 * `spattn bench --varlen-baselines` (issue 14, item 6): beside the packed call of a varlen case,
 * the two ways to do the same work without varlen support, timed like the packed call and
 * checked against a packed call's outputs with the eco criterion (run_varlen.h):
 *   loop       one dense call per sequence (spattn_*_fwd_ex / _bwd_ex) on views into the packed
 *              tensors; sequences without queries or without keys are skipped (the O = 0,
 *              LSE = -inf rows of those without keys are filled before the timed calls).
 *   blockdiag  one dense call over all tokens (B = 1): bsa with Sq = Tq, Skv = Tkv and every
 *              sequence's mask blocks on the diagonal; sfa with the indices shifted to global
 *              key positions (mode 3: the causal limit applied as -1 entries, a mode 0 call).
 * bsa: when a sequence's first query (key) token is not a multiple of bx (by), its blocks would
 * share a block row (column) with its neighbour's; then every sequence but the last is padded
 * with zero rows to whole blocks (queries to bx, keys to by).  Padding adds work (reported as
 * the variant's own FLOPs) and changes the outputs, so the padded call is checked against a
 * packed call over the same padded batch.  sfa with sbs > 1: skipped in mode 3 (a causal limit
 * inside a block has no mode-0 form) and where a sequence's keys do not start on a multiple of
 * sbs or its last block would reach the next sequence's keys.
 * Paged cases: the baselines, and the packed call they are checked against, read the packed
 * copy of the keys (the dense entry points take no block table).
 * Timing as sp_bench_varlen: wall clock around each pass (all calls of the loop), followed on
 * CUDA by a device synchronisation.  The dense calls are the plain entry points (no plan), as
 * the varlen calls have none.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_varlen.h"

#ifdef SPATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* ---- one set of buffers (host, and device copies on CUDA) ---- */

typedef struct side {
    sp_vl_bufs h, d;
    int dev; /* the calls run on the device copies */
} side;

static const sp_vl_bufs *side_use(const side *s) { return s->dev ? &s->d : &s->h; }

static int side_make(side *s, const sp_case *c, const sp_inputs *in, int backend, char *msg,
                     size_t msglen) {
    memset(s, 0, sizeof *s);
    if (sp_vl_host_bufs(c, in, &s->h)) {
        snprintf(msg, msglen, "out of memory allocating the baseline buffers");
        return -1;
    }
#ifdef SPATTN_HAVE_CUDA
    if (backend == SPATTN_BACKEND_CUDA) {
        s->dev = 1;
        if (sp_vl_dev_bufs(&s->h, &s->d, msg, msglen)) return -1;
    }
#else
    (void)backend;
#endif
    return 0;
}

static void side_free(side *s) {
#ifdef SPATTN_HAVE_CUDA
    if (s->dev) sp_vl_dev_bufs_free(&s->d);
#endif
    sp_vl_host_bufs_free(&s->h);
}

/* Copies buffer b host -> device (to_dev) or device -> host; nothing on the CPU. */
static int side_sync(side *s, int b, int to_dev, char *msg, size_t msglen) {
#ifdef SPATTN_HAVE_CUDA
    if (s->dev && s->h.bytes[b]) {
        cudaError_t e = to_dev ? cudaMemcpy(s->d.b[b], s->h.b[b], s->h.bytes[b],
                                            cudaMemcpyHostToDevice)
                               : cudaMemcpy(s->h.b[b], s->d.b[b], s->h.bytes[b],
                                            cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) {
            snprintf(msg, msglen, "CUDA: %s", cudaGetErrorString(e));
            return -1;
        }
    }
#else
    (void)s, (void)b, (void)to_dev, (void)msg, (void)msglen;
#endif
    return 0;
}

/* Buffer b of src into dst (same layout), where the calls read it. */
static int side_copy(side *dst, const side *src, int b, char *msg, size_t msglen) {
    const size_t n = src->h.bytes[b];
    if (n != dst->h.bytes[b]) {
        snprintf(msg, msglen, "internal: buffer sizes differ");
        return -1;
    }
    if (!n) return 0;
#ifdef SPATTN_HAVE_CUDA
    if (dst->dev) {
        cudaError_t e = cudaMemcpy(dst->d.b[b], src->d.b[b], n, cudaMemcpyDeviceToDevice);
        if (e != cudaSuccess) {
            snprintf(msg, msglen, "CUDA: %s", cudaGetErrorString(e));
            return -1;
        }
        return 0;
    }
#endif
    (void)msg, (void)msglen;
    memcpy(dst->h.b[b], src->h.b[b], n);
    return 0;
}

static void device_sync(int backend) {
#ifdef SPATTN_HAVE_CUDA
    if (backend == SPATTN_BACKEND_CUDA) cudaDeviceSynchronize();
#else
    (void)backend;
#endif
}

/* ---- token layouts: the case's own (keys packed) or padded to whole blocks (bsa) ---- */

typedef struct lay {
    sp_case c;   /* the case as the packed reference call sees it: page 0, maybe padded lengths */
    sp_inputs in; /* its inputs: the case's own, or the owned padded copies below */
    void *own[4]; /* padded q, k, v, dout */
    int32_t *own_cu[2];
    int padded;
} lay;

static void lay_plain(const sp_case *c, const sp_inputs *in, lay *L) {
    memset(L, 0, sizeof *L);
    L->c = *c;
    L->c.page = 0;
    L->in = *in;
    L->in.table = NULL;
    L->in.kpage = L->in.vpage = NULL;
    L->in.num_pages = L->in.max_pages = L->in.nkpage = L->in.nvpage = 0;
}

static void lay_free(lay *L) {
    for (int i = 0; i < 4; i++) free(L->own[i]);
    free(L->own_cu[0]);
    free(L->own_cu[1]);
    memset(L->own, 0, sizeof L->own);
    L->own_cu[0] = L->own_cu[1] = NULL;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* 1 when every sequence with queries starts on a multiple of bx and every one with keys on a
 * multiple of by: then no block row or column is shared by two sequences. */
static int bsa_aligned(const sp_case *c, const sp_inputs *in) {
    for (int64_t b = 0; b < c->B; b++)
        if ((c->lens[b] > 0 && in->cu_q[b] % c->bx) || (c->kvlens[b] > 0 && in->cu_kv[b] % c->by))
            return 0;
    return 1;
}

/* Copies the rows of every sequence from a packed [T, width] buffer to its padded place. */
static void spread_rows(const void *src, void *dst, const int32_t *cu, const int32_t *cu_pad,
                        int64_t B, int64_t width, size_t es) {
    for (int64_t b = 0; b < B; b++)
        memcpy((char *)dst + (size_t)(cu_pad[b] * width) * es,
               (const char *)src + (size_t)(cu[b] * width) * es,
               (size_t)((cu[b + 1] - cu[b]) * width) * es);
}

/* bsa: every sequence but the last padded with zero rows to whole blocks. */
static int lay_padded(const sp_case *c, const sp_inputs *in, lay *L) {
    lay_plain(c, in, L);
    L->padded = 1;
    int32_t *cq = calloc((size_t)(c->B + 1), sizeof *cq);
    int32_t *ck = calloc((size_t)(c->B + 1), sizeof *ck);
    L->own_cu[0] = cq;
    L->own_cu[1] = ck;
    if (!cq || !ck) return -1;
    int64_t mq = 1, mk = 1;
    for (int64_t b = 0; b < c->B; b++) {
        const int last = b == c->B - 1;
        L->c.lens[b] = (int32_t)(last ? c->lens[b] : round_up(c->lens[b], c->bx));
        L->c.kvlens[b] = (int32_t)(last ? c->kvlens[b] : round_up(c->kvlens[b], c->by));
        cq[b + 1] = cq[b] + L->c.lens[b];
        ck[b + 1] = ck[b] + L->c.kvlens[b];
        if (L->c.lens[b] > mq) mq = L->c.lens[b];
        if (L->c.kvlens[b] > mk) mk = L->c.kvlens[b];
    }
    L->c.Sq = mq; /* ceil(mq / bx) == in->nbx: the mask keeps its shape */
    L->c.Skv = mk;
    sp_inputs *p = &L->in;
    p->cu_q = cq;
    p->cu_kv = ck;
    p->Tq = cq[c->B];
    p->Tkv = ck[c->B];
    const int64_t wq = c->N * c->D, wk = c->Nkv * c->D;
    p->nq = p->ndout = p->Tq * wq;
    p->nk = p->nv = p->Tkv * wk;
    const size_t es = in->esize;
    for (int i = 0; i < 4; i++) {
        const int64_t n = i == 0 || i == 3 ? p->nq : p->nk;
        if (!(L->own[i] = calloc((size_t)(n ? n : 1), es))) return -1;
    }
    spread_rows(in->q, L->own[0], in->cu_q, cq, c->B, wq, es);
    spread_rows(in->k, L->own[1], in->cu_kv, ck, c->B, wk, es);
    spread_rows(in->v, L->own[2], in->cu_kv, ck, c->B, wk, es);
    spread_rows(in->dout, L->own[3], in->cu_q, cq, c->B, wq, es);
    p->q = L->own[0];
    p->k = L->own[1];
    p->v = L->own[2];
    p->dout = L->own[3];
    return 0;
}

/* ---- the block-diagonal problem: mask (bsa) or global indices (sfa) ---- */

/* bsa: [1, N, ceil(Tq/bx), ceil(Tkv/by)] with sequence b's blocks at its (aligned) offsets. */
static uint8_t *diag_mask(const lay *L, const sp_inputs *orig, int64_t *nbx, int64_t *nby) {
    const sp_case *c = &L->c;
    *nbx = (L->in.Tq + c->bx - 1) / c->bx;
    *nby = (L->in.Tkv + c->by - 1) / c->by;
    const int64_t n = c->N * *nbx * *nby;
    uint8_t *m = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!m) return NULL;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t rows = (c->lens[b] + c->bx - 1) / c->bx, cols = (c->kvlens[b] + c->by - 1) / c->by;
        const int64_t i0 = L->in.cu_q[b] / c->bx, j0 = L->in.cu_kv[b] / c->by;
        for (int64_t n = 0; n < c->N; n++)
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++)
                    m[(n * *nbx + i0 + i) * *nby + j0 + j] =
                        orig->mask[((b * c->N + n) * orig->nbx + i) * orig->nby + j];
    }
    return m;
}

/* sfa: why the indices have no exact global form (NULL: they have). */
static const char *sfa_diag_skip(const sp_case *c, const sp_inputs *in) {
    if (c->sbs == 1) return NULL;
    if (c->mode == SPATTN_SFA_MODE_CAUSAL)
        return "sfa mode 3 with sbs > 1: the causal limit cuts blocks, no mode-0 form";
    for (int64_t b = 0; b < c->B; b++)
        if (c->kvlens[b] > 0 && (in->cu_kv[b] % c->sbs ||
                                 (c->kvlens[b] % c->sbs && in->cu_kv[b + 1] != in->Tkv)))
            return "sfa sbs > 1: a sequence's keys do not start / end on a multiple of sbs";
    return NULL;
}

/* sfa: [Tq, N2, K] global block positions; mode 3's limit applied as -1 entries (sbs 1). */
static int32_t *diag_indices(const sp_case *c, const sp_inputs *in) {
    int32_t *g = malloc((size_t)(in->nidx ? in->nidx : 1) * sizeof *g);
    if (!g) return NULL;
    for (int64_t b = 0; b < c->B; b++) {
        const int64_t Sq = c->lens[b], Skv = c->kvlens[b], shift = in->cu_kv[b] / c->sbs;
        for (int64_t s = 0; s < Sq; s++) {
            const int64_t lim = c->mode == SPATTN_SFA_MODE_CAUSAL ? Skv - Sq + s : Skv - 1;
            const int64_t row = (in->cu_q[b] + s) * c->N2 * c->K;
            for (int64_t e = 0; e < c->N2 * c->K; e++) {
                const int64_t v = in->idx[row + e];
                g[row + e] = v < 0 || v * c->sbs > lim ? -1 : (int32_t)(v + shift);
            }
        }
    }
    return g;
}

/* ---- dense views (B = 1) of query tokens [q0, q0 + Sq) and keys [k0, k0 + Skv) ---- */

/* [1, H, S, D] over packed [T, H, width] rows starting at row r0. */
static spattn_tensor bnsd(void *base, int32_t dt, int32_t dev, int64_t r0, int64_t H, int64_t S,
                          int64_t D, int64_t width) {
    const size_t es = spattn_dtype_size((spattn_dtype)dt);
    int64_t shape[4] = {1, H, S, D};
    spattn_tensor t = sp_view((char *)base + (size_t)(r0 * H * width) * es, dt, dev, 4, shape, width);
    t.strides[0] = S * H * width;
    t.strides[1] = width;
    t.strides[2] = H * width;
    return t;
}

/* The views of one dense call; mask (bsa): its first block row of this part, head stride mh,
 * row stride mr. */
static void dense_views(const sp_case *c, const sp_vl_bufs *u, int32_t dev, int64_t q0,
                        int64_t Sq, int64_t k0, int64_t Skv, uint8_t *mask, int64_t mh,
                        int64_t mr, sp_tensors *t) {
    memset(t, 0, sizeof *t);
    const int32_t dt = c->dtype;
    const size_t es = spattn_dtype_size((spattn_dtype)dt);
    if (c->op == SP_OP_BSA) {
        const int64_t N = c->N, Nk = c->Nkv, D = c->D;
        t->q = bnsd(u->b[SP_B_Q], dt, dev, q0, N, Sq, D, D);
        t->dout = bnsd(u->b[SP_B_DOUT], dt, dev, q0, N, Sq, D, D);
        t->o = bnsd(u->b[SP_B_O], dt, dev, q0, N, Sq, D, D);
        t->dq = bnsd(u->b[SP_B_DQ], dt, dev, q0, N, Sq, D, D);
        t->k = bnsd(u->b[SP_B_K], dt, dev, k0, Nk, Skv, D, D);
        t->v = bnsd(u->b[SP_B_V], dt, dev, k0, Nk, Skv, D, D);
        t->dk = bnsd(u->b[SP_B_DK], dt, dev, k0, Nk, Skv, D, D);
        t->dv = bnsd(u->b[SP_B_DV], dt, dev, k0, Nk, Skv, D, D);
        int64_t sl[3] = {1, N, Sq};
        t->lse = sp_view((float *)u->b[SP_B_LSE] + q0 * N, SPATTN_DTYPE_F32, dev, 3, sl, 1);
        t->lse.strides[0] = Sq * N;
        t->lse.strides[1] = 1;
        t->lse.strides[2] = N;
        int64_t sm[4] = {1, N, (Sq + c->bx - 1) / c->bx, (Skv + c->by - 1) / c->by};
        t->mask = sp_view(mask, SPATTN_DTYPE_U8, dev, 4, sm, 1);
        t->mask.strides[0] = N * mh;
        t->mask.strides[1] = mh;
        t->mask.strides[2] = mr;
        t->mask.strides[3] = 1;
        t->has_v = 1;
        return;
    }
    const int64_t N1 = c->N1, N2 = c->N2, D = c->D, W = c->D + c->Dr;
    int64_t sq[4] = {1, Sq, N1, D}, sqr[4] = {1, Sq, N1, c->Dr};
    int64_t sk[4] = {1, Skv, N2, D}, skr[4] = {1, Skv, N2, c->Dr};
    int64_t si[4] = {1, Sq, N2, c->K}, sl[3] = {1, Sq, N1};
    char *q = (char *)u->b[SP_B_Q] + (size_t)(q0 * N1 * W) * es;
    char *dq = (char *)u->b[SP_B_DQ] + (size_t)(q0 * N1 * W) * es;
    char *k = (char *)u->b[SP_B_K] + (size_t)(k0 * N2 * W) * es;
    char *dk = (char *)u->b[SP_B_DK] + (size_t)(k0 * N2 * W) * es;
    t->has_rope = c->Dr > 0;
    t->has_v = !c->shared_kv;
    t->q = sp_view(q, dt, dev, 4, sq, W);
    t->dq = sp_view(dq, dt, dev, 4, sq, W);
    t->k = sp_view(k, dt, dev, 4, sk, W);
    t->dk = sp_view(dk, dt, dev, 4, sk, W);
    if (t->has_rope) {
        t->qr = sp_view(q + (size_t)D * es, dt, dev, 4, sqr, W);
        t->dqr = sp_view(dq + (size_t)D * es, dt, dev, 4, sqr, W);
        t->kr = sp_view(k + (size_t)D * es, dt, dev, 4, skr, W);
        t->dkr = sp_view(dk + (size_t)D * es, dt, dev, 4, skr, W);
    }
    if (t->has_v) {
        t->v = sp_view((char *)u->b[SP_B_V] + (size_t)(k0 * N2 * D) * es, dt, dev, 4, sk, D);
        t->dv = sp_view((char *)u->b[SP_B_DV] + (size_t)(k0 * N2 * D) * es, dt, dev, 4, sk, D);
    }
    t->o = sp_view((char *)u->b[SP_B_O] + (size_t)(q0 * N1 * D) * es, dt, dev, 4, sq, D);
    t->dout = sp_view((char *)u->b[SP_B_DOUT] + (size_t)(q0 * N1 * D) * es, dt, dev, 4, sq, D);
    t->idx = sp_view((int32_t *)u->b[SP_B_IDX] + q0 * N2 * c->K, SPATTN_DTYPE_I32, dev, 4, si, c->K);
    t->lse = sp_view((float *)u->b[SP_B_LSE] + q0 * N1, SPATTN_DTYPE_F32, dev, 3, sl, N1);
}

/* ---- calls, timing, comparison ---- */

typedef struct runctx {
    int pass, warmup, repeats, backend;
    spattn_options fwd, bwd; /* the forward's options and the backward's (--deterministic) */
} runctx;

/* The packed varlen call(s) of the pass over a layout: the reference outputs. */
static spattn_status packed_ref(const lay *L, side *s, const runctx *x) {
    sp_vl_tensors t;
    const sp_vl_bufs *u = side_use(s);
    sp_vl_tensors_make(&L->c, &L->in, u->b, u->cu_q, u->cu_kv, NULL,
                       s->dev ? SPATTN_DEVICE_CUDA : SPATTN_DEVICE_CPU, &t);
    spattn_status st = sp_vl_call_fwd(&L->c, &t, &x->fwd);
    if (st == SPATTN_STATUS_SUCCESS && x->pass == SP_PASS_BWD) st = sp_vl_call_bwd(&L->c, &t, &x->bwd);
    device_sync(x->backend);
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* `warmup` + `repeats` passes of n dense calls; stats[0..2] = median, min, max (ms). */
static spattn_status time_dense(const sp_case *dc, const sp_tensors *ts, int n, const runctx *x,
                                double *ms, double stats[3]) {
    spattn_status st = SPATTN_STATUS_SUCCESS;
    const spattn_options *opt = x->pass == SP_PASS_FWD ? &x->fwd : &x->bwd;
    for (int i = 0; i < x->warmup + x->repeats && st == SPATTN_STATUS_SUCCESS; i++) {
        double t0 = sp_now_ms();
        for (int s = 0; s < n && st == SPATTN_STATUS_SUCCESS; s++)
            st = x->pass == SP_PASS_FWD ? sp_call_fwd(dc, &ts[s], opt) : sp_call_bwd(dc, &ts[s], opt);
        device_sync(x->backend);
        if (i >= x->warmup) ms[i - x->warmup] = sp_now_ms() - t0;
    }
    if (st != SPATTN_STATUS_SUCCESS) return st;
    qsort(ms, (size_t)x->repeats, sizeof *ms, cmp_double);
    const int r = x->repeats;
    stats[0] = r % 2 ? ms[r / 2] : 0.5 * (ms[r / 2 - 1] + ms[r / 2]);
    stats[1] = ms[0];
    stats[2] = ms[r - 1];
    return st;
}

/* The outputs of the pass in `got` against `ref` (eco criterion, ref as the golden).
 * 1 all within it, 0 not (why in msg), -1 copy / memory failure (msg). */
static int compare_pass(const sp_case *c, int pass, side *ref, side *got, char *msg, size_t msglen) {
    static const char *const names[SP_B_COUNT] = {[SP_B_O] = "o", [SP_B_LSE] = "lse",
                                                  [SP_B_DQ] = "dq", [SP_B_DK] = "dk",
                                                  [SP_B_DV] = "dv"};
    const int first = pass == SP_PASS_FWD ? SP_B_O : SP_B_DQ;
    const int last = pass == SP_PASS_FWD ? SP_B_LSE : SP_B_DV;
    int same = 1;
    for (int b = first; b <= last; b++) {
        const int32_t dt = b == SP_B_LSE ? SPATTN_DTYPE_F32 : c->dtype;
        const int64_t n = (int64_t)(ref->h.bytes[b] / spattn_dtype_size((spattn_dtype)dt));
        if (!n) continue;
        if (side_sync(ref, b, 0, msg, msglen) || side_sync(got, b, 0, msg, msglen)) return -1;
        float *a = malloc((size_t)n * sizeof *a);
        double *g = malloc((size_t)n * sizeof *g);
        if (!a || !g) {
            free(a);
            free(g);
            snprintf(msg, msglen, "out of memory comparing the baseline outputs");
            return -1;
        }
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            a[i] = sp_load(got->h.b[b], dt, i);
            g[i] = sp_load(ref->h.b[b], dt, i);
        }
        sp_eco e;
        sp_eco_compare(a, g, n, sp_tol_for(dt), &e);
        if (!e.pass && same) {
            same = 0;
            snprintf(msg, msglen, "%s: matched %.4f, max |diff| %.3g", names[b], e.matched_ratio,
                     e.max_abs);
        }
        free(a);
        free(g);
    }
    return same;
}

/* The baseline's output buffers before its timed calls: the backward reads the reference's O
 * and LSE; the loop's forward skips sequences without keys, whose rows get LSE = -inf (O and
 * the gradients start at 0). */
static int prepare_outputs(const sp_case *c, const sp_inputs *in, int pass, int loop, side *ref,
                           side *s, char *msg, size_t msglen) {
    if (pass == SP_PASS_BWD)
        return side_copy(s, ref, SP_B_O, msg, msglen) || side_copy(s, ref, SP_B_LSE, msg, msglen)
                   ? -1 : 0;
    if (!loop) return 0;
    const int64_t heads = c->op == SP_OP_BSA ? c->N : c->N1;
    float *lse = s->h.b[SP_B_LSE];
    for (int64_t b = 0; b < c->B; b++)
        if (c->lens[b] > 0 && c->kvlens[b] == 0)
            for (int64_t r = in->cu_q[b] * heads; r < in->cu_q[b + 1] * heads; r++) lse[r] = -INFINITY;
    return side_sync(s, SP_B_LSE, 1, msg, msglen);
}

static void fail_call(spattn_status st, const char *what, int *status, char *msg, size_t msglen) {
    *status = st;
    snprintf(msg, msglen, "%s: %s: %s", what, spattn_status_str(st), spattn_last_error());
}

/* The loop: one dense call per sequence with queries and keys. */
static int run_loop(const lay *P, side *ref, const runctx *x, double *ms, sp_vl_base *res,
                    int *status, char *msg, size_t msglen) {
    const sp_case *c = &P->c;
    side s;
    sp_tensors *ts = calloc((size_t)c->B, sizeof *ts);
    int rc = -1;
    if (!ts) {
        snprintf(msg, msglen, "out of memory");
        return -1;
    }
    if (side_make(&s, c, &P->in, x->backend, msg, msglen) ||
        prepare_outputs(c, &P->in, x->pass, 1, ref, &s, msg, msglen))
        goto done;
    const sp_vl_bufs *u = side_use(&s);
    const int32_t dev = s.dev ? SPATTN_DEVICE_CUDA : SPATTN_DEVICE_CPU;
    const int64_t mh = P->in.nbx * P->in.nby;
    int n = 0;
    for (int64_t b = 0; b < c->B; b++) {
        if (c->lens[b] == 0 || c->kvlens[b] == 0) continue;
        uint8_t *m = c->op == SP_OP_BSA ? (uint8_t *)u->b[SP_B_MASK] + b * c->N * mh : NULL;
        dense_views(c, u, dev, P->in.cu_q[b], c->lens[b], P->in.cu_kv[b], c->kvlens[b], m, mh,
                    P->in.nby, &ts[n++]);
    }
    res->loop_calls = n;
    spattn_status st = time_dense(c, ts, n, x, ms, res->loop_ms);
    if (st != SPATTN_STATUS_SUCCESS) {
        fail_call(st, "loop", status, msg, msglen);
        goto done;
    }
    char why[256];
    const int same = compare_pass(c, x->pass, ref, &s, why, sizeof why);
    if (same < 0) {
        snprintf(msg, msglen, "%s", why);
        goto done;
    }
    if (!same) {
        res->same = 0;
        snprintf(res->mismatch, sizeof res->mismatch, "loop != packed call: %s", why);
    }
    rc = 0;
done:
    side_free(&s);
    free(ts);
    return rc;
}

/* The block-diagonal call over layout D (whose packed call's outputs are in dref). */
static int run_diag(const lay *D, const sp_inputs *orig, side *dref, const runctx *x, double *ms,
                    sp_vl_base *res, int *status, char *msg, size_t msglen) {
    const sp_case *c = &D->c;
    sp_inputs in = D->in;
    uint8_t *mask = NULL;
    int32_t *idx = NULL;
    int64_t nbx = 0, nby = 0;
    side s;
    memset(&s, 0, sizeof s);
    int rc = -1;
    if (c->op == SP_OP_BSA) {
        if (!(in.mask = mask = diag_mask(D, orig, &nbx, &nby))) goto oom;
        in.nmask = c->N * nbx * nby;
    } else if (!(in.idx = idx = diag_indices(c, &D->in))) {
        goto oom;
    }
    /* the dense problem: one sequence of all tokens */
    sp_case dc = *c;
    dc.varlen = 0;
    dc.B = 1;
    if (c->op == SP_OP_BSA) {
        dc.Sq = in.Tq;
        dc.Skv = in.Tkv;
    } else {
        dc.S1 = in.Tq;
        dc.S2 = in.Tkv;
        dc.mode = SPATTN_SFA_MODE_NONE;
    }
    sp_inputs pin;
    memset(&pin, 0, sizeof pin);
    pin.mask = mask;
    pin.nbx = nbx;
    pin.nby = nby;
    pin.idx = idx;
    res->diag_pairs = sp_pairs(&dc, &pin);
    if (side_make(&s, c, &in, x->backend, msg, msglen) ||
        prepare_outputs(c, &in, x->pass, 0, dref, &s, msg, msglen))
        goto done;
    sp_tensors t;
    const sp_vl_bufs *u = side_use(&s);
    dense_views(&dc, u, s.dev ? SPATTN_DEVICE_CUDA : SPATTN_DEVICE_CPU, 0, in.Tq, 0, in.Tkv,
                u->b[SP_B_MASK], nbx * nby, nby, &t);
    spattn_status st = time_dense(&dc, &t, 1, x, ms, res->diag_ms);
    if (st != SPATTN_STATUS_SUCCESS) {
        fail_call(st, "block-diagonal", status, msg, msglen);
        goto done;
    }
    res->diag_run = 1;
    char why[256];
    const int same = compare_pass(c, x->pass, dref, &s, why, sizeof why);
    if (same < 0) {
        snprintf(msg, msglen, "%s", why);
        goto done;
    }
    if (!same) {
        res->same = 0;
        snprintf(res->mismatch, sizeof res->mismatch, "block-diagonal != packed call%s: %s",
                 D->padded ? " (padded batch)" : "", why);
    }
    rc = 0;
    goto done;
oom:
    snprintf(msg, msglen, "out of memory building the block-diagonal problem");
done:
    side_free(&s);
    free(mask);
    free(idx);
    return rc;
}

int sp_bench_varlen_base(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                         int backend, int threads, int deterministic, double *ms,
                         sp_vl_base *res, int *status, char *msg, size_t msglen) {
    memset(res, 0, sizeof *res);
    for (int i = 0; i < 3; i++) res->loop_ms[i] = res->diag_ms[i] = NAN;
    res->same = 1;
    *status = 0;
    runctx x = {pass, warmup, repeats, backend, {0}, {0}};
    spattn_options_init(&x.fwd);
    x.fwd.backend = backend;
    x.fwd.num_threads = threads;
    x.bwd = x.fwd;
    x.bwd.deterministic = deterministic;
    lay P, D;
    lay_plain(c, in, &P);
    memset(&D, 0, sizeof D);
    side ref, dref;
    memset(&ref, 0, sizeof ref);
    memset(&dref, 0, sizeof dref);
    int rc = -1;
    if (c->page)
        snprintf(res->note, sizeof res->note, "paged keys: the baselines read the packed copy");
    if (side_make(&ref, &P.c, &P.in, backend, msg, msglen)) goto done;
    spattn_status st = packed_ref(&P, &ref, &x);
    if (st != SPATTN_STATUS_SUCCESS) {
        fail_call(st, "packed reference call", status, msg, msglen);
        goto done;
    }
    if (run_loop(&P, &ref, &x, ms, res, status, msg, msglen)) goto done;
    const char *skip = c->op == SP_OP_SFA ? sfa_diag_skip(c, in) : NULL;
    if (skip) {
        size_t l = strlen(res->note);
        snprintf(res->note + l, sizeof res->note - l, "%sblock-diagonal skipped (%s)",
                 l ? "; " : "", skip);
        rc = 0;
        goto done;
    }
    side *use_ref = &ref;
    if (c->op == SP_OP_BSA && !bsa_aligned(c, in)) {
        if (lay_padded(c, in, &D)) {
            snprintf(msg, msglen, "out of memory padding the batch");
            goto done;
        }
        res->diag_padded = 1;
        if (side_make(&dref, &D.c, &D.in, backend, msg, msglen)) goto done;
        st = packed_ref(&D, &dref, &x);
        if (st != SPATTN_STATUS_SUCCESS) {
            fail_call(st, "packed call over the padded batch", status, msg, msglen);
            goto done;
        }
        use_ref = &dref;
        size_t l = strlen(res->note);
        snprintf(res->note + l, sizeof res->note - l,
                 "%sblock-diagonal padded: sequences start off the bx / by grid, each padded "
                 "to whole blocks (%lld query, %lld key tokens)", l ? "; " : "",
                 (long long)D.in.Tq, (long long)D.in.Tkv);
    } else {
        D = P; /* same inputs, nothing owned */
    }
    if (run_diag(&D, in, use_ref, &x, ms, res, status, msg, msglen)) goto done;
    rc = 0;
done:
    side_free(&ref);
    side_free(&dref);
    if (D.padded) lay_free(&D);
    return rc;
}
