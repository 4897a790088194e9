/*
 * Top-k sparse flash attention entry points: validation (index values included) before any
 * output is written, then dispatch to the CPU or CUDA backend.
 */
#include <float.h>
#include <math.h>

#include "check.h"

static const char *const kQ[] = {"B", "S1", "N1", "D"};
static const char *const kQr[] = {"B", "S1", "N1", "Dr"};
static const char *const kK[] = {"B", "S2", "N2", "D"};
static const char *const kKr[] = {"B", "S2", "N2", "Dr"};
static const char *const kIdx[] = {"B", "S1", "N2", "K"};

/* Checks a 4-d tensor of the problem's float dtype against an expected shape. */
static spattn_status check4(const char *name, const spattn_tensor *t, const char *layout,
                            const char *const *dn, const int64_t *want, const char *const *why,
                            int32_t dtype, const spattn_tensor *q, int is_output) {
    TRY(spattn_check_present(name, t));
    TRY(spattn_check_ndim(name, t, 4, layout));
    TRY(spattn_check_dtype(name, t, dtype, dtype == SPATTN_DTYPE_I32 ? "indices are int32" : "dtype of q"));
    TRY(spattn_check_positive(name, t, dn));
    for (int d = 0; d < 4; d++)
        if (want[d] >= 0) TRY(spattn_check_dim(name, t, d, dn[d], want[d], why[d]));
    TRY(spattn_check_strides(name, t));
    if (is_output) TRY(spattn_check_no_self_overlap(name, t));
    return spattn_check_same_device(name, t, "q", q);
}

static spattn_status check_inputs(const spattn_tensor *q, const spattn_tensor *q_rope,
                                  const spattn_tensor *k, const spattn_tensor *k_rope,
                                  const spattn_tensor *v, const spattn_tensor *idx, int64_t sbs,
                                  int32_t mode, double scale, spattn_sfa_problem *p) {
    TRY(spattn_check_present("q", q));
    TRY(spattn_check_present("k", k));
    TRY(spattn_check_present("indices", idx));
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
    TRY(spattn_check_ndim("q", q, 4, "[B, S1, N1, D]"));
    if (!spattn_is_float_dtype(q->dtype))
        return spattn_set_error(SPATTN_STATUS_BAD_DTYPE,
                                "q: dtype must be fp16, bf16 or fp32, got %s (%d)",
                                spattn_dtype_name((spattn_dtype)q->dtype), q->dtype);
    TRY(spattn_check_positive("q", q, kQ));
    TRY(spattn_check_strides("q", q));
    int32_t dt = q->dtype;
    int64_t B = q->shape[0], S1 = q->shape[1], N1 = q->shape[2], D = q->shape[3];
    TRY(spattn_check_ndim("k", k, 4, "[B, S2, N2, D]"));
    const int64_t wk[4] = {B, -1, -1, D};
    const char *const whyk[4] = {"B of q", "", "", "D of q"};
    TRY(check4("k", k, "[B, S2, N2, D]", kK, wk, whyk, dt, q, 0));
    int64_t S2 = k->shape[1], N2 = k->shape[2];
    if (N1 % N2 != 0)
        return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                "k: dimension 2 (N2) must divide N1=%lld (heads of q), got %lld",
                                (long long)N1, (long long)N2);
    if (D % 8 != 0 || D > 1024)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                "q: dimension 3 (D) must be a multiple of 8 in [8, 1024], got %lld",
                                (long long)D);
    int64_t Dr = 0;
    if (q_rope) {
        TRY(spattn_check_ndim("q_rope", q_rope, 4, "[B, S1, N1, Dr]"));
        Dr = q_rope->shape[3];
        const int64_t w[4] = {B, S1, N1, -1};
        const char *const why[4] = {"B of q", "S1 of q", "N1 of q", ""};
        TRY(check4("q_rope", q_rope, "[B, S1, N1, Dr]", kQr, w, why, dt, q, 0));
        const int64_t wr[4] = {B, S2, N2, Dr};
        const char *const whyr[4] = {"B of q", "S2 of k", "N2 of k", "Dr of q_rope"};
        TRY(check4("k_rope", k_rope, "[B, S2, N2, Dr]", kKr, wr, whyr, dt, q, 0));
        if (Dr % 8 != 0 || Dr > 256)
            return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                                    "q_rope: dimension 3 (Dr) must be a multiple of 8 in [8, 256], got %lld",
                                    (long long)Dr);
    }
    if (v) {
        const int64_t w[4] = {B, S2, N2, D};
        const char *const why[4] = {"B of q", "S2 of k", "N2 of k", "D of q"};
        TRY(check4("v", v, "[B, S2, N2, D]", kK, w, why, dt, q, 0));
    }
    TRY(spattn_check_present("indices", idx));
    TRY(spattn_check_ndim("indices", idx, 4, "[B, S1, N2, K]"));
    const int64_t wi[4] = {B, S1, N2, -1};
    const char *const whyi[4] = {"B of q", "S1 of q", "N2 of k", ""};
    TRY(check4("indices", idx, "[B, S1, N2, K]", kIdx, wi, whyi, SPATTN_DTYPE_I32, q, 0));
    p->q = q;
    p->q_rope = q_rope;
    p->k = k;
    p->k_rope = k_rope;
    p->v = v;
    p->idx = idx;
    p->B = B;
    p->S1 = S1;
    p->S2 = S2;
    p->N1 = N1;
    p->N2 = N2;
    p->D = D;
    p->Dr = Dr;
    p->K = idx->shape[3];
    p->sbs = sbs;
    p->nblk = (S2 + sbs - 1) / sbs;
    p->mode = mode;
    p->shared_kv = v == NULL;
    p->scale = scale == 0.0 ? (float)(1.0 / sqrt((double)(D + Dr))) : (float)scale;
    p->dtype = dt;
    return SPATTN_STATUS_SUCCESS;
}

static spattn_status check_lse(const spattn_tensor *t, const spattn_sfa_problem *p, int is_output) {
    static const char *const dn[] = {"B", "S1", "N1"};
    TRY(spattn_check_present("lse", t));
    TRY(spattn_check_ndim("lse", t, 3, "[B, S1, N1]"));
    TRY(spattn_check_dtype("lse", t, SPATTN_DTYPE_F32, "LSE is fp32"));
    TRY(spattn_check_positive("lse", t, dn));
    TRY(spattn_check_dim("lse", t, 0, "B", p->B, "B of q"));
    TRY(spattn_check_dim("lse", t, 1, "S1", p->S1, "S1 of q"));
    TRY(spattn_check_dim("lse", t, 2, "N1", p->N1, "N1 of q"));
    TRY(spattn_check_strides("lse", t));
    if (is_output) TRY(spattn_check_no_self_overlap("lse", t));
    return spattn_check_same_device("lse", t, "q", p->q);
}

/* Index values must be -1 or in [0, nblk): scanned before any output is written. */
static spattn_status check_index_values(const spattn_sfa_problem *p, const spattn_exec *ex,
                                        int use_cuda) {
    if (use_cuda) return spattn_cuda_sfa_check_indices(p, ex);
    const spattn_tensor *t = p->idx;
    const int32_t *base = (const int32_t *)t->data;
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t s = 0; s < p->S1; s++)
            for (int64_t n = 0; n < p->N2; n++)
                for (int64_t j = 0; j < p->K; j++) {
                    int32_t x = base[spattn_offset4(t, b, s, n, j)];
                    if (x < -1 || (int64_t)x >= p->nblk)
                        return spattn_set_error(
                            SPATTN_STATUS_BAD_INDEX,
                            "indices: value at [%lld, %lld, %lld, %lld] must be -1 or in [0, %lld) "
                            "(ceil(S2/sbs) = ceil(%lld/%lld)), got %d",
                            (long long)b, (long long)s, (long long)n, (long long)j,
                            (long long)p->nblk, (long long)p->S2, (long long)p->sbs, x);
                }
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_sfa_fwd_ex(const spattn_tensor *q, const spattn_tensor *q_rope,
                                const spattn_tensor *k, const spattn_tensor *k_rope,
                                const spattn_tensor *v, const spattn_tensor *indices, int64_t sbs,
                                int32_t mode, double scale, const spattn_tensor *o,
                                const spattn_tensor *lse, const spattn_options *opt) {
    spattn_clear_error();
    spattn_sfa_problem p = {0};
    TRY(check_inputs(q, q_rope, k, k_rope, v, indices, sbs, mode, scale, &p));
    const int64_t wo[4] = {p.B, p.S1, p.N1, p.D};
    const char *const why[4] = {"B of q", "S1 of q", "N1 of q", "D of q"};
    TRY(check4("o", o, "[B, S1, N1, D]", kQ, wo, why, p.dtype, q, 1));
    if (lse) TRY(check_lse(lse, &p, 1));
    const char *on[] = {"o", "lse"};
    const spattn_tensor *os[] = {o, lse};
    const char *in[] = {"q", "q_rope", "k", "k_rope", "v", "indices"};
    const spattn_tensor *is[] = {q, q_rope, k, k_rope, v, indices};
    TRY(spattn_check_aliasing(on, os, 2, in, is, 6));
    p.o = o;
    p.lse = lse;
    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, q, &ex, &use_cuda));
    TRY(spattn_check_workspace(&ex, use_cuda ? spattn_cuda_sfa_workspace(&p, 0)
                                      : spattn_cpu_sfa_workspace(&p, 0, ex.num_threads)));
    /* the CUDA forward scans the indices itself, gating its kernel on the result (no host
       round trip before the launch; still nothing written for a bad index) */
    if (use_cuda) return spattn_cuda_sfa_fwd(&p, &ex);
    TRY(check_index_values(&p, &ex, 0));
    return spattn_cpu_sfa_fwd(&p, &ex);
}

spattn_status spattn_sfa_fwd(const spattn_tensor *q, const spattn_tensor *q_rope,
                             const spattn_tensor *k, const spattn_tensor *k_rope,
                             const spattn_tensor *v, const spattn_tensor *indices, int64_t sbs,
                             int32_t mode, double scale, const spattn_tensor *o,
                             const spattn_tensor *lse) {
    return spattn_sfa_fwd_ex(q, q_rope, k, k_rope, v, indices, sbs, mode, scale, o, lse, NULL);
}

spattn_status spattn_sfa_bwd_ex(const spattn_tensor *q, const spattn_tensor *q_rope,
                                const spattn_tensor *k, const spattn_tensor *k_rope,
                                const spattn_tensor *v, const spattn_tensor *o,
                                const spattn_tensor *dout, const spattn_tensor *lse,
                                const spattn_tensor *indices, int64_t sbs, int32_t mode,
                                double scale, const spattn_tensor *dq, const spattn_tensor *dq_rope,
                                const spattn_tensor *dk, const spattn_tensor *dk_rope,
                                const spattn_tensor *dv, const spattn_options *opt) {
    spattn_clear_error();
    spattn_sfa_problem p = {0};
    TRY(check_inputs(q, q_rope, k, k_rope, v, indices, sbs, mode, scale, &p));
    const int64_t wq[4] = {p.B, p.S1, p.N1, p.D};
    const char *const whyq[4] = {"B of q", "S1 of q", "N1 of q", "D of q"};
    const int64_t wqr[4] = {p.B, p.S1, p.N1, p.Dr};
    const char *const whyqr[4] = {"B of q", "S1 of q", "N1 of q", "Dr of q_rope"};
    const int64_t wk[4] = {p.B, p.S2, p.N2, p.D};
    const char *const whyk[4] = {"B of k", "S2 of k", "N2 of k", "D of k"};
    const int64_t wkr[4] = {p.B, p.S2, p.N2, p.Dr};
    const char *const whykr[4] = {"B of k", "S2 of k", "N2 of k", "Dr of k_rope"};
    TRY(check4("o", o, "[B, S1, N1, D]", kQ, wq, whyq, p.dtype, q, 0));
    TRY(check4("dout", dout, "[B, S1, N1, D]", kQ, wq, whyq, p.dtype, q, 0));
    TRY(check_lse(lse, &p, 0));
    TRY(check4("dq", dq, "[B, S1, N1, D]", kQ, wq, whyq, p.dtype, q, 1));
    TRY(check4("dk", dk, "[B, S2, N2, D]", kK, wk, whyk, p.dtype, q, 1));
    if (p.Dr > 0) {
        TRY(check4("dq_rope", dq_rope, "[B, S1, N1, Dr]", kQr, wqr, whyqr, p.dtype, q, 1));
        TRY(check4("dk_rope", dk_rope, "[B, S2, N2, Dr]", kKr, wkr, whykr, p.dtype, q, 1));
    } else if (dq_rope || dk_rope) {
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "%s: must be NULL when q_rope/k_rope are not given (Dr = 0)",
                                dq_rope ? "dq_rope" : "dk_rope");
    }
    if (v) {
        TRY(check4("dv", dv, "[B, S2, N2, D]", kK, wk, whyk, p.dtype, q, 1));
    } else if (dv) {
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "dv: must be NULL when v is NULL (shared key/value: the dV "
                                "contribution goes into dk)");
    }
    const char *on[] = {"dq", "dq_rope", "dk", "dk_rope", "dv"};
    const spattn_tensor *os[] = {dq, dq_rope, dk, dk_rope, dv};
    const char *in[] = {"q", "q_rope", "k", "k_rope", "v", "o", "dout", "lse", "indices"};
    const spattn_tensor *is[] = {q, q_rope, k, k_rope, v, o, dout, lse, indices};
    TRY(spattn_check_aliasing(on, os, 5, in, is, 9));
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
    TRY(spattn_resolve_exec(opt, q, &ex, &use_cuda));
    TRY(spattn_check_workspace(&ex, use_cuda ? spattn_cuda_sfa_workspace(&p, 1)
                                      : spattn_cpu_sfa_workspace(&p, 1, ex.num_threads)));
    TRY(check_index_values(&p, &ex, use_cuda));
    return use_cuda ? spattn_cuda_sfa_bwd(&p, &ex) : spattn_cpu_sfa_bwd(&p, &ex);
}

spattn_status spattn_sfa_bwd(const spattn_tensor *q, const spattn_tensor *q_rope,
                             const spattn_tensor *k, const spattn_tensor *k_rope,
                             const spattn_tensor *v, const spattn_tensor *o,
                             const spattn_tensor *dout, const spattn_tensor *lse,
                             const spattn_tensor *indices, int64_t sbs, int32_t mode, double scale,
                             const spattn_tensor *dq, const spattn_tensor *dq_rope,
                             const spattn_tensor *dk, const spattn_tensor *dk_rope,
                             const spattn_tensor *dv) {
    return spattn_sfa_bwd_ex(q, q_rope, k, k_rope, v, o, dout, lse, indices, sbs, mode, scale, dq,
                             dq_rope, dk, dk_rope, dv, NULL);
}

spattn_status spattn_sfa_workspace_size(const spattn_tensor *q, const spattn_tensor *q_rope,
                                        const spattn_tensor *k, const spattn_tensor *k_rope,
                                        const spattn_tensor *v, const spattn_tensor *indices,
                                        int64_t sbs, int32_t mode, int32_t backward,
                                        const spattn_options *opt, size_t *bytes) {
    spattn_clear_error();
    if (!bytes) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "bytes: out-pointer is NULL");
    spattn_sfa_problem p = {0};
    TRY(check_inputs(q, q_rope, k, k_rope, v, indices, sbs, mode, 0.0, &p));
    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, q, &ex, &use_cuda));
    return spattn_answer_workspace(use_cuda ? spattn_cuda_sfa_workspace(&p, backward != 0)
                                            : spattn_cpu_sfa_workspace(&p, backward != 0, ex.num_threads),
                                   bytes);
}
