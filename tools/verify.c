/*
 * `spattn verify`: every selected case, forward then backward, against an independent golden,
 * judged by the eco criterion; a table on stdout, "bsa 17/17 passed" per operator, optional
 * JSON.  Exit 0 when every case passed, 1 otherwise.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "report.h"
#include "run.h"
#include "run_varlen.h"
#include "spattn.h"

static const char *pass_str(int pass) { return pass == SP_PASS_FWD ? "fwd" : "bwd"; }

static void print_header(const sp_opts *o, int ncases, int nvarlen) {
    char dev[512];
    sp_device_name(o, dev, sizeof dev);
    printf("spattn %s verify: %d case%s, backend %s, %s", spattn_version(NULL, NULL, NULL), ncases,
           ncases == 1 ? "" : "s", sp_backend_str(o->backend), dev);
    if (o->backend == SPATTN_BACKEND_CPU && o->threads)
        printf(", %d thread%s", o->threads, o->threads == 1 ? "" : "s");
    printf("\n");
    double f = sp_effective_scale(o);
    if (f < 1.0)
        printf("SCALED RUN: sequence lengths x%g%s; --scale 1 runs the cases at full size "
               "(docs/cli.md, \"Scaling\")\n", f,
               o->scale > 0.0 ? "" : " (default of the cpu backend: the suites finish in minutes)");
    if (!o->deterministic)
        printf("NON-DETERMINISTIC backward (--deterministic 0): its outputs may vary in the last "
               "bits from run to run\n");
    if (o->perturb != 0.0)
        printf("SELF-TEST: %g is added to every output before the comparison (--perturb)\n",
               o->perturb);
    printf("golden: %s%s\n", o->backend == SPATTN_BACKEND_CUDA
                                 ? "CUDA reference kernels (fp32 accumulation)"
                                 : "fp64 reference (src/ref)",
           /* varlen cases: the fp64 varlen reference on the host on every backend */
           nvarlen && o->backend == SPATTN_BACKEND_CUDA
               ? "; varlen cases: fp64 varlen reference on the host (src/ref/ref_varlen.h)" : "");
    printf("%-26s %-6s %-11s %9s %10s %10s %9s %9s %9s\n", "case", "result", "tensor", "matched",
           "max_abs", "rel_l2", "fwd_ms", "bwd_ms", "gold_ms");
}

static void print_case(const sp_case_res *r) {
    const sp_case *c = r->c;
    if (r->status) {
        /* A refusal of the backend is not a wrong result: say so (it still fails the run). */
        printf("%-26s %-6s %s\n", c->name,
               r->status == SPATTN_STATUS_NOT_SUPPORTED ? "UNSUP" : "FAIL", r->msg);
        return;
    }
    for (int i = 0; i < r->nt; i++) {
        const sp_tensor_res *t = &r->t[i];
        char tname[24];
        snprintf(tname, sizeof tname, "%s.%s", pass_str(t->pass), t->name);
        printf("%-26s %-6s %-11s %9.6f %10.3e %10.3e", i == 0 ? c->name : "",
               i == 0 ? (r->pass ? "pass" : "FAIL") : (t->eco.pass ? "" : "FAIL"), tname,
               t->eco.matched_ratio, t->eco.max_abs, t->eco.rel_l2);
        if (i == 0) printf(" %9.2f %9.2f %9.1f", r->fwd_ms, r->bwd_ms, r->ref_ms);
        if (!t->eco.pass && t->eco.worst >= 0)
            printf("%s  worst [%lld]: got %.6g want %.6g", i == 0 ? "" : "                              ",
                   (long long)t->eco.worst, t->worst_actual, t->worst_golden);
        printf("\n");
    }
}

static void run_one(const sp_opts *o, const sp_case *c, sp_case_res *r) {
    memset(r, 0, sizeof *r);
    r->c = c;
    double t0 = sp_now_ms();
    sp_inputs in;
    char err[512];
    if (sp_inputs_make(c, &in, err, sizeof err)) {
        r->status = SPATTN_STATUS_OUT_OF_MEMORY;
        snprintf(r->msg, sizeof r->msg, "%s", err);
        return;
    }
    r->pairs = sp_pairs(c, &in);
    sp_verify_out out;
    int rc = c->varlen ? sp_verify_varlen(c, &in, o->passes, o->backend, o->threads,
                                          o->deterministic, &out)
             : o->backend == SPATTN_BACKEND_CUDA
                 ? sp_verify_cuda(c, &in, o->passes, o->deterministic, &out)
                 : sp_verify_cpu(c, &in, o->passes, o->threads, o->deterministic, &out);
    r->fwd_ms = out.fwd_ms;
    r->bwd_ms = out.bwd_ms;
    r->ref_ms = out.ref_ms;
    if (rc) {
        r->status = out.status ? out.status : SPATTN_STATUS_INTERNAL;
        snprintf(r->msg, sizeof r->msg, "%s", out.msg);
    } else {
        if (o->perturb != 0.0) {
            /* Self-test of the check: shift our outputs and judge them again (must fail). */
            for (int i = 0; i < out.nt; i++) {
                sp_named *n = &out.t[i];
                for (int64_t e = 0; e < n->n; e++) n->actual[e] += (float)o->perturb;
            }
            sp_verify_compare(&out);
        }
        r->pass = 1;
        r->nt = out.nt;
        for (int i = 0; i < out.nt; i++) {
            const sp_named *n = &out.t[i];
            sp_tensor_res *t = &r->t[i];
            snprintf(t->name, sizeof t->name, "%s", n->name);
            t->pass = n->pass;
            t->dtype = n->dtype;
            t->eco = n->eco;
            t->tol = sp_tol_for(n->dtype);
            if (n->eco.worst >= 0) {
                t->worst_actual = n->actual[n->eco.worst];
                t->worst_golden = n->golden[n->eco.worst];
            }
            r->pass &= n->eco.pass;
        }
    }
    sp_verify_out_free(&out);
    sp_inputs_free(&in);
    r->total_ms = sp_now_ms() - t0;
}

static int write_json(const sp_opts *o, const sp_case_res *res, int n, const int *passed,
                      const int *total) {
    FILE *f = fopen(o->json_path, "w");
    if (!f) {
        fprintf(stderr, "spattn: --json %s: cannot write: %s\n", o->json_path, strerror(errno));
        return -1;
    }
    sp_jw w;
    sp_jw_init(&w, f);
    sp_jw_obj(&w, NULL);
    sp_json_header(&w, o, "verify");
    sp_jw_str(&w, "golden", o->backend == SPATTN_BACKEND_CUDA ? "cuda_reference" : "fp64_reference");
    sp_jw_num(&w, "perturb", o->perturb);
    sp_jw_int(&w, "deterministic", o->deterministic);
    int all = 1;
    sp_jw_obj(&w, "summary");
    for (int op = 0; op < SP_OP_COUNT; op++) {
        if (!total[op]) continue;
        sp_jw_obj(&w, sp_op_name(op));
        sp_jw_int(&w, "passed", passed[op]);
        sp_jw_int(&w, "total", total[op]);
        sp_jw_end_obj(&w);
        all &= passed[op] == total[op];
    }
    sp_jw_end_obj(&w);
    sp_jw_bool(&w, "all_passed", all);
    sp_jw_arr(&w, "cases");
    for (int i = 0; i < n; i++) {
        const sp_case_res *r = &res[i];
        const sp_case *c = r->c;
        sp_jw_obj(&w, NULL);
        sp_jw_str(&w, "case", c->name);
        sp_jw_str(&w, "op", sp_op_name(c->op));
        sp_jw_str(&w, "file", c->file);
        sp_jw_int(&w, "line", c->line);
        sp_jw_num(&w, "scale", c->scaled_by);
        sp_json_shape(&w, c);
        sp_jw_bool(&w, "pass", r->pass);
        sp_jw_str(&w, "status", spattn_status_str((spattn_status)r->status));
        sp_jw_str(&w, "message", r->msg);
        sp_jw_num(&w, "pairs", r->pairs);
        sp_jw_num(&w, "fwd_ms", r->fwd_ms);
        sp_jw_num(&w, "bwd_ms", r->bwd_ms);
        sp_jw_num(&w, "golden_ms", r->ref_ms);
        sp_jw_num(&w, "total_ms", r->total_ms);
        sp_jw_arr(&w, "tensors");
        for (int k = 0; k < r->nt; k++) {
            const sp_tensor_res *t = &r->t[k];
            sp_jw_obj(&w, NULL);
            sp_jw_str(&w, "name", t->name);
            sp_jw_str(&w, "pass", pass_str(t->pass));
            sp_jw_str(&w, "dtype", sp_dtype_str(t->dtype));
            sp_jw_bool(&w, "ok", t->eco.pass);
            sp_jw_int(&w, "elements", t->eco.total);
            sp_jw_int(&w, "matched", t->eco.matched);
            sp_jw_num(&w, "matched_ratio", t->eco.matched_ratio);
            sp_jw_num(&w, "max_abs_error", t->eco.max_abs);
            sp_jw_num(&w, "rel_l2_error", t->eco.rel_l2);
            sp_jw_int(&w, "nonfinite_mismatches", t->eco.nonfinite_mismatch);
            sp_jw_num(&w, "atol", t->tol.atol);
            sp_jw_num(&w, "rtol", t->tol.rtol);
            sp_jw_num(&w, "max_abs_limit", t->tol.limit);
            sp_jw_end_obj(&w);
        }
        sp_jw_end_arr(&w);
        sp_jw_end_obj(&w);
    }
    sp_jw_end_arr(&w);
    sp_jw_end_obj(&w);
    if (fclose(f)) {
        fprintf(stderr, "spattn: --json %s: write failed\n", o->json_path);
        return -1;
    }
    return 0;
}

int sp_cmd_verify(sp_opts *o) {
    if (sp_resolve_backend(o)) return SP_EXIT_USAGE;
    sp_case_list cases;
    if (sp_select_cases(o, &cases)) return SP_EXIT_USAGE;
    if (cases.n == 0) {
        fprintf(stderr, "spattn: no case matches the filters\n");
        sp_case_list_free(&cases);
        return SP_EXIT_USAGE;
    }
    sp_case_res *res = calloc((size_t)cases.n, sizeof *res);
    double *work = calloc((size_t)cases.n, sizeof *work);
    if (!res || !work) {
        fprintf(stderr, "spattn: out of memory\n");
        free(res);
        free(work);
        sp_case_list_free(&cases);
        return SP_EXIT_USAGE;
    }
    int nvarlen = 0;
    for (int i = 0; i < cases.n; i++) nvarlen += cases.v[i].varlen;
    print_header(o, cases.n, nvarlen);
    fflush(stdout);
    double total_work = 0.0;
    for (int i = 0; i < cases.n; i++) {
        /* Work of a case for the estimate: forward + backward FLOPs (the golden scales alike). */
        double p = sp_pairs_estimate(&cases.v[i]);
        work[i] = sp_flops(&cases.v[i], p, 0) + sp_flops(&cases.v[i], p, 1);
        total_work += work[i];
    }
    sp_progress prog;
    sp_progress_start(&prog, cases.n, total_work, o->quiet);
    int passed[SP_OP_COUNT] = {0}, total[SP_OP_COUNT] = {0}, unsup[SP_OP_COUNT] = {0};
    for (int i = 0; i < cases.n; i++) {
        const sp_case *c = &cases.v[i];
        sp_progress_case(&prog, i, c->name);
        run_one(o, c, &res[i]);
        sp_progress_done(&prog, work[i]);
        sp_progress_end(&prog);
        print_case(&res[i]);
        fflush(stdout);
        if (res[i].status)
            fprintf(stderr, "spattn: %s:%d: case %s: %s\n", c->file, c->line, c->name, res[i].msg);
        total[c->op]++;
        passed[c->op] += res[i].pass;
        unsup[c->op] += res[i].status == SPATTN_STATUS_NOT_SUPPORTED;
    }
    double el = (sp_now_ms() - prog.start_ms) / 1e3;
    printf("\n");
    int all = 1;
    for (int op = 0; op < SP_OP_COUNT; op++) {
        if (!total[op]) continue;
        printf("%s %d/%d passed", sp_op_name(op), passed[op], total[op]);
        if (unsup[op])
            printf(" (%d not supported by the %s backend: NOT_SUPPORTED, not run)", unsup[op],
                   sp_backend_str(o->backend));
        printf("\n");
        all &= passed[op] == total[op];
    }
    double f = sp_effective_scale(o);
    if (f < 1.0) printf("(scaled run: sequence lengths x%g)\n", f);
    printf("backend %s, %.1f s in all\n", sp_backend_str(o->backend), el);
    for (int i = 0; i < cases.n; i++)
        if (!res[i].pass)
            printf("FAILED: %s (%s:%d)%s%s\n", cases.v[i].name, cases.v[i].file, cases.v[i].line,
                   res[i].status ? ": " : "", res[i].status ? res[i].msg : "");
    int rc = all ? SP_EXIT_OK : SP_EXIT_FAIL;
    if (o->json_path && write_json(o, res, cases.n, passed, total)) rc = SP_EXIT_USAGE;
    free(res);
    free(work);
    sp_case_list_free(&cases);
    return rc;
}
