/*
 * Argument checks shared by the operator entry points.  Each returns SPATTN_STATUS_SUCCESS or
 * records a message (naming the tensor, the dimension, what was expected and what came) and
 * returns the failing status.  None of them touches tensor data.
 */
#ifndef SPATTN_CHECK_H
#define SPATTN_CHECK_H

#include "internal.h"

/* Returns from the enclosing function when a check fails. */
#define TRY(expr)                                                                        \
    do {                                                                                 \
        spattn_status st_ = (expr);                                                      \
        if (st_ != SPATTN_STATUS_SUCCESS) return st_;                                    \
    } while (0)

/* Non-NULL descriptor and data pointer. */
spattn_status spattn_check_present(const char *name, const spattn_tensor *t);
/* ndim == expected; `layout` (e.g. "[B, N, Sq, D]") is quoted in the message. */
spattn_status spattn_check_ndim(const char *name, const spattn_tensor *t, int32_t ndim,
                                const char *layout);
/* dtype == expected; `why` says where the expectation comes from ("dtype of q"). */
spattn_status spattn_check_dtype(const char *name, const spattn_tensor *t, int32_t dtype,
                                 const char *why);
/* Every dimension > 0; `dimnames` lists one name per dimension. */
spattn_status spattn_check_positive(const char *name, const spattn_tensor *t,
                                    const char *const *dimnames);
/* t->shape[dim] == expected. */
spattn_status spattn_check_dim(const char *name, const spattn_tensor *t, int dim,
                               const char *dimname, int64_t expected, const char *why);
/* Element and byte offsets of the whole view fit in int64 (and in the address space). */
spattn_status spattn_check_strides(const char *name, const spattn_tensor *t);
/* No two elements of an output share memory. */
spattn_status spattn_check_no_self_overlap(const char *name, const spattn_tensor *t);
/* Same device as the reference tensor. */
spattn_status spattn_check_same_device(const char *name, const spattn_tensor *t,
                                       const char *refname, const spattn_tensor *ref);
/* Outputs overlap no input and no other output.  Arrays may hold NULL entries (skipped). */
spattn_status spattn_check_aliasing(const char *const *out_names, const spattn_tensor *const *outs,
                                    int n_out, const char *const *in_names,
                                    const spattn_tensor *const *ins, int n_in);
/* 1 when the memory of a and b may overlap (conservative), else 0. */
int spattn_tensors_overlap(const spattn_tensor *a, const spattn_tensor *b);

/* The softmax scale: finite in fp32 (|scale| <= FLT_MAX; NaN rejected), 0 meaning the default
 * `dflt` names in the message ("1/sqrt(D)"). */
spattn_status spattn_check_scale(double scale, const char *dflt);

/* A caller-provided workspace (ex->workspace != NULL) holds at least `need` bytes. */
spattn_status spattn_check_workspace(const spattn_exec *ex, size_t need);
/* A size query's answer: *bytes = need, or OUT_OF_MEMORY when need is SIZE_MAX (the backends
 * saturate there: a problem over huge stride-0 views needing more than the address space). */
spattn_status spattn_answer_workspace(size_t need, size_t *bytes);

/* Resolves options (NULL = defaults) and the backend from the tensors' device.
 * On success *ex is filled and *use_cuda says which backend runs. */
spattn_status spattn_resolve_exec(const spattn_options *opt, const spattn_tensor *first,
                                  spattn_exec *ex, int *use_cuda);
#endif
