/*
 * Determinism of the CPU bsa kernels: outputs are bitwise identical for num_threads 1, 2, 3
 * and 7 (forward and backward) and with a caller-provided workspace, and every ISA variant this binary can run (selected with
 * SPATTN_CPU_ISA) matches the fp64 reference (variants are not bitwise equal to each other).
 */
#include "bsa_testkit.h"

#if defined(_WIN32)
static void set_isa(const char *v) { _putenv_s("SPATTN_CPU_ISA", v ? v : ""); }
#else
int setenv(const char *, const char *, int); /* POSIX; not declared under strict C11 */
int unsetenv(const char *);
static void set_isa(const char *v) {
    if (v) setenv("SPATTN_CPU_ISA", v, 1);
    else unsetenv("SPATTN_CPU_ISA");
}
#endif

static void check_threads(const bk_case *base, tu_rng *r) {
    static const int threads[] = {1, 2, 3, 7};
    bk_case c = *base;
    char desc[256];
    bk_describe(&c, desc, sizeof desc);
    bk_data d;
    bk_setup(&d, &c, r, 0);
    bk_out first;
    memset(&first, 0, sizeof first);
    for (int t = 0; t < 4; t++) {
        d.c.threads = threads[t];
        bk_out out;
        memset(&out, 0, sizeof out);
        spattn_status sf = bk_run_fwd(&d, &out, c.lay_out);
        spattn_status sb = sf ? sf : bk_run_bwd(&d, &out, c.lay_out);
        TU_CHECK(sf == 0 && sb == 0, "%s threads %d: status %d/%d %s", desc, threads[t], sf, sb, spattn_last_error());
        if (t == 0) {
            first = out;
            continue;
        }
        TU_CHECK(bk_same_bits(&out.o, &first.o) && bk_same_bits(&out.lse, &first.lse),
                 "%s: forward differs between 1 and %d threads", desc, threads[t]);
        TU_CHECK(bk_same_bits(&out.dq, &first.dq) && bk_same_bits(&out.dk, &first.dk) &&
                     bk_same_bits(&out.dv, &first.dv),
                 "%s: backward differs between 1 and %d threads", desc, threads[t]);
        bk_out_free(&out);
    }
    bk_out_free(&first);
    bk_teardown(&d);
}

/* A caller workspace of exactly the queried size at an odd address gives the same bits as the
 * library's own allocation (under ASan this also proves the size covers every access). */
static void check_workspace(const bk_case *base, tu_rng *r) {
    bk_case c = *base;
    char desc[256];
    bk_describe(&c, desc, sizeof desc);
    bk_data d;
    bk_setup(&d, &c, r, 0);
    bk_out ref, out;
    memset(&ref, 0, sizeof ref);
    memset(&out, 0, sizeof out);
    spattn_status st = bk_run_fwd(&d, &ref, c.lay_out);
    if (!st) st = bk_run_bwd(&d, &ref, c.lay_out);
    TU_CHECK(st == 0, "%s: %s", desc, spattn_last_error());
    for (int backward = 0; backward < 2 && !st; backward++) {
        spattn_options opt;
        spattn_options_init(&opt);
        opt.num_threads = c.threads;
        size_t need = 0;
        st = spattn_bsa_workspace_size(&d.tq.t, &d.tk.t, &d.tv.t, &d.tm.t, c.bx, c.by, backward, &opt, &need);
        TU_CHECK(st == 0 && need > 0, "%s: workspace query %s", desc, spattn_last_error());
        char *mem = malloc(need + 1);
        opt.workspace = mem + 1;
        opt.workspace_size = need;
        int64_t sq[4] = {c.B, c.N, c.Sq, c.D}, skv[4] = {c.B, c.Nkv, c.Skv, c.D}, sl[3] = {c.B, c.N, c.Sq};
        if (!backward) {
            out.o = bk_alloc(c.dtype, 4, sq, c.lay_out);
            out.lse = bk_alloc(SPATTN_DTYPE_F32, 3, sl, (c.lay_out + 1) % LAY_COUNT);
            st = spattn_bsa_fwd_ex(&d.tq.t, &d.tk.t, &d.tv.t, &d.tm.t, c.bx, c.by, c.scale, &out.o.t,
                                   &out.lse.t, &opt);
            TU_CHECK(st == 0 && bk_same_bits(&out.o, &ref.o) && bk_same_bits(&out.lse, &ref.lse),
                     "%s: fwd with caller workspace differs (%d)", desc, st);
        } else {
            out.dq = bk_alloc(c.dtype, 4, sq, c.lay_out);
            out.dk = bk_alloc(c.dtype, 4, skv, (c.lay_out + 1) % LAY_COUNT);
            out.dv = bk_alloc(c.dtype, 4, skv, (c.lay_out + 2) % LAY_COUNT);
            st = spattn_bsa_bwd_ex(&d.tq.t, &d.tk.t, &d.tv.t, &ref.o.t, &d.tdo.t, &ref.lse.t, &d.tm.t,
                                   c.bx, c.by, c.scale, &out.dq.t, &out.dk.t, &out.dv.t, &opt);
            TU_CHECK(st == 0 && bk_same_bits(&out.dq, &ref.dq) && bk_same_bits(&out.dk, &ref.dk) &&
                         bk_same_bits(&out.dv, &ref.dv),
                     "%s: bwd with caller workspace differs (%d)", desc, st);
        }
        free(mem);
    }
    bk_out_free(&out);
    bk_out_free(&ref);
    bk_teardown(&d);
}

static void check_isa(const char *isa, const bk_case *c, tu_rng *r) {
    char desc[300], base[256];
    bk_describe(c, base, sizeof base);
    snprintf(desc, sizeof desc, "[isa %s] %s", isa, base);
    bk_data d;
    bk_setup(&d, c, r, 1);
    bk_out out;
    memset(&out, 0, sizeof out);
    double tol = bk_dtype_tol(c->dtype);
    spattn_status st = bk_run_fwd(&d, &out, c->lay_out);
    TU_CHECK(st == 0, "%s: fwd %s", desc, spattn_last_error());
    if (!st) {
        bk_check_tensor("o", &out.o, d.o_ref, d.nq, tol, desc);
        bk_check_tensor("lse", &out.lse, d.lse_ref, d.nl, 2e-6, desc);
        st = bk_run_bwd(&d, &out, c->lay_out);
        TU_CHECK(st == 0, "%s: bwd %s", desc, spattn_last_error());
        if (!st) {
            double gt = c->dtype == SPATTN_DTYPE_F32 ? 2e-5 : 2 * tol;
            bk_norm_max = c->dtype != SPATTN_DTYPE_F32;
            bk_check_tensor("dq", &out.dq, d.dq_ref, d.nq, gt, desc);
            bk_check_tensor("dk", &out.dk, d.dk_ref, d.nkv, gt, desc);
            bk_check_tensor("dv", &out.dv, d.dv_ref, d.nkv, gt, desc);
            bk_norm_max = 0;
        }
    }
    bk_out_free(&out);
    bk_teardown(&d);
}

int main(void) {
    int quick = getenv("SPATTN_TEST_QUICK") != NULL;
    tu_rng r;
    tu_seed(&r, tu_test_seed(99));
    int64_t S = quick ? 70 : 300;
    /* Several tiles per sequence, GQA, partial edge blocks, each dtype. */
    bk_case cases[] = {
        {1, 4, 2, S, S + 29, 64, 48, 80, PAT_CAUSAL, LAY_CONTIG, LAY_CONTIG, SPATTN_DTYPE_F32, 0, 0},
        {2, 2, 1, S + 5, S - 17, 128, 16, 3, PAT_RANDOM, LAY_PERMUTED, LAY_PADDED, SPATTN_DTYPE_BF16, 0, 0},
        {1, 3, 3, S / 2, S, 32, 1, 128, PAT_EMPTY_ROWS, LAY_PADDED, LAY_INNER2, SPATTN_DTYPE_F16, 0.5, 0},
        {1, 2, 1, S, S, 8, 64, 64, PAT_BIGBIRD, LAY_INNER2, LAY_PERMUTED, SPATTN_DTYPE_F32, 0, 0},
    };
    int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < ncases; i++) check_threads(&cases[i], &r);
    for (int i = 0; i < ncases; i++) {
        bk_case c = cases[i];
        c.threads = i == 0 ? 0 : 3; /* 0: OpenMP's default thread count */
        check_workspace(&c, &r);
    }

    /* Every ISA variant the CPU supports (the override only lowers the choice). */
    set_isa(NULL);
    const char *best = spattn_cpu_isa();
    static const char *const isas[] = {"avx512", "avx2", "generic"};
    int started = 0, ran = 0;
    for (int k = 0; k < 3; k++) {
        if (!strcmp(isas[k], best)) started = 1;
        if (!started) continue;
        set_isa(isas[k]);
        TU_CHECK(!strcmp(spattn_cpu_isa(), isas[k]), "SPATTN_CPU_ISA=%s selected %s", isas[k], spattn_cpu_isa());
        for (int i = 0; i < ncases; i++) {
            bk_case c = cases[i];
            c.threads = 2;
            check_isa(isas[k], &c, &r);
        }
        ran++;
    }
    set_isa(NULL);
    printf("ISA variants checked: %d (best on this CPU: %s)\n", ran, best);
    TU_CHECK(ran >= 1, "no ISA variant ran");
    return tu_summary("test_bsa_determinism");
}
