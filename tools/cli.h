/* Command-line options shared by the subcommands, and the pieces main.c wires together. */
#ifndef SPATTN_CLI_CLI_H
#define SPATTN_CLI_CLI_H

#include <regex.h>
#include <stddef.h>

#include "cases.h"

/* Exit codes: 0 all passed, 1 a case failed, 2 usage or input error. */
enum { SP_EXIT_OK = 0, SP_EXIT_FAIL = 1, SP_EXIT_USAGE = 2 };

#define SP_MAX_LIST 16

/* Default --scale of the cpu backend: sized so that `spattn verify` (both public suites,
 * fp64 golden included) finishes well inside 5 minutes on 2 cores.  See README.md. */
#define SP_CPU_DEFAULT_SCALE 0.0625

typedef struct sp_opts {
    const char *cases_dir;
    const char *suites[SP_MAX_LIST];
    int n_suites;
    const char *case_regex;
    regex_t re;
    int has_re;
    int op;        /* -1 any, SP_OP_* */
    int passes;    /* SP_PASS_FWD | SP_PASS_BWD */
    int dtype;     /* -1 any */
    int backend;   /* SPATTN_BACKEND_* as asked (AUTO resolved by sp_resolve_backend) */
    double scale;  /* sequence-length factor; 0 = the backend's default */
    int threads;
    const char *json_path;
    int repeats, warmup;
    const char *compare[SP_MAX_LIST];
    int n_compare;
    const char *svg_path;
    const char *load_path; /* bench: our results from a JSON file instead of running */
    int quiet;
    double perturb; /* verify self-test: added to our outputs before the comparison */
    int plan_per_call; /* bench, bsa: 0 = one plan per case reused by every timed call (default),
                          1 = the plain calls (schedules built and workspace allocated per call) */
    const char *dump_dir; /* bench: each case's block mask / indices + a JSON header go here, so
                             that peers (bench/peers/) time the very same sparsity (docs/cli.md) */
    int peak; /* bench, cpu: measure the fp32 FMA peak first and report rates as % of it */
    int varlen_baselines; /* bench: also time each varlen case as a per-sequence loop of dense
                             calls and as one block-diagonal dense call (bench_varlen.c) */
    int deterministic; /* bench, verify: spattn_options.deterministic of every backward call
                          (1 default: bitwise reproducible; 0 lets CUDA use faster kernels whose
                          summation order may vary).  Forward calls keep the default. */
} sp_opts;

/* Loads the selected suites and applies filters and scaling.  Returns 0, or -1 with the
 * message (naming file and line) already printed. */
int sp_select_cases(sp_opts *o, sp_case_list *out);
/* cpu or cuda for --backend auto; prints an error and returns -1 if cuda was asked for but is
 * not available. */
int sp_resolve_backend(sp_opts *o);
/* The scale factor in effect for the resolved backend (1 = not scaled). */
double sp_effective_scale(const sp_opts *o);
/* "Intel(R) Xeon(R) ... (avx512, 2 threads)" or the GPU name. */
void sp_device_name(const sp_opts *o, char *buf, size_t n);

int sp_cmd_verify(sp_opts *o);
int sp_cmd_bench(sp_opts *o);
int sp_cmd_list(sp_opts *o);

/* Progress on stderr: "[i/n] name  elapsed 12s  eta 40s". */
typedef struct sp_progress {
    double start_ms, total_work, done_work;
    int n, quiet, tty, printed;
} sp_progress;
void sp_progress_start(sp_progress *p, int n, double total_work, int quiet);
void sp_progress_case(sp_progress *p, int i, const char *name);
void sp_progress_done(sp_progress *p, double work);
void sp_progress_end(sp_progress *p);

#endif
