/* CPU bsa entry points: workspace size and allocation, and the choice of ISA variant. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "bsa_cpu.h"
#include "bsa_tiles.h"
#include "cpu_isa.h"

/* Threads of a call: the request (0 = OpenMP's default), but no more than an upper bound on the
 * work items of any of its parallel loops (a tile holds at least one token, so the tokens bound
 * the tiles), since each thread gets a workspace region: 1024 threads on a tiny problem asked
 * for ~400 MB of regions at D = 128.  Results do not depend on the count. */
static int resolve_threads(const spattn_bsa_problem *p, int backward, int n) {
    int t = n > 0 ? n : omp_get_max_threads();
    const spattn_seqs *s = p->seqs;
    const double tq = s ? (double)s->Tq + (double)s->B : (double)p->B * (double)p->Sq;
    const double tk = s ? (double)s->Tkv + (double)s->B : (double)p->B * (double)p->Skv;
    const double items = (double)p->N * tq + (backward ? (double)p->Nkv * tk : 0.0) + 1.0;
    if ((double)t > items) t = (int)items;
    return t < 1 ? 1 : t;
}

size_t spattn_cpu_bsa_workspace(const spattn_bsa_problem *p, int backward, int num_threads) {
    return bsa_workspace_bytes(p, backward, resolve_threads(p, backward, num_threads));
}

typedef void (*bsa_kernel_fn)(const spattn_bsa_problem *, float *, int);

static spattn_status run(const spattn_bsa_problem *p, const spattn_exec *ex, int backward) {
    int threads = resolve_threads(p, backward, ex->num_threads);
    size_t need = bsa_workspace_bytes(p, backward, threads);
    void *mem = ex->workspace;
    void *own = NULL;
    if (!mem) {
        own = mem = malloc(need);
        if (!own)
            return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY,
                                    "bsa cpu: cannot allocate %zu bytes of workspace", need);
    }
    float *ws = (float *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    bsa_kernel_fn fn;
    switch (spattn_cpu_isa_select()) {
#if defined(__x86_64__) || defined(__i386__)
    case SPATTN_CPU_ISA_AVX512:
        fn = backward ? spattn_cpu_bsa_bwd_avx512 : spattn_cpu_bsa_fwd_avx512;
        break;
    case SPATTN_CPU_ISA_AVX2:
        fn = backward ? spattn_cpu_bsa_bwd_avx2 : spattn_cpu_bsa_fwd_avx2;
        break;
#endif
    default:
        fn = backward ? spattn_cpu_bsa_bwd_generic : spattn_cpu_bsa_fwd_generic;
        break;
    }
    fn(p, ws, threads);
    free(own);
    return SPATTN_STATUS_SUCCESS;
}

spattn_status spattn_cpu_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex) {
    return run(p, ex, 0);
}

spattn_status spattn_cpu_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex) {
    return run(p, ex, 1);
}
