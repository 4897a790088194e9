#include "call.h"

#include <math.h>
#include <string.h>

#include "gen.h"

double sp_softmax_scale(const sp_case *c) {
    return 1.0 / sqrt((double)(c->op == SP_OP_BSA ? c->D : c->D + c->Dr));
}

void sp_buffer_sizes(const sp_case *c, size_t bytes[SP_B_COUNT]) {
    size_t es = spattn_dtype_size((spattn_dtype)c->dtype);
    int64_t no, nlse, ndq, ndk, ndv;
    sp_output_sizes(c, &no, &nlse, &ndq, &ndk, &ndv);
    memset(bytes, 0, SP_B_COUNT * sizeof bytes[0]);
    if (c->op == SP_OP_BSA) {
        bytes[SP_B_Q] = (size_t)(c->B * c->N * c->Sq * c->D) * es;
        bytes[SP_B_K] = bytes[SP_B_V] = (size_t)(c->B * c->Nkv * c->Skv * c->D) * es;
        bytes[SP_B_MASK] = (size_t)(c->B * c->N * ((c->Sq + c->bx - 1) / c->bx) *
                                    ((c->Skv + c->by - 1) / c->by));
    } else {
        bytes[SP_B_Q] = (size_t)(c->B * c->S1 * c->N1 * (c->D + c->Dr)) * es;
        bytes[SP_B_K] = (size_t)(c->B * c->S2 * c->N2 * (c->D + c->Dr)) * es;
        bytes[SP_B_V] = c->shared_kv ? 0 : (size_t)(c->B * c->S2 * c->N2 * c->D) * es;
        bytes[SP_B_IDX] = (size_t)(c->B * c->S1 * c->N2 * c->K) * sizeof(int32_t);
    }
    bytes[SP_B_DOUT] = (size_t)no * es;
    bytes[SP_B_O] = (size_t)no * es;
    bytes[SP_B_LSE] = (size_t)nlse * sizeof(float);
    bytes[SP_B_DQ] = (size_t)ndq * es;
    bytes[SP_B_DK] = (size_t)ndk * es;
    bytes[SP_B_DV] = (size_t)ndv * es;
}

spattn_tensor sp_view(void *data, int32_t dtype, int32_t dev, int ndim, const int64_t *shape,
                      int64_t width) {
    spattn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device_type = dev;
    t.device_id = 0;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.strides[d] = stride;
        stride *= d == ndim - 1 ? width : shape[d];
    }
    return t;
}

void sp_tensors_make(const sp_case *c, void *const buf[SP_B_COUNT], int32_t dev, sp_tensors *t) {
    memset(t, 0, sizeof *t);
    const int32_t dt = c->dtype;
    const size_t es = spattn_dtype_size((spattn_dtype)dt);
    if (c->op == SP_OP_BSA) {
        int64_t sq[4] = {c->B, c->N, c->Sq, c->D}, skv[4] = {c->B, c->Nkv, c->Skv, c->D};
        int64_t sm[4] = {c->B, c->N, (c->Sq + c->bx - 1) / c->bx, (c->Skv + c->by - 1) / c->by};
        t->q = sp_view(buf[SP_B_Q], dt, dev, 4, sq, c->D);
        t->k = sp_view(buf[SP_B_K], dt, dev, 4, skv, c->D);
        t->v = sp_view(buf[SP_B_V], dt, dev, 4, skv, c->D);
        t->dout = sp_view(buf[SP_B_DOUT], dt, dev, 4, sq, c->D);
        t->mask = sp_view(buf[SP_B_MASK], SPATTN_DTYPE_U8, dev, 4, sm, sm[3]);
        t->o = sp_view(buf[SP_B_O], dt, dev, 4, sq, c->D);
        t->lse = sp_view(buf[SP_B_LSE], SPATTN_DTYPE_F32, dev, 3, sq, c->Sq);
        t->dq = sp_view(buf[SP_B_DQ], dt, dev, 4, sq, c->D);
        t->dk = sp_view(buf[SP_B_DK], dt, dev, 4, skv, c->D);
        t->dv = sp_view(buf[SP_B_DV], dt, dev, 4, skv, c->D);
        t->has_v = 1;
        return;
    }
    const int64_t W = c->D + c->Dr;
    int64_t sq[4] = {c->B, c->S1, c->N1, c->D}, sqr[4] = {c->B, c->S1, c->N1, c->Dr};
    int64_t sk[4] = {c->B, c->S2, c->N2, c->D}, skr[4] = {c->B, c->S2, c->N2, c->Dr};
    int64_t si[4] = {c->B, c->S1, c->N2, c->K};
    t->has_rope = c->Dr > 0;
    t->has_v = !c->shared_kv;
    /* Nope and rope parts are column views of one [.., D+Dr] buffer: no copies. */
    t->q = sp_view(buf[SP_B_Q], dt, dev, 4, sq, W);
    t->k = sp_view(buf[SP_B_K], dt, dev, 4, sk, W);
    t->dq = sp_view(buf[SP_B_DQ], dt, dev, 4, sq, W);
    t->dk = sp_view(buf[SP_B_DK], dt, dev, 4, sk, W);
    if (t->has_rope) {
        t->qr = sp_view((char *)buf[SP_B_Q] + (size_t)c->D * es, dt, dev, 4, sqr, W);
        t->kr = sp_view((char *)buf[SP_B_K] + (size_t)c->D * es, dt, dev, 4, skr, W);
        t->dqr = sp_view((char *)buf[SP_B_DQ] + (size_t)c->D * es, dt, dev, 4, sqr, W);
        t->dkr = sp_view((char *)buf[SP_B_DK] + (size_t)c->D * es, dt, dev, 4, skr, W);
    }
    if (t->has_v) {
        t->v = sp_view(buf[SP_B_V], dt, dev, 4, sk, c->D);
        t->dv = sp_view(buf[SP_B_DV], dt, dev, 4, sk, c->D);
    }
    t->dout = sp_view(buf[SP_B_DOUT], dt, dev, 4, sq, c->D);
    t->idx = sp_view(buf[SP_B_IDX], SPATTN_DTYPE_I32, dev, 4, si, c->K);
    t->o = sp_view(buf[SP_B_O], dt, dev, 4, sq, c->D);
    t->lse = sp_view(buf[SP_B_LSE], SPATTN_DTYPE_F32, dev, 3, sq, c->N1);
}

spattn_status sp_plan_make(const sp_case *c, sp_tensors *t, const spattn_options *opt) {
    t->plan = NULL;
    if (c->op != SP_OP_BSA) return SPATTN_STATUS_SUCCESS;
    return spattn_bsa_plan_create(&t->mask, c->bx, c->by, c->Sq, c->Skv, c->Nkv, opt, &t->plan);
}

void sp_plan_free(sp_tensors *t) {
    spattn_bsa_plan_destroy(t->plan);
    t->plan = NULL;
}

spattn_status sp_call_fwd(const sp_case *c, const sp_tensors *t, const spattn_options *opt) {
    if (c->op == SP_OP_BSA && t->plan)
        return spattn_bsa_fwd_plan(t->plan, &t->q, &t->k, &t->v, 0.0, &t->o, &t->lse, opt);
    if (c->op == SP_OP_BSA)
        return spattn_bsa_fwd_ex(&t->q, &t->k, &t->v, &t->mask, c->bx, c->by, 0.0, &t->o, &t->lse,
                                 opt);
    return spattn_sfa_fwd_ex(&t->q, t->has_rope ? &t->qr : NULL, &t->k,
                             t->has_rope ? &t->kr : NULL, t->has_v ? &t->v : NULL, &t->idx, c->sbs,
                             c->mode, 0.0, &t->o, &t->lse, opt);
}

spattn_status sp_call_bwd(const sp_case *c, const sp_tensors *t, const spattn_options *opt) {
    if (c->op == SP_OP_BSA && t->plan)
        return spattn_bsa_bwd_plan(t->plan, &t->q, &t->k, &t->v, &t->o, &t->dout, &t->lse, 0.0,
                                   &t->dq, &t->dk, &t->dv, opt);
    if (c->op == SP_OP_BSA)
        return spattn_bsa_bwd_ex(&t->q, &t->k, &t->v, &t->o, &t->dout, &t->lse, &t->mask, c->bx,
                                 c->by, 0.0, &t->dq, &t->dk, &t->dv, opt);
    return spattn_sfa_bwd_ex(&t->q, t->has_rope ? &t->qr : NULL, &t->k,
                             t->has_rope ? &t->kr : NULL, t->has_v ? &t->v : NULL, &t->o, &t->dout,
                             &t->lse, &t->idx, c->sbs, c->mode, 0.0, &t->dq,
                             t->has_rope ? &t->dqr : NULL, &t->dk, t->has_rope ? &t->dkr : NULL,
                             t->has_v ? &t->dv : NULL, opt);
}
