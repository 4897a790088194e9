/* `spattn`: command-line entry point, argument parsing and dispatch to the subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli.h"
#include "run.h"
#include "spattn.h"

static void usage(FILE *f) {
    fprintf(f,
"usage: spattn <command> [options] [SUITE_FILE...]\n"
"\n"
"commands:\n"
"  verify   run every selected case forward + backward and check it against an independent\n"
"           golden with the eco criterion (cases/README.md); exit 0 all pass, 1 any fails\n"
"  bench    time every selected case (median/min/max, TFLOP/s); compare with peers\n"
"  list     print the selected cases, their (scaled) shapes and FLOPs\n"
"  version  print the library version\n"
"\n"
"selection:\n"
"  --suite NAME|FILE   a suite by name (DIR/NAME.cases) or a .cases file; repeatable\n"
"                      (default: bsa and sfa)\n"
"  --cases-dir DIR     where suites live (default: $SPATTN_CASES_DIR, else the source\n"
"                      tree's cases/, else ./cases)\n"
"  --case REGEX        only cases whose name matches (POSIX extended regex)\n"
"  --op bsa|sfa        only one operator\n"
"  --pass fwd|bwd      only one pass (bwd still runs our forward for O and LSE)\n"
"  --dtype fp16|bf16|fp32\n"
"execution:\n"
"  --backend cpu|cuda|auto   (default auto: cuda when a device is usable, else cpu)\n"
"  --scale F           multiply sequence lengths by F (0 < F <= 1); default 1 on cuda,\n"
"                      %g on cpu so that the suites finish in minutes\n"
"  --threads N         CPU threads (default: all)\n"
"  --deterministic 0|1 verify, bench: spattn_options.deterministic of the backward calls;\n"
"                      1 (default) bitwise reproducible, 0 lets CUDA kernels sum in an order\n"
"                      that may vary (faster; some shapes have only such a kernel)\n"
"output:\n"
"  --json FILE         write the results as JSON (schema: docs/cli.md)\n"
"  --quiet             no progress on stderr\n"
"  --perturb X         verify self-test: add X to our outputs before comparing (must fail)\n"
"bench only:\n"
"  --repeats N         timed repeats (default 10)\n"
"  --warmup N          untimed calls first (default 2)\n"
"  --compare FILE      a peer's bench JSON to put beside ours; repeatable\n"
"  --svg FILE          grouped bar chart (TFLOP/s) of ours vs the peers\n"
"  --load FILE         take our results from a bench JSON instead of running\n"
"  --plan reuse|call   bsa: one spattn_bsa_plan per case reused by every timed call\n"
"                      (default; the kernels alone) or the plain calls (schedules built and\n"
"                      workspace allocated in every call); with reuse, each case's plan\n"
"                      outputs must equal a plain call's bit for bit (else exit 1)\n"
"  --dump DIR          write each case's block mask (bsa) or indices (sfa) and a JSON header\n"
"                      to DIR (created if missing) for peers to time the same sparsity\n"
"                      (bench/peers/; format: docs/cli.md)\n"
"  --peak              cpu: measure the fp32 FMA peak first; rates also as %% of it\n"
"  --varlen-baselines  varlen cases: also time the same work as a loop of dense calls, one\n"
"                      per sequence, and as one dense call with a block-diagonal mask (bsa)\n"
"                      or global indices (sfa); both must match the packed call (else\n"
"                      exit 1); prints packed/diag and loop/packed (docs/cli.md)\n",
            SP_CPU_DEFAULT_SCALE);
}

static int bad(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "spattn: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(run 'spattn help' for usage)\n");
    return SP_EXIT_USAGE;
}

static int parse_int_arg(const char *opt, const char *v, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || !*v || x < lo || x > hi) {
        char range[64];
        snprintf(range, sizeof range, "an integer in [%d, %d]", lo, hi);
        fprintf(stderr, "spattn: %s: expected %s, got '%s'\n", opt, range, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return SP_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return SP_EXIT_OK;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("spattn %s\n", spattn_version(NULL, NULL, NULL));
        return SP_EXIT_OK;
    }
    if (strcmp(cmd, "verify") && strcmp(cmd, "bench") && strcmp(cmd, "list"))
        return bad("unknown command '%s'%s", cmd, "");

    sp_opts o;
    memset(&o, 0, sizeof o);
    o.op = -1;
    o.dtype = -1;
    o.passes = SP_PASS_FWD | SP_PASS_BWD;
    o.backend = SPATTN_BACKEND_AUTO;
    o.repeats = 10;
    o.warmup = 2;
    o.deterministic = 1;
    int rc = SP_EXIT_USAGE, seen_timing = 0, seen_plan = 0, seen_det = 0;
    for (int i = 2; i < argc; i++) {
        char *a = argv[i];
        if (a[0] != '-') { /* a suite file */
            if (o.n_suites == SP_MAX_LIST) return bad("too many suites (at most 16)%s%s", "", "");
            o.suites[o.n_suites++] = a;
            continue;
        }
        /* --opt=value or --opt value */
        char name[64];
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
        if (!strcmp(name, "--quiet") || !strcmp(name, "-q")) {
            o.quiet = 1;
            continue;
        }
        if (!strcmp(name, "--peak")) {
            o.peak = 1;
            continue;
        }
        if (!strcmp(name, "--varlen-baselines")) {
            o.varlen_baselines = 1;
            continue;
        }
        static const char *const kWithValue[] = {
            "--suite", "--cases-dir", "--case", "--op", "--pass", "--dtype", "--backend", "--scale",
            "--threads", "--repeats", "--warmup", "--json", "--compare", "--svg", "--load",
            "--perturb", "--plan", "--dump", "--deterministic"};
        int known = 0;
        for (size_t k = 0; k < sizeof kWithValue / sizeof kWithValue[0]; k++)
            known |= !strcmp(name, kWithValue[k]);
        if (!known) return bad("unknown option '%s'%s", name, "");
        if (!val) {
            if (i + 1 >= argc) return bad("%s: missing value%s", name, "");
            val = argv[++i];
        }
        if (!strcmp(name, "--suite")) {
            if (o.n_suites == SP_MAX_LIST) return bad("too many suites (at most 16)%s%s", "", "");
            o.suites[o.n_suites++] = val;
        } else if (!strcmp(name, "--cases-dir")) {
            o.cases_dir = val;
        } else if (!strcmp(name, "--case")) {
            if (o.has_re) regfree(&o.re);
            int e = regcomp(&o.re, val, REG_EXTENDED | REG_NOSUB);
            if (e) {
                char msg[256];
                regerror(e, &o.re, msg, sizeof msg);
                return bad("--case: bad regular expression: %s (%s)", msg, val);
            }
            o.has_re = 1;
            o.case_regex = val;
        } else if (!strcmp(name, "--op")) {
            if (!strcmp(val, "bsa")) o.op = SP_OP_BSA;
            else if (!strcmp(val, "sfa")) o.op = SP_OP_SFA;
            else return bad("--op: expected bsa or sfa, got '%s'%s", val, "");
        } else if (!strcmp(name, "--pass")) {
            if (!strcmp(val, "fwd")) o.passes = SP_PASS_FWD;
            else if (!strcmp(val, "bwd")) o.passes = SP_PASS_BWD;
            else return bad("--pass: expected fwd or bwd, got '%s'%s", val, "");
        } else if (!strcmp(name, "--dtype")) {
            if (!strcmp(val, "fp16")) o.dtype = SPATTN_DTYPE_F16;
            else if (!strcmp(val, "bf16")) o.dtype = SPATTN_DTYPE_BF16;
            else if (!strcmp(val, "fp32")) o.dtype = SPATTN_DTYPE_F32;
            else return bad("--dtype: expected fp16, bf16 or fp32, got '%s'%s", val, "");
        } else if (!strcmp(name, "--backend")) {
            if (!strcmp(val, "cpu")) o.backend = SPATTN_BACKEND_CPU;
            else if (!strcmp(val, "cuda")) o.backend = SPATTN_BACKEND_CUDA;
            else if (!strcmp(val, "auto")) o.backend = SPATTN_BACKEND_AUTO;
            else return bad("--backend: expected cpu, cuda or auto, got '%s'%s", val, "");
        } else if (!strcmp(name, "--scale")) {
            char *end;
            errno = 0;
            double f = strtod(val, &end);
            if (errno || *end || !*val || !(f > 0.0 && f <= 1.0))
                return bad("--scale: expected a number in (0, 1], got '%s'%s", val, "");
            o.scale = f;
        } else if (!strcmp(name, "--perturb")) {
            char *end;
            errno = 0;
            o.perturb = strtod(val, &end);
            if (errno || *end || !*val || !isfinite(o.perturb))
                return bad("--perturb: expected a finite number, got '%s'%s", val, "");
        } else if (!strcmp(name, "--threads")) {
            if (parse_int_arg(name, val, 0, 4096, &o.threads)) return SP_EXIT_USAGE;
        } else if (!strcmp(name, "--repeats")) {
            if (parse_int_arg(name, val, 1, 100000, &o.repeats)) return SP_EXIT_USAGE;
            seen_timing = 1;
        } else if (!strcmp(name, "--warmup")) {
            if (parse_int_arg(name, val, 0, 100000, &o.warmup)) return SP_EXIT_USAGE;
            seen_timing = 1;
        } else if (!strcmp(name, "--json")) {
            o.json_path = val;
        } else if (!strcmp(name, "--compare")) {
            if (o.n_compare == SP_MAX_LIST) return bad("too many --compare files%s%s", "", "");
            o.compare[o.n_compare++] = val;
        } else if (!strcmp(name, "--svg")) {
            o.svg_path = val;
        } else if (!strcmp(name, "--load")) {
            o.load_path = val;
        } else if (!strcmp(name, "--plan")) {
            if (strcmp(val, "reuse") && strcmp(val, "call"))
                return bad("--plan: expected reuse or call, got '%s'%s", val, "");
            o.plan_per_call = !strcmp(val, "call");
            seen_plan = 1;
        } else if (!strcmp(name, "--dump")) {
            o.dump_dir = val;
        } else if (!strcmp(name, "--deterministic")) {
            if (strcmp(val, "0") && strcmp(val, "1"))
                return bad("--deterministic: expected 0 or 1, got '%s'%s", val, "");
            o.deterministic = val[0] == '1';
            seen_det = 1;
        }
    }
    if (strcmp(cmd, "verify") && o.perturb != 0.0)
        return bad("--perturb belongs to 'spattn verify'%s%s", "", "");
    if (strcmp(cmd, "bench") && (o.n_compare || o.svg_path || o.load_path))
        return bad("--compare, --svg and --load belong to 'spattn bench'%s%s", "", "");
    /* options a command would silently ignore are errors */
    if (strcmp(cmd, "bench") && seen_timing)
        return bad("--repeats and --warmup belong to 'spattn bench'%s%s", "", "");
    if (strcmp(cmd, "bench") && seen_plan) return bad("--plan belongs to 'spattn bench'%s%s", "", "");
    if (o.peak && (strcmp(cmd, "bench") || o.load_path))
        return bad("--peak belongs to 'spattn bench' without --load%s%s", "", "");
    if (seen_det && (!strcmp(cmd, "list") || o.load_path))
        return bad("--deterministic belongs to 'spattn verify' and 'spattn bench' without "
                   "--load%s%s", "", "");
    if (o.varlen_baselines && (strcmp(cmd, "bench") || o.load_path))
        return bad("--varlen-baselines belongs to 'spattn bench' without --load%s%s", "", "");
    if (o.dump_dir && (strcmp(cmd, "bench") || o.load_path))
        return bad("--dump belongs to 'spattn bench' without --load%s%s", "", "");
    if (!strcmp(cmd, "list") && o.json_path)
        return bad("--json belongs to 'spattn verify' and 'spattn bench'%s%s", "", "");
    /* output files are checked before the run, not after it (results would be lost); "a"
     * leaves an existing file as it is until the run rewrites it */
    const char *outs[2] = {o.json_path, o.svg_path};
    for (int f = 0; f < 2; f++) {
        FILE *fp = outs[f] ? fopen(outs[f], "a") : NULL;
        if (outs[f] && !fp)
            return bad("%s: cannot open for writing: %s", outs[f], strerror(errno));
        if (fp) fclose(fp);
    }
#ifdef _OPENMP
    /* The fp64 reference uses OpenMP directly: give it the same thread count. */
    if (o.threads > 0) omp_set_num_threads(o.threads);
#endif
    if (!strcmp(cmd, "verify")) rc = sp_cmd_verify(&o);
    else if (!strcmp(cmd, "bench")) rc = sp_cmd_bench(&o);
    else rc = sp_cmd_list(&o);
    if (o.has_re) regfree(&o.re);
    return rc;
}
