/*
 * CPU bsa forward and backward against the fp64 reference on many random small shapes:
 * Sq != Skv, bx/by from {1, 3, 16, 48, 80, 128}, D 8/64/128, GQA, every mask pattern (with
 * empty rows and an all-zero mask), every dtype, strided views of every tensor, S = 1.
 * fp16/bf16 inputs are rounded first and the reference runs on the rounded values.
 */
#include "bsa_testkit.h"

static const int64_t kBlk[] = {1, 3, 16, 48, 80, 128};

static void run_case(const bk_case *c, tu_rng *r) {
    char desc[256];
    bk_describe(c, desc, sizeof desc);
    bk_data d;
    bk_setup(&d, c, r, 1);
    bk_out out;
    memset(&out, 0, sizeof out);
    double tol = bk_dtype_tol(c->dtype);
    spattn_status st = bk_run_fwd(&d, &out, c->lay_out);
    TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: fwd status %d (%s)", desc, st, spattn_last_error());
    if (st == SPATTN_STATUS_SUCCESS) {
        bk_check_tensor("o", &out.o, d.o_ref, d.nq, tol, desc);
        /* LSE is fp32 whatever the dtype (computed from the same rounded inputs). */
        bk_check_tensor("lse", &out.lse, d.lse_ref, d.nl, 2e-6, desc);
        st = bk_run_bwd(&d, &out, (c->lay_out + 1) % LAY_COUNT);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS, "%s: bwd status %d (%s)", desc, st, spattn_last_error());
        if (st == SPATTN_STATUS_SUCCESS) {
            /* The backward reads the library's O rounded to the dtype: Delta = dO . O carries
             * that rounding into every dS of a row, so for fp16/bf16 the error scales with the
             * tensor's largest gradient, not with each element (fp32 stays element-wise). */
            double gt = c->dtype == SPATTN_DTYPE_F32 ? 2e-5 : 2 * tol;
            bk_norm_max = c->dtype != SPATTN_DTYPE_F32;
            bk_check_tensor("dq", &out.dq, d.dq_ref, d.nq, gt, desc);
            bk_check_tensor("dk", &out.dk, d.dk_ref, d.nkv, gt, desc);
            bk_check_tensor("dv", &out.dv, d.dv_ref, d.nkv, gt, desc);
            bk_norm_max = 0;
        }
    }
    /* lse == NULL: O alone, bitwise the same as with LSE. */
    if (st == SPATTN_STATUS_SUCCESS) {
        bk_out o2;
        memset(&o2, 0, sizeof o2);
        int64_t sq[4] = {c->B, c->N, c->Sq, c->D};
        o2.o = bk_alloc(c->dtype, 4, sq, c->lay_out);
        spattn_options opt;
        spattn_options_init(&opt);
        st = spattn_bsa_fwd_ex(&d.tq.t, &d.tk.t, &d.tv.t, &d.tm.t, c->bx, c->by, c->scale, &o2.o.t,
                               NULL, &opt);
        TU_CHECK(st == SPATTN_STATUS_SUCCESS && bk_same_bits(&o2.o, &out.o),
                 "%s: fwd without lse differs (status %d)", desc, st);
        bk_out_free(&o2);
    }
    bk_out_free(&out);
    bk_teardown(&d);
}

int main(void) {
    int quick = getenv("SPATTN_TEST_QUICK") != NULL;
    tu_rng r;
    tu_seed(&r, tu_test_seed(2024));
    const int64_t smax = quick ? 40 : 150;

    /* 1. Every (pattern, dtype, layout) combination on a random shape. */
    for (int i = 0; i < PAT_COUNT * 3 * LAY_COUNT; i++) {
        bk_case c = {0};
        c.pat = i % PAT_COUNT;
        c.dtype = (int32_t[]){SPATTN_DTYPE_F32, SPATTN_DTYPE_F16, SPATTN_DTYPE_BF16}[(i / PAT_COUNT) % 3];
        c.lay = (i / (PAT_COUNT * 3)) % LAY_COUNT;
        c.lay_out = (c.lay + i) % LAY_COUNT;
        c.B = tu_range(&r, 1, 2);
        c.Nkv = tu_range(&r, 1, 2);
        c.N = c.Nkv * tu_range(&r, 1, 2);
        c.Sq = tu_range(&r, 1, smax);
        c.Skv = tu_range(&r, 1, smax);
        c.D = (int64_t[]){8, 64, 128, 24, 80, 256, 64}[(i + i / PAT_COUNT) % 7];
        c.bx = kBlk[tu_range(&r, 0, 5)];
        c.by = kBlk[tu_range(&r, 0, 5)];
        /* Custom scales relative to the default: fp32 score error grows with |scale * q.k|, so
         * an absolute 0.9 at D = 256 would test fp32 itself rather than the kernels. */
        c.scale = ((i % 5 == 3) ? -0.6 : (i % 5 == 4 ? 1.7 : 0.0)) / sqrt((double)c.D);
        run_case(&c, &r);
    }
    /* 2. Every bx and by value, D 64 and 128, with multi-tile sequences (Sq != Skv). */
    for (int i = 0; i < 6; i++)
        for (int dd = 0; dd < 2; dd++) {
            bk_case c = {0};
            c.pat = (i + dd) % 5; /* dense, causal, window, bigbird, random */
            c.dtype = SPATTN_DTYPE_F32;
            c.lay = (i + dd) % LAY_COUNT;
            c.lay_out = i % LAY_COUNT;
            c.B = 1;
            c.N = 2;
            c.Nkv = 1 + dd;
            c.Sq = quick ? 37 + 7 * i : 130 + 11 * i;
            c.Skv = quick ? 45 - 3 * i : 170 - 13 * i;
            c.D = dd ? 128 : 64;
            c.bx = kBlk[i];
            c.by = kBlk[5 - i];
            run_case(&c, &r);
        }
    /* 3. S = 1 on either side and both; a GQA group of 4. */
    int64_t ones[4][2] = {{1, 1}, {1, 77}, {77, 1}, {1, 130}};
    for (int i = 0; i < 4; i++) {
        bk_case c = {0};
        c.pat = i == 3 ? PAT_CAUSAL : PAT_DENSE;
        c.dtype = (int32_t[]){SPATTN_DTYPE_F32, SPATTN_DTYPE_BF16, SPATTN_DTYPE_F16, SPATTN_DTYPE_F32}[i];
        c.lay = i;
        c.B = 2;
        c.N = 4;
        c.Nkv = i == 3 ? 1 : 2;
        c.Sq = ones[i][0];
        c.Skv = ones[i][1];
        c.D = 64;
        c.bx = kBlk[i];
        c.by = kBlk[i + 1];
        run_case(&c, &r);
    }
    return tu_summary("test_bsa_cpu");
}
