/*
 * spattn_merge_attention_states: argument validation (before any write), then the CPU or CUDA
 * backend.  Semantics: include/spattn.h.
 */
#include <string.h>

#include "check.h"
#include "merge.h"

/* Same memory, dtype, shape and strides: the in-place case the contract allows. */
static int same_view(const spattn_tensor *a, const spattn_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->device_type != b->device_type || a->device_id != b->device_id)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->strides[i] != b->strides[i])) return 0;
    return 1;
}

static spattn_status check_o(const char *name, const spattn_tensor *t, const spattn_tensor *o1,
                             int is_output) {
    TRY(spattn_check_present(name, t));
    if (t->ndim != o1->ndim)
        return spattn_set_error(SPATTN_STATUS_BAD_NDIM, "%s: expected %d dimensions (ndim of o1), got ndim=%d",
                                name, o1->ndim, t->ndim);
    if (!spattn_is_float_dtype(t->dtype))
        return spattn_set_error(SPATTN_STATUS_BAD_DTYPE, "%s: dtype must be fp16, bf16 or fp32, got %s (%d)",
                                name, spattn_dtype_name((spattn_dtype)t->dtype), t->dtype);
    for (int i = 0; i < o1->ndim; i++)
        TRY(spattn_check_dim(name, t, i, i == o1->ndim - 1 ? "D" : "row", o1->shape[i], "shape of o1"));
    TRY(spattn_check_strides(name, t));
    if (is_output) TRY(spattn_check_no_self_overlap(name, t));
    return spattn_check_same_device(name, t, "o1", o1);
}

static spattn_status check_lse(const char *name, const spattn_tensor *t, const spattn_tensor *o1,
                               int is_output) {
    TRY(spattn_check_present(name, t));
    if (t->ndim != o1->ndim - 1)
        return spattn_set_error(SPATTN_STATUS_BAD_NDIM,
                                "%s: expected %d dimensions (the shape of o1 without D), got ndim=%d",
                                name, o1->ndim - 1, t->ndim);
    TRY(spattn_check_dtype(name, t, SPATTN_DTYPE_F32, "LSE is fp32"));
    for (int i = 0; i < t->ndim; i++) TRY(spattn_check_dim(name, t, i, "row", o1->shape[i], "shape of o1"));
    TRY(spattn_check_strides(name, t));
    if (is_output) TRY(spattn_check_no_self_overlap(name, t));
    return spattn_check_same_device(name, t, "o1", o1);
}

spattn_status spattn_merge_attention_states_ex(const spattn_tensor *o1, const spattn_tensor *lse1,
                                               const spattn_tensor *o2, const spattn_tensor *lse2,
                                               const spattn_tensor *o, const spattn_tensor *lse,
                                               const spattn_options *opt) {
    spattn_clear_error();
    TRY(spattn_check_present("o1", o1));
    if (o1->ndim < 2 || o1->ndim > SPATTN_MAX_DIMS)
        return spattn_set_error(SPATTN_STATUS_BAD_NDIM, "o1: expected 2 .. %d dimensions [rows..., D], got ndim=%d",
                                SPATTN_MAX_DIMS, o1->ndim);
    for (int i = 0; i < o1->ndim; i++)
        if (o1->shape[i] <= 0)
            return spattn_set_error(SPATTN_STATUS_BAD_SHAPE, "o1: dimension %d must be positive, got %lld", i,
                                    (long long)o1->shape[i]);
    TRY(check_o("o1", o1, o1, 0));
    TRY(check_lse("lse1", lse1, o1, 0));
    TRY(check_o("o2", o2, o1, 0));
    TRY(check_lse("lse2", lse2, o1, 0));
    TRY(check_o("o", o, o1, 1));
    if (lse) TRY(check_lse("lse", lse, o1, 1));

    /* Outputs overlap no input except the identical view (in place), and not each other. */
    const char *in_names[] = {"o1", "lse1", "o2", "lse2"};
    const spattn_tensor *ins[] = {o1, lse1, o2, lse2};
    const char *out_names[] = {"o", "lse"};
    const spattn_tensor *outs[] = {o, lse};
    for (int i = 0; i < 2; i++) {
        if (!outs[i]) continue;
        for (int j = 0; j < 4; j++)
            if (!same_view(outs[i], ins[j]) && spattn_tensors_overlap(outs[i], ins[j]))
                return spattn_set_error(SPATTN_STATUS_ALIASING,
                                        "%s: output memory overlaps input %s (only the identical view is "
                                        "allowed, for in-place merging)", out_names[i], in_names[j]);
    }
    if (lse && spattn_tensors_overlap(o, lse))
        return spattn_set_error(SPATTN_STATUS_ALIASING, "lse: output memory overlaps output o");

    spattn_merge_problem p;
    memset(&p, 0, sizeof p);
    p.o1 = o1; p.lse1 = lse1; p.o2 = o2; p.lse2 = lse2; p.o = o; p.lse = lse;
    p.nr = o1->ndim - 1;
    p.rows = 1;
    for (int i = 0; i < p.nr; i++) {
        p.rshape[i] = o1->shape[i];
        if (__builtin_mul_overflow(p.rows, p.rshape[i], &p.rows))
            return spattn_set_error(SPATTN_STATUS_BAD_SHAPE, "o1: number of rows overflows int64");
    }
    p.D = o1->shape[o1->ndim - 1];

    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, o1, &ex, &use_cuda));
    if (use_cuda) {
#ifdef SPATTN_HAVE_CUDA
        return spattn_cuda_merge(&p, &ex);
#else
        return spattn_set_error(SPATTN_STATUS_BACKEND_UNAVAILABLE, "backend cuda: spattn was built without CUDA");
#endif
    }
    return spattn_cpu_merge(&p, &ex);
}

spattn_status spattn_merge_attention_states(const spattn_tensor *o1, const spattn_tensor *lse1,
                                            const spattn_tensor *o2, const spattn_tensor *lse2,
                                            const spattn_tensor *o, const spattn_tensor *lse) {
    return spattn_merge_attention_states_ex(o1, lse1, o2, lse2, o, lse, NULL);
}
