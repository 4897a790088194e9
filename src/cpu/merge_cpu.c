/* CPU merge of two attention states (see include/spattn.h): one row per iteration, fp32 math. */
#include <math.h>
#include <omp.h>

#include "../core/dtype.h"
#include "../core/merge.h"

/* Element offset of row `r` (row-major over p->rshape) in t (whose first nr dims are rows). */
static int64_t row_offset(const spattn_merge_problem *p, const spattn_tensor *t, int64_t r) {
    int64_t off = 0;
    for (int i = p->nr - 1; i >= 0; i--) {
        int64_t idx = r % p->rshape[i];
        r /= p->rshape[i];
        off += idx * t->strides[i];
    }
    return off;
}

spattn_status spattn_cpu_merge(const spattn_merge_problem *p, const spattn_exec *ex) {
    const int64_t D = p->D, rows = p->rows;
    const int nd = p->o1->ndim - 1;
    const int64_t s1 = p->o1->strides[nd], s2 = p->o2->strides[nd], so = p->o->strides[nd];
    const int nt = ex->num_threads > 0 ? ex->num_threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) if (rows * D > 32768) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        float l1 = ((const float *)p->lse1->data)[row_offset(p, p->lse1, r)];
        float l2 = ((const float *)p->lse2->data)[row_offset(p, p->lse2, r)];
        int64_t b1 = row_offset(p, p->o1, r), b2 = row_offset(p, p->o2, r), bo = row_offset(p, p->o, r);
        float m = l1 > l2 ? l1 : l2;
        float out_lse;
        if (isnan(l1) || isnan(l2)) { /* a NaN LSE propagates to the whole row */
            for (int64_t d = 0; d < D; d++) spattn_store_f32(p->o->data, p->o->dtype, bo + d * so, NAN);
            out_lse = NAN;
        } else if (m == -INFINITY) { /* empty in both inputs */
            for (int64_t d = 0; d < D; d++) spattn_store_f32(p->o->data, p->o->dtype, bo + d * so, 0.0f);
            out_lse = -INFINITY;
        } else {
            float w1 = l1 == -INFINITY ? 0.0f : expf(l1 - m);
            float w2 = l2 == -INFINITY ? 0.0f : expf(l2 - m);
            float s = w1 + w2;
            float a1 = w1 / s, a2 = w2 / s;
            for (int64_t d = 0; d < D; d++) {
                float x = 0.0f;
                if (w1 != 0.0f) x += a1 * spattn_load_f32(p->o1->data, p->o1->dtype, b1 + d * s1);
                if (w2 != 0.0f) x += a2 * spattn_load_f32(p->o2->data, p->o2->dtype, b2 + d * s2);
                spattn_store_f32(p->o->data, p->o->dtype, bo + d * so, x);
            }
            out_lse = m + logf(s);
        }
        if (p->lse) ((float *)p->lse->data)[row_offset(p, p->lse, r)] = out_lse;
    }
    return SPATTN_STATUS_SUCCESS;
}
