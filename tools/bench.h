/*
 * Pieces of `spattn bench` beside the timing itself.
 * --dump DIR (bench_dump.c): the sparsity each case was timed with (bsa block mask, sfa
 * indices), written so that the peer scripts (bench/peers/) time the very same masks and
 * indices instead of regenerating them with another random generator.  Format: docs/cli.md
 * ("Dump files"); reader: bench/peers/spattn_dump.py.
 * --peak (bench_peak.c): the machine's measured fp32 FMA peak, for "% of peak" on the CPU.
 */
#ifndef SPATTN_CLI_BENCH_H
#define SPATTN_CLI_BENCH_H

#include <stddef.h>

#include "cli.h"
#include "gen.h"

/* Creates DIR when missing and checks that a file can be written in it, before any case
 * runs (a run must not end with its dumps lost).  Returns 0, or -1 with the message printed. */
int sp_dump_prepare(const char *dir);

/* Writes DIR/<case>.<what>.<u8|i32> (raw, C order) and then DIR/<case>.json (the header: who
 * wrote it, the case's scaled shape, pairs, FLOPs, the data file's dtype and shape; written
 * last, so a header means complete data).  Varlen cases write nothing.  Returns 0, or -1 with
 * a message in err. */
int sp_dump_case(const char *dir, const sp_opts *o, const sp_case *c, const sp_inputs *in,
                 double pairs, char *err, size_t errlen);

/* `--peak` (bench_peak.c): the measured fp32 FMA peak of `threads` threads (0: OpenMP's
 * default) with the library's widest ISA, in GFLOP/s over wall time; *cpu_gflops (may be NULL)
 * gets the same work over the process CPU time per thread, which other processes on a shared
 * machine barely change. */
double sp_fma_peak_gflops(int threads, double *cpu_gflops);

#endif
