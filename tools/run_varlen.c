/*
 * Tensors and calls of varlen / paged cases (run_varlen.h).  The layout follows
 * cases/README.md "Varlen and paged cases": packed [T, heads, width] rows, sfa nope / rope
 * parts as column views of one [.., D+Dr] buffer (as the dense cases), key side packed or
 * pages [num_pages, page, heads, width].
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_varlen.h"

#ifdef SPATTN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* Shape of the key side with `heads` heads and `cols` columns: [Tkv, heads, cols] packed or
 * [num_pages, page, heads, cols]; returns ndim. */
static int kv_shape(const sp_case *c, const sp_inputs *in, int64_t heads, int64_t cols,
                    int64_t *shape) {
    if (c->page) {
        shape[0] = in->num_pages;
        shape[1] = c->page;
        shape[2] = heads;
        shape[3] = cols;
        return 4;
    }
    shape[0] = in->Tkv;
    shape[1] = heads;
    shape[2] = cols;
    return 3;
}

void sp_vl_tensors_make(const sp_case *c, const sp_inputs *in, void *const buf[SP_B_COUNT],
                        void *cu_q, void *cu_kv, void *table, int32_t dev, sp_vl_tensors *vt) {
    memset(vt, 0, sizeof *vt);
    sp_tensors *t = &vt->t;
    const int32_t dt = c->dtype;
    const size_t es = in->esize;
    int64_t scu[1] = {c->B + 1}, stab[2] = {c->B, in->max_pages};
    vt->cu_q = sp_view(cu_q, SPATTN_DTYPE_I32, dev, 1, scu, 1);
    vt->cu_kv = sp_view(cu_kv, SPATTN_DTYPE_I32, dev, 1, scu, 1);
    vt->paged = c->page > 0;
    if (vt->paged) vt->table = sp_view(table, SPATTN_DTYPE_I32, dev, 2, stab, in->max_pages);
    int64_t sk[4];
    if (c->op == SP_OP_BSA) {
        int64_t sq[3] = {in->Tq, c->N, c->D}, sm[4] = {c->B, c->N, in->nbx, in->nby};
        int nk = kv_shape(c, in, c->Nkv, c->D, sk);
        t->q = sp_view(buf[SP_B_Q], dt, dev, 3, sq, c->D);
        t->k = sp_view(buf[SP_B_K], dt, dev, nk, sk, c->D);
        t->v = sp_view(buf[SP_B_V], dt, dev, nk, sk, c->D);
        t->dout = sp_view(buf[SP_B_DOUT], dt, dev, 3, sq, c->D);
        t->mask = sp_view(buf[SP_B_MASK], SPATTN_DTYPE_U8, dev, 4, sm, in->nby);
        t->o = sp_view(buf[SP_B_O], dt, dev, 3, sq, c->D);
        t->lse = sp_view(buf[SP_B_LSE], SPATTN_DTYPE_F32, dev, 2, sq, c->N);
        t->dq = sp_view(buf[SP_B_DQ], dt, dev, 3, sq, c->D);
        t->dk = sp_view(buf[SP_B_DK], dt, dev, nk, sk, c->D);
        t->dv = sp_view(buf[SP_B_DV], dt, dev, nk, sk, c->D);
        t->has_v = 1;
        return;
    }
    const int64_t W = c->D + c->Dr;
    int64_t sq[3] = {in->Tq, c->N1, c->D}, sqr[3] = {in->Tq, c->N1, c->Dr};
    int64_t si[3] = {in->Tq, c->N2, c->K}, skr[4];
    int nk = kv_shape(c, in, c->N2, c->D, sk);
    kv_shape(c, in, c->N2, c->Dr, skr);
    t->has_rope = c->Dr > 0;
    t->has_v = !c->shared_kv;
    t->q = sp_view(buf[SP_B_Q], dt, dev, 3, sq, W);
    t->k = sp_view(buf[SP_B_K], dt, dev, nk, sk, W);
    t->dq = sp_view(buf[SP_B_DQ], dt, dev, 3, sq, W);
    t->dk = sp_view(buf[SP_B_DK], dt, dev, nk, sk, W);
    if (t->has_rope) {
        t->qr = sp_view((char *)buf[SP_B_Q] + (size_t)c->D * es, dt, dev, 3, sqr, W);
        t->kr = sp_view((char *)buf[SP_B_K] + (size_t)c->D * es, dt, dev, nk, skr, W);
        t->dqr = sp_view((char *)buf[SP_B_DQ] + (size_t)c->D * es, dt, dev, 3, sqr, W);
        t->dkr = sp_view((char *)buf[SP_B_DK] + (size_t)c->D * es, dt, dev, nk, skr, W);
    }
    if (t->has_v) {
        t->v = sp_view(buf[SP_B_V], dt, dev, nk, sk, c->D);
        t->dv = sp_view(buf[SP_B_DV], dt, dev, nk, sk, c->D);
    }
    t->dout = sp_view(buf[SP_B_DOUT], dt, dev, 3, sq, c->D);
    t->idx = sp_view(buf[SP_B_IDX], SPATTN_DTYPE_I32, dev, 3, si, c->K);
    t->o = sp_view(buf[SP_B_O], dt, dev, 3, sq, c->D);
    t->lse = sp_view(buf[SP_B_LSE], SPATTN_DTYPE_F32, dev, 2, sq, c->N1);
}

/* The layout argument; it points into vt, so it is made at each call. */
static spattn_varlen layout(const sp_case *c, const sp_vl_tensors *vt) {
    spattn_varlen vl;
    memset(&vl, 0, sizeof vl);
    vl.cu_seqlens_q = &vt->cu_q;
    vl.cu_seqlens_kv = &vt->cu_kv;
    vl.max_seqlen_q = c->op == SP_OP_BSA ? c->Sq : c->S1;
    vl.max_seqlen_kv = c->op == SP_OP_BSA ? c->Skv : c->S2;
    vl.block_table = vt->paged ? &vt->table : NULL;
    return vl;
}

spattn_status sp_vl_call_fwd(const sp_case *c, const sp_vl_tensors *vt, const spattn_options *opt) {
    const sp_tensors *t = &vt->t;
    spattn_varlen vl = layout(c, vt);
    if (c->op == SP_OP_BSA)
        return spattn_bsa_fwd_varlen(&t->q, &t->k, &t->v, &t->mask, c->bx, c->by, 0.0, &vl, &t->o,
                                     &t->lse, opt);
    return spattn_sfa_fwd_varlen(&t->q, t->has_rope ? &t->qr : NULL, &t->k,
                                 t->has_rope ? &t->kr : NULL, t->has_v ? &t->v : NULL, &t->idx,
                                 c->sbs, c->mode, 0.0, &vl, &t->o, &t->lse, opt);
}

spattn_status sp_vl_call_bwd(const sp_case *c, const sp_vl_tensors *vt, const spattn_options *opt) {
    const sp_tensors *t = &vt->t;
    spattn_varlen vl = layout(c, vt);
    if (c->op == SP_OP_BSA)
        return spattn_bsa_bwd_varlen(&t->q, &t->k, &t->v, &t->o, &t->dout, &t->lse, &t->mask,
                                     c->bx, c->by, 0.0, &vl, &t->dq, &t->dk, &t->dv, opt);
    return spattn_sfa_bwd_varlen(&t->q, t->has_rope ? &t->qr : NULL, &t->k,
                                 t->has_rope ? &t->kr : NULL, t->has_v ? &t->v : NULL, &t->o,
                                 &t->dout, &t->lse, &t->idx, c->sbs, c->mode, 0.0, &vl, &t->dq,
                                 t->has_rope ? &t->dqr : NULL, &t->dk,
                                 t->has_rope ? &t->dkr : NULL, t->has_v ? &t->dv : NULL, opt);
}

/* ---- buffers: host (the inputs in place, zeroed outputs) and, for CUDA, device copies ---- */

int sp_vl_host_bufs(const sp_case *c, const sp_inputs *in, sp_vl_bufs *h) {
    memset(h, 0, sizeof *h);
    int64_t no, nlse, ndq, ndk, ndv;
    sp_output_sizes(c, &no, &nlse, &ndq, &ndk, &ndv);
    const size_t es = in->esize;
    h->b[SP_B_Q] = in->q;
    h->bytes[SP_B_Q] = (size_t)in->nq * es;
    h->b[SP_B_K] = c->page ? in->kpage : in->k;
    h->bytes[SP_B_K] = (size_t)(c->page ? in->nkpage : in->nk) * es;
    h->b[SP_B_V] = c->page ? in->vpage : in->v;
    h->bytes[SP_B_V] = (size_t)(c->page ? in->nvpage : in->nv) * es;
    h->b[SP_B_DOUT] = in->dout;
    h->bytes[SP_B_DOUT] = (size_t)in->ndout * es;
    h->b[SP_B_MASK] = in->mask;
    h->bytes[SP_B_MASK] = (size_t)in->nmask;
    h->b[SP_B_IDX] = in->idx;
    h->bytes[SP_B_IDX] = (size_t)in->nidx * sizeof(int32_t);
    h->bytes[SP_B_O] = (size_t)no * es;
    h->bytes[SP_B_LSE] = (size_t)nlse * sizeof(float);
    h->bytes[SP_B_DQ] = (size_t)ndq * es;
    h->bytes[SP_B_DK] = (size_t)ndk * es;
    h->bytes[SP_B_DV] = (size_t)ndv * es;
    h->cu_q = in->cu_q;
    h->cu_kv = in->cu_kv;
    h->table = in->table;
    h->cu_bytes = (size_t)(c->B + 1) * sizeof(int32_t);
    h->table_bytes = c->page ? (size_t)(c->B * in->max_pages) * sizeof(int32_t) : 0;
    for (int b = SP_B_O; b < SP_B_COUNT; b++)
        if (h->bytes[b] && !(h->b[b] = calloc(1, h->bytes[b]))) return -1;
    return 0;
}

void sp_vl_host_bufs_free(sp_vl_bufs *h) {
    for (int b = SP_B_O; b < SP_B_COUNT; b++) free(h->b[b]);
    memset(h, 0, sizeof *h);
}

#ifdef SPATTN_HAVE_CUDA
int sp_vl_dev_bufs(const sp_vl_bufs *h, sp_vl_bufs *d, char *msg, size_t msglen) {
    memset(d, 0, sizeof *d);
    d->owns_inputs = 1;
    cudaError_t e = cudaSuccess;
    for (int b = 0; b < SP_B_COUNT && e == cudaSuccess; b++) {
        d->bytes[b] = h->bytes[b];
        if (!h->bytes[b]) continue;
        e = cudaMalloc(&d->b[b], h->bytes[b]);
        if (e == cudaSuccess)
            e = b < SP_B_O ? cudaMemcpy(d->b[b], h->b[b], h->bytes[b], cudaMemcpyHostToDevice)
                           : cudaMemset(d->b[b], 0, h->bytes[b]);
    }
    d->cu_bytes = h->cu_bytes;
    d->table_bytes = h->table_bytes;
    if (e == cudaSuccess) e = cudaMalloc(&d->cu_q, h->cu_bytes);
    if (e == cudaSuccess) e = cudaMemcpy(d->cu_q, h->cu_q, h->cu_bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMalloc(&d->cu_kv, h->cu_bytes);
    if (e == cudaSuccess) e = cudaMemcpy(d->cu_kv, h->cu_kv, h->cu_bytes, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && h->table_bytes) e = cudaMalloc(&d->table, h->table_bytes);
    if (e == cudaSuccess && h->table_bytes)
        e = cudaMemcpy(d->table, h->table, h->table_bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) snprintf(msg, msglen, "CUDA: %s", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : -1;
}

void sp_vl_dev_bufs_free(sp_vl_bufs *d) {
    for (int b = 0; b < SP_B_COUNT; b++)
        if (d->b[b]) cudaFree(d->b[b]);
    if (d->cu_q) cudaFree(d->cu_q);
    if (d->cu_kv) cudaFree(d->cu_kv);
    if (d->table) cudaFree(d->table);
    memset(d, 0, sizeof *d);
}
#endif

/* Runs the forward (and the backward) on the backend; outputs end up in h. */
static int run_impl(const sp_case *c, const sp_inputs *in, sp_vl_bufs *h, int passes, int backend,
                    int threads, int deterministic, sp_verify_out *out) {
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = backend;
    opt.num_threads = threads;
    spattn_options bopt = opt; /* the backward's */
    bopt.deterministic = deterministic;
    const sp_vl_bufs *use = h;
#ifdef SPATTN_HAVE_CUDA
    sp_vl_bufs d;
    memset(&d, 0, sizeof d);
    if (backend == SPATTN_BACKEND_CUDA) {
        if (sp_vl_dev_bufs(h, &d, out->msg, sizeof out->msg)) {
            out->status = SPATTN_STATUS_CUDA_ERROR;
            sp_vl_dev_bufs_free(&d);
            return -1;
        }
        use = &d;
    }
#endif
    sp_vl_tensors t;
    sp_vl_tensors_make(c, in, use->b, use->cu_q, use->cu_kv, use->table,
                       backend == SPATTN_BACKEND_CUDA ? SPATTN_DEVICE_CUDA : SPATTN_DEVICE_CPU, &t);
    int rc = -1;
    double t0 = sp_now_ms();
    spattn_status st = sp_vl_call_fwd(c, &t, &opt);
#ifdef SPATTN_HAVE_CUDA
    if (backend == SPATTN_BACKEND_CUDA) cudaDeviceSynchronize();
#endif
    out->fwd_ms = sp_now_ms() - t0;
    if (st != SPATTN_STATUS_SUCCESS) {
        sp_fail_status(out, st, "forward");
        goto done;
    }
    if (passes & SP_PASS_BWD) {
        t0 = sp_now_ms();
        st = sp_vl_call_bwd(c, &t, &bopt);
#ifdef SPATTN_HAVE_CUDA
        if (backend == SPATTN_BACKEND_CUDA) cudaDeviceSynchronize();
#endif
        out->bwd_ms = sp_now_ms() - t0;
        if (st != SPATTN_STATUS_SUCCESS) {
            sp_fail_status(out, st, "backward");
            goto done;
        }
    }
#ifdef SPATTN_HAVE_CUDA
    if (backend == SPATTN_BACKEND_CUDA)
        for (int b = SP_B_O; b < SP_B_COUNT; b++) {
            if (!h->bytes[b]) continue;
            cudaError_t e = cudaMemcpy(h->b[b], d.b[b], h->bytes[b], cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) {
                out->status = SPATTN_STATUS_CUDA_ERROR;
                snprintf(out->msg, sizeof out->msg, "CUDA: %s", cudaGetErrorString(e));
                goto done;
            }
        }
#endif
    rc = 0;
done:
#ifdef SPATTN_HAVE_CUDA
    if (backend == SPATTN_BACKEND_CUDA) sp_vl_dev_bufs_free(&d);
#endif
    return rc;
}

int sp_bench_varlen(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                    int backend, int threads, int deterministic, double *ms, int *status,
                    char *msg, size_t msglen) {
    *status = 0;
    sp_vl_bufs h, d;
    memset(&d, 0, sizeof d);
    const sp_vl_bufs *use = &h;
    int rc = -1;
    if (sp_vl_host_bufs(c, in, &h)) {
        *status = SPATTN_STATUS_OUT_OF_MEMORY;
        snprintf(msg, msglen, "out of memory allocating the outputs");
        goto done;
    }
#ifdef SPATTN_HAVE_CUDA
    if (backend == SPATTN_BACKEND_CUDA) {
        if (sp_vl_dev_bufs(&h, &d, msg, msglen)) {
            *status = SPATTN_STATUS_CUDA_ERROR;
            goto done;
        }
        use = &d;
    }
#endif
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = backend;
    opt.num_threads = threads;
    spattn_options popt = opt; /* the timed calls': the backward's take --deterministic */
    if (pass == SP_PASS_BWD) popt.deterministic = deterministic;
    sp_vl_tensors t;
    sp_vl_tensors_make(c, in, use->b, use->cu_q, use->cu_kv, use->table,
                       backend == SPATTN_BACKEND_CUDA ? SPATTN_DEVICE_CUDA : SPATTN_DEVICE_CPU, &t);
    spattn_status st = SPATTN_STATUS_SUCCESS;
    const char *what = pass == SP_PASS_FWD ? "forward" : "backward";
    if (pass == SP_PASS_BWD) {
        st = sp_vl_call_fwd(c, &t, &opt); /* O and LSE for the backward */
        if (st != SPATTN_STATUS_SUCCESS) what = "forward (before the backward)";
    }
    /* Wall clock around each call; on CUDA the call is followed by a device synchronisation
     * (no L2 flush: these are correctness-shaped suites, the dense bench does the flushing). */
    for (int i = 0; i < warmup + repeats && st == SPATTN_STATUS_SUCCESS; i++) {
        double t0 = sp_now_ms();
        st = pass == SP_PASS_FWD ? sp_vl_call_fwd(c, &t, &popt) : sp_vl_call_bwd(c, &t, &popt);
#ifdef SPATTN_HAVE_CUDA
        if (backend == SPATTN_BACKEND_CUDA) cudaDeviceSynchronize();
#endif
        if (i >= warmup) ms[i - warmup] = sp_now_ms() - t0;
    }
    if (st != SPATTN_STATUS_SUCCESS) {
        *status = st;
        snprintf(msg, msglen, "%s: %s: %s", what, spattn_status_str(st), spattn_last_error());
        goto done;
    }
    rc = 0;
done:
#ifdef SPATTN_HAVE_CUDA
    if (use == &d) sp_vl_dev_bufs_free(&d);
#endif
    sp_vl_host_bufs_free(&h);
    return rc;
}

int sp_verify_varlen(const sp_case *c, const sp_inputs *in, int passes, int backend, int threads,
                     int deterministic, sp_verify_out *out) {
    memset(out, 0, sizeof *out);
    sp_vl_bufs h;
    int rc = -1;
    if (sp_vl_host_bufs(c, in, &h)) {
        out->status = SPATTN_STATUS_OUT_OF_MEMORY;
        snprintf(out->msg, sizeof out->msg, "out of memory allocating the outputs");
        goto done;
    }
    if (run_impl(c, in, &h, passes, backend, threads, deterministic, out)) goto done;
    if (sp_add_outputs(c, h.b, passes, out)) goto done;
    if (sp_verify_golden(c, in, passes, out)) goto done;
    sp_verify_compare(out);
    rc = 0;
done:
    sp_vl_host_bufs_free(&h);
    return rc;
}
