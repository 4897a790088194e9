/* CPU feature detection and the SPATTN_CPU_ISA override (see cpu_isa.h). */
#include <stdlib.h>
#include <string.h>

#include "../core/internal.h"
#include "cpu_isa.h"

spattn_cpu_isa_id spattn_cpu_isa_best(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return SPATTN_CPU_ISA_AVX512;
    /* F16C has no __builtin_cpu_supports name in older compilers; every AVX2 CPU has it. */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SPATTN_CPU_ISA_AVX2;
#endif
    return SPATTN_CPU_ISA_GENERIC;
}

spattn_cpu_isa_id spattn_cpu_isa_select(void) {
    spattn_cpu_isa_id best = spattn_cpu_isa_best();
    const char *e = getenv("SPATTN_CPU_ISA");
    if (!e || !*e) return best;
    spattn_cpu_isa_id want = best;
    if (!strcmp(e, "generic")) want = SPATTN_CPU_ISA_GENERIC;
    else if (!strcmp(e, "avx2")) want = SPATTN_CPU_ISA_AVX2;
    else if (!strcmp(e, "avx512")) want = SPATTN_CPU_ISA_AVX512;
    return want < best ? want : best;
}

const char *spattn_cpu_isa_id_name(spattn_cpu_isa_id id) {
    switch (id) {
    case SPATTN_CPU_ISA_AVX512: return "avx512";
    case SPATTN_CPU_ISA_AVX2: return "avx2";
    default: return "generic";
    }
}

const char *spattn_cpu_isa_name(void) { return spattn_cpu_isa_id_name(spattn_cpu_isa_select()); }
