/*
 * libFuzzer harness for the public entry points beyond the plain bsa / sfa calls (those are in
 * fuzz_api.c, whose descriptor machinery and oracles this file shares through fuzz_desc.h):
 *   spattn_merge_attention_states[_ex]          o1, o2 [B,N,S,D] (each its own dtype), in place
 *   spattn_bsa_plan_create / _fwd_plan / _bwd_plan / _plan_workspace_size / _plan_destroy
 *   spattn_bsa_{fwd,bwd}_varlen, spattn_bsa_varlen_workspace_size   (packed, paged keys)
 *   spattn_sfa_{fwd,bwd}_varlen, spattn_sfa_varlen_workspace_size
 * The varlen problems start from valid prefix sums and block tables; the mutations, plus up to
 * four values poked anywhere into the buffers (cu_seqlens, tables, indices), then break them.
 * Extra oracle: a spattn_varlen with a nonzero reserved field is rejected.
 *
 * Run: build-fuzz/tests/fuzz/fuzz_api_more -max_total_time=60 NEW_DIR tests/fuzz/corpus/api_more
 */
#include "fuzz_desc.h"

typedef struct vlen {
    int32_t cuq[5], cuk[5], table[4 * 8];
    int64_t maxq, maxk;
    int B, paged, max_pages;
} vlen;

/* B sequences of 0..6 queries and 0..8 keys; paged keys: pages of `ps` rows, in order. */
static void make_vlen(vlen *v, fz_in *in, int64_t ps, int64_t *tq, int64_t *tk, int64_t *pages) {
    v->B = 1 + fz_range(in, 4);
    v->cuq[0] = v->cuk[0] = 0;
    v->maxq = v->maxk = 1;
    int64_t np = 0;
    v->max_pages = 1;
    for (int b = 0; b < v->B; b++) {
        int lq = fz_range(in, 7), lk = fz_range(in, 9);
        v->cuq[b + 1] = v->cuq[b] + lq;
        v->cuk[b + 1] = v->cuk[b] + lk;
        if (lq > v->maxq) v->maxq = lq;
        if (lk > v->maxk) v->maxk = lk;
    }
    for (int b = 0; b < v->B; b++) {
        int lk = v->cuk[b + 1] - v->cuk[b];
        int need = (int)((lk + ps - 1) / ps);
        if (need > v->max_pages) v->max_pages = need;
        for (int p = 0; p < 8; p++) v->table[b * 8 + p] = p < need ? (int32_t)np++ : 0;
    }
    *tq = v->cuq[v->B] + fz_range(in, 3);
    *tk = v->cuk[v->B] + fz_range(in, 3);
    if (*tq < 1) *tq = 1;
    if (*tk < 1) *tk = 1;
    *pages = np + 1;
}

/* Slots: 0 q 1 k 2 v 3 mask 4 o 5 lse 6 dout 7 dq 8 dk 9 dv 10 cu_q 11 cu_kv 12 table */
static void base_bsa_varlen(call *c, vlen *vl, fz_in *in) {
    int32_t dt = fz_range(in, 3);
    int64_t Nkv = 1 + fz_range(in, 2), N = Nkv * (1 + fz_range(in, 2)), D = 8 * (1 + fz_range(in, 2));
    int64_t ps = 1 + fz_range(in, 4), Tq, Tk, pages;
    make_vlen(vl, in, ps, &Tq, &Tk, &pages);
    vl->paged = fz_range(in, 3) == 0;
    c->bx = 1 + fz_range(in, 6);
    c->by = 1 + fz_range(in, 6);
    int64_t qs[3] = {Tq, N, D}, ks[3] = {Tk, Nkv, D}, ls[2] = {Tq, N};
    int64_t pk[4] = {pages, ps, Nkv, D}, cs[1] = {vl->B + 1}, ts[2] = {vl->B, vl->max_pages};
    int64_t ms[4] = {vl->B, N, (vl->maxq + c->bx - 1) / c->bx, (vl->maxk + c->by - 1) / c->by};
    make(&c->ts[0], K_FLOAT, dt, 3, qs, fz_u8(in), 0);
    make(&c->ts[1], K_FLOAT, dt, vl->paged ? 4 : 3, vl->paged ? pk : ks, fz_u8(in), 0);
    make(&c->ts[2], K_FLOAT, dt, vl->paged ? 4 : 3, vl->paged ? pk : ks, fz_u8(in), 0);
    make(&c->ts[3], K_MASK, SPATTN_DTYPE_U8, 4, ms, fz_u8(in), 0);
    make(&c->ts[4], K_FLOAT, dt, 3, qs, fz_u8(in) % 3, 1);
    make(&c->ts[5], K_LSE, SPATTN_DTYPE_F32, 2, ls, fz_u8(in) % 3, 1);
    make(&c->ts[6], K_FLOAT, dt, 3, qs, fz_u8(in), 0);
    make(&c->ts[7], K_FLOAT, dt, 3, qs, 0, 1);
    /* dk / dv: pages like k when paged (the paged backward writes every page row) */
    make(&c->ts[8], K_FLOAT, dt, vl->paged ? 4 : 3, vl->paged ? pk : ks, 0, 1);
    make(&c->ts[9], K_FLOAT, dt, vl->paged ? 4 : 3, vl->paged ? pk : ks, 0, 1);
    make(&c->ts[10], K_IDX, SPATTN_DTYPE_I32, 1, cs, 0, 0);
    make(&c->ts[11], K_IDX, SPATTN_DTYPE_I32, 1, cs, 0, 0);
    make(&c->ts[12], K_IDX, SPATTN_DTYPE_I32, 2, ts, 0, 0);
    c->ts[10].vals = vl->cuq;
    c->ts[11].vals = vl->cuk;
    c->ts[12].vals = vl->table; /* rows of 8 entries: only the first max_pages columns exist */
    c->ts[10].nvals = c->ts[11].nvals = vl->B + 1;
    c->ts[12].nvals = 8 * vl->B;
    c->ts[12].present = vl->paged;
    c->nt = 13;
}

/* Slots: 0 q 1 q_rope 2 k 3 k_rope 4 v 5 idx 6 o 7 lse 8 dout 9 dq 10 dq_rope 11 dk 12 dk_rope
 * 13 dv; cu_q, cu_kv and the table live in the vlen struct's own tensors (slots of `extra`). */
static void base_sfa_varlen(call *c, call *extra, vlen *vl, fz_in *in) {
    int32_t dt = fz_range(in, 3);
    int64_t N2 = 1 + fz_range(in, 2), N1 = N2 * (1 + fz_range(in, 2)), D = 8 * (1 + fz_range(in, 2));
    int64_t Dr = 8 * fz_range(in, 2), K = 1 + fz_range(in, 4), ps = 1 + fz_range(in, 4), Tq, Tk, pages;
    c->sbs = (int64_t)1 << fz_range(in, 3);
    c->mode = fz_range(in, 2) ? SPATTN_SFA_MODE_CAUSAL : SPATTN_SFA_MODE_NONE;
    make_vlen(vl, in, ps, &Tq, &Tk, &pages);
    vl->paged = fz_range(in, 3) == 0;
    int64_t minkv = vl->maxk;
    for (int b = 0; b < vl->B; b++)
        if (vl->cuk[b + 1] - vl->cuk[b] < minkv) minkv = vl->cuk[b + 1] - vl->cuk[b];
    c->nblk = (minkv + c->sbs - 1) / c->sbs;
    int64_t qs[3] = {Tq, N1, D}, qr[3] = {Tq, N1, Dr}, ks[3] = {Tk, N2, D}, kr[3] = {Tk, N2, Dr};
    int64_t pk[4] = {pages, ps, N2, D}, pr[4] = {pages, ps, N2, Dr}, is[3] = {Tq, N2, K}, ls[2] = {Tq, N1};
    int p = vl->paged;
    make(&c->ts[0], K_FLOAT, dt, 3, qs, fz_u8(in), 0);
    make(&c->ts[1], K_FLOAT, dt, 3, qr, fz_u8(in), 0);
    make(&c->ts[2], K_FLOAT, dt, p ? 4 : 3, p ? pk : ks, fz_u8(in), 0);
    make(&c->ts[3], K_FLOAT, dt, p ? 4 : 3, p ? pr : kr, fz_u8(in), 0);
    make(&c->ts[4], K_FLOAT, dt, p ? 4 : 3, p ? pk : ks, fz_u8(in), 0);
    make(&c->ts[5], K_IDX, SPATTN_DTYPE_I32, 3, is, fz_u8(in), 0);
    make(&c->ts[6], K_FLOAT, dt, 3, qs, fz_u8(in) % 3, 1);
    make(&c->ts[7], K_LSE, SPATTN_DTYPE_F32, 2, ls, fz_u8(in) % 3, 1);
    make(&c->ts[8], K_FLOAT, dt, 3, qs, fz_u8(in), 0);
    make(&c->ts[9], K_FLOAT, dt, 3, qs, 0, 1);
    make(&c->ts[10], K_FLOAT, dt, 3, qr, 0, 1);
    make(&c->ts[11], K_FLOAT, dt, p ? 4 : 3, p ? pk : ks, 0, 1);
    make(&c->ts[12], K_FLOAT, dt, p ? 4 : 3, p ? pr : kr, 0, 1);
    make(&c->ts[13], K_FLOAT, dt, p ? 4 : 3, p ? pk : ks, 0, 1);
    c->nt = 14;
    if (!Dr) c->ts[1].present = c->ts[3].present = c->ts[10].present = c->ts[12].present = 0;
    if (fz_range(in, 2)) c->ts[4].present = c->ts[13].present = 0;
    int64_t cs[1] = {vl->B + 1}, ts[2] = {vl->B, vl->max_pages};
    make(&extra->ts[0], K_IDX, SPATTN_DTYPE_I32, 1, cs, 0, 0);
    make(&extra->ts[1], K_IDX, SPATTN_DTYPE_I32, 1, cs, 0, 0);
    make(&extra->ts[2], K_IDX, SPATTN_DTYPE_I32, 2, ts, 0, 0);
    extra->ts[0].vals = vl->cuq;
    extra->ts[1].vals = vl->cuk;
    extra->ts[2].vals = vl->table;
    extra->ts[0].nvals = extra->ts[1].nvals = vl->B + 1;
    extra->ts[2].nvals = 8 * vl->B;
    extra->ts[2].present = p;
    extra->nt = 3;
}

/* Slots: 0 o1 1 lse1 2 o2 3 lse2 4 o 5 lse */
static void base_merge(call *c, fz_in *in) {
    int64_t B = 1 + fz_range(in, 2), N = 1 + fz_range(in, 3), S = 1 + fz_range(in, 9);
    int64_t D = 1 + fz_range(in, 40), os[4] = {B, N, S, D}, ls[3] = {B, N, S};
    make(&c->ts[0], K_FLOAT, fz_range(in, 3), 4, os, fz_u8(in), 0);
    make(&c->ts[1], K_LSE, SPATTN_DTYPE_F32, 3, ls, fz_u8(in), 0);
    make(&c->ts[2], K_FLOAT, fz_range(in, 3), 4, os, fz_u8(in), 0);
    make(&c->ts[3], K_LSE, SPATTN_DTYPE_F32, 3, ls, fz_u8(in), 0);
    make(&c->ts[4], K_FLOAT, fz_range(in, 3), 4, os, fz_u8(in) % 3, 1);
    make(&c->ts[5], K_LSE, SPATTN_DTYPE_F32, 3, ls, fz_u8(in) % 3, 1);
    c->nt = 6;
    int inplace = fz_range(in, 4);
    if (inplace == 1 || inplace == 2) { /* o is exactly o1 (or o2), lse exactly lse1 (lse2) */
        int src = inplace == 1 ? 0 : 2;
        c->ts[4] = c->ts[src];
        c->ts[4].share = src;
        c->ts[4].is_output = 1;
        c->ts[5] = c->ts[src + 1];
        c->ts[5].share = src + 1;
        c->ts[5].is_output = 1;
    }
}

static spattn_varlen varlen_of(const call *c, int icu, int itab, fz_in *in) {
    spattn_varlen v;
    memset(&v, 0, sizeof v);
    v.cu_seqlens_q = c->ts[icu].present ? &c->ts[icu].t : NULL;
    v.cu_seqlens_kv = c->ts[icu + 1].present ? &c->ts[icu + 1].t : NULL;
    v.block_table = c->ts[itab].present ? &c->ts[itab].t : NULL;
    if (fz_range(in, 8) == 0) v.reserved[fz_range(in, 4)] = fz_i64(in);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_in in = {data, size};
    int entry = fz_range(&in, 9);
    static call c, x;
    memset(&c, 0, sizeof c);
    memset(&x, 0, sizeof x);
    spattn_options_init(&c.opt);
    c.use_opt = 1;
    vlen vl;
    memset(&vl, 0, sizeof vl);
    if (entry <= 1) base_merge(&c, &in);
    else if (entry <= 5) base_bsa_varlen(&c, &vl, &in);
    else base_sfa_varlen(&c, &x, &vl, &in);
    int64_t max_q = fz_range(&in, 4) == 0 ? fz_i64(&in) : vl.maxq; /* max_seqlen overrides */
    int64_t max_k = fz_range(&in, 4) == 0 ? fz_i64(&in) : vl.maxk;
    int sub = fz_range(&in, 3); /* plan: 0 fwd, 1 bwd, 2 workspace query */
    c.backward = entry == 4 || entry == 7 || (entry == 2 && sub == 1);
    if (c.backward && entry != 2) c.ts[entry < 6 ? 4 : 6].is_output = c.ts[entry < 6 ? 5 : 7].is_output = 0;
    if (entry == 2 && sub == 1) c.ts[4].is_output = c.ts[5].is_output = 0;
    uint64_t seed = fz_bytes(&in, 4) | 1;
    mutate(&c, &in);
    if (entry == 0) c.use_opt = 0; /* the plain merge takes no options */
    int big = place(&c, seed);
    if (x.nt) big |= place(&x, seed);
    apply_pokes(&c, &in);
    if (x.nt) apply_pokes(&x, &in);
    /* max_seqlen values far above the real lengths run too: no CPU workspace grows with them
     * (the sfa varlen backward's duplicate marks follow the key-side rows, not max_seqlen_kv;
     * tests/test_sfa_varlen_bigmax.c). */
    uint8_t *ws = setup_workspace(&c, &in);
    for (int i = 0; i < x.nt; i++)
        if (x.ts[i].buf) memcpy(x.ts[i].snap, x.ts[i].buf, x.ts[i].bytes);
    const spattn_options *opt = c.use_opt ? &c.opt : NULL;
    spattn_status st = SPATTN_STATUS_SUCCESS;
    size_t bytes = 0;
    int ran = !big, vl_bad = 0;
    if (entry <= 1) {
        if (big) { /* too big to place and merge has no size query: nothing is called */
            st = SPATTN_STATUS_SUCCESS;
            c.use_opt = 0; /* so the options oracle does not judge a call that did not happen */
        } else if (entry == 0) st = spattn_merge_attention_states(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4), arg(&c, 5));
        else st = spattn_merge_attention_states_ex(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4), arg(&c, 5), opt);
    } else if (entry == 2 && c.ts[3].present && c.ts[3].state == 2) {
        /* a mask too big to place has no memory behind it (g_dummy), and plan_create copies the
         * mask's values: nothing is called (as for merge) */
        c.use_opt = 0;
    } else if (entry == 2) { /* plan over the varlen problem's mask, as a dense [B, N, Sq, D] call */
        int64_t Sq = fz_range(&in, 2) ? vl.maxq : fz_i64(&in), Skv = vl.maxk;
        spattn_bsa_plan *plan = NULL;
        st = spattn_bsa_plan_create(arg(&c, 3), c.bx, c.by, Sq, Skv, c.ts[1].t.shape[c.ts[1].t.ndim == 4 ? 2 : 1], opt, &plan);
        if (st == SPATTN_STATUS_SUCCESS && !plan) fail("plan_create succeeded without a plan", st);
        if (st == SPATTN_STATUS_SUCCESS && !big) {
            if (sub == 0) st = spattn_bsa_fwd_plan(plan, arg(&c, 0), arg(&c, 1), arg(&c, 2), c.scale, arg(&c, 4), arg(&c, 5), opt);
            else if (sub == 1) st = spattn_bsa_bwd_plan(plan, arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 4), arg(&c, 6), arg(&c, 5), c.scale, arg(&c, 7), arg(&c, 8), arg(&c, 9), opt);
            else { st = spattn_bsa_plan_workspace_size(plan, arg(&c, 0), arg(&c, 1), arg(&c, 2), c.backward, opt, &bytes); ran = 0; }
        }
        spattn_bsa_plan_destroy(plan);
    } else if (entry <= 5) {
        spattn_varlen v = varlen_of(&c, 10, 12, &in);
        v.max_seqlen_q = max_q;
        v.max_seqlen_kv = max_k;
        for (int i = 0; i < 4; i++) vl_bad |= v.reserved[i] != 0;
        if (entry == 5 || big) {
            st = spattn_bsa_varlen_workspace_size(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), c.bx, c.by, &v, c.backward, opt, &bytes);
            ran = 0;
        } else if (entry == 3) {
            st = spattn_bsa_fwd_varlen(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), c.bx, c.by, c.scale, &v, arg(&c, 4), arg(&c, 5), opt);
        } else {
            st = spattn_bsa_bwd_varlen(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 4), arg(&c, 6), arg(&c, 5), arg(&c, 3), c.bx, c.by, c.scale, &v, arg(&c, 7), arg(&c, 8), arg(&c, 9), opt);
        }
    } else {
        spattn_varlen v = varlen_of(&x, 0, 2, &in);
        v.max_seqlen_q = max_q;
        v.max_seqlen_kv = max_k;
        for (int i = 0; i < 4; i++) vl_bad |= v.reserved[i] != 0;
        if (entry == 8 || big) {
            st = spattn_sfa_varlen_workspace_size(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4), arg(&c, 5), c.sbs, c.mode, &v, c.backward, opt, &bytes);
            ran = 0;
        } else if (entry == 6) {
            st = spattn_sfa_fwd_varlen(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4), arg(&c, 5), c.sbs, c.mode, c.scale, &v, arg(&c, 6), arg(&c, 7), opt);
        } else {
            st = spattn_sfa_bwd_varlen(arg(&c, 0), arg(&c, 1), arg(&c, 2), arg(&c, 3), arg(&c, 4), arg(&c, 6), arg(&c, 8), arg(&c, 7), arg(&c, 5), c.sbs, c.mode, c.scale, &v, arg(&c, 9), arg(&c, 10), arg(&c, 11), arg(&c, 12), arg(&c, 13), opt);
        }
    }
    if (vl_bad && st == SPATTN_STATUS_SUCCESS) fail("spattn_varlen.reserved nonzero accepted", st);
    if (x.nt) {
        for (int i = 0; i < x.nt; i++)
            if (x.ts[i].buf && memcmp(x.ts[i].buf, x.ts[i].snap, x.ts[i].bytes)) fail("cu_seqlens / block table written", st);
        check_and_free(&x, SPATTN_STATUS_SUCCESS, 0, 0, NULL);
    }
    check_and_free(&c, st, ran, bytes, ws);
    return 0;
}
