/*
 * verify on the CPU: the implementation through the public API on host tensors, the golden
 * from the fp64 reference (src/ref) on the same rounded low-precision inputs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "gen.h"
#include "ref.h"
#include "ref_varlen.h"
#include "run.h"

/* fp64 copy of a dtype buffer (the rounded inputs, exactly). */
static double *to_f64(const void *buf, int32_t dtype, int64_t n) {
    if (!buf || n == 0) return NULL;
    double *d = malloc((size_t)n * sizeof *d);
    if (d) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = (double)sp_load(buf, dtype, i);
    }
    return d;
}

/* Golden of every named tensor from the fp64 reference on the same rounded inputs: dense
 * cases through src/ref/ref.h, varlen / paged ones through src/ref/ref_varlen.h (each sequence
 * gathered into a dense problem, the key side packed or paged exactly as the implementation got
 * it; NaN page rows stay NaN, the reference never reads them). */
int sp_verify_golden(const sp_case *c, const sp_inputs *in, int passes, sp_verify_out *out) {
    int rc = -1;
    const int paged = c->varlen && c->page > 0;
    const void *kbuf = paged ? in->kpage : in->k, *vbuf = paged ? in->vpage : in->v;
    const int64_t nk = paged ? in->nkpage : in->nk, nv = paged ? in->nvpage : in->nv;
    double *q = to_f64(in->q, c->dtype, in->nq), *k = to_f64(kbuf, c->dtype, nk);
    double *v = to_f64(vbuf, c->dtype, nv), *dout = to_f64(in->dout, c->dtype, in->ndout);
    int64_t no, nlse, ndq, ndk, ndv;
    sp_output_sizes(c, &no, &nlse, &ndq, &ndk, &ndv);
    double *o = NULL, *lse = NULL, *dq = NULL, *dk = NULL, *dv = NULL;
    if (passes & SP_PASS_FWD) {
        o = malloc((size_t)no * sizeof *o);
        lse = malloc((size_t)nlse * sizeof *lse);
    }
    if (passes & SP_PASS_BWD) {
        dq = malloc((size_t)ndq * sizeof *dq);
        dk = malloc((size_t)ndk * sizeof *dk);
        dv = ndv ? malloc((size_t)ndv * sizeof *dv) : NULL;
    }
    if (!q || !k || (nv && !v) || !dout || ((passes & SP_PASS_FWD) && (!o || !lse)) ||
        ((passes & SP_PASS_BWD) && (!dq || !dk || (ndv && !dv)))) {
        out->status = SPATTN_STATUS_OUT_OF_MEMORY;
        snprintf(out->msg, sizeof out->msg, "golden: out of memory");
        goto done;
    }
    const double scale = sp_softmax_scale(c);
    double t0 = sp_now_ms();
    spattn_ref_seqs sq = {0};
    if (c->varlen) {
        int64_t tq, tkv, kv_rows;
        sp_varlen_rows(c, &tq, &tkv, &kv_rows);
        sq = (spattn_ref_seqs){c->B, in->cu_q, in->cu_kv, paged ? in->table : NULL,
                               paged ? in->max_pages : 0, paged ? c->page : 0, kv_rows};
    }
    if (c->op == SP_OP_BSA) {
        spattn_ref_bsa_shape s = {c->B, c->N, c->Nkv, c->Sq, c->Skv, c->D, c->bx, c->by};
        if (o && c->varlen) spattn_ref_bsa_varlen_fwd(&s, &sq, q, k, v, in->mask, scale, o, lse);
        else if (o) spattn_ref_bsa_fwd(&s, q, k, v, in->mask, scale, o, lse);
        if (dq && c->varlen) spattn_ref_bsa_varlen_bwd(&s, &sq, q, k, v, in->mask, scale, dout, dq, dk, dv);
        else if (dq) spattn_ref_bsa_bwd(&s, q, k, v, in->mask, scale, dout, dq, dk, dv);
    } else {
        spattn_ref_sfa_shape s = {c->B, c->S1, c->S2, c->N1, c->N2, c->D,
                                  c->Dr, c->K, c->sbs, c->mode, c->shared_kv};
        if (o && c->varlen) spattn_ref_sfa_varlen_fwd(&s, &sq, q, k, v, in->idx, scale, o, lse);
        else if (o) spattn_ref_sfa_fwd(&s, q, k, v, in->idx, scale, o, lse);
        if (dq && c->varlen) spattn_ref_sfa_varlen_bwd(&s, &sq, q, k, v, in->idx, scale, dout, dq, dk, dv);
        else if (dq) spattn_ref_sfa_bwd(&s, q, k, v, in->idx, scale, dout, dq, dk, dv);
    }
    out->ref_ms = sp_now_ms() - t0;
    /* Named tensors were added in the order of sp_verify_cpu; match them by name. */
    const int64_t W = c->op == SP_OP_BSA ? c->D : c->D + c->Dr;
    for (int i = 0; i < out->nt; i++) {
        sp_named *t = &out->t[i];
        int bad = 0;
        if (!strcmp(t->name, "o")) bad = sp_named_golden_d(t, o, c->D, 0);
        else if (!strcmp(t->name, "lse")) bad = sp_named_golden_d(t, lse, 1, 0);
        else if (!strcmp(t->name, "dq")) bad = sp_named_golden_d(t, dq, W, 0);
        else if (!strcmp(t->name, "dq_rope")) bad = sp_named_golden_d(t, dq, W, c->D);
        else if (!strcmp(t->name, "dk")) bad = sp_named_golden_d(t, dk, W, 0);
        else if (!strcmp(t->name, "dk_rope")) bad = sp_named_golden_d(t, dk, W, c->D);
        else if (!strcmp(t->name, "dv")) bad = sp_named_golden_d(t, dv, c->D, 0);
        if (bad) {
            out->status = SPATTN_STATUS_OUT_OF_MEMORY;
            snprintf(out->msg, sizeof out->msg, "golden: out of memory");
            goto done;
        }
    }
    rc = 0;
done:
    free(q);
    free(k);
    free(v);
    free(dout);
    free(o);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    return rc;
}

int sp_verify_cpu(const sp_case *c, const sp_inputs *in, int passes, int threads,
                  int deterministic, sp_verify_out *out) {
    memset(out, 0, sizeof *out);
    size_t bytes[SP_B_COUNT];
    sp_buffer_sizes(c, bytes);
    void *buf[SP_B_COUNT] = {in->q, in->k, in->v, in->dout, in->mask, in->idx};
    int rc = -1;
    for (int b = SP_B_O; b < SP_B_COUNT; b++) {
        buf[b] = bytes[b] ? calloc(1, bytes[b]) : NULL;
        if (bytes[b] && !buf[b]) {
            out->status = SPATTN_STATUS_OUT_OF_MEMORY;
            snprintf(out->msg, sizeof out->msg, "out of memory allocating the outputs");
            goto done;
        }
    }
    sp_tensors t;
    sp_tensors_make(c, buf, SPATTN_DEVICE_CPU, &t);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CPU;
    opt.num_threads = threads;
    spattn_options bopt = opt; /* the backward's */
    bopt.deterministic = deterministic;
    double t0 = sp_now_ms();
    spattn_status st = sp_call_fwd(c, &t, &opt);
    out->fwd_ms = sp_now_ms() - t0;
    if (st != SPATTN_STATUS_SUCCESS) {
        sp_fail_status(out, st, "forward");
        goto done;
    }
    if (passes & SP_PASS_BWD) {
        t0 = sp_now_ms();
        st = sp_call_bwd(c, &t, &bopt);
        out->bwd_ms = sp_now_ms() - t0;
        if (st != SPATTN_STATUS_SUCCESS) {
            sp_fail_status(out, st, "backward");
            goto done;
        }
    }
    if (sp_add_outputs(c, buf, passes, out)) goto done;
    if (sp_verify_golden(c, in, passes, out)) goto done;
    sp_verify_compare(out);
    rc = 0;
done:
    for (int b = SP_B_O; b < SP_B_COUNT; b++) free(buf[b]);
    return rc;
}
