/*
 * The ISA variants of the CPU bsa kernels (one body, bsa_kernels.inc, compiled by
 * bsa_avx512.c, bsa_avx2.c and bsa_generic.c); bsa_cpu.c picks one per call.
 * `ws` is the 64-byte aligned workspace laid out as in bsa_tiles.h for `threads` threads.
 */
#ifndef SPATTN_CPU_BSA_CPU_H
#define SPATTN_CPU_BSA_CPU_H

#include "../core/internal.h"

#define BSA_CPU_DECLARE(isa)                                                              \
    void spattn_cpu_bsa_fwd_##isa(const spattn_bsa_problem *p, float *ws, int threads);   \
    void spattn_cpu_bsa_bwd_##isa(const spattn_bsa_problem *p, float *ws, int threads);

BSA_CPU_DECLARE(avx512)
BSA_CPU_DECLARE(avx2)
BSA_CPU_DECLARE(generic)

/* Threads of a parallel region with `items` work items: no more than the items (each region
 * ends in a barrier whose cost grows with the team: 1024 threads on a tiny problem were ~100x
 * slower than 1 on a 2-core VM).  The workspace stays laid out for `threads`. */
static inline int bsa_team(int threads, int64_t items) {
    return items < 1 ? 1 : items < threads ? (int)items : threads;
}

#endif
