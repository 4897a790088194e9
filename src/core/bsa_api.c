/*
 * Block-sparse attention entry points: every argument is validated here, before any output
 * is written, then the problem goes to the CPU or CUDA backend.
 */
#include <float.h>
#include <math.h>

#include "check.h"

static const char *const kBNSD_q[] = {"B", "N", "Sq", "D"};
static const char *const kBNSD_kv[] = {"B", "Nkv", "Skv", "D"};
static const char *const kMask[] = {"B", "N", "ceil(Sq/bx)", "ceil(Skv/by)"};
static const char *const kLse[] = {"B", "N", "Sq"};

/* Checks shared by fwd, bwd and the workspace query: q, k, v, mask and the scalars. */
static spattn_status check_inputs(const spattn_tensor *q, const spattn_tensor *k,
                                  const spattn_tensor *v, const spattn_tensor *mask, int64_t bx,
                                  int64_t by, double scale, spattn_bsa_problem *p) {
    TRY(spattn_check_present("q", q));
    TRY(spattn_check_present("k", k));
    TRY(spattn_check_present("v", v));
    TRY(spattn_check_present("block_mask", mask));
    if (bx <= 0) return spattn_set_error(SPATTN_STATUS_INVALID_VALUE, "bx: must be >= 1, got %lld", (long long)bx);
    if (by <= 0) return spattn_set_error(SPATTN_STATUS_INVALID_VALUE, "by: must be >= 1, got %lld", (long long)by);
    TRY(spattn_check_scale(scale, "1/sqrt(D)"));
    TRY(spattn_check_ndim("q", q, 4, "[B, N, Sq, D]"));
    TRY(spattn_check_ndim("k", k, 4, "[B, Nkv, Skv, D]"));
    TRY(spattn_check_ndim("v", v, 4, "[B, Nkv, Skv, D]"));
    TRY(spattn_check_ndim("block_mask", mask, 4, "[B, N, ceil(Sq/bx), ceil(Skv/by)]"));
    if (!spattn_is_float_dtype(q->dtype))
        return spattn_set_error(SPATTN_STATUS_BAD_DTYPE, "q: dtype must be fp16, bf16 or fp32, got %s (%d)",
                                spattn_dtype_name((spattn_dtype)q->dtype), q->dtype);
    TRY(spattn_check_dtype("k", k, q->dtype, "dtype of q"));
    TRY(spattn_check_dtype("v", v, q->dtype, "dtype of q"));
    TRY(spattn_check_dtype("block_mask", mask, SPATTN_DTYPE_U8, "block masks are uint8"));
    TRY(spattn_check_positive("q", q, kBNSD_q));
    TRY(spattn_check_positive("k", k, kBNSD_kv));
    TRY(spattn_check_positive("v", v, kBNSD_kv));
    int64_t B = q->shape[0], N = q->shape[1], Sq = q->shape[2], D = q->shape[3];
    int64_t Nkv = k->shape[1], Skv = k->shape[2];
    TRY(spattn_check_dim("k", k, 0, "B", B, "B of q"));
    TRY(spattn_check_dim("k", k, 3, "D", D, "D of q"));
    if (N % Nkv != 0)
        return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                "k: dimension 1 (Nkv) must divide N=%lld (heads of q), got %lld",
                                (long long)N, (long long)Nkv);
    TRY(spattn_check_dim("v", v, 0, "B", B, "B of q"));
    TRY(spattn_check_dim("v", v, 1, "Nkv", Nkv, "Nkv of k"));
    TRY(spattn_check_dim("v", v, 2, "Skv", Skv, "Skv of k"));
    TRY(spattn_check_dim("v", v, 3, "D", D, "D of q"));
    if (D % 8 != 0 || D > 256)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "q: dimension 3 (D) must be a multiple of 8 in [8, 256], got %lld",
                                (long long)D);
    /* ceil without Sq + bx - 1, which overflows for bx near INT64_MAX */
    int64_t nbx = Sq / bx + (Sq % bx != 0), nby = Skv / by + (Skv % by != 0);
    TRY(spattn_check_dim("block_mask", mask, 0, "B", B, "B of q"));
    TRY(spattn_check_dim("block_mask", mask, 1, "N", N, "N of q"));
    TRY(spattn_check_dim("block_mask", mask, 2, "ceil(Sq/bx)", nbx, "ceil(Sq/bx)"));
    TRY(spattn_check_dim("block_mask", mask, 3, "ceil(Skv/by)", nby, "ceil(Skv/by)"));
    (void)kMask;
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
    p->Sq = Sq;
    p->Skv = Skv;
    p->D = D;
    /* A block longer than the sequence is the whole sequence: clamped, so that no backend's
     * tiling grows with bx or by (bx = 2^40 over 64 tokens used to run for minutes). */
    p->bx = bx < Sq ? bx : Sq;
    p->by = by < Skv ? by : Skv;
    p->nbx = nbx;
    p->nby = nby;
    p->scale = scale == 0.0 ? (float)(1.0 / sqrt((double)D)) : (float)scale;
    p->dtype = q->dtype;
    return SPATTN_STATUS_SUCCESS;
}

/* A [B, N, Sq, D]-shaped tensor of q's dtype and device (o, dout, dq). */
static spattn_status check_like_q(const char *name, const spattn_tensor *t, const spattn_bsa_problem *p,
                                  int is_output) {
    TRY(spattn_check_present(name, t));
    TRY(spattn_check_ndim(name, t, 4, "[B, N, Sq, D]"));
    TRY(spattn_check_dtype(name, t, p->dtype, "dtype of q"));
    TRY(spattn_check_dim(name, t, 0, "B", p->B, "B of q"));
    TRY(spattn_check_dim(name, t, 1, "N", p->N, "N of q"));
    TRY(spattn_check_dim(name, t, 2, "Sq", p->Sq, "Sq of q"));
    TRY(spattn_check_dim(name, t, 3, "D", p->D, "D of q"));
    TRY(spattn_check_strides(name, t));
    if (is_output) TRY(spattn_check_no_self_overlap(name, t));
    return spattn_check_same_device(name, t, "q", p->q);
}

static spattn_status check_like_kv(const char *name, const spattn_tensor *t, const spattn_bsa_problem *p) {
    TRY(spattn_check_present(name, t));
    TRY(spattn_check_ndim(name, t, 4, "[B, Nkv, Skv, D]"));
    TRY(spattn_check_dtype(name, t, p->dtype, "dtype of q"));
    TRY(spattn_check_dim(name, t, 0, "B", p->B, "B of k"));
    TRY(spattn_check_dim(name, t, 1, "Nkv", p->Nkv, "Nkv of k"));
    TRY(spattn_check_dim(name, t, 2, "Skv", p->Skv, "Skv of k"));
    TRY(spattn_check_dim(name, t, 3, "D", p->D, "D of k"));
    TRY(spattn_check_strides(name, t));
    TRY(spattn_check_no_self_overlap(name, t));
    return spattn_check_same_device(name, t, "q", p->q);
}

static spattn_status check_lse(const spattn_tensor *t, const spattn_bsa_problem *p, int is_output) {
    TRY(spattn_check_present("lse", t));
    TRY(spattn_check_ndim("lse", t, 3, "[B, N, Sq]"));
    TRY(spattn_check_dtype("lse", t, SPATTN_DTYPE_F32, "LSE is fp32"));
    (void)kLse;
    TRY(spattn_check_dim("lse", t, 0, "B", p->B, "B of q"));
    TRY(spattn_check_dim("lse", t, 1, "N", p->N, "N of q"));
    TRY(spattn_check_dim("lse", t, 2, "Sq", p->Sq, "Sq of q"));
    TRY(spattn_check_strides("lse", t));
    if (is_output) TRY(spattn_check_no_self_overlap("lse", t));
    return spattn_check_same_device("lse", t, "q", p->q);
}

spattn_status spattn_bsa_fwd_planned(const spattn_tensor *q, const spattn_tensor *k,
                                     const spattn_tensor *v, const spattn_tensor *block_mask,
                                     int64_t bx, int64_t by, double scale, const spattn_tensor *o,
                                     const spattn_tensor *lse, const spattn_options *opt,
                                     const struct spattn_bsa_plan *plan) {
    spattn_clear_error();
    spattn_bsa_problem p = {0};
    TRY(check_inputs(q, k, v, block_mask, bx, by, scale, &p));
    p.plan = plan;
    TRY(check_like_q("o", o, &p, 1));
    if (lse) TRY(check_lse(lse, &p, 1));
    const char *on[] = {"o", "lse"};
    const spattn_tensor *os[] = {o, lse};
    const char *in[] = {"q", "k", "v", "block_mask"};
    const spattn_tensor *is[] = {q, k, v, block_mask};
    TRY(spattn_check_aliasing(on, os, 2, in, is, 4));
    p.o = o;
    p.lse = lse;
    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, q, &ex, &use_cuda));
    if (use_cuda) {
        TRY(spattn_check_workspace(&ex, spattn_cuda_bsa_workspace(&p, 0)));
        return spattn_cuda_bsa_fwd(&p, &ex);
    }
    TRY(spattn_check_workspace(&ex, spattn_cpu_bsa_workspace(&p, 0, ex.num_threads)));
    return spattn_cpu_bsa_fwd(&p, &ex);
}

spattn_status spattn_bsa_fwd(const spattn_tensor *q, const spattn_tensor *k,
                             const spattn_tensor *v, const spattn_tensor *block_mask, int64_t bx,
                             int64_t by, double scale, const spattn_tensor *o,
                             const spattn_tensor *lse) {
    return spattn_bsa_fwd_ex(q, k, v, block_mask, bx, by, scale, o, lse, NULL);
}

spattn_status spattn_bsa_fwd_ex(const spattn_tensor *q, const spattn_tensor *k,
                                const spattn_tensor *v, const spattn_tensor *block_mask,
                                int64_t bx, int64_t by, double scale, const spattn_tensor *o,
                                const spattn_tensor *lse, const spattn_options *opt) {
    return spattn_bsa_fwd_planned(q, k, v, block_mask, bx, by, scale, o, lse, opt, NULL);
}

spattn_status spattn_bsa_bwd_planned(const spattn_tensor *q, const spattn_tensor *k,
                                     const spattn_tensor *v, const spattn_tensor *o,
                                     const spattn_tensor *dout, const spattn_tensor *lse,
                                     const spattn_tensor *block_mask, int64_t bx, int64_t by,
                                     double scale, const spattn_tensor *dq, const spattn_tensor *dk,
                                     const spattn_tensor *dv, const spattn_options *opt,
                                     const struct spattn_bsa_plan *plan) {
    spattn_clear_error();
    spattn_bsa_problem p = {0};
    TRY(check_inputs(q, k, v, block_mask, bx, by, scale, &p));
    p.plan = plan;
    TRY(check_like_q("o", o, &p, 0));
    TRY(check_like_q("dout", dout, &p, 0));
    TRY(check_lse(lse, &p, 0));
    TRY(check_like_q("dq", dq, &p, 1));
    TRY(check_like_kv("dk", dk, &p));
    TRY(check_like_kv("dv", dv, &p));
    const char *on[] = {"dq", "dk", "dv"};
    const spattn_tensor *os[] = {dq, dk, dv};
    const char *in[] = {"q", "k", "v", "o", "dout", "lse", "block_mask"};
    const spattn_tensor *is[] = {q, k, v, o, dout, lse, block_mask};
    TRY(spattn_check_aliasing(on, os, 3, in, is, 7));
    p.o = o;
    p.dout = dout;
    p.lse = lse;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, q, &ex, &use_cuda));
    if (use_cuda) {
        TRY(spattn_check_workspace(&ex, spattn_cuda_bsa_workspace(&p, 1)));
        return spattn_cuda_bsa_bwd(&p, &ex);
    }
    TRY(spattn_check_workspace(&ex, spattn_cpu_bsa_workspace(&p, 1, ex.num_threads)));
    return spattn_cpu_bsa_bwd(&p, &ex);
}

spattn_status spattn_bsa_bwd(const spattn_tensor *q, const spattn_tensor *k,
                             const spattn_tensor *v, const spattn_tensor *o,
                             const spattn_tensor *dout, const spattn_tensor *lse,
                             const spattn_tensor *block_mask, int64_t bx, int64_t by, double scale,
                             const spattn_tensor *dq, const spattn_tensor *dk,
                             const spattn_tensor *dv) {
    return spattn_bsa_bwd_ex(q, k, v, o, dout, lse, block_mask, bx, by, scale, dq, dk, dv, NULL);
}

spattn_status spattn_bsa_bwd_ex(const spattn_tensor *q, const spattn_tensor *k,
                                const spattn_tensor *v, const spattn_tensor *o,
                                const spattn_tensor *dout, const spattn_tensor *lse,
                                const spattn_tensor *block_mask, int64_t bx, int64_t by,
                                double scale, const spattn_tensor *dq, const spattn_tensor *dk,
                                const spattn_tensor *dv, const spattn_options *opt) {
    return spattn_bsa_bwd_planned(q, k, v, o, dout, lse, block_mask, bx, by, scale, dq, dk, dv, opt,
                                  NULL);
}

spattn_status spattn_bsa_workspace_size(const spattn_tensor *q, const spattn_tensor *k,
                                        const spattn_tensor *v, const spattn_tensor *block_mask,
                                        int64_t bx, int64_t by, int32_t backward,
                                        const spattn_options *opt, size_t *bytes) {
    return spattn_bsa_workspace_planned(q, k, v, block_mask, bx, by, backward, opt, bytes, NULL);
}

spattn_status spattn_bsa_workspace_planned(const spattn_tensor *q, const spattn_tensor *k,
                                           const spattn_tensor *v, const spattn_tensor *block_mask,
                                           int64_t bx, int64_t by, int32_t backward,
                                           const spattn_options *opt, size_t *bytes,
                                           const struct spattn_bsa_plan *plan) {
    spattn_clear_error();
    if (!bytes) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "bytes: out-pointer is NULL");
    spattn_bsa_problem p = {0};
    TRY(check_inputs(q, k, v, block_mask, bx, by, 0.0, &p));
    p.plan = plan;
    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, q, &ex, &use_cuda));
    return spattn_answer_workspace(use_cuda ? spattn_cuda_bsa_workspace(&p, backward != 0)
                                            : spattn_cpu_bsa_workspace(&p, backward != 0, ex.num_threads),
                                   bytes);
}
