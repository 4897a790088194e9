/*
 * `spattn bench`: median / min / max time and TFLOP/s of every selected case and pass, our
 * results beside peers' (--compare FILE, same JSON schema: docs/cli.md) with per-case ratios
 * and their geometric mean, and an SVG bar chart (--svg FILE).  With a reused bsa plan (the
 * default) each pass is checked bit for bit against a plain call; --dump DIR writes each
 * case's mask / indices for the peer scripts (bench_dump.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "cli.h"
#include "json.h"
#include "report.h"
#include "run.h"
#include "run_varlen.h"
#include "spattn.h"
#include "svg.h"

typedef struct bres {
    char name[96];
    int op, pass;
    double median_ms, min_ms, max_ms, flops, tflops;
    double cpu_min_ms; /* cpu: least process CPU time of a repeat (all threads), 0 unknown */
    int ok;
    int plan_same; /* -1 not checked (no plan), 1 plan outputs == plain call's bits, 0 not */
    char msg[512];
    const sp_case *c;
    int has_base;    /* --varlen-baselines ran (or --load read) the loop / block-diagonal times */
    sp_vl_base base; /* bench_varlen.c */
    double base_flops; /* FLOPs of the block-diagonal call (padding included) */
} bres;

typedef struct bset {
    char label[128];
    bres *v;
    int n;
    double peak_gflops; /* --peak: measured fp32 FMA peak (cpu), 0 when not measured */
    double peak_cpu_gflops; /* the same over process CPU time per thread */
    int threads;            /* threads the cpu runs used (for the CPU-time rates) */
    int nondet;             /* --deterministic 0: backward outputs may differ run to run */
} bset;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *pass_str(int pass) { return pass == SP_PASS_FWD ? "fwd" : "bwd"; }

/* --varlen-baselines: the loop and block-diagonal forms of a varlen case's pass (bench_varlen.c).
 * Returns 1 when they failed or differ from the packed call (a failed case), else 0. */
static int run_baselines(const sp_opts *o, const sp_case *c, const sp_inputs *in, bres *r,
                         double *ms, sp_progress *prog) {
    int status = 0;
    char msg[512];
    r->has_base = 1;
    if (sp_bench_varlen_base(c, in, r->pass, o->warmup, o->repeats, o->backend, o->threads,
                             o->deterministic, ms, &r->base, &status, msg, sizeof msg)) {
        r->base.same = 0;
        snprintf(r->base.mismatch, sizeof r->base.mismatch, "%s", msg);
        sp_progress_end(prog);
        fprintf(stderr, "spattn: %s:%d: case %s %s: baselines: %s\n", c->file, c->line, c->name,
                pass_str(r->pass), msg);
        return 1;
    }
    r->base_flops = sp_flops(c, r->base.diag_pairs, r->pass == SP_PASS_BWD);
    if (r->base.same) return 0;
    sp_progress_end(prog);
    fprintf(stderr, "spattn: %s:%d: case %s %s: %s\n", c->file, c->line, c->name,
            pass_str(r->pass), r->base.mismatch);
    return 1;
}

/* Runs the benchmarks; returns the number of failed runs, -1 when out of memory, -2 when a
 * --dump file could not be written (message printed). */
static int run_all(sp_opts *o, const sp_case_list *cases, bset *ours) {
    int npass = (o->passes & SP_PASS_FWD ? 1 : 0) + (o->passes & SP_PASS_BWD ? 1 : 0);
    ours->v = calloc((size_t)(cases->n * npass), sizeof *ours->v);
    double *ms = malloc((size_t)o->repeats * sizeof *ms);
    double *cpu_ms = malloc((size_t)o->repeats * sizeof *cpu_ms);
    if (!ours->v || !ms || !cpu_ms) {
        free(ms);
        free(cpu_ms);
        return -1;
    }
    snprintf(ours->label, sizeof ours->label, "spattn %s", sp_backend_str(o->backend));
    double total_work = 0.0;
    for (int i = 0; i < cases->n; i++) {
        double p = sp_pairs_estimate(&cases->v[i]);
        if (o->passes & SP_PASS_FWD) total_work += sp_flops(&cases->v[i], p, 0);
        if (o->passes & SP_PASS_BWD) total_work += sp_flops(&cases->v[i], p, 1);
    }
    sp_progress prog;
    sp_progress_start(&prog, cases->n, total_work, o->quiet);
    int failed = 0;
    for (int i = 0; i < cases->n; i++) {
        const sp_case *c = &cases->v[i];
        sp_progress_case(&prog, i, c->name);
        sp_inputs in;
        char err[512];
        int have_in = sp_inputs_make(c, &in, err, sizeof err) == 0;
        double pairs = have_in ? sp_pairs(c, &in) : 0.0;
        if (have_in && o->dump_dir && sp_dump_case(o->dump_dir, o, c, &in, pairs, err, sizeof err)) {
            sp_progress_end(&prog);
            fprintf(stderr, "spattn: %s\n", err);
            sp_inputs_free(&in);
            free(ms);
            free(cpu_ms);
            return -2;
        }
        for (int pass = SP_PASS_FWD; pass <= SP_PASS_BWD; pass++) {
            if (!(o->passes & pass)) continue;
            bres *r = &ours->v[ours->n++];
            snprintf(r->name, sizeof r->name, "%s", c->name);
            r->c = c;
            r->op = c->op;
            r->pass = pass;
            r->flops = sp_flops(c, pairs, pass == SP_PASS_BWD);
            r->plan_same = -1;
            int status = 0;
            if (!have_in) {
                snprintf(r->msg, sizeof r->msg, "%s", err);
            } else if ((c->varlen /* run_varlen.c: the _varlen entry points, no plans */
                            ? sp_bench_varlen(c, &in, pass, o->warmup, o->repeats, o->backend,
                                              o->threads, o->deterministic, ms, &status, r->msg,
                                              sizeof r->msg)
                        : o->backend == SPATTN_BACKEND_CUDA
                            ? sp_bench_cuda(c, &in, pass, o->warmup, o->repeats, !o->plan_per_call,
                                            o->deterministic, ms, &r->plan_same, &status, r->msg,
                                            sizeof r->msg)
                            : sp_bench_cpu(c, &in, pass, o->warmup, o->repeats, o->threads,
                                           !o->plan_per_call, o->deterministic, ms, cpu_ms,
                                           &r->plan_same, &status, r->msg, sizeof r->msg)) == 0) {
                r->ok = 1;
                r->median_ms = median(ms, o->repeats);
                r->min_ms = ms[0];
                if (o->backend == SPATTN_BACKEND_CPU && !c->varlen) {
                    r->cpu_min_ms = cpu_ms[0];
                    for (int k = 1; k < o->repeats; k++)
                        if (cpu_ms[k] < r->cpu_min_ms) r->cpu_min_ms = cpu_ms[k];
                }
                r->max_ms = ms[o->repeats - 1];
                r->tflops = r->flops / (r->median_ms * 1e-3) / 1e12;
            }
            if (r->ok && c->varlen && o->varlen_baselines) failed += run_baselines(o, c, &in, r, ms, &prog);
            if (!r->ok) {
                failed++;
                sp_progress_end(&prog);
                fprintf(stderr, "spattn: %s:%d: case %s: %s\n", c->file, c->line, c->name, r->msg);
            } else if (r->plan_same == 0 && pass == SP_PASS_BWD && !o->deterministic) {
                /* a backward allowed to vary its summation order may differ from any other
                 * run of itself: reported, not a failure */
                sp_progress_end(&prog);
                fprintf(stderr, "spattn: note: case %s bwd: plan outputs differ from the plain "
                        "call's (--deterministic 0 allows it)\n", c->name);
            } else if (r->plan_same == 0) {
                /* timed fine, but the plan broke its promise: a failed case */
                failed++;
                sp_progress_end(&prog);
                fprintf(stderr, "spattn: %s:%d: case %s %s: plan outputs differ from the plain "
                        "call's (bitwise)\n", c->file, c->line, c->name, pass_str(pass));
            }
            sp_progress_done(&prog, r->flops);
        }
        if (have_in) sp_inputs_free(&in);
    }
    sp_progress_end(&prog);
    free(ms);
    free(cpu_ms);
    return failed;
}

/* Reads a result set (ours via --load, or a peer's) from the bench JSON schema. */
static int load_set(const char *path, bset *s) {
    char err[512];
    sp_jv *doc = sp_json_load(path, err, sizeof err);
    if (!doc) {
        fprintf(stderr, "spattn: %s\n", err);
        return -1;
    }
    const sp_jv *results = sp_jv_get(doc, "results");
    if (!results || results->type != SP_JARR) {
        fprintf(stderr, "spattn: %s: no \"results\" array (schema: docs/cli.md)\n", path);
        sp_json_free(doc);
        return -1;
    }
    const char *label = sp_jv_str(doc, "name");
    const char *backend = sp_jv_str(doc, "backend");
    if (label && backend) snprintf(s->label, sizeof s->label, "%s %s", label, backend);
    else snprintf(s->label, sizeof s->label, "%s", label ? label : backend ? backend : path);
    /* `--plan call` results beside the plan's (same name and backend) need telling apart */
    const char *plan = sp_jv_str(doc, "bsa_plan");
    if (plan && !strcmp(plan, "per_call")) {
        size_t l = strlen(s->label);
        snprintf(s->label + l, sizeof s->label - l, " per-call");
    }
    /* `--deterministic 0` results likewise (files written before the key: deterministic) */
    s->nondet = sp_jv_num(doc, "deterministic", 1.0) == 0.0;
    if (s->nondet) {
        size_t l = strlen(s->label);
        snprintf(s->label + l, sizeof s->label - l, " nondet");
    }
    s->v = calloc((size_t)(results->n ? results->n : 1), sizeof *s->v);
    s->n = 0;
    if (!s->v) {
        sp_json_free(doc);
        return -1;
    }
    for (int i = 0; i < results->n; i++) {
        const sp_jv *e = &results->items[i];
        const char *name = sp_jv_str(e, "case"), *pass = sp_jv_str(e, "pass");
        if (!name || !pass || (strcmp(pass, "fwd") && strcmp(pass, "bwd"))) {
            fprintf(stderr, "spattn: %s: results[%d]: needs \"case\" and \"pass\": \"fwd\"|\"bwd\"\n",
                    path, i);
            sp_json_free(doc);
            return -1;
        }
        bres *r = &s->v[s->n++];
        snprintf(r->name, sizeof r->name, "%s", name);
        r->pass = strcmp(pass, "fwd") ? SP_PASS_BWD : SP_PASS_FWD;
        r->median_ms = sp_jv_num(e, "median_ms", NAN);
        r->min_ms = sp_jv_num(e, "min_ms", NAN);
        r->max_ms = sp_jv_num(e, "max_ms", NAN);
        r->tflops = sp_jv_num(e, "tflops", NAN);
        r->cpu_min_ms = sp_jv_num(e, "cpu_min_ms", 0.0);
        r->flops = sp_jv_num(e, "flops", NAN);
        r->ok = isfinite(r->median_ms) || isfinite(r->tflops);
        const sp_jv *pb = sp_jv_get(e, "plan_bitwise");
        r->plan_same = pb && pb->type == SP_JBOOL ? (int)pb->num : -1;
        if (sp_jv_get(e, "loop_median_ms")) { /* --varlen-baselines results */
            r->has_base = 1;
            r->base.loop_ms[0] = sp_jv_num(e, "loop_median_ms", NAN);
            r->base.diag_ms[0] = sp_jv_num(e, "blockdiag_median_ms", NAN);
            const sp_jv *m = sp_jv_get(e, "baselines_match");
            r->base.same = !(m && m->type == SP_JBOOL && m->num == 0.0);
            const char *why = sp_jv_str(e, "baselines_error");
            snprintf(r->base.mismatch, sizeof r->base.mismatch, "%s", why ? why : "");
        }
        const char *op = sp_jv_str(e, "op");
        r->op = op && !strcmp(op, "sfa") ? SP_OP_SFA : SP_OP_BSA;
    }
    s->peak_gflops = sp_jv_num(doc, "fma_peak_gflops", 0.0); /* --load reprints %peak */
    s->peak_cpu_gflops = sp_jv_num(doc, "fma_peak_cpu_gflops", 0.0);
    s->threads = (int)sp_jv_num(doc, "peak_threads", 0.0);
    double sc = sp_jv_num(doc, "scale", 1.0);
    if (sc != 1.0) fprintf(stderr, "spattn: note: %s was a scaled run (x%g)\n", path, sc);
    sp_json_free(doc);
    return 0;
}

static const bres *find(const bset *s, const char *name, int pass) {
    for (int i = 0; i < s->n; i++)
        if (s->v[i].pass == pass && !strcmp(s->v[i].name, name)) return &s->v[i];
    return NULL;
}

/* Speed of ours relative to a peer: peer time / our time (> 1: we are faster). */
static double ratio(const bres *ours, const bres *peer) {
    if (!ours || !peer || !ours->ok || !peer->ok) return NAN;
    if (isfinite(ours->median_ms) && isfinite(peer->median_ms) && ours->median_ms > 0)
        return peer->median_ms / ours->median_ms;
    if (isfinite(ours->tflops) && isfinite(peer->tflops) && peer->tflops > 0)
        return ours->tflops / peer->tflops;
    return NAN;
}

/* Fraction of the measured FMA peak reached in `ms` (NaN without a peak). */
static double peak_frac(const bset *s, const bres *r, double ms) {
    return s->peak_gflops > 0 && ms > 0 ? r->flops / (ms * 1e-3) / 1e9 / s->peak_gflops : NAN;
}

/* The same over process CPU time per thread against the CPU-time peak: what the kernels reach
 * while they run, whatever else the machine is doing. */
static double peak_frac_cpu(const bset *s, const bres *r) {
    if (!(s->peak_cpu_gflops > 0) || !(r->cpu_min_ms > 0) || s->threads < 1) return NAN;
    return r->flops / (r->cpu_min_ms / s->threads * 1e-3) / 1e9 / s->peak_cpu_gflops;
}

/* Ratios of --varlen-baselines: packed / block-diagonal and loop / packed (NaN when missing). */
static double packed_over_diag(const bres *r) {
    return r->has_base && r->ok ? r->median_ms / r->base.diag_ms[0] : NAN;
}
static double loop_over_packed(const bres *r) {
    return r->has_base && r->ok ? r->base.loop_ms[0] / r->median_ms : NAN;
}

static void print_num(double x, const char *fmt, int width) {
    if (isfinite(x)) printf(fmt, x);
    else printf(" %*s", width, "-");
}

/* The --varlen-baselines columns of one row. */
static void print_base_cols(const bres *r) {
    if (!r->has_base) return;
    print_num(r->base.loop_ms[0], " %10.3f", 10);
    print_num(r->base.diag_ms[0], " %10.3f", 10);
    print_num(packed_over_diag(r), " %10.3f", 10);
    print_num(loop_over_packed(r), " %10.2f", 10);
}

/* Notes and failures of the baselines, under the table. */
static void print_base_notes(const bset *ours) {
    for (int i = 0; i < ours->n; i++) {
        const bres *r = &ours->v[i];
        if (!r->has_base) continue;
        if (r->base.note[0]) {
            printf("  %s %s: %s", r->name, pass_str(r->pass), r->base.note);
            if (r->base.diag_run && r->base.diag_padded)
                printf("; block-diagonal %.4g GFLOP vs packed %.4g", r->base_flops / 1e9,
                       r->flops / 1e9);
            printf("\n");
        }
        if (!r->base.same)
            printf("  %s %s: FAIL: %s\n", r->name, pass_str(r->pass), r->base.mismatch);
    }
}

static void print_results(const bset *ours) {
    const int pk = ours->peak_gflops > 0;
    int nb = 0;
    for (int i = 0; i < ours->n; i++) nb += ours->v[i].has_base;
    printf("%-26s %-4s %10s %10s %10s %9s %10s%s%s\n", "case", "pass", "median_ms", "min_ms", "max_ms",
           "TFLOP/s", "GFLOP", pk ? "   %peak   best%    cpu%" : "",
           nb ? "    loop_ms    diag_ms packed/diag loop/packed" : "");
    for (int i = 0; i < ours->n; i++) {
        const bres *r = &ours->v[i];
        if (!r->ok) {
            printf("%-26s %-4s ERROR %s\n", r->name, pass_str(r->pass), r->msg);
            continue;
        }
        printf("%-26s %-4s %10.3f %10.3f %10.3f %9.4g %10.4g", r->name, pass_str(r->pass),
               r->median_ms, r->min_ms, r->max_ms, r->tflops, r->flops / 1e9);
        /* best%: the fastest repeat, less sensitive to other load on a shared machine */
        if (pk)
            printf(" %7.1f %7.1f %7.1f", 100.0 * peak_frac(ours, r, r->median_ms),
                   100.0 * peak_frac(ours, r, r->min_ms), 100.0 * peak_frac_cpu(ours, r));
        print_base_cols(r);
        printf("%s\n", r->plan_same != 0                           ? ""
                       : ours->nondet && r->pass == SP_PASS_BWD ? "  plan != plain call (nondet)"
                                                                 : "  FAIL: plan != plain call");
    }
}

static void print_compare(const bset *ours, const bset *peers, int np) {
    printf("\ncomparison (ratio = peer time / our time; > 1 means spattn is faster)\n");
    printf("%-26s %-4s %10s", "case", "pass", "ours_ms");
    for (int p = 0; p < np; p++) printf("  %-22.22s %7s", peers[p].label, "ratio");
    printf("\n");
    double logsum[SP_MAX_LIST] = {0};
    int cnt[SP_MAX_LIST] = {0};
    for (int i = 0; i < ours->n; i++) {
        const bres *r = &ours->v[i];
        if (r->ok && isfinite(r->median_ms)) printf("%-26s %-4s %10.3f", r->name, pass_str(r->pass), r->median_ms);
        else printf("%-26s %-4s %10s", r->name, pass_str(r->pass), "-");
        for (int p = 0; p < np; p++) {
            const bres *q = find(&peers[p], r->name, r->pass);
            double x = ratio(r, q);
            double pm = q && q->ok ? q->median_ms : NAN;
            if (isfinite(pm)) printf("  %22.3f", pm);
            else printf("  %22s", "-");
            if (isfinite(x)) printf(" %6.2fx", x);
            else printf(" %7s", "-");
            if (isfinite(x) && x > 0) {
                logsum[p] += log(x);
                cnt[p]++;
            }
        }
        printf("\n");
    }
    for (int p = 0; p < np; p++) {
        if (cnt[p])
            printf("geometric mean vs %s: %.3fx over %d case-passes\n", peers[p].label,
                   exp(logsum[p] / cnt[p]), cnt[p]);
        else
            printf("geometric mean vs %s: no common case\n", peers[p].label);
    }
}

/* --varlen-baselines keys of one result (docs/cli.md). */
static void write_json_base(sp_jw *w, const bres *r) {
    const sp_vl_base *b = &r->base;
    sp_jw_num(w, "loop_median_ms", b->loop_ms[0]);
    sp_jw_num(w, "loop_min_ms", b->loop_ms[1]);
    sp_jw_num(w, "loop_max_ms", b->loop_ms[2]);
    sp_jw_int(w, "loop_calls", b->loop_calls);
    sp_jw_num(w, "blockdiag_median_ms", b->diag_ms[0]);
    sp_jw_num(w, "blockdiag_min_ms", b->diag_ms[1]);
    sp_jw_num(w, "blockdiag_max_ms", b->diag_ms[2]);
    sp_jw_num(w, "blockdiag_flops", b->diag_run ? r->base_flops : NAN);
    sp_jw_bool(w, "blockdiag_padded", b->diag_padded);
    sp_jw_num(w, "packed_over_blockdiag", packed_over_diag(r));
    sp_jw_num(w, "loop_over_packed", loop_over_packed(r));
    sp_jw_bool(w, "baselines_match", b->same);
    sp_jw_str(w, "baselines_note", b->note);
    if (!b->same) sp_jw_str(w, "baselines_error", b->mismatch);
}

static int write_json(const sp_opts *o, const bset *ours) {
    FILE *f = fopen(o->json_path, "w");
    if (!f) {
        fprintf(stderr, "spattn: --json %s: cannot write: %s\n", o->json_path, strerror(errno));
        return -1;
    }
    sp_jw w;
    sp_jw_init(&w, f);
    sp_jw_obj(&w, NULL);
    sp_json_header(&w, o, "bench");
    sp_jw_int(&w, "warmup", o->warmup);
    sp_jw_int(&w, "repeats", o->repeats);
    sp_jw_int(&w, "deterministic", o->deterministic);
    sp_jw_str(&w, "timer", o->backend == SPATTN_BACKEND_CUDA ? "cuda_events_l2_flushed" : "wall_clock");
    sp_jw_str(&w, "bsa_plan", o->plan_per_call ? "per_call" : "reused");
    sp_jw_bool(&w, "varlen_baselines", o->varlen_baselines);
    if (ours->peak_gflops > 0) {
        sp_jw_num(&w, "fma_peak_gflops", ours->peak_gflops);
        sp_jw_num(&w, "fma_peak_cpu_gflops", ours->peak_cpu_gflops);
        sp_jw_int(&w, "peak_threads", ours->threads);
    }
    sp_jw_arr(&w, "results");
    for (int i = 0; i < ours->n; i++) {
        const bres *r = &ours->v[i];
        sp_jw_obj(&w, NULL);
        sp_jw_str(&w, "case", r->name);
        sp_jw_str(&w, "op", sp_op_name(r->op));
        sp_jw_str(&w, "pass", pass_str(r->pass));
        if (r->c) {
            sp_jw_num(&w, "scale", r->c->scaled_by);
            sp_json_shape(&w, r->c);
        }
        sp_jw_bool(&w, "ok", r->ok);
        if (!r->ok) sp_jw_str(&w, "error", r->msg);
        /* bsa with a reused plan: its outputs equal a plain call's bit for bit */
        if (r->plan_same >= 0) sp_jw_bool(&w, "plan_bitwise", r->plan_same);
        sp_jw_num(&w, "median_ms", r->ok ? r->median_ms : NAN);
        sp_jw_num(&w, "min_ms", r->ok ? r->min_ms : NAN);
        sp_jw_num(&w, "max_ms", r->ok ? r->max_ms : NAN);
        sp_jw_num(&w, "flops", r->flops);
        sp_jw_num(&w, "tflops", r->ok ? r->tflops : NAN);
        if (r->has_base) write_json_base(&w, r);
        if (ours->peak_gflops > 0) {
            sp_jw_num(&w, "peak_fraction", r->ok ? peak_frac(ours, r, r->median_ms) : NAN);
            sp_jw_num(&w, "peak_fraction_best", r->ok ? peak_frac(ours, r, r->min_ms) : NAN);
            sp_jw_num(&w, "cpu_min_ms", r->ok && r->cpu_min_ms > 0 ? r->cpu_min_ms : NAN);
            sp_jw_num(&w, "peak_fraction_cpu", r->ok ? peak_frac_cpu(ours, r) : NAN);
        }
        sp_jw_end_obj(&w);
    }
    sp_jw_end_arr(&w);
    sp_jw_end_obj(&w);
    return fclose(f) ? -1 : 0;
}

static int write_svg(const sp_opts *o, const bset *ours, const bset *peers, int np) {
    int ns = np + 1, ng = ours->n;
    const char **groups = calloc((size_t)(ng ? ng : 1), sizeof *groups);
    char *labels = calloc((size_t)(ng ? ng : 1), 112);
    const char *series[SP_MAX_LIST + 1];
    double *vals = calloc((size_t)(ns * (ng ? ng : 1)), sizeof *vals);
    int rc = -1;
    if (!groups || !labels || !vals) goto done;
    series[0] = ours->label;
    for (int p = 0; p < np; p++) series[p + 1] = peers[p].label;
    for (int g = 0; g < ng; g++) {
        const bres *r = &ours->v[g];
        char *l = labels + (size_t)g * 112;
        snprintf(l, 112, "%s %s", r->name, pass_str(r->pass));
        groups[g] = l;
        vals[g] = r->ok ? r->tflops : NAN;
        for (int p = 0; p < np; p++) {
            const bres *q = find(&peers[p], r->name, r->pass);
            double v = NAN;
            if (q && q->ok) {
                v = q->tflops;
                /* A peer that reports only its time: our FLOP count of the same case. */
                if (!isfinite(v) && isfinite(q->median_ms) && r->flops > 0)
                    v = r->flops / (q->median_ms * 1e-3) / 1e12;
            }
            vals[(p + 1) * ng + g] = v;
        }
    }
    char title[256];
    double f = sp_effective_scale(o);
    snprintf(title, sizeof title, "spattn bench: TFLOP/s per case%s", f < 1.0 ? " (scaled run)" : "");
    rc = sp_svg_bars(o->svg_path, title, "TFLOP/s", groups, ng, series, ns, vals);
    if (rc) fprintf(stderr, "spattn: --svg %s: cannot write\n", o->svg_path);
done:
    free(groups);
    free(labels);
    free(vals);
    return rc;
}

int sp_cmd_bench(sp_opts *o) {
    bset ours = {{0}, NULL, 0, 0.0, 0.0, 0, 0};
    bset peers[SP_MAX_LIST];
    int np = 0, rc = SP_EXIT_OK;
    sp_case_list cases = {0};
    memset(peers, 0, sizeof peers);
    for (int i = 0; i < o->n_compare; i++) {
        if (load_set(o->compare[i], &peers[np])) {
            rc = SP_EXIT_USAGE;
            goto done;
        }
        np++;
    }
    if (o->load_path) {
        if (load_set(o->load_path, &ours)) {
            rc = SP_EXIT_USAGE;
            goto done;
        }
    } else {
        if (sp_resolve_backend(o) || sp_select_cases(o, &cases)) {
            rc = SP_EXIT_USAGE;
            goto done;
        }
        if (cases.n == 0) {
            fprintf(stderr, "spattn: no case matches the filters\n");
            rc = SP_EXIT_USAGE;
            goto done;
        }
        if (o->dump_dir && sp_dump_prepare(o->dump_dir)) { /* before the run, not after it */
            rc = SP_EXIT_USAGE;
            goto done;
        }
        if (o->peak && o->backend != SPATTN_BACKEND_CPU) {
            fprintf(stderr, "spattn: --peak belongs to the cpu backend\n");
            rc = SP_EXIT_USAGE;
            goto done;
        }
        char dev[512];
        sp_device_name(o, dev, sizeof dev);
        printf("spattn %s bench: %d case%s, backend %s, %s; warm-up %d, repeats %d (%s)\n",
               spattn_version(NULL, NULL, NULL), cases.n, cases.n == 1 ? "" : "s",
               sp_backend_str(o->backend), dev, o->warmup, o->repeats,
               o->backend == SPATTN_BACKEND_CUDA ? "CUDA events, L2 flushed before each repeat"
                                                 : "wall clock");
        if (!o->deterministic)
            printf("NON-DETERMINISTIC backward (--deterministic 0)\n");
        if (o->varlen_baselines)
            printf("varlen baselines: loop = one dense call per sequence, diag = one dense call "
                   "over all tokens (block-diagonal mask / global indices); packed/diag and "
                   "loop/packed are ratios of medians\n");
        double f = sp_effective_scale(o);
        if (f < 1.0)
            printf("SCALED RUN: sequence lengths x%g%s; --scale 1 runs the cases at full size\n", f,
                   o->scale > 0.0 ? "" : " (the cpu backend's default)");
        if (o->peak) {
            ours.peak_gflops = sp_fma_peak_gflops(o->threads, &ours.peak_cpu_gflops);
            ours.threads = o->threads;
#ifdef _OPENMP
            if (ours.threads <= 0) ours.threads = omp_get_max_threads();
#else
            ours.threads = 1;
#endif
            printf("fp32 FMA peak (measured, %s, %d threads): %.1f GFLOP/s over wall time, %.1f "
                   "over CPU time\n%%peak = median rate / peak, best%% = fastest repeat / peak, "
                   "cpu%% = rate over process CPU time / CPU-time peak (least sensitive to other "
                   "load)\n", spattn_cpu_isa(), ours.threads, ours.peak_gflops,
                   ours.peak_cpu_gflops);
        }
        fflush(stdout);
        ours.nondet = !o->deterministic;
        int failed = run_all(o, &cases, &ours);
        if (failed < 0) {
            if (failed == -1) fprintf(stderr, "spattn: out of memory\n");
            rc = SP_EXIT_USAGE;
            goto done;
        }
        if (failed) rc = SP_EXIT_FAIL;
    }
    print_results(&ours);
    print_base_notes(&ours);
    int nplan = 0, nsame = 0;
    for (int i = 0; i < ours.n; i++) {
        nplan += ours.v[i].plan_same >= 0;
        nsame += ours.v[i].plan_same == 1;
    }
    if (nplan)
        printf("bsa plan reused: %d/%d case-passes bitwise equal to the plain calls\n", nsame, nplan);
    if (np) print_compare(&ours, peers, np);
    if (o->json_path && !o->load_path && write_json(o, &ours)) rc = SP_EXIT_USAGE;
    if (o->svg_path && write_svg(o, &ours, peers, np)) rc = SP_EXIT_USAGE;
done:
    free(ours.v);
    for (int p = 0; p < SP_MAX_LIST; p++) free(peers[p].v);
    sp_case_list_free(&cases);
    return rc;
}
