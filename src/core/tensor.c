/* Tensor descriptor helpers and the shared argument checks (see check.h). */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

size_t spattn_dtype_size(spattn_dtype dtype) {
    switch (dtype) {
    case SPATTN_DTYPE_F32: return 4;
    case SPATTN_DTYPE_F16: return 2;
    case SPATTN_DTYPE_BF16: return 2;
    case SPATTN_DTYPE_I32: return 4;
    case SPATTN_DTYPE_U8: return 1;
    }
    return 0;
}

const char *spattn_dtype_name(spattn_dtype dtype) {
    switch (dtype) {
    case SPATTN_DTYPE_F32: return "fp32";
    case SPATTN_DTYPE_F16: return "fp16";
    case SPATTN_DTYPE_BF16: return "bf16";
    case SPATTN_DTYPE_I32: return "int32";
    case SPATTN_DTYPE_U8: return "uint8";
    }
    return "unknown";
}

int spattn_is_float_dtype(int32_t dtype) {
    return dtype == SPATTN_DTYPE_F32 || dtype == SPATTN_DTYPE_F16 || dtype == SPATTN_DTYPE_BF16;
}

spattn_tensor spattn_tensor_make(void *data, spattn_dtype dtype, int32_t ndim,
                                 const int64_t *shape, const int64_t *strides) {
    spattn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device_type = SPATTN_DEVICE_CPU;
    t.dtype = (int32_t)dtype;
    t.ndim = ndim;
    if (ndim < 1 || ndim > SPATTN_MAX_DIMS || !shape) return t;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = strides ? strides[i] : s;
        /* Saturates: a stride past int64 is then rejected by the checks (BAD_STRIDE). */
        if (__builtin_mul_overflow(s, shape[i], &s)) s = INT64_MAX;
    }
    return t;
}

int64_t spattn_numel(const spattn_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

void spattn_options_init(spattn_options *opt) {
    if (!opt) return;
    memset(opt, 0, sizeof *opt);
    opt->backend = SPATTN_BACKEND_AUTO;
    opt->deterministic = 1;
}

spattn_status spattn_check_present(const char *name, const spattn_tensor *t) {
    if (!t) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "%s: tensor descriptor is NULL", name);
    if (!t->data) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "%s: data pointer is NULL", name);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_check_ndim(const char *name, const spattn_tensor *t, int32_t ndim,
                                const char *layout) {
    if (t->ndim != ndim)
        return spattn_set_error(SPATTN_STATUS_BAD_NDIM,
                                "%s: expected %d dimensions %s, got ndim=%d", name, ndim, layout,
                                t->ndim);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_check_dtype(const char *name, const spattn_tensor *t, int32_t dtype,
                                 const char *why) {
    if (t->dtype != dtype)
        return spattn_set_error(SPATTN_STATUS_BAD_DTYPE, "%s: dtype must be %s (%s), got %s (%d)",
                                name, spattn_dtype_name((spattn_dtype)dtype), why,
                                spattn_dtype_name((spattn_dtype)t->dtype), t->dtype);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_check_positive(const char *name, const spattn_tensor *t,
                                    const char *const *dimnames) {
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] <= 0)
            return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                    "%s: dimension %d (%s) must be positive, got %lld", name, i,
                                    dimnames[i], (long long)t->shape[i]);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_check_dim(const char *name, const spattn_tensor *t, int dim,
                               const char *dimname, int64_t expected, const char *why) {
    if (t->shape[dim] != expected)
        return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                "%s: dimension %d (%s) must be %lld (%s), got %lld", name, dim,
                                dimname, (long long)expected, why, (long long)t->shape[dim]);
    return SPATTN_STATUS_SUCCESS;
}

/* Lowest and highest element offsets of a view; 0 on overflow. */
static int elem_extent(const spattn_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t l = 0, h = 0;
    for (int i = 0; i < t->ndim; i++) {
        int64_t span;
        if (__builtin_mul_overflow(t->strides[i], t->shape[i] - 1, &span)) return 0;
        if (span < 0) {
            if (__builtin_add_overflow(l, span, &l)) return 0;
        } else {
            if (__builtin_add_overflow(h, span, &h)) return 0;
        }
    }
    *lo = l;
    *hi = h;
    return 1;
}

spattn_status spattn_check_strides(const char *name, const spattn_tensor *t) {
    int64_t lo, hi, end, blo, bhi;
    int64_t es = (int64_t)spattn_dtype_size((spattn_dtype)t->dtype);
    if (!elem_extent(t, &lo, &hi) || __builtin_mul_overflow(lo, es, &blo) ||
        __builtin_add_overflow(hi, 1, &end) || __builtin_mul_overflow(end, es, &bhi))
        return spattn_set_error(SPATTN_STATUS_BAD_STRIDE,
                                "%s: strides overflow 64-bit offsets (shape and strides describe "
                                "more than 2^63 bytes)", name);
    /* No process has more than 2^57 bytes of address space (x86-64 with 5-level paging; arm64
     * 2^52), so a larger view cannot have memory behind it: refused, not read (a fuzzed mask of
     * shape [4, 2, 1, 2] with a head stride of 4.9e18 passed the checks above and was read at
     * data + 4.9e18).  On the byte extent, not on addresses: tagged pointers use the top bits. */
    if ((uint64_t)bhi + ((uint64_t)0 - (uint64_t)blo) > ((uint64_t)1 << 57))
        return spattn_set_error(SPATTN_STATUS_BAD_STRIDE,
                                "%s: shape and strides describe more than 2^57 bytes (more than any "
                                "address space)", name);
    uintptr_t base = (uintptr_t)t->data;
    /* the magnitude of blo in unsigned arithmetic: -blo overflows for INT64_MIN */
    if ((blo < 0 && (uintptr_t)0 - (uintptr_t)blo > base) || (uintptr_t)bhi > UINTPTR_MAX - base)
        return spattn_set_error(SPATTN_STATUS_BAD_STRIDE,
                                "%s: strides reach outside the address space from data=%p", name,
                                t->data);
    return SPATTN_STATUS_SUCCESS;
}

/* First dimension whose step lands inside the span of the smaller dimensions (elements of the
 * view then share memory), or -1.  *reach gets that span.  Extents must fit int64. */
static int overlapping_dim(const spattn_tensor *t, int64_t *reach_out) {
    /* Sort the dims of extent > 1 by |stride|; each must step past everything below it. */
    int idx[SPATTN_MAX_DIMS], n = 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] > 1) idx[n++] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && llabs(t->strides[idx[j]]) < llabs(t->strides[idx[j - 1]]); j--) {
            int tmp = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = tmp;
        }
    int64_t reach = 0; /* highest offset reachable by the smaller dims */
    for (int i = 0; i < n; i++) {
        int d = idx[i];
        int64_t s = llabs(t->strides[d]);
        if (s <= reach) {
            *reach_out = reach;
            return d;
        }
        reach += s * (t->shape[d] - 1);
    }
    return -1;
}

spattn_status spattn_check_no_self_overlap(const char *name, const spattn_tensor *t) {
    int64_t reach = 0;
    int d = overlapping_dim(t, &reach);
    if (d >= 0)
        return spattn_set_error(SPATTN_STATUS_BAD_STRIDE,
                                "%s: output elements overlap: dimension %d has stride %lld "
                                "but the smaller dimensions span %lld elements",
                                name, d, (long long)t->strides[d], (long long)reach + 1);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_check_same_device(const char *name, const spattn_tensor *t,
                                       const char *refname, const spattn_tensor *ref) {
    if (t->device_type != ref->device_type || t->device_id != ref->device_id)
        return spattn_set_error(SPATTN_STATUS_BAD_DEVICE,
                                "%s: device must be %s:%d (device of %s), got %s:%d", name,
                                ref->device_type == SPATTN_DEVICE_CUDA ? "cuda" : "cpu",
                                ref->device_id, refname,
                                t->device_type == SPATTN_DEVICE_CUDA ? "cuda"
                                : t->device_type == SPATTN_DEVICE_CPU ? "cpu" : "unknown",
                                t->device_id);
    return SPATTN_STATUS_SUCCESS;
}

static int64_t gcd64(int64_t a, int64_t b) {
    a = llabs(a);
    b = llabs(b);
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Column-split special case: both views have a unit last stride and all their other strides
 * are multiples of one row pitch P; then each occupies a fixed residue interval mod P (this is
 * how a concatenated [.., D+Dr] buffer is split into nope/rope views). */
static int column_split_disjoint(const spattn_tensor *a, const spattn_tensor *b, size_t es) {
    if (a->ndim < 1 || b->ndim < 1) return 0;
    if ((a->shape[a->ndim - 1] > 1 && a->strides[a->ndim - 1] != 1) ||
        (b->shape[b->ndim - 1] > 1 && b->strides[b->ndim - 1] != 1))
        return 0;
    int64_t P = 0;
    for (int i = 0; i < a->ndim - 1; i++)
        if (a->shape[i] > 1) P = gcd64(P, a->strides[i]);
    for (int i = 0; i < b->ndim - 1; i++)
        if (b->shape[i] > 1) P = gcd64(P, b->strides[i]);
    if (P <= 0) return 0;
    intptr_t diff = (intptr_t)((const char *)b->data - (const char *)a->data);
    if (diff % (intptr_t)es) return 0;
    int64_t d = (int64_t)(diff / (intptr_t)es);
    int64_t r = ((d % P) + P) % P;
    int64_t wa = a->shape[a->ndim - 1], wb = b->shape[b->ndim - 1];
    /* a at residues [0, wa), b at [r, r + wb) */
    return wa <= r && r + wb <= P;
}

/* Split along any dimension: a and b share every stride (where either has extent > 1) and
 * every extent but dimension d, and b starts k >= a.shape[d] steps of d after a.  Both are
 * then index ranges of one view with extent k + b.shape[d] along d; if that view does not
 * overlap itself, a and b are disjoint.  Covers concatenated buffers of any layout. */
static int dim_split_disjoint(const spattn_tensor *a, const spattn_tensor *b, size_t es) {
    if (a->ndim != b->ndim) return 0;
    intptr_t diff = (intptr_t)((const char *)b->data - (const char *)a->data);
    if (diff % (intptr_t)es) return 0;
    int64_t delta = (int64_t)(diff / (intptr_t)es);
    for (int d = 0; d < a->ndim; d++) {
        int same = 1;
        for (int i = 0; i < a->ndim && same; i++) {
            if (i != d && a->shape[i] != b->shape[i]) same = 0;
            if ((a->shape[i] > 1 || b->shape[i] > 1 || i == d) && a->strides[i] != b->strides[i]) same = 0;
        }
        int64_t st = a->strides[d];
        if (!same || st == 0 || delta % st) continue;
        int64_t k = delta / st;
        if (k < a->shape[d] || k > INT64_MAX / 2 - b->shape[d]) continue;
        spattn_tensor u = *a;
        u.shape[d] = k + b->shape[d];
        int64_t lo, hi;
        int64_t reach;
        if (elem_extent(&u, &lo, &hi) && overlapping_dim(&u, &reach) < 0) return 1;
    }
    return 0;
}

int spattn_tensors_overlap(const spattn_tensor *a, const spattn_tensor *b) {
    int64_t alo, ahi, blo, bhi;
    size_t ea = spattn_dtype_size((spattn_dtype)a->dtype), eb = spattn_dtype_size((spattn_dtype)b->dtype);
    if (!elem_extent(a, &alo, &ahi) || !elem_extent(b, &blo, &bhi)) return 1;
    uintptr_t a0 = (uintptr_t)a->data + (uintptr_t)(alo * (int64_t)ea);
    uintptr_t a1 = (uintptr_t)a->data + (uintptr_t)((ahi + 1) * (int64_t)ea);
    uintptr_t b0 = (uintptr_t)b->data + (uintptr_t)(blo * (int64_t)eb);
    uintptr_t b1 = (uintptr_t)b->data + (uintptr_t)((bhi + 1) * (int64_t)eb);
    if (a1 <= b0 || b1 <= a0) return 0;
    if (ea == eb && (column_split_disjoint(a, b, ea) || column_split_disjoint(b, a, ea) ||
                     dim_split_disjoint(a, b, ea) || dim_split_disjoint(b, a, ea)))
        return 0;
    return 1;
}

spattn_status spattn_check_aliasing(const char *const *out_names, const spattn_tensor *const *outs,
                                    int n_out, const char *const *in_names,
                                    const spattn_tensor *const *ins, int n_in) {
    for (int i = 0; i < n_out; i++) {
        if (!outs[i]) continue;
        for (int j = 0; j < n_in; j++)
            if (ins[j] && spattn_tensors_overlap(outs[i], ins[j]))
                return spattn_set_error(SPATTN_STATUS_ALIASING,
                                        "%s: output memory overlaps input %s", out_names[i],
                                        in_names[j]);
        for (int j = 0; j < i; j++)
            if (outs[j] && spattn_tensors_overlap(outs[i], outs[j]))
                return spattn_set_error(SPATTN_STATUS_ALIASING,
                                        "%s: output memory overlaps output %s", out_names[i],
                                        out_names[j]);
    }
    return SPATTN_STATUS_SUCCESS;
}

static spattn_status too_big(void) {
    return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY,
                            "workspace: this problem needs more than SIZE_MAX bytes (its views "
                            "are larger than any memory)");
}

spattn_status spattn_answer_workspace(size_t need, size_t *bytes) {
    if (need == SIZE_MAX) return too_big();
    *bytes = need;
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_check_workspace(const spattn_exec *ex, size_t need) {
    if (need == SIZE_MAX) return too_big();
    if (ex->workspace && ex->workspace_size < need)
        return spattn_set_error(SPATTN_STATUS_WORKSPACE_TOO_SMALL,
                                "options.workspace_size: need %zu bytes, got %zu", need,
                                ex->workspace_size);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_resolve_exec(const spattn_options *opt, const spattn_tensor *first,
                                  spattn_exec *ex, int *use_cuda) {
    spattn_options def;
    if (!opt) {
        spattn_options_init(&def);
        opt = &def;
    }
    if (opt->backend < SPATTN_BACKEND_AUTO || opt->backend > SPATTN_BACKEND_CUDA)
        return spattn_set_error(SPATTN_STATUS_BAD_OPTIONS,
                                "options.backend: must be 0 (auto), 1 (cpu) or 2 (cuda), got %d",
                                opt->backend);
    /* The CPU backend sizes its workspace per thread and starts that many OpenMP threads: an
     * absurd count must be an error, not a huge allocation or an abort inside OpenMP. */
    if (opt->num_threads < 0 || opt->num_threads > 1024)
        return spattn_set_error(SPATTN_STATUS_BAD_OPTIONS,
                                "options.num_threads: must be in [0, 1024] (0 = OpenMP's default), "
                                "got %d", opt->num_threads);
    if (opt->workspace_size > 0 && !opt->workspace)
        return spattn_set_error(SPATTN_STATUS_BAD_OPTIONS,
                                "options.workspace: NULL with workspace_size=%zu",
                                opt->workspace_size);
    if (opt->deterministic != 0 && opt->deterministic != 1)
        return spattn_set_error(SPATTN_STATUS_BAD_OPTIONS,
                                "options.deterministic: must be 0 or 1, got %d", opt->deterministic);
    for (int i = 0; i < (int)(sizeof opt->reserved / sizeof opt->reserved[0]); i++)
        if (opt->reserved[i] != 0)
            return spattn_set_error(SPATTN_STATUS_BAD_OPTIONS,
                                    "options.reserved[%d]: must be 0 (spattn_options_init), got %d",
                                    i, opt->reserved[i]);
    int dev = first->device_type;
    if (dev != SPATTN_DEVICE_CPU && dev != SPATTN_DEVICE_CUDA)
        return spattn_set_error(SPATTN_STATUS_BAD_DEVICE,
                                "device_type: must be 1 (cpu) or 2 (cuda), got %d", dev);
    if (opt->backend == SPATTN_BACKEND_CPU && dev != SPATTN_DEVICE_CPU)
        return spattn_set_error(SPATTN_STATUS_BAD_DEVICE,
                                "backend cpu: tensors must be on the CPU, got cuda:%d",
                                first->device_id);
    if (opt->backend == SPATTN_BACKEND_CUDA && dev != SPATTN_DEVICE_CUDA)
        return spattn_set_error(SPATTN_STATUS_BAD_DEVICE,
                                "backend cuda: tensors must be on a CUDA device, got cpu");
    *use_cuda = dev == SPATTN_DEVICE_CUDA;
    if (*use_cuda && !spattn_cuda_backend_available())
        return spattn_set_error(SPATTN_STATUS_BACKEND_UNAVAILABLE,
                                "backend cuda: this build of spattn has no CUDA backend or no "
                                "CUDA device is visible");
    ex->num_threads = opt->num_threads;
    ex->stream = opt->cuda_stream;
    ex->workspace = opt->workspace;
    ex->workspace_size = opt->workspace_size;
    ex->deterministic = opt->deterministic;
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_check_scale(double scale, const char *dflt) {
    if (!(fabs(scale) <= FLT_MAX)) /* also NaN; the kernels compute in fp32 */
        return spattn_set_error(SPATTN_STATUS_INVALID_VALUE,
                                "scale: must be finite in fp32 (|scale| <= %g; 0 = %s), got %g",
                                (double)FLT_MAX, dflt, scale);
    return SPATTN_STATUS_SUCCESS;
}
