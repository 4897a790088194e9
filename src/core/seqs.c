/* Packed variable-length batches and paged keys: checks of the layout and per-sequence views
 * (see seqs.h). */
#include <stdlib.h>

#include "check.h"
#include "seqs.h"

int64_t spattn_seq_of_q(const spattn_seqs *s, int64_t t) {
    int64_t lo = 0, hi = s->B - 1; /* last b with cu_q[b] <= t */
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (spattn_seq_q0(s, mid) <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static spattn_status check_cu(const char *name, const spattn_tensor *t, const spattn_tensor *q) {
    TRY(spattn_check_present(name, t));
    TRY(spattn_check_ndim(name, t, 1, "[B+1]"));
    TRY(spattn_check_dtype(name, t, SPATTN_DTYPE_I32, "prefix sums are int32"));
    if (t->shape[0] < 2)
        return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                "%s: dimension 0 (B+1) must be >= 2 (at least one sequence), got %lld",
                                name, (long long)t->shape[0]);
    TRY(spattn_check_strides(name, t));
    return spattn_check_same_device(name, t, "q", q);
}

spattn_status spattn_seqs_check_shapes(const spattn_varlen *vl, const spattn_tensor *q,
                                       int64_t Tq, int64_t Tkv, int k_paged, int64_t num_pages,
                                       int64_t page_size, spattn_seqs *s) {
    if (!vl) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "vl: varlen descriptor is NULL");
    for (int i = 0; i < 4; i++)
        if (vl->reserved[i])
            return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                    "vl.reserved[%d]: must be 0, got %lld", i,
                                    (long long)vl->reserved[i]);
    TRY(check_cu("cu_seqlens_q", vl->cu_seqlens_q, q));
    TRY(check_cu("cu_seqlens_kv", vl->cu_seqlens_kv, q));
    int64_t B = vl->cu_seqlens_q->shape[0] - 1;
    TRY(spattn_check_dim("cu_seqlens_kv", vl->cu_seqlens_kv, 0, "B+1", B + 1,
                         "length of cu_seqlens_q"));
    if (vl->max_seqlen_q < 1 || vl->max_seqlen_q > INT32_MAX)
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "max_seqlen_q: must be in [1, 2^31), got %lld",
                                (long long)vl->max_seqlen_q);
    if (vl->max_seqlen_kv < 1 || vl->max_seqlen_kv > INT32_MAX)
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "max_seqlen_kv: must be in [1, 2^31), got %lld",
                                (long long)vl->max_seqlen_kv);
    const spattn_tensor *bt = vl->block_table;
    if (k_paged != (bt != NULL))
        return spattn_set_error(SPATTN_STATUS_BAD_NDIM,
                                k_paged ? "k: 4 dimensions (pages) need vl.block_table"
                                        : "k: with vl.block_table, k must be pages "
                                          "[num_pages, page_size, Nkv, D] (4 dimensions)");
    s->B = B;
    s->cu_q = (const int32_t *)vl->cu_seqlens_q->data;
    s->cu_kv = (const int32_t *)vl->cu_seqlens_kv->data;
    s->cu_q_st = vl->cu_seqlens_q->strides[0];
    s->cu_kv_st = vl->cu_seqlens_kv->strides[0];
    s->Tq = Tq;
    s->Tkv = Tkv;
    s->max_q = vl->max_seqlen_q;
    s->max_kv = vl->max_seqlen_kv;
    s->table = NULL;
    s->tab_s0 = s->tab_s1 = s->max_pages = s->page_size = s->num_pages = 0;
    if (bt) {
        static const char *const dn[] = {"B", "max_pages"};
        TRY(spattn_check_present("block_table", bt));
        TRY(spattn_check_ndim("block_table", bt, 2, "[B, max_pages]"));
        TRY(spattn_check_dtype("block_table", bt, SPATTN_DTYPE_I32, "page ids are int32"));
        TRY(spattn_check_positive("block_table", bt, dn));
        TRY(spattn_check_dim("block_table", bt, 0, "B", B, "sequences of cu_seqlens_q"));
        TRY(spattn_check_strides("block_table", bt));
        TRY(spattn_check_same_device("block_table", bt, "q", q));
        int64_t rows;
        if (__builtin_mul_overflow(num_pages, page_size, &rows) || rows > INT32_MAX)
            return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                    "k: num_pages * page_size = %lld * %lld must stay below 2^31",
                                    (long long)num_pages, (long long)page_size);
        s->table = (const int32_t *)bt->data;
        s->tab_s0 = bt->strides[0];
        s->tab_s1 = bt->strides[1];
        s->max_pages = bt->shape[1];
        s->page_size = page_size;
        s->num_pages = num_pages;
        s->Tkv = num_pages * page_size;
    }
    return SPATTN_STATUS_SUCCESS;
}

static spattn_status check_prefix(const char *name, const int32_t *cu, int64_t st, int64_t B,
                                  int64_t max, const char *maxname, int64_t T, const char *tname) {
    if (cu[0] != 0)
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX, "%s: [0] must be 0, got %d", name, cu[0]);
    for (int64_t b = 0; b < B; b++) {
        int64_t a = cu[b * st], e = cu[(b + 1) * st];
        if (e < a)
            return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                    "%s: prefix sums must be non-decreasing, got [%lld] = %lld > "
                                    "[%lld] = %lld", name, (long long)b, (long long)a,
                                    (long long)(b + 1), (long long)e);
        if (e - a > max)
            return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                    "%s: sequence %lld has length %lld > %s = %lld", name,
                                    (long long)b, (long long)(e - a), maxname, (long long)max);
    }
    int64_t end = cu[B * st];
    if (T >= 0 && end > T)
        return spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                "%s: [B] = %lld exceeds the %lld tokens of %s", name,
                                (long long)end, (long long)T, tname);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_seqs_check_values(const spattn_seqs *s) {
    TRY(check_prefix("cu_seqlens_q", s->cu_q, s->cu_q_st, s->B, s->max_q, "max_seqlen_q", s->Tq, "q"));
    TRY(check_prefix("cu_seqlens_kv", s->cu_kv, s->cu_kv_st, s->B, s->max_kv, "max_seqlen_kv",
                     s->table ? -1 : s->Tkv, "k"));
    if (!s->table) return SPATTN_STATUS_SUCCESS;
    int64_t *seen = calloc((size_t)s->num_pages, sizeof *seen); /* last row (+1) using a page */
    if (!seen)
        return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY,
                                "block_table: cannot allocate %lld bytes to check page ids",
                                (long long)(s->num_pages * 8));
    spattn_status st = SPATTN_STATUS_SUCCESS;
    for (int64_t b = 0; b < s->B && st == SPATTN_STATUS_SUCCESS; b++) {
        int64_t len = spattn_seq_len_kv(s, b), need = (len + s->page_size - 1) / s->page_size;
        if (need > s->max_pages) {
            st = spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                  "block_table: sequence %lld has %lld keys, more than max_pages * "
                                  "page_size = %lld * %lld", (long long)b, (long long)len,
                                  (long long)s->max_pages, (long long)s->page_size);
            break;
        }
        for (int64_t j = 0; j < need; j++) {
            int32_t pg = s->table[b * s->tab_s0 + j * s->tab_s1];
            if (pg < 0 || pg >= s->num_pages) {
                st = spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                      "block_table: [%lld, %lld] must be a page id in [0, %lld) "
                                      "(pages of k), got %d", (long long)b, (long long)j,
                                      (long long)s->num_pages, pg);
                break;
            }
            if (seen[pg] == b + 1) {
                st = spattn_set_error(SPATTN_STATUS_BAD_INDEX,
                                      "block_table: page %d appears twice in row %lld", pg,
                                      (long long)b);
                break;
            }
            seen[pg] = b + 1;
        }
    }
    free(seen);
    return st;
}

spattn_status spattn_seqs_not_on_cuda(const char *op) {
    return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                            "%s: packed variable-length / paged calls run on the CPU only for now "
                            "(the tensors are on a CUDA device)", op);
}

/* A packed [T, H, D] tensor's tokens [t0, t0+len) as a 4-d view with batch stride 0:
 * bnsd = 1 gives [1, H, len, D], else [1, len, H, D]. */
spattn_tensor spattn_packed_view4(const spattn_tensor *t, int64_t t0, int64_t len, int bnsd) {
    spattn_tensor v = *t;
    size_t es = spattn_dtype_size((spattn_dtype)t->dtype);
    /* An empty range keeps the base: its t0 may be T, one token past the validated extent, and
     * with T = 1 the token stride is not bounded by it at all (a fuzzed stride of 3.4e18 made
     * t0 * stride * es overflow); a non-empty range has t0 < T, inside the extent. */
    v.data = (char *)t->data + (len > 0 ? t0 : 0) * t->strides[0] * (int64_t)es;
    v.ndim = 4;
    v.shape[0] = 1;
    v.strides[0] = 0;
    int ts = bnsd ? 2 : 1, hs = bnsd ? 1 : 2;
    v.shape[ts] = len;
    v.strides[ts] = t->strides[0];
    v.shape[hs] = t->shape[1];
    v.strides[hs] = t->strides[1];
    v.shape[3] = t->shape[2];
    v.strides[3] = t->strides[2];
    return v;
}

/* lse [T, N] tokens [t0, t0+len) as [1, N, len] (bns = 1) or [1, len, N]. */
static spattn_tensor view3(const spattn_tensor *t, int64_t t0, int64_t len, int bns) {
    spattn_tensor v = *t;
    v.data = (float *)t->data + (len > 0 ? t0 : 0) * t->strides[0];  /* as spattn_packed_view4 */
    v.ndim = 3;
    v.shape[0] = 1;
    v.strides[0] = 0;
    int ts = bns ? 2 : 1, hs = bns ? 1 : 2;
    v.shape[ts] = len;
    v.strides[ts] = t->strides[0];
    v.shape[hs] = t->shape[1];
    v.strides[hs] = t->strides[1];
    return v;
}

#define view4 spattn_packed_view4
#define VIEW(field, slot, t0, len, kind)                              \
    do {                                                              \
        if (p->field) {                                               \
            out->t[slot] = kind(p->field, t0, len, layout);           \
            out->p.field = &out->t[slot];                             \
        }                                                             \
    } while (0)

void spattn_bsa_seq_at(const spattn_bsa_problem *p, int64_t b, spattn_bsa_seq *out) {
    const spattn_seqs *s = p->seqs;
    const int layout = 1;
    int64_t q0 = spattn_seq_q0(s, b), lq = spattn_seq_len_q(s, b);
    int64_t k0 = spattn_seq_kv0(s, b), lk = spattn_seq_len_kv(s, b);
    out->p = *p;
    VIEW(q, 0, q0, lq, view4);
    VIEW(o, 1, q0, lq, view4);
    VIEW(dout, 2, q0, lq, view4);
    VIEW(dq, 3, q0, lq, view4);
    VIEW(lse, 4, q0, lq, view3);
    if (!s->table) {
        VIEW(k, 5, k0, lk, view4);
        VIEW(v, 6, k0, lk, view4);
        VIEW(dk, 7, k0, lk, view4);
        VIEW(dv, 8, k0, lk, view4);
    }
    out->p.Sq = lq;
    out->p.Skv = lk;
    /* i / bx is the same mask block for every i < lq (likewise keys) */
    out->p.bx = spattn_seq_blk(p->bx, lq);
    out->p.by = spattn_seq_blk(p->by, lk);
    out->p.nbx = (lq + out->p.bx - 1) / out->p.bx;
    out->p.nby = (lk + out->p.by - 1) / out->p.by;
}

void spattn_sfa_seq_at(const spattn_sfa_problem *p, int64_t b, spattn_sfa_seq *out) {
    const spattn_seqs *s = p->seqs;
    const int layout = 0;
    int64_t q0 = spattn_seq_q0(s, b), lq = spattn_seq_len_q(s, b);
    int64_t k0 = spattn_seq_kv0(s, b), lk = spattn_seq_len_kv(s, b);
    out->p = *p;
    VIEW(q, 0, q0, lq, view4);
    VIEW(q_rope, 1, q0, lq, view4);
    VIEW(idx, 2, q0, lq, view4);
    VIEW(o, 3, q0, lq, view4);
    VIEW(dout, 4, q0, lq, view4);
    VIEW(dq, 5, q0, lq, view4);
    VIEW(dq_rope, 6, q0, lq, view4);
    VIEW(lse, 7, q0, lq, view3);
    if (!s->table) {
        VIEW(k, 8, k0, lk, view4);
        VIEW(k_rope, 9, k0, lk, view4);
        VIEW(v, 10, k0, lk, view4);
        VIEW(dk, 11, k0, lk, view4);
        VIEW(dk_rope, 12, k0, lk, view4);
        VIEW(dv, 13, k0, lk, view4);
    }
    out->p.S1 = lq;
    out->p.S2 = lk;
    out->p.nblk = (lk + p->sbs - 1) / p->sbs;
}
