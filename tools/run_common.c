#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "call.h"
#include "run.h"
#include "spattn.h"

double sp_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

sp_named *sp_named_add(sp_verify_out *out, const char *name, int pass, int32_t dtype,
                       const void *buf, int64_t rows, int64_t width, int64_t col0, int64_t cols) {
    if (out->nt >= (int)(sizeof out->t / sizeof out->t[0])) return NULL;
    sp_named *t = &out->t[out->nt];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->pass = pass;
    t->dtype = dtype;
    t->rows = rows;
    t->cols = cols;
    t->n = rows * cols;
    t->actual = malloc((size_t)(t->n ? t->n : 1) * sizeof(float));
    if (!t->actual) return NULL;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            t->actual[r * cols + j] = sp_load(buf, dtype, r * width + col0 + j);
    out->nt++;
    return t;
}

int sp_named_golden_d(sp_named *t, const double *src, int64_t width, int64_t col0) {
    t->golden = malloc((size_t)(t->n ? t->n : 1) * sizeof(double));
    if (!t->golden) return -1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < t->rows; r++)
        for (int64_t j = 0; j < t->cols; j++) t->golden[r * t->cols + j] = src[r * width + col0 + j];
    return 0;
}

int sp_named_golden_f(sp_named *t, const float *src, int64_t width, int64_t col0) {
    t->golden = malloc((size_t)(t->n ? t->n : 1) * sizeof(double));
    if (!t->golden) return -1;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < t->rows; r++)
        for (int64_t j = 0; j < t->cols; j++)
            t->golden[r * t->cols + j] = (double)src[r * width + col0 + j];
    return 0;
}

void sp_verify_compare(sp_verify_out *out) {
    for (int i = 0; i < out->nt; i++) {
        sp_named *t = &out->t[i];
        sp_eco_compare(t->actual, t->golden, t->n, sp_tol_for(t->dtype), &t->eco);
    }
}

void sp_verify_out_free(sp_verify_out *out) {
    for (int i = 0; i < out->nt; i++) {
        free(out->t[i].actual);
        free(out->t[i].golden);
        out->t[i].actual = NULL;
        out->t[i].golden = NULL;
    }
}

int sp_fail_status(sp_verify_out *out, int status, const char *what) {
    out->status = status;
    snprintf(out->msg, sizeof out->msg, "%s: %s: %s", what,
             spattn_status_str((spattn_status)status), spattn_last_error());
    return -1;
}

/* Adds the named tensors of the passes from the implementation's output buffers. */
int sp_add_outputs(const sp_case *c, void *const buf[], int passes, sp_verify_out *out) {
    const int32_t dt = c->dtype;
    int64_t no, nlse, ndq, ndk, ndv;
    sp_output_sizes(c, &no, &nlse, &ndq, &ndk, &ndv);
    const int64_t W = c->op == SP_OP_BSA ? c->D : c->D + c->Dr;
    int ok = 1;
    if (passes & SP_PASS_FWD) {
        ok &= sp_named_add(out, "o", SP_PASS_FWD, dt, buf[SP_B_O], no / c->D, c->D, 0, c->D) != NULL;
        ok &= sp_named_add(out, "lse", SP_PASS_FWD, SPATTN_DTYPE_F32, buf[SP_B_LSE], nlse, 1, 0,
                           1) != NULL;
    }
    if (passes & SP_PASS_BWD) {
        ok &= sp_named_add(out, "dq", SP_PASS_BWD, dt, buf[SP_B_DQ], ndq / W, W, 0, c->D) != NULL;
        if (c->op == SP_OP_SFA && c->Dr > 0)
            ok &= sp_named_add(out, "dq_rope", SP_PASS_BWD, dt, buf[SP_B_DQ], ndq / W, W, c->D,
                               c->Dr) != NULL;
        ok &= sp_named_add(out, "dk", SP_PASS_BWD, dt, buf[SP_B_DK], ndk / W, W, 0, c->D) != NULL;
        if (c->op == SP_OP_SFA && c->Dr > 0)
            ok &= sp_named_add(out, "dk_rope", SP_PASS_BWD, dt, buf[SP_B_DK], ndk / W, W, c->D,
                               c->Dr) != NULL;
        if (ndv)
            ok &= sp_named_add(out, "dv", SP_PASS_BWD, dt, buf[SP_B_DV], ndv / c->D, c->D, 0,
                               c->D) != NULL;
    }
    if (!ok) {
        out->status = SPATTN_STATUS_OUT_OF_MEMORY;
        snprintf(out->msg, sizeof out->msg, "out of memory collecting the outputs");
        return -1;
    }
    return 0;
}

