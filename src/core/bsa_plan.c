/*
 * Reusable bsa plans (spattn.h, spattn_bsa_plan_*): validation of the mask and shapes once, an
 * owned copy of the block mask on its device (CPU: broadcast dimensions kept broadcast; CUDA:
 * contiguous), and (CUDA) the schedules of every
 * kernel, built by the backend.  The _plan calls check that q, k, v match the plan and then run
 * the ordinary entry points with the plan's mask and schedules.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"

static spattn_status check_plan_args(const spattn_tensor *mask, int64_t bx, int64_t by, int64_t Sq,
                                     int64_t Skv, int64_t Nkv) {
    static const char *const names[] = {"B", "N", "ceil(Sq/bx)", "ceil(Skv/by)"};
    TRY(spattn_check_present("block_mask", mask));
    if (bx <= 0) return spattn_set_error(SPATTN_STATUS_INVALID_VALUE, "bx: must be >= 1, got %lld", (long long)bx);
    if (by <= 0) return spattn_set_error(SPATTN_STATUS_INVALID_VALUE, "by: must be >= 1, got %lld", (long long)by);
    if (Sq <= 0) return spattn_set_error(SPATTN_STATUS_INVALID_VALUE, "Sq: must be >= 1, got %lld", (long long)Sq);
    if (Skv <= 0) return spattn_set_error(SPATTN_STATUS_INVALID_VALUE, "Skv: must be >= 1, got %lld", (long long)Skv);
    TRY(spattn_check_ndim("block_mask", mask, 4, "[B, N, ceil(Sq/bx), ceil(Skv/by)]"));
    TRY(spattn_check_dtype("block_mask", mask, SPATTN_DTYPE_U8, "block masks are uint8"));
    TRY(spattn_check_positive("block_mask", mask, names));
    if (Nkv <= 0 || mask->shape[1] % Nkv != 0)
        return spattn_set_error(SPATTN_STATUS_BAD_SHAPE,
                                "Nkv: must be >= 1 and divide N=%lld (dimension 1 of block_mask), got %lld",
                                (long long)mask->shape[1], (long long)Nkv);
    const int64_t nbx = Sq / bx + (Sq % bx != 0), nby = Skv / by + (Skv % by != 0);
    TRY(spattn_check_dim("block_mask", mask, 2, "ceil(Sq/bx)", nbx, "ceil(Sq/bx)"));
    TRY(spattn_check_dim("block_mask", mask, 3, "ceil(Skv/by)", nby, "ceil(Skv/by)"));
    /* the schedules index int32 tiles: sequences beyond that are refused, not truncated */
    if (Sq > INT32_MAX / 2 || Skv > INT32_MAX / 2)
        return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "Sq, Skv: must be < 2^30 for a plan, got %lld, %lld",
                                (long long)Sq, (long long)Skv);
    return spattn_check_strides("block_mask", mask);
}

/* The CPU plan's own copy of the mask, never larger than the caller's view needs: dimensions
 * the caller broadcasts (stride 0: one mask for every batch or head) stay broadcast and the rest
 * are stored contiguously; when the view's own memory is smaller still (overlapping strides),
 * that memory is copied and the view's strides kept.  (A dense copy of a broadcast mask of
 * B x N x blocks took B x N times the memory: 16 GB for a fuzzed 8 MB view.) */
static const size_t kMaxMaskCopy = (size_t)1 << 40;
static spattn_status copy_mask_cpu(const spattn_tensor *t, spattn_bsa_plan *pl) {
    int64_t st[4], lo = 0, hi = 0; /* element offsets of the view: checked, no overflow */
    size_t compact = 1;
    for (int d = 3; d >= 0; d--) {
        st[d] = t->strides[d] == 0 ? 0 : (int64_t)compact;
        if (t->strides[d] != 0 && __builtin_mul_overflow(compact, (size_t)t->shape[d], &compact)) compact = SIZE_MAX;
        const int64_t span = t->strides[d] * (t->shape[d] - 1);
        if (span < 0) lo += span;
        else hi += span;
    }
    const size_t extent = (size_t)(hi - lo) + 1;
    const int packed = compact <= extent;
    const size_t bytes = packed ? compact : extent;
    /* A view that passes the stride checks may still describe up to 2^57 bytes without memory
     * behind it (a fuzzed [1.8e18, 4, 1, 1] view of 64 bytes asked for 7.2e18 before that check
     * existed): no host holds a 2^40-byte block mask, so such a copy is refused before it is
     * attempted (sanitizers abort on an allocation that size instead of returning NULL). */
    if (bytes > kMaxMaskCopy)
        return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY,
                                "bsa plan: the mask's copy would take %zu bytes (more than 2^40: the view "
                                "describes more memory than any host has)", bytes);
    uint8_t *m = (uint8_t *)malloc(bytes);
    if (!m) return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY, "bsa plan: cannot allocate %zu bytes", bytes);
    const uint8_t *src = (const uint8_t *)t->data;
    if (packed) {
        for (int64_t b = 0; b < (st[0] ? t->shape[0] : 1); b++)
            for (int64_t n = 0; n < (st[1] ? t->shape[1] : 1); n++)
                for (int64_t r = 0; r < (st[2] ? t->shape[2] : 1); r++)
                    for (int64_t c = 0; c < (st[3] ? t->shape[3] : 1); c++)
                        m[b * st[0] + n * st[1] + r * st[2] + c * st[3]] = src[spattn_offset4(t, b, n, r, c)];
        pl->mask = spattn_tensor_make(m, SPATTN_DTYPE_U8, 4, t->shape, st);
    } else {
        memcpy(m, src + lo, extent);
        pl->mask = spattn_tensor_make(m - lo, SPATTN_DTYPE_U8, 4, t->shape, t->strides);
    }
    pl->mask_mem = m;
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_bsa_plan_create(const spattn_tensor *block_mask, int64_t bx, int64_t by, int64_t Sq,
                                     int64_t Skv, int64_t Nkv, const spattn_options *opt,
                                     spattn_bsa_plan **plan) {
    spattn_clear_error();
    if (!plan) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "plan: out-pointer is NULL");
    *plan = NULL;
    TRY(check_plan_args(block_mask, bx, by, Sq, Skv, Nkv));
    spattn_exec ex;
    int use_cuda;
    TRY(spattn_resolve_exec(opt, block_mask, &ex, &use_cuda));
    spattn_bsa_plan *pl = (spattn_bsa_plan *)calloc(1, sizeof *pl);
    if (!pl) return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY, "bsa plan: out of host memory");
    pl->device_type = block_mask->device_type;
    pl->device_id = block_mask->device_id;
    pl->B = block_mask->shape[0];
    pl->N = block_mask->shape[1];
    pl->Nkv = Nkv;
    pl->Sq = Sq;
    pl->Skv = Skv;
    pl->bx = bx;
    pl->by = by;
    pl->nbx = block_mask->shape[2];
    pl->nby = block_mask->shape[3];
    if (use_cuda) {
        spattn_status s = spattn_cuda_bsa_plan_make(pl, block_mask, &ex);
        if (s != SPATTN_STATUS_SUCCESS) {
            free(pl);
            return s;
        }
    } else {
        spattn_status s = copy_mask_cpu(block_mask, pl);
        if (s != SPATTN_STATUS_SUCCESS) {
            free(pl);
            return s;
        }
    }
    *plan = pl;
    return SPATTN_STATUS_SUCCESS;
}

void spattn_bsa_plan_destroy(spattn_bsa_plan *plan) {
    if (!plan) return;
    if (plan->cuda) spattn_cuda_bsa_plan_free(plan);  /* frees the device mask copy too */
    else if (plan->device_type == SPATTN_DEVICE_CPU) free(plan->mask_mem);
    free(plan);
}

/* q, k present, with the plan's shapes and on its device (the rest is checked by the
 * ordinary entry point against the plan's mask). */
static spattn_status check_against_plan(const spattn_bsa_plan *pl, const spattn_tensor *q,
                                        const spattn_tensor *k) {
    if (!pl) return spattn_set_error(SPATTN_STATUS_NULL_POINTER, "plan: is NULL");
    TRY(spattn_check_present("q", q));
    TRY(spattn_check_present("k", k));
    TRY(spattn_check_ndim("q", q, 4, "[B, N, Sq, D]"));
    TRY(spattn_check_ndim("k", k, 4, "[B, Nkv, Skv, D]"));
    TRY(spattn_check_dim("q", q, 0, "B", pl->B, "B of the plan"));
    TRY(spattn_check_dim("q", q, 1, "N", pl->N, "N of the plan"));
    TRY(spattn_check_dim("q", q, 2, "Sq", pl->Sq, "Sq of the plan"));
    TRY(spattn_check_dim("k", k, 1, "Nkv", pl->Nkv, "Nkv of the plan"));
    TRY(spattn_check_dim("k", k, 2, "Skv", pl->Skv, "Skv of the plan"));
    if (q->device_type != pl->device_type || q->device_id != pl->device_id)
        return spattn_set_error(SPATTN_STATUS_BAD_DEVICE, "q: must be on the plan's device (type %d id %d), got type %d id %d",
                                pl->device_type, pl->device_id, q->device_type, q->device_id);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_bsa_fwd_plan(const spattn_bsa_plan *plan, const spattn_tensor *q, const spattn_tensor *k,
                                  const spattn_tensor *v, double scale, const spattn_tensor *o,
                                  const spattn_tensor *lse, const spattn_options *opt) {
    spattn_clear_error();
    TRY(check_against_plan(plan, q, k));
    return spattn_bsa_fwd_planned(q, k, v, &plan->mask, plan->bx, plan->by, scale, o, lse, opt, plan);
}

spattn_status spattn_bsa_bwd_plan(const spattn_bsa_plan *plan, const spattn_tensor *q, const spattn_tensor *k,
                                  const spattn_tensor *v, const spattn_tensor *o, const spattn_tensor *dout,
                                  const spattn_tensor *lse, double scale, const spattn_tensor *dq,
                                  const spattn_tensor *dk, const spattn_tensor *dv, const spattn_options *opt) {
    spattn_clear_error();
    TRY(check_against_plan(plan, q, k));
    return spattn_bsa_bwd_planned(q, k, v, o, dout, lse, &plan->mask, plan->bx, plan->by, scale, dq, dk, dv, opt,
                                  plan);
}

spattn_status spattn_bsa_plan_workspace_size(const spattn_bsa_plan *plan, const spattn_tensor *q,
                                             const spattn_tensor *k, const spattn_tensor *v, int32_t backward,
                                             const spattn_options *opt, size_t *bytes) {
    spattn_clear_error();
    TRY(check_against_plan(plan, q, k));
    return spattn_bsa_workspace_planned(q, k, v, &plan->mask, plan->bx, plan->by, backward, opt, bytes, plan);
}
