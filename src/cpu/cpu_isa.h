/*
 * Run-time choice of the CPU kernels' SIMD variant (see simd.h for how variants are built).
 * Every operator's dispatcher asks spattn_cpu_isa_select() on each call and calls the matching
 * SPATTN_ISA_FN(...) function, so one binary runs on any x86-64 CPU.
 */
#ifndef SPATTN_CPU_ISA_H
#define SPATTN_CPU_ISA_H

typedef enum spattn_cpu_isa_id {
    SPATTN_CPU_ISA_GENERIC = 0,
    SPATTN_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    SPATTN_CPU_ISA_AVX512 = 2  /* AVX-512 F/BW/VL/DQ (+ AVX2, FMA, F16C) */
} spattn_cpu_isa_id;

/* Best variant this CPU supports.  The environment variable SPATTN_CPU_ISA=avx512|avx2|generic
 * (read on every call, for tests) lowers the choice; a request above what the CPU supports
 * falls back to the best supported one. */
spattn_cpu_isa_id spattn_cpu_isa_select(void);
/* Best variant the CPU supports, ignoring the environment. */
spattn_cpu_isa_id spattn_cpu_isa_best(void);
const char *spattn_cpu_isa_id_name(spattn_cpu_isa_id id);

#endif
