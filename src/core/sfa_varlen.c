/*
 * Packed variable-length top-k sparse flash attention entry points (spattn_sfa_*_varlen):
 * every argument, the prefix sums, the block table and the index values (per sequence)
 * validated before any output is written, then the backend.  CPU tensors: the values are
 * checked here.  CUDA tensors: the forward and the backward run on the GPU, which checks the
 * values on the device itself (src/cuda/sfa_host.cu; they stay there); the backward there takes
 * the Hopper kernels' shapes only (others: SPATTN_STATUS_NOT_SUPPORTED from the backend).
 */
#include <math.h>

#include "check.h"
#include "seqs.h"

static const char *const kQ[] = {"Tq", "N1", "D"};
static const char *const kQr[] = {"Tq", "N1", "Dr"};
static const char *const kK[] = {"Tkv", "N2", "D"};
static const char *const kKr[] = {"Tkv", "N2", "Dr"};
static const char *const kP[] = {"num_pages", "page_size", "N2", "D"};
static const char *const kPr[] = {"num_pages", "page_size", "N2", "Dr"};
static const char *const kIdx[] = {"Tq", "N2", "K"};

/* A tensor of ndim `nd` with dims `want` (-1: any positive), dtype, strides, device. */
static spattn_status check_t(const char *name, const spattn_tensor *t, int nd, const char *layout,
                             const char *const *dn, const int64_t *want, int32_t dtype,
                             const spattn_tensor *q, int is_output) {
    TRY(spattn_check_present(name, t));
    TRY(spattn_check_ndim(name, t, nd, layout));
    TRY(spattn_check_dtype(name, t, dtype, dtype == SPATTN_DTYPE_I32 ? "indices are int32" : "dtype of q"));
    TRY(spattn_check_positive(name, t, dn));
    for (int d = 0; d < nd; d++)
        if (want[d] >= 0) TRY(spattn_check_dim(name, t, d, dn[d], want[d], "matching q / k"));
    TRY(spattn_check_strides(name, t));
    if (is_output) TRY(spattn_check_no_self_overlap(name, t));
    return spattn_check_same_device(name, t, "q", q);
}

/* k-side tensor (k, v, k_rope and their gradients): packed [Tkv, N2, w] or pages. */
static spattn_status check_kside(const char *name, const spattn_tensor *t, const spattn_tensor *k,
                                 int64_t w, int paged, int rope, int32_t dt, const spattn_tensor *q,
                                 int is_output) {
    if (paged) {
        const int64_t want[4] = {k->shape[0], k->shape[1], k->shape[2], w};
        return check_t(name, t, 4, rope ? "[num_pages, page_size, N2, Dr]" : "[num_pages, page_size, N2, D]",
                       rope ? kPr : kP, want, dt, q, is_output);
    }
    const int64_t want[3] = {k->shape[0], k->shape[1], w};
    return check_t(name, t, 3, rope ? "[Tkv, N2, Dr]" : "[Tkv, N2, D]", rope ? kKr : kK, want, dt,
                   q, is_output);
}

static spattn_status check_inputs(const spattn_tensor *q, const spattn_tensor *q_rope,
                                  const spattn_tensor *k, const spattn_tensor *k_rope,
                                  const spattn_tensor *v, const spattn_tensor *idx, int64_t sbs,
                                  int32_t mode, double scale, const spattn_varlen *vl,
                                  spattn_sfa_problem *p, spattn_seqs *s) {
    TRY(spattn_check_present("q", q));
    TRY(spattn_check_present("k", k));
    TRY(spattn_check_present("indices", idx));
    if (!vl) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "vl: varlen descriptor is NULL");
    if ((q_rope == NULL) != (k_rope == NULL))
        return spattn_set_error(SPATTN_STATUS_NULL_POINTER,
                                "%s: must be given when %s is (rope parts come in pairs)",
                                q_rope ? "k_rope" : "q_rope", q_rope ? "q_rope" : "k_rope");
    if (sbs < 1 || sbs > 128 || (sbs & (sbs - 1)))
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "sbs: must be a power of two in [1, 128], got %lld", (long long)sbs);
    if (mode != SPATTN_SFA_MODE_NONE && mode != SPATTN_SFA_MODE_CAUSAL)
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "mode: must be 0 (none) or 3 (right-down causal), got %d", mode);
    TRY(spattn_check_scale(scale, "1/sqrt(D+Dr)"));
    TRY(spattn_check_ndim("q", q, 3, "[Tq, N1, D]"));
    if (!spattn_is_float_dtype(q->dtype))
        return spattn_set_error(SPATTN_STATUS_BAD_DTYPE, "q: dtype must be fp16, bf16 or fp32, got %s (%d)",
                                spattn_dtype_name((spattn_dtype)q->dtype), q->dtype);
    TRY(spattn_check_positive("q", q, kQ));
    TRY(spattn_check_strides("q", q));
    const int32_t dt = q->dtype;
    const int paged = vl->block_table != NULL;
    const int64_t Tq = q->shape[0], N1 = q->shape[1], D = q->shape[2];
    if (paged) {
        const int64_t want[4] = {-1, -1, -1, D};
        TRY(check_t("k", k, 4, "[num_pages, page_size, N2, D]", kP, want, dt, q, 0));
    } else {
        const int64_t want[3] = {-1, -1, D};
        TRY(check_t("k", k, 3, "[Tkv, N2, D]", kK, want, dt, q, 0));
    }
    const int hd = paged ? 2 : 1;
    const int64_t N2 = k->shape[hd];
    if (N1 % N2 != 0)
        return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                "k: dimension %d (N2) must divide N1=%lld (heads of q), got %lld",
                                hd, (long long)N1, (long long)N2);
    if (D % 8 != 0 || D > 1024)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "q: dimension 2 (D) must be a multiple of 8 in [8, 1024], got %lld",
                                (long long)D);
    int64_t Dr = 0;
    if (q_rope) {
        TRY(spattn_check_ndim("q_rope", q_rope, 3, "[Tq, N1, Dr]"));
        Dr = q_rope->shape[2];
        const int64_t w[3] = {Tq, N1, -1};
        TRY(check_t("q_rope", q_rope, 3, "[Tq, N1, Dr]", kQr, w, dt, q, 0));
        TRY(check_kside("k_rope", k_rope, k, Dr, paged, 1, dt, q, 0));
        if (Dr % 8 != 0 || Dr > 256)
            return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                    "q_rope: dimension 2 (Dr) must be a multiple of 8 in [8, 256], got %lld",
                                    (long long)Dr);
    }
    if (v) TRY(check_kside("v", v, k, D, paged, 0, dt, q, 0));
    const int64_t wi[3] = {Tq, N2, -1};
    TRY(check_t("indices", idx, 3, "[Tq, N2, K]", kIdx, wi, SPATTN_DTYPE_I32, q, 0));
    TRY(spattn_seqs_check_shapes(vl, q, Tq, paged ? 0 : k->shape[0], paged,
                                 paged ? k->shape[0] : 0, paged ? k->shape[1] : 0, s));
    p->q = q;
    p->q_rope = q_rope;
    p->k = k;
    p->k_rope = k_rope;
    p->v = v;
    p->idx = idx;
    p->B = s->B;
    p->S1 = s->max_q;
    p->S2 = s->max_kv;
    p->N1 = N1;
    p->N2 = N2;
    p->D = D;
    p->Dr = Dr;
    p->K = idx->shape[2];
    p->sbs = sbs;
    p->nblk = (s->max_kv + sbs - 1) / sbs;
    p->mode = mode;
    p->shared_kv = v == NULL;
    p->scale = scale == 0.0 ? (float)(1.0 / sqrt((double)(D + Dr))) : (float)scale;
    p->dtype = dt;
    p->seqs = s;
    return SPATTN_STATUS_SUCCESS;
}

static spattn_status check_lse(const spattn_tensor *t, const spattn_sfa_problem *p, int is_output) {
    static const char *const dn[] = {"Tq", "N1"};
    const int64_t want[2] = {p->q->shape[0], p->N1};
    return check_t("lse", t, 2, "[Tq, N1]", dn, want, SPATTN_DTYPE_F32, p->q, is_output);
}

/* Index values per sequence: -1 or [0, ceil(Skv_b/sbs)); rows past cu_q[B] are not read. */
static spattn_status check_index_values(const spattn_sfa_problem *p) {
    const spattn_seqs *s = p->seqs;
    const spattn_tensor *t = p->idx;
    const int32_t *base = (const int32_t *)t->data;
    for (int64_t b = 0; b < s->B; b++) {
        int64_t q0 = spattn_seq_q0(s, b), lq = spattn_seq_len_q(s, b), lk = spattn_seq_len_kv(s, b);
        int64_t nblk = (lk + p->sbs - 1) / p->sbs;
        for (int64_t i = q0; i < q0 + lq; i++)
            for (int64_t n = 0; n < p->N2; n++)
                for (int64_t j = 0; j < p->K; j++) {
                    int32_t x = base[spattn_offset3(t, i, n, j)];
                    if (x < -1 || (int64_t)x >= nblk)
                        return spattn_set_error(
                            SPATTN_STATUS_BAD_INDEX,
                            "indices: value at [%lld, %lld, %lld] (sequence %lld) must be -1 or in "
                            "[0, %lld) (ceil(Skv/sbs) = ceil(%lld/%lld) of the sequence), got %d",
                            (long long)i, (long long)n, (long long)j, (long long)b,
                            (long long)nblk, (long long)lk, (long long)p->sbs, x);
                }
    }
    return SPATTN_STATUS_SUCCESS;
}

/* CUDA: the workspace only (the device checks the values, before any write). */
static spattn_status resolve(const spattn_options *opt, const spattn_sfa_problem *p, const char *op,
                             int backward, spattn_exec *ex, int *use_cuda) {
    TRY(spattn_resolve_exec(opt, p->q, ex, use_cuda));
    (void)op;
    if (*use_cuda) return spattn_check_workspace(ex, spattn_cuda_sfa_workspace(p, backward));
    TRY(spattn_check_workspace(ex, spattn_cpu_sfa_workspace(p, backward, ex->num_threads)));
    TRY(spattn_seqs_check_values(p->seqs));
    return check_index_values(p);
}

spattn_status spattn_sfa_fwd_varlen(const spattn_tensor *q, const spattn_tensor *q_rope,
                                    const spattn_tensor *k, const spattn_tensor *k_rope,
                                    const spattn_tensor *v, const spattn_tensor *indices,
                                    int64_t sbs, int32_t mode, double scale, const spattn_varlen *vl,
                                    const spattn_tensor *o, const spattn_tensor *lse,
                                    const spattn_options *opt) {
    spattn_clear_error();
    spattn_sfa_problem p = {0};
    spattn_seqs s;
    TRY(check_inputs(q, q_rope, k, k_rope, v, indices, sbs, mode, scale, vl, &p, &s));
    const int64_t wo[3] = {q->shape[0], p.N1, p.D};
    TRY(check_t("o", o, 3, "[Tq, N1, D]", kQ, wo, p.dtype, q, 1));
    if (lse) TRY(check_lse(lse, &p, 1));
    const char *on[] = {"o", "lse"};
    const spattn_tensor *os[] = {o, lse};
    const char *in[] = {"q", "q_rope", "k", "k_rope", "v", "indices", "cu_seqlens_q",
                        "cu_seqlens_kv", "block_table"};
    const spattn_tensor *is[] = {q, q_rope, k, k_rope, v, indices, vl->cu_seqlens_q,
                                 vl->cu_seqlens_kv, vl->block_table};
    TRY(spattn_check_aliasing(on, os, 2, in, is, 9));
    p.o = o;
    p.lse = lse;
    spattn_exec ex;
    int use_cuda;
    TRY(resolve(opt, &p, "sfa_fwd_varlen", 0, &ex, &use_cuda));
    return use_cuda ? spattn_cuda_sfa_fwd(&p, &ex) : spattn_cpu_sfa_fwd(&p, &ex);
}

spattn_status spattn_sfa_bwd_varlen(const spattn_tensor *q, const spattn_tensor *q_rope,
                                    const spattn_tensor *k, const spattn_tensor *k_rope,
                                    const spattn_tensor *v, const spattn_tensor *o,
                                    const spattn_tensor *dout, const spattn_tensor *lse,
                                    const spattn_tensor *indices, int64_t sbs, int32_t mode,
                                    double scale, const spattn_varlen *vl, const spattn_tensor *dq,
                                    const spattn_tensor *dq_rope, const spattn_tensor *dk,
                                    const spattn_tensor *dk_rope, const spattn_tensor *dv,
                                    const spattn_options *opt) {
    spattn_clear_error();
    spattn_sfa_problem p = {0};
    spattn_seqs s;
    TRY(check_inputs(q, q_rope, k, k_rope, v, indices, sbs, mode, scale, vl, &p, &s));
    const int paged = s.table != NULL;
    const int64_t wq[3] = {q->shape[0], p.N1, p.D}, wqr[3] = {q->shape[0], p.N1, p.Dr};
    TRY(check_t("o", o, 3, "[Tq, N1, D]", kQ, wq, p.dtype, q, 0));
    TRY(check_t("dout", dout, 3, "[Tq, N1, D]", kQ, wq, p.dtype, q, 0));
    TRY(check_lse(lse, &p, 0));
    TRY(check_t("dq", dq, 3, "[Tq, N1, D]", kQ, wq, p.dtype, q, 1));
    TRY(check_kside("dk", dk, k, p.D, paged, 0, p.dtype, q, 1));
    if (p.Dr > 0) {
        TRY(check_t("dq_rope", dq_rope, 3, "[Tq, N1, Dr]", kQr, wqr, p.dtype, q, 1));
        TRY(check_kside("dk_rope", dk_rope, k, p.Dr, paged, 1, p.dtype, q, 1));
    } else if (dq_rope || dk_rope) {
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "%s: must be NULL when q_rope/k_rope are not given (Dr = 0)",
                                dq_rope ? "dq_rope" : "dk_rope");
    }
    if (v) {
        TRY(check_kside("dv", dv, k, p.D, paged, 0, p.dtype, q, 1));
    } else if (dv) {
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "dv: must be NULL when v is NULL (shared key/value: the dV "
                                "contribution goes into dk)");
    }
    const char *on[] = {"dq", "dq_rope", "dk", "dk_rope", "dv"};
    const spattn_tensor *os[] = {dq, dq_rope, dk, dk_rope, dv};
    const char *in[] = {"q", "q_rope", "k", "k_rope", "v", "o", "dout", "lse", "indices",
                        "cu_seqlens_q", "cu_seqlens_kv", "block_table"};
    const spattn_tensor *is[] = {q, q_rope, k, k_rope, v, o, dout, lse, indices,
                                 vl->cu_seqlens_q, vl->cu_seqlens_kv, vl->block_table};
    TRY(spattn_check_aliasing(on, os, 5, in, is, 12));
    p.o = o;
    p.dout = dout;
    p.lse = lse;
    p.dq = dq;
    p.dq_rope = dq_rope;
    p.dk = dk;
    p.dk_rope = dk_rope;
    p.dv = dv;
    spattn_exec ex;
    int use_cuda;
    TRY(resolve(opt, &p, "sfa_bwd_varlen", 1, &ex, &use_cuda));
    return use_cuda ? spattn_cuda_sfa_bwd(&p, &ex) : spattn_cpu_sfa_bwd(&p, &ex);
}

spattn_status spattn_sfa_varlen_workspace_size(const spattn_tensor *q, const spattn_tensor *q_rope,
                                               const spattn_tensor *k, const spattn_tensor *k_rope,
                                               const spattn_tensor *v, const spattn_tensor *indices,
                                               int64_t sbs, int32_t mode, const spattn_varlen *vl,
                                               int32_t backward, const spattn_options *opt,
                                               size_t *bytes) {
    spattn_clear_error();
    if (!bytes) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "bytes: out-pointer is NULL");
    spattn_sfa_problem p = {0};
    spattn_seqs s;
    TRY(check_inputs(q, q_rope, k, k_rope, v, indices, sbs, mode, 0.0, vl, &p, &s));
    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, q, &ex, &use_cuda));
    return spattn_answer_workspace(use_cuda ? spattn_cuda_sfa_workspace(&p, backward != 0)
                                            : spattn_cpu_sfa_workspace(&p, backward != 0, ex.num_threads),
                                   bytes);
}
