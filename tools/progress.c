/* Progress on stderr: one line per case, rewritten in place on a terminal.  The estimate
 * weighs the remaining cases by their FLOPs, not their count: case sizes differ 100x. */
#include <stdio.h>
#include <unistd.h>

#include "cli.h"
#include "run.h"

void sp_progress_start(sp_progress *p, int n, double total_work, int quiet) {
    p->start_ms = sp_now_ms();
    p->total_work = total_work;
    p->done_work = 0.0;
    p->n = n;
    p->quiet = quiet;
    p->tty = isatty(2);
    p->printed = 0;
}

void sp_progress_case(sp_progress *p, int i, const char *name) {
    if (p->quiet) return;
    double el = (sp_now_ms() - p->start_ms) / 1e3;
    /* Off a terminal, stay silent for the first seconds: short runs need no progress. */
    if (!p->tty && el < 3.0) return;
    char eta[64] = "";
    if (p->done_work > 0.0 && p->total_work > p->done_work)
        snprintf(eta, sizeof eta, "  eta %.0fs", el * (p->total_work - p->done_work) / p->done_work);
    fprintf(stderr, "%s[%d/%d] %-28s elapsed %.0fs%s%s", p->tty ? "\r" : "", i + 1, p->n, name, el,
            eta, p->tty ? "        " : "\n");
    fflush(stderr);
    p->printed = 1;
}

void sp_progress_done(sp_progress *p, double work) { p->done_work += work; }

void sp_progress_end(sp_progress *p) {
    if (p->quiet || !p->printed) return;
    if (p->tty) fprintf(stderr, "\r%79s\r", "");
    fflush(stderr);
    p->printed = 0;
}
