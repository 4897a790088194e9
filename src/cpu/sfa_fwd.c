/*
 * CPU sfa forward driver: one task per (b, token, kv-group), dynamically scheduled (causal
 * rows differ in length; the longest rows go first), each thread with its own slice of the
 * workspace.  The task kernel (gather, scores, online softmax, P V) is in sfa_kernels.inc.
 */
#include <stdlib.h>

#include <omp.h>

#include "sfa_cpu.h"

spattn_status spattn_cpu_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    sfa_plan pl;
    sfa_plan_init(&pl, p, 0, ex->num_threads);
    size_t bytes = sfa_workspace_parts(&pl, 0, NULL, NULL);
    char *raw = ex->workspace ? (char *)ex->workspace : malloc(bytes);
    if (!raw)
        return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY,
                                "sfa cpu forward: cannot allocate %zu bytes of workspace", bytes);
    char *ws = raw + (SFA_ALIGN - (uintptr_t)raw % SFA_ALIGN) % SFA_ALIGN;
    const size_t tbytes = sfa_thread_layout_of(&pl, 0).total;
    const sfa_kernels *kn = sfa_kernels_select();
    const int64_t S1 = p->S1, N2 = p->N2, ntask = p->B * S1 * N2;
#pragma omp parallel num_threads(pl.nt)
    {
        char *tb = ws + (size_t)omp_get_thread_num() * tbytes;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            int64_t n2 = t % N2, i = S1 - 1 - (t / N2) % S1, b = t / (N2 * S1);
            kn->fwd_task(&pl, b, i, n2, tb);
        }
    }
    if (!ex->workspace) free(raw);
    return SPATTN_STATUS_SUCCESS;
}
