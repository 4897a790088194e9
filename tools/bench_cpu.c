/* bench on the CPU: wall-clock time of each call (the CPU has no L2 flush worth doing: the
 * working sets of the suite's cases are far larger than the caches). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "call.h"
#include "run.h"

/* The outputs of `pass` (fwd: O, LSE; bwd: dQ, dK, dV; O and LSE are then inputs, untouched). */
static int pass_output(int pass, int b) {
    return pass == SP_PASS_FWD ? (b == SP_B_O || b == SP_B_LSE)
                               : (b == SP_B_DQ || b == SP_B_DK || b == SP_B_DV);
}

/* Keeps the plan's outputs of `pass`, reruns the pass through the plain entry point (plan
 * detached) and compares bytes.  1 equal, 0 different, -1 with *st set when the plain call
 * failed or memory ran out. */
static int plan_same_cpu(const sp_case *c, sp_tensors *t, void *const buf[], const size_t bytes[],
                         int pass, const spattn_options *opt, spattn_status *st) {
    void *keep[SP_B_COUNT] = {0};
    int same = -1;
    *st = SPATTN_STATUS_OUT_OF_MEMORY;
    for (int b = 0; b < SP_B_COUNT; b++) {
        if (!pass_output(pass, b) || !bytes[b]) continue;
        if (!(keep[b] = malloc(bytes[b]))) goto done;
        memcpy(keep[b], buf[b], bytes[b]);
    }
    spattn_bsa_plan *plan = t->plan;
    t->plan = NULL;
    *st = pass == SP_PASS_FWD ? sp_call_fwd(c, t, opt) : sp_call_bwd(c, t, opt);
    t->plan = plan;
    if (*st != SPATTN_STATUS_SUCCESS) goto done;
    same = 1;
    for (int b = 0; b < SP_B_COUNT; b++)
        if (keep[b] && memcmp(keep[b], buf[b], bytes[b])) same = 0;
done:
    for (int b = 0; b < SP_B_COUNT; b++) free(keep[b]);
    return same;
}

/* Process CPU time in ms: with cpu_ms, rates that other processes on the machine barely
 * change (bench --peak reports them against the FMA peak measured the same way). */
static double cpu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + 1e-6 * (double)ts.tv_nsec;
}

int sp_bench_cpu(const sp_case *c, const sp_inputs *in, int pass, int warmup, int repeats,
                 int threads, int reuse_plan, int deterministic, double *ms, double *cpu_ms,
                 int *plan_same, int *status, char *msg, size_t msglen) {
    sp_tensors t;
    memset(&t, 0, sizeof t);
    size_t bytes[SP_B_COUNT];
    sp_buffer_sizes(c, bytes);
    void *buf[SP_B_COUNT] = {in->q, in->k, in->v, in->dout, in->mask, in->idx};
    int rc = -1;
    *status = 0;
    *plan_same = -1;
    for (int b = SP_B_O; b < SP_B_COUNT; b++) {
        buf[b] = bytes[b] ? calloc(1, bytes[b]) : NULL;
        if (bytes[b] && !buf[b]) {
            *status = SPATTN_STATUS_OUT_OF_MEMORY;
            snprintf(msg, msglen, "out of memory allocating the outputs");
            goto done;
        }
    }
    sp_tensors_make(c, buf, SPATTN_DEVICE_CPU, &t);
    spattn_options opt;
    spattn_options_init(&opt);
    opt.backend = SPATTN_BACKEND_CPU;
    opt.num_threads = threads;
    /* the options of the calls made for the pass timed: the backward's take --deterministic */
    spattn_options popt = opt;
    if (pass == SP_PASS_BWD) popt.deterministic = deterministic;
    spattn_status st = SPATTN_STATUS_SUCCESS;
    const char *what = pass == SP_PASS_FWD ? "forward" : "backward";
    if (reuse_plan) {
        st = sp_plan_make(c, &t, &opt);
        if (st != SPATTN_STATUS_SUCCESS) what = "plan";
    }
    if (pass == SP_PASS_BWD && st == SPATTN_STATUS_SUCCESS) {
        st = sp_call_fwd(c, &t, &opt); /* O and LSE for the backward */
        if (st != SPATTN_STATUS_SUCCESS) what = "forward (before the backward)";
    }
    for (int i = 0; i < warmup + repeats && st == SPATTN_STATUS_SUCCESS; i++) {
        double t0 = sp_now_ms(), c0 = cpu_now_ms();
        st = pass == SP_PASS_FWD ? sp_call_fwd(c, &t, &popt) : sp_call_bwd(c, &t, &popt);
        if (i >= warmup) {
            ms[i - warmup] = sp_now_ms() - t0;
            if (cpu_ms) cpu_ms[i - warmup] = cpu_now_ms() - c0;
        }
    }
    if (st != SPATTN_STATUS_SUCCESS) {
        *status = st;
        snprintf(msg, msglen, "%s: %s: %s", what, spattn_status_str(st), spattn_last_error());
        goto done;
    }
    if (t.plan) {
        /* The plan's promise (include/spattn.h): outputs bitwise equal to a plain call's. */
        int same = plan_same_cpu(c, &t, buf, bytes, pass, &popt, &st);
        if (same < 0) {
            *status = st;
            snprintf(msg, msglen, "plain call to check the plan: %s: %s", spattn_status_str(st),
                     st == SPATTN_STATUS_OUT_OF_MEMORY ? "out of memory" : spattn_last_error());
            goto done;
        }
        *plan_same = same;
    }
    rc = 0;
done:
    sp_plan_free(&t);
    for (int b = SP_B_O; b < SP_B_COUNT; b++) free(buf[b]);
    return rc;
}
