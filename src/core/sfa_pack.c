/* The MLA column map of sfa_pack.h: plan and workspace layout (the copies: src/cuda/sfa_pad.cu). */
#include "sfa_pack.h"

#include <string.h>

static const int32_t part0[2] = {0, SPATTN_PACK_D}, partw[2] = {SPATTN_PACK_D, SPATTN_PACK_DR};

int spattn_sfa_pack_readable(const spattn_tensor *t) {
    const int lead = t->ndim - 1;
    if (t->strides[lead] != 1 || ((uintptr_t)t->data) % 16) return 0;
    for (int d = 0; d < lead; ++d)
        if (t->strides[d] % 8) return 0;
    return 1;
}

/* a view of like's leading dimensions and w columns, rows `stride` elements apart, dense (data
   bound later); zero_stride: every stride 0 but the last */
static spattn_tensor view_like(const spattn_tensor *like, int64_t w, int64_t stride, int zero_stride) {
    spattn_tensor v = *like;
    const int lead = like->ndim - 1;
    v.shape[lead] = w;
    v.strides[lead] = 1;
    int64_t st = stride;
    for (int d = lead - 1; d >= 0; d--) {
        v.strides[d] = zero_stride ? 0 : st;
        st *= like->shape[d];
    }
    v.data = NULL;
    return v;
}

static void seg(spattn_sfa_pack_group *g, const spattn_tensor *t, int64_t col0, int64_t w) {
    if (w <= 0) return;
    g->seg[g->nseg].t = t;
    g->seg[g->nseg].col0 = (int32_t)col0;
    g->seg[g->nseg].w = (int32_t)w;
    g->nseg++;
}

int spattn_sfa_pack_fits(const spattn_sfa_problem *p, int any_dtype) {
    if ((!any_dtype && p->dtype == SPATTN_DTYPE_F32) || p->D % 8 || p->Dr % 8 || p->D < 8) return 0;
    return p->shared_kv ? p->D <= SPATTN_PACK_D && p->D + p->Dr <= SPATTN_PACK_D + SPATTN_PACK_DR
                        : 2 * p->D + p->Dr <= SPATTN_PACK_D + SPATTN_PACK_DR;
}

void spattn_sfa_pack_plan(const spattn_sfa_problem *p, int backward, spattn_sfa_pack *d) {
    memset(d, 0, sizeof *d);
    d->pp = *p;
    d->pp.D = SPATTN_PACK_D;
    d->pp.Dr = SPATTN_PACK_DR;
    d->pp.v = NULL;
    d->pp.dv = NULL;
    d->pp.shared_kv = 1;
    const int call = backward ? p->dq != NULL : p->o != NULL, sep = !p->shared_kv;
    const int64_t D = p->D, qc = sep ? D : 0; /* q's first column in q' (and dq's in dQ') */
    spattn_sfa_pack_group *g = d->g;
    seg(&g[SPATTN_PACK_GQ], p->q, qc, D);
    seg(&g[SPATTN_PACK_GQ], p->q_rope, qc + D, p->Dr);
    if (sep) seg(&g[SPATTN_PACK_GK], p->v, 0, D);
    seg(&g[SPATTN_PACK_GK], p->k, qc, D);
    seg(&g[SPATTN_PACK_GK], p->k_rope, qc + D, p->Dr);
    seg(&g[SPATTN_PACK_GO], p->o, 0, D);
    seg(&g[SPATTN_PACK_GDO], p->dout, 0, D);
    seg(&g[SPATTN_PACK_GDQ], p->dq, qc, D);
    seg(&g[SPATTN_PACK_GDQ], p->dq_rope, qc + D, p->Dr);
    if (sep) seg(&g[SPATTN_PACK_GDK], p->dv, 0, D);
    seg(&g[SPATTN_PACK_GDK], p->dk, qc, D);
    seg(&g[SPATTN_PACK_GDK], p->dk_rope, qc + D, p->Dr);
    const spattn_tensor **dst[SPATTN_PACK_NG][2] = {
        {&d->pp.q, &d->pp.q_rope}, {&d->pp.k, &d->pp.k_rope},   {&d->pp.o, NULL},
        {&d->pp.dout, NULL},       {&d->pp.dq, &d->pp.dq_rope}, {&d->pp.dk, &d->pp.dk_rope}};
    const size_t esz = spattn_dtype_size((spattn_dtype)p->dtype);
    size_t o = 0;
    for (int i = 0; i < SPATTN_PACK_NG; i++) {
        spattn_sfa_pack_group *x = &g[i];
        const int kside = i == SPATTN_PACK_GK || i == SPATTN_PACK_GDK;
        x->like = kside ? p->k : p->q;
        x->rows = 1;
        for (int dd = 0; dd < x->like->ndim - 1; dd++) x->rows *= x->like->shape[dd];
        x->nparts = i == SPATTN_PACK_GO || i == SPATTN_PACK_GDO ? 1 : 2;
        x->out = i >= SPATTN_PACK_GDQ || (i == SPATTN_PACK_GO && !backward);
        x->used = i <= SPATTN_PACK_GO || backward;
        /* the inputs q', k' always (q and k are given); O', dO' and the outputs in a call only */
        x->subst = x->used && (i < SPATTN_PACK_GO || call);
        if (!x->used) continue;
        x->b0 = SPATTN_PACK_D + SPATTN_PACK_DR;
        x->b1 = 0;
        for (int pt = 0; pt < x->nparts; pt++) {
            int n = 0, one = -1;
            for (int s = 0; s < x->nseg; s++)
                if (x->seg[s].col0 < part0[pt] + partw[pt] && x->seg[s].col0 + x->seg[s].w > part0[pt]) n++, one = s;
            const spattn_sfa_pack_seg *s = one >= 0 ? &x->seg[one] : NULL;
            if (n == 1 && s->t && s->col0 == part0[pt] && s->w == partw[pt] && spattn_sfa_pack_readable(s->t)) {
                x->state[pt] = SPATTN_PACK_INPLACE;
                x->t[pt] = *s->t;
            } else if (n == 0 && !x->out) {
                x->state[pt] = SPATTN_PACK_ZERO;
                x->t[pt] = view_like(x->like, partw[pt], 0, 1);
            } else {
                x->state[pt] = SPATTN_PACK_BUF;
                if (part0[pt] < x->b0) x->b0 = part0[pt];
                if (part0[pt] + partw[pt] > x->b1) x->b1 = part0[pt] + partw[pt];
            }
        }
        if (x->b1 < x->b0) x->b0 = x->b1 = 0;
        x->off = o;
        o += ((size_t)x->rows * (size_t)(x->b1 - x->b0) * esz + 255) & ~(size_t)255;
        for (int pt = 0; pt < x->nparts; pt++) {
            if (x->state[pt] == SPATTN_PACK_BUF) x->t[pt] = view_like(x->like, partw[pt], x->b1 - x->b0, 0);
            if (x->subst) *dst[i][pt] = &x->t[pt];
        }
    }
    d->zero_off = o;
    d->bytes = o + SPATTN_PACK_ZERO_BYTES;
}

void spattn_sfa_pack_bind(spattn_sfa_pack *d, unsigned char *base) {
    for (int i = 0; i < SPATTN_PACK_NG; i++) {
        spattn_sfa_pack_group *x = &d->g[i];
        if (!x->used) continue;
        const size_t esz = spattn_dtype_size((spattn_dtype)x->t[0].dtype);
        for (int pt = 0; pt < x->nparts; pt++) {
            if (x->state[pt] == SPATTN_PACK_BUF) x->t[pt].data = base + x->off + (size_t)(part0[pt] - x->b0) * esz;
            else if (x->state[pt] == SPATTN_PACK_ZERO) x->t[pt].data = base + d->zero_off;
        }
    }
}

int spattn_sfa_pack_copied(const spattn_sfa_pack_group *x, int s) {
    if (!x->seg[s].t) return 0;
    for (int pt = 0; pt < x->nparts; pt++)
        if (x->state[pt] == SPATTN_PACK_INPLACE && x->seg[s].col0 == part0[pt]) return 0;
    return 1;
}

int spattn_sfa_pack_needs_copy_back(const spattn_sfa_pack *d) {
    for (int i = 0; i < SPATTN_PACK_NG; i++)
        for (int s = 0; s < d->g[i].nseg; s++)
            if (d->g[i].used && d->g[i].out && spattn_sfa_pack_copied(&d->g[i], s)) return 1;
    return 0;
}
