/*
 * Packed variable-length block-sparse attention entry points (spattn_bsa_*_varlen): every
 * argument, the prefix sums and the block table validated before any output is written, then
 * the CPU backend, or CUDA for the packed and paged forward and backward (the prefix sums and
 * the block table are checked there on the device, before any write; the CUDA backward takes
 * fp16 / bf16, D <= 128, TMA-readable views, paged: page sizes that are multiples of 8, and
 * refuses other shapes).
 */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "seqs.h"

static const char *const kTND_q[] = {"Tq", "N", "D"};
static const char *const kTND_kv[] = {"Tkv", "Nkv", "D"};
static const char *const kPages[] = {"num_pages", "page_size", "Nkv", "D"};

/* q, k, v, mask, scalars and the varlen layout (shapes only). */
static spattn_status check_inputs(const spattn_tensor *q, const spattn_tensor *k,
                                  const spattn_tensor *v, const spattn_tensor *mask, int64_t bx,
                                  int64_t by, double scale, const spattn_varlen *vl,
                                  spattn_bsa_problem *p, spattn_seqs *s) {
    TRY(spattn_check_present("q", q));
    TRY(spattn_check_present("k", k));
    TRY(spattn_check_present("v", v));
    TRY(spattn_check_present("block_mask", mask));
    if (!vl) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "vl: varlen descriptor is NULL");
    if (bx <= 0) return spattn_set_error(SPATTN_STATUS_INVALID_VALUE, "bx: must be >= 1, got %lld", (long long)bx);
    if (by <= 0) return spattn_set_error(SPATTN_STATUS_INVALID_VALUE, "by: must be >= 1, got %lld", (long long)by);
    TRY(spattn_check_scale(scale, "1/sqrt(D)"));
    const int paged = vl->block_table != NULL;
    TRY(spattn_check_ndim("q", q, 3, "[Tq, N, D]"));
    const char *kl = paged ? "[num_pages, page_size, Nkv, D]" : "[Tkv, Nkv, D]";
    TRY(spattn_check_ndim("k", k, paged ? 4 : 3, kl));
    TRY(spattn_check_ndim("v", v, paged ? 4 : 3, kl));
    TRY(spattn_check_ndim("block_mask", mask, 4, "[B, N, ceil(max_seqlen_q/bx), ceil(max_seqlen_kv/by)]"));
    if (!spattn_is_float_dtype(q->dtype))
        return spattn_set_error(SPATTN_STATUS_BAD_DTYPE, "q: dtype must be fp16, bf16 or fp32, got %s (%d)",
                                spattn_dtype_name((spattn_dtype)q->dtype), q->dtype);
    TRY(spattn_check_dtype("k", k, q->dtype, "dtype of q"));
    TRY(spattn_check_dtype("v", v, q->dtype, "dtype of q"));
    TRY(spattn_check_dtype("block_mask", mask, SPATTN_DTYPE_U8, "block masks are uint8"));
    TRY(spattn_check_positive("q", q, kTND_q));
    TRY(spattn_check_positive("k", k, paged ? kPages : kTND_kv));
    TRY(spattn_check_positive("v", v, paged ? kPages : kTND_kv));
    const int hd = paged ? 2 : 1; /* k's head dimension */
    int64_t Tq = q->shape[0], N = q->shape[1], D = q->shape[2];
    int64_t Nkv = k->shape[hd];
    TRY(spattn_check_dim("k", k, hd + 1, "D", D, "D of q"));
    if (N % Nkv != 0)
        return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                "k: dimension %d (Nkv) must divide N=%lld (heads of q), got %lld",
                                hd, (long long)N, (long long)Nkv);
    for (int d = 0; d < k->ndim; d++)
        TRY(spattn_check_dim("v", v, d, (paged ? kPages : kTND_kv)[d], k->shape[d], "shape of k"));
    if (D % 8 != 0 || D > 256)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "q: dimension 2 (D) must be a multiple of 8 in [8, 256], got %lld",
                                (long long)D);
    TRY(spattn_seqs_check_shapes(vl, q, Tq, paged ? 0 : k->shape[0], paged,
                                 paged ? k->shape[0] : 0, paged ? k->shape[1] : 0, s));
    /* ceil without max + bx - 1, which overflows for bx near INT64_MAX */
    int64_t B = s->B, nbx = s->max_q / bx + (s->max_q % bx != 0);
    int64_t nby = s->max_kv / by + (s->max_kv % by != 0);
    TRY(spattn_check_dim("block_mask", mask, 0, "B", B, "sequences of cu_seqlens_q"));
    TRY(spattn_check_dim("block_mask", mask, 1, "N", N, "N of q"));
    TRY(spattn_check_dim("block_mask", mask, 2, "ceil(max_seqlen_q/bx)", nbx, "ceil(max_seqlen_q/bx)"));
    TRY(spattn_check_dim("block_mask", mask, 3, "ceil(max_seqlen_kv/by)", nby, "ceil(max_seqlen_kv/by)"));
    TRY(spattn_check_strides("q", q));
    TRY(spattn_check_strides("k", k));
    TRY(spattn_check_strides("v", v));
    TRY(spattn_check_strides("block_mask", mask));
    TRY(spattn_check_same_device("k", k, "q", q));
    TRY(spattn_check_same_device("v", v, "q", q));
    TRY(spattn_check_same_device("block_mask", mask, "q", q));
    p->q = q;
    p->k = k;
    p->v = v;
    p->mask = mask;
    p->B = B;
    p->N = N;
    p->Nkv = Nkv;
    p->Sq = s->max_q;
    p->Skv = s->max_kv;
    p->D = D;
    /* A block longer than every sequence is the whole sequence (as in bsa_api.c): clamped, so
     * that the tiling neither overflows nor grows with bx or by. */
    p->bx = bx < s->max_q ? bx : s->max_q;
    p->by = by < s->max_kv ? by : s->max_kv;
    p->nbx = nbx;
    p->nby = nby;
    p->scale = scale == 0.0 ? (float)(1.0 / sqrt((double)D)) : (float)scale;
    p->dtype = q->dtype;
    p->seqs = s;
    return SPATTN_STATUS_SUCCESS;
}

/* A tensor of q's dtype and device shaped like `like` (o, dout, dq like q; dk, dv like k:
 * packed [Tkv, Nkv, D], or pages [num_pages, page_size, Nkv, D] when k is paged). */
static spattn_status check_like(const char *name, const spattn_tensor *t, const spattn_tensor *like,
                                const char *likename, const char *const *dn, int is_output) {
    TRY(spattn_check_present(name, t));
    TRY(spattn_check_ndim(name, t, like->ndim,
                          dn == kTND_q ? "[Tq, N, D]"
                          : dn == kPages ? "[num_pages, page_size, Nkv, D] (pages, as k)"
                                         : "[Tkv, Nkv, D]"));
    TRY(spattn_check_dtype(name, t, like->dtype, "dtype of q"));
    for (int d = 0; d < like->ndim; d++) TRY(spattn_check_dim(name, t, d, dn[d], like->shape[d], likename));
    TRY(spattn_check_strides(name, t));
    if (is_output) TRY(spattn_check_no_self_overlap(name, t));
    return spattn_check_same_device(name, t, "q", like);
}

static spattn_status check_lse(const spattn_tensor *t, const spattn_bsa_problem *p, int is_output) {
    TRY(spattn_check_present("lse", t));
    TRY(spattn_check_ndim("lse", t, 2, "[Tq, N]"));
    TRY(spattn_check_dtype("lse", t, SPATTN_DTYPE_F32, "LSE is fp32"));
    TRY(spattn_check_dim("lse", t, 0, "Tq", p->q->shape[0], "Tq of q"));
    TRY(spattn_check_dim("lse", t, 1, "N", p->N, "N of q"));
    TRY(spattn_check_strides("lse", t));
    if (is_output) TRY(spattn_check_no_self_overlap("lse", t));
    return spattn_check_same_device("lse", t, "q", p->q);
}

/* Backend, then (CPU) the values of the prefix sums and the table (CUDA checks them on the
 * device: spattn_cuda_bsa_fwd_varlen / _bwd_varlen). */
static spattn_status resolve(const spattn_options *opt, const spattn_bsa_problem *p, spattn_exec *ex,
                             int *use_cuda) {
    TRY(spattn_resolve_exec(opt, p->q, ex, use_cuda));
    if (*use_cuda) return SPATTN_STATUS_SUCCESS;
    return spattn_seqs_check_values(p->seqs);
}

spattn_status spattn_bsa_fwd_varlen(const spattn_tensor *q, const spattn_tensor *k,
                                    const spattn_tensor *v, const spattn_tensor *block_mask,
                                    int64_t bx, int64_t by, double scale, const spattn_varlen *vl,
                                    const spattn_tensor *o, const spattn_tensor *lse,
                                    const spattn_options *opt) {
    spattn_clear_error();
    spattn_bsa_problem p = {0};
    spattn_seqs s;
    TRY(check_inputs(q, k, v, block_mask, bx, by, scale, vl, &p, &s));
    TRY(check_like("o", o, q, "shape of q", kTND_q, 1));
    if (lse) TRY(check_lse(lse, &p, 1));
    const char *on[] = {"o", "lse"};
    const spattn_tensor *os[] = {o, lse};
    const char *in[] = {"q", "k", "v", "block_mask", "cu_seqlens_q", "cu_seqlens_kv", "block_table"};
    const spattn_tensor *is[] = {q, k, v, block_mask, vl->cu_seqlens_q, vl->cu_seqlens_kv, vl->block_table};
    TRY(spattn_check_aliasing(on, os, 2, in, is, 7));
    p.o = o;
    p.lse = lse;
    spattn_exec ex;
    int use_cuda;
    TRY(resolve(opt, &p, &ex, &use_cuda));
    if (use_cuda) {
        TRY(spattn_check_workspace(&ex, spattn_cuda_bsa_varlen_workspace(&p, 0)));
        return spattn_cuda_bsa_fwd_varlen(&p, &ex);
    }
    TRY(spattn_check_workspace(&ex, spattn_cpu_bsa_workspace(&p, 0, ex.num_threads)));
    return spattn_cpu_bsa_fwd(&p, &ex);
}

spattn_status spattn_bsa_bwd_varlen(const spattn_tensor *q, const spattn_tensor *k,
                                    const spattn_tensor *v, const spattn_tensor *o,
                                    const spattn_tensor *dout, const spattn_tensor *lse,
                                    const spattn_tensor *block_mask, int64_t bx, int64_t by,
                                    double scale, const spattn_varlen *vl, const spattn_tensor *dq,
                                    const spattn_tensor *dk, const spattn_tensor *dv,
                                    const spattn_options *opt) {
    spattn_clear_error();
    spattn_bsa_problem p = {0};
    spattn_seqs s;
    TRY(check_inputs(q, k, v, block_mask, bx, by, scale, vl, &p, &s));
    TRY(check_like("o", o, q, "shape of q", kTND_q, 0));
    TRY(check_like("dout", dout, q, "shape of q", kTND_q, 0));
    TRY(check_lse(lse, &p, 0));
    TRY(check_like("dq", dq, q, "shape of q", kTND_q, 1));
    /* paged k / v: dk / dv are pages too (rows no sequence uses get 0, shared pages the sum) */
    const char *const *kdn = s.table ? kPages : kTND_kv;
    TRY(check_like("dk", dk, k, "shape of k", kdn, 1));
    TRY(check_like("dv", dv, k, "shape of k", kdn, 1));
    const char *on[] = {"dq", "dk", "dv"};
    const spattn_tensor *os[] = {dq, dk, dv};
    const char *in[] = {"q", "k", "v", "o", "dout", "lse", "block_mask", "cu_seqlens_q",
                        "cu_seqlens_kv", "block_table"};
    const spattn_tensor *is[] = {q, k, v, o, dout, lse, block_mask, vl->cu_seqlens_q,
                                 vl->cu_seqlens_kv, vl->block_table};
    TRY(spattn_check_aliasing(on, os, 3, in, is, 10));
    p.o = o;
    p.dout = dout;
    p.lse = lse;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    spattn_exec ex;
    int use_cuda;
    TRY(resolve(opt, &p, &ex, &use_cuda));
    if (use_cuda) {
        TRY(spattn_check_workspace(&ex, spattn_cuda_bsa_varlen_workspace(&p, 1)));
        return spattn_cuda_bsa_bwd_varlen(&p, &ex);
    }
    TRY(spattn_check_workspace(&ex, spattn_cpu_bsa_workspace(&p, 1, ex.num_threads)));
    return spattn_cpu_bsa_bwd(&p, &ex);
}

spattn_status spattn_bsa_varlen_workspace_size(const spattn_tensor *q, const spattn_tensor *k,
                                               const spattn_tensor *v,
                                               const spattn_tensor *block_mask, int64_t bx,
                                               int64_t by, const spattn_varlen *vl,
                                               int32_t backward, const spattn_options *opt,
                                               size_t *bytes) {
    spattn_clear_error();
    if (!bytes) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "bytes: out-pointer is NULL");
    spattn_bsa_problem p = {0};
    spattn_seqs s;
    TRY(check_inputs(q, k, v, block_mask, bx, by, 0.0, vl, &p, &s));
    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, q, &ex, &use_cuda));
    return spattn_answer_workspace(use_cuda ? spattn_cuda_bsa_varlen_workspace(&p, backward != 0)
                                            : spattn_cpu_bsa_workspace(&p, backward != 0, ex.num_threads),
                                   bytes);
}
