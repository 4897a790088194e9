/*
 * verify and bench on the GPU (CUDA builds only).  The implementation runs through the public
 * API on device tensors; the golden comes from the deliberately simple CUDA reference kernels
 * (spattn_cuda_ref_*, src/core/internal.h), which take a problem struct filled the way
 * src/core/bsa_api.c and sfa_api.c fill it.  Timings use CUDA events; bench writes a buffer
 * of twice the L2 size before every timed call so that no repeat finds its inputs in L2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"
#include "spattn.h"

#ifdef SPATTN_HAVE_CUDA

#include <cuda_runtime.h>

#include "call.h"
#include "core/internal.h"

#define CK(call)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            snprintf(msg, msglen, "%s: %s", #call, cudaGetErrorString(e_));              \
            *status = SPATTN_STATUS_CUDA_ERROR;                                          \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

int sp_cuda_device_name(char *buf, size_t n) {
    int dev = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        return -1;
    snprintf(buf, n, "%s", prop.name);
    return 0;
}

/* Device copies of the inputs and zeroed output buffers. */
static int upload(const sp_case *c, const sp_inputs *in, void *dbuf[SP_B_COUNT], int *status,
                  char *msg, size_t msglen) {
    size_t bytes[SP_B_COUNT];
    sp_buffer_sizes(c, bytes);
    const void *host[SP_B_COUNT] = {in->q, in->k, in->v, in->dout, in->mask, in->idx};
    memset(dbuf, 0, SP_B_COUNT * sizeof dbuf[0]);
    for (int b = 0; b < SP_B_COUNT; b++) {
        if (!bytes[b]) continue;
        CK(cudaMalloc(&dbuf[b], bytes[b]));
        if (b < SP_B_O) CK(cudaMemcpy(dbuf[b], host[b], bytes[b], cudaMemcpyHostToDevice));
        else CK(cudaMemset(dbuf[b], 0, bytes[b]));
    }
    return 0;
done:
    return -1;
}

static void release(void *dbuf[SP_B_COUNT]) {
    for (int b = 0; b < SP_B_COUNT; b++)
        if (dbuf[b]) cudaFree(dbuf[b]);
}

static void fill_bsa(const sp_case *c, const sp_tensors *t, int bwd, spattn_bsa_problem *p) {
    memset(p, 0, sizeof *p);
    p->q = &t->q;
    p->k = &t->k;
    p->v = &t->v;
    p->mask = &t->mask;
    p->o = &t->o;
    p->lse = &t->lse;
    if (bwd) {
        p->dout = &t->dout;
        p->dq = &t->dq;
        p->dk = &t->dk;
        p->dv = &t->dv;
    }
    p->B = c->B;
    p->N = c->N;
    p->Nkv = c->Nkv;
    p->Sq = c->Sq;
    p->Skv = c->Skv;
    p->D = c->D;
    p->bx = c->bx;
    p->by = c->by;
    p->nbx = (c->Sq + c->bx - 1) / c->bx;
    p->nby = (c->Skv + c->by - 1) / c->by;
    p->scale = (float)sp_softmax_scale(c);
    p->dtype = c->dtype;
}

static void fill_sfa(const sp_case *c, const sp_tensors *t, int bwd, spattn_sfa_problem *p) {
    memset(p, 0, sizeof *p);
    p->q = &t->q;
    p->q_rope = t->has_rope ? &t->qr : NULL;
    p->k = &t->k;
    p->k_rope = t->has_rope ? &t->kr : NULL;
    p->v = t->has_v ? &t->v : NULL;
    p->idx = &t->idx;
    p->o = &t->o;
    p->lse = &t->lse;
    if (bwd) {
        p->dout = &t->dout;
        p->dq = &t->dq;
        p->dq_rope = t->has_rope ? &t->dqr : NULL;
        p->dk = &t->dk;
        p->dk_rope = t->has_rope ? &t->dkr : NULL;
        p->dv = t->has_v ? &t->dv : NULL;
    }
    p->B = c->B;
    p->S1 = c->S1;
    p->S2 = c->S2;
    p->N1 = c->N1;
    p->N2 = c->N2;
    p->D = c->D;
    p->Dr = c->Dr;
    p->K = c->K;
    p->sbs = c->sbs;
    p->nblk = (c->S2 + c->sbs - 1) / c->sbs;
    p->mode = c->mode;
    p->shared_kv = c->shared_kv;
    p->scale = (float)sp_softmax_scale(c);
    p->dtype = c->dtype;
}

/* Golden buffers, contiguous fp32 in the reference kernels' layout (split rope parts). */
enum { G_O, G_LSE, G_DQ, G_DQR, G_DK, G_DKR, G_DV, G_COUNT };
static const char *const kGName[G_COUNT] = {"o", "lse", "dq", "dq_rope", "dk", "dk_rope", "dv"};

int sp_verify_cuda(const sp_case *c, const sp_inputs *in, int passes, int deterministic,
                   sp_verify_out *out) {
    memset(out, 0, sizeof *out);
    int *status = &out->status;
    char *msg = out->msg;
    size_t msglen = sizeof out->msg;
    void *dbuf[SP_B_COUNT] = {0};
    void *hbuf[SP_B_COUNT] = {0};
    float *dg[G_COUNT] = {0};
    float *hg = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1;
    size_t bytes[SP_B_COUNT];
    sp_buffer_sizes(c, bytes);
    if (upload(c, in, dbuf, status, msg, msglen)) goto done;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    sp_tensors t;
    sp_tensors_make(c, dbuf, SPATTN_DEVICE_CUDA, &t);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CUDA;
    spattn_options bopt = opt; /* the backward's */
    bopt.deterministic = deterministic;
    float ms = 0.f;
    CK(cudaEventRecord(e0, NULL));
    spattn_status st = sp_call_fwd(c, &t, &opt);
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    out->fwd_ms = ms;
    if (st != SPATTN_STATUS_SUCCESS) {
        sp_fail_status(out, st, "forward");
        goto done;
    }
    if (passes & SP_PASS_BWD) {
        CK(cudaEventRecord(e0, NULL));
        st = sp_call_bwd(c, &t, &bopt);
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        out->bwd_ms = ms;
        if (st != SPATTN_STATUS_SUCCESS) {
            sp_fail_status(out, st, "backward");
            goto done;
        }
    }
    for (int b = SP_B_O; b < SP_B_COUNT; b++) {
        if (!bytes[b]) continue;
        hbuf[b] = malloc(bytes[b]);
        if (!hbuf[b]) {
            *status = SPATTN_STATUS_OUT_OF_MEMORY;
            snprintf(msg, msglen, "out of memory");
            goto done;
        }
        CK(cudaMemcpy(hbuf[b], dbuf[b], bytes[b], cudaMemcpyDeviceToHost));
    }
    if (sp_add_outputs(c, hbuf, passes, out)) goto done;

    /* Golden on the device. */
    int64_t no, nlse, ndq, ndk, ndv;
    sp_output_sizes(c, &no, &nlse, &ndq, &ndk, &ndv);
    const int sfa = c->op == SP_OP_SFA;
    int64_t rq = sfa ? c->B * c->S1 * c->N1 : c->B * c->N * c->Sq;  /* rows of dq */
    int64_t rk = sfa ? c->B * c->S2 * c->N2 : c->B * c->Nkv * c->Skv; /* rows of dk */
    int64_t gn[G_COUNT] = {0};
    if (passes & SP_PASS_FWD) {
        gn[G_O] = no;
        gn[G_LSE] = nlse;
    }
    if (passes & SP_PASS_BWD) {
        gn[G_DQ] = rq * c->D;
        gn[G_DK] = rk * c->D;
        gn[G_DQR] = sfa ? rq * c->Dr : 0;
        gn[G_DKR] = sfa ? rk * c->Dr : 0;
        gn[G_DV] = ndv;
    }
    int64_t most = 0;
    for (int g = 0; g < G_COUNT; g++) {
        if (gn[g]) CK(cudaMalloc((void **)&dg[g], (size_t)gn[g] * sizeof(float)));
        if (gn[g] > most) most = gn[g];
    }
    spattn_exec ex;
    memset(&ex, 0, sizeof ex);
    ex.deterministic = 1;
    double t0 = sp_now_ms();
    if (passes & SP_PASS_FWD) {
        if (sfa) {
            spattn_sfa_problem p;
            fill_sfa(c, &t, 0, &p);
            st = spattn_cuda_ref_sfa_fwd(&p, &ex, dg[G_O], dg[G_LSE]);
        } else {
            spattn_bsa_problem p;
            fill_bsa(c, &t, 0, &p);
            st = spattn_cuda_ref_bsa_fwd(&p, &ex, dg[G_O], dg[G_LSE]);
        }
        if (st != SPATTN_STATUS_SUCCESS) {
            sp_fail_status(out, st, "reference forward");
            goto done;
        }
    }
    if (passes & SP_PASS_BWD) {
        if (sfa) {
            spattn_sfa_problem p;
            fill_sfa(c, &t, 1, &p);
            st = spattn_cuda_ref_sfa_bwd(&p, &ex, dg[G_DQ], dg[G_DQR], dg[G_DK], dg[G_DKR], dg[G_DV]);
        } else {
            spattn_bsa_problem p;
            fill_bsa(c, &t, 1, &p);
            st = spattn_cuda_ref_bsa_bwd(&p, &ex, dg[G_DQ], dg[G_DK], dg[G_DV]);
        }
        if (st != SPATTN_STATUS_SUCCESS) {
            sp_fail_status(out, st, "reference backward");
            goto done;
        }
    }
    CK(cudaDeviceSynchronize());
    out->ref_ms = sp_now_ms() - t0;
    hg = malloc((size_t)(most ? most : 1) * sizeof(float));
    if (!hg) {
        *status = SPATTN_STATUS_OUT_OF_MEMORY;
        snprintf(msg, msglen, "out of memory");
        goto done;
    }
    for (int i = 0; i < out->nt; i++) {
        sp_named *tn = &out->t[i];
        int g = 0;
        while (g < G_COUNT && strcmp(kGName[g], tn->name)) g++;
        if (g == G_COUNT || !dg[g] || gn[g] != tn->n) {
            *status = SPATTN_STATUS_INTERNAL;
            snprintf(msg, msglen, "no golden for tensor %s", tn->name);
            goto done;
        }
        CK(cudaMemcpy(hg, dg[g], (size_t)gn[g] * sizeof(float), cudaMemcpyDeviceToHost));
        if (sp_named_golden_f(tn, hg, tn->cols, 0)) {
            *status = SPATTN_STATUS_OUT_OF_MEMORY;
            snprintf(msg, msglen, "out of memory");
            goto done;
        }
    }
    sp_verify_compare(out);
    rc = 0;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    for (int g = 0; g < G_COUNT; g++)
        if (dg[g]) cudaFree(dg[g]);
    for (int b = 0; b < SP_B_COUNT; b++) free(hbuf[b]);
    free(hg);
    release(dbuf);
    return rc;
}

/* Keeps the plan's outputs of `pass` (fwd: O, LSE; bwd: dQ, dK, dV), reruns the pass through
 * the plain entry point (plan detached, library-allocated workspace) and compares the bytes on
 * the host.  1 equal, 0 different, -1 with status/msg set. */
static int plan_same_cuda(const sp_case *c, sp_tensors *t, void *const dbuf[], int pass,
                          int deterministic, int *status, char *msg, size_t msglen) {
    size_t bytes[SP_B_COUNT];
    sp_buffer_sizes(c, bytes);
    void *keep[SP_B_COUNT] = {0}, *now = NULL;
    int same = -1;
    for (int b = 0; b < SP_B_COUNT; b++) {
        int out = pass == SP_PASS_FWD ? (b == SP_B_O || b == SP_B_LSE)
                                      : (b == SP_B_DQ || b == SP_B_DK || b == SP_B_DV);
        if (!out || !bytes[b]) continue;
        if (!(keep[b] = malloc(bytes[b]))) {
            *status = SPATTN_STATUS_OUT_OF_MEMORY;
            snprintf(msg, msglen, "plan check: out of host memory");
            goto done;
        }
        CK(cudaMemcpy(keep[b], dbuf[b], bytes[b], cudaMemcpyDeviceToHost));
    }
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CUDA;
    if (pass == SP_PASS_BWD) opt.deterministic = deterministic;
    spattn_bsa_plan *plan = t->plan;
    t->plan = NULL;
    spattn_status st = pass == SP_PASS_FWD ? sp_call_fwd(c, t, &opt) : sp_call_bwd(c, t, &opt);
    t->plan = plan;
    if (st != SPATTN_STATUS_SUCCESS) {
        *status = st;
        snprintf(msg, msglen, "plain call to check the plan: %s: %s", spattn_status_str(st),
                 spattn_last_error());
        goto done;
    }
    CK(cudaDeviceSynchronize());
    same = 1;
    for (int b = 0; b < SP_B_COUNT && same; b++) {
        if (!keep[b]) continue;
        free(now);
        if (!(now = malloc(bytes[b]))) {
            *status = SPATTN_STATUS_OUT_OF_MEMORY;
            snprintf(msg, msglen, "plan check: out of host memory");
            same = -1;
            goto done;
        }
        CK(cudaMemcpy(now, dbuf[b], bytes[b], cudaMemcpyDeviceToHost));
        if (memcmp(now, keep[b], bytes[b])) same = 0;
    }
done:
    if (*status) same = -1;
    free(now);
    for (int b = 0; b < SP_B_COUNT; b++) free(keep[b]);
    return same;
}

int sp_bench_cuda(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                  int reuse_plan, int deterministic, double *ms_out, int *plan_same, int *status,
                  char *msg, size_t msglen) {
    void *dbuf[SP_B_COUNT] = {0};
    void *flush = NULL, *ws = NULL;
    sp_tensors t;
    memset(&t, 0, sizeof t);
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1, dev = 0, l2 = 0;
    *status = 0;
    *plan_same = -1;
    if (upload(c, in, dbuf, status, msg, msglen)) goto done;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    size_t flush_bytes = 2 * (size_t)(l2 > 0 ? l2 : 64 << 20);
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    sp_tensors_make(c, dbuf, SPATTN_DEVICE_CUDA, &t);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CUDA;
    /* the options of the calls made for the pass timed: the backward's take --deterministic */
    spattn_options popt = opt;
    if (pass == SP_PASS_BWD) popt.deterministic = deterministic;
    spattn_status st = SPATTN_STATUS_SUCCESS;
    const char *what = pass == SP_PASS_FWD ? "forward" : "backward";
    if (reuse_plan && c->op == SP_OP_BSA) {
        /* the plan and a caller workspace of its size: the timed calls launch kernels only */
        size_t w = 0;
        what = "plan";
        st = sp_plan_make(c, &t, &opt);
        if (st == SPATTN_STATUS_SUCCESS)
            st = spattn_bsa_plan_workspace_size(t.plan, &t.q, &t.k, &t.v, pass == SP_PASS_BWD, &popt, &w);
        if (st == SPATTN_STATUS_SUCCESS && w) {
            CK(cudaMalloc(&ws, w));
            opt.workspace = popt.workspace = ws;
            opt.workspace_size = popt.workspace_size = w;
        }
    }
    if (pass == SP_PASS_BWD && st == SPATTN_STATUS_SUCCESS) {
        st = sp_call_fwd(c, &t, &opt); /* O and LSE for the backward */
        what = "forward (before the backward)";
    }
    for (int i = 0; i < warmup + repeats && st == SPATTN_STATUS_SUCCESS; i++) {
        what = pass == SP_PASS_FWD ? "forward" : "backward";
        /* Evict the inputs from L2: every timed call starts from HBM, as in a model. */
        CK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, NULL));
        CK(cudaEventRecord(e0, NULL));
        st = pass == SP_PASS_FWD ? sp_call_fwd(c, &t, &popt) : sp_call_bwd(c, &t, &popt);
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= warmup) ms_out[i - warmup] = ms;
    }
    if (st != SPATTN_STATUS_SUCCESS) {
        *status = st;
        snprintf(msg, msglen, "%s: %s: %s", what, spattn_status_str(st), spattn_last_error());
        goto done;
    }
    if (t.plan &&
        (*plan_same = plan_same_cuda(c, &t, dbuf, pass, deterministic, status, msg, msglen)) < 0)
        goto done;
    rc = 0;
done:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (flush) cudaFree(flush);
    sp_plan_free(&t);
    if (ws) cudaFree(ws);
    release(dbuf);
    return rc;
}

#else /* no CUDA in this build */

int sp_cuda_device_name(char *buf, size_t n) {
    (void)buf;
    (void)n;
    return -1;
}

int sp_verify_cuda(const sp_case *c, const sp_inputs *in, int passes, int deterministic,
                   sp_verify_out *out) {
    (void)c;
    (void)in;
    (void)passes;
    (void)deterministic;
    memset(out, 0, sizeof *out);
    out->status = SPATTN_STATUS_BACKEND_UNAVAILABLE;
    snprintf(out->msg, sizeof out->msg, "backend cuda: spattn was built without CUDA");
    return -1;
}

int sp_bench_cuda(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                  int reuse_plan, int deterministic, double *ms, int *plan_same, int *status,
                  char *msg, size_t msglen) {
    (void)reuse_plan;
    (void)deterministic;
    *plan_same = -1;
    (void)c;
    (void)in;
    (void)pass;
    (void)warmup;
    (void)repeats;
    (void)ms;
    *status = SPATTN_STATUS_BACKEND_UNAVAILABLE;
    snprintf(msg, msglen, "backend cuda: spattn was built without CUDA");
    return -1;
}

#endif
