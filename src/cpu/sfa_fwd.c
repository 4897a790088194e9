/*
 * CPU sfa forward driver: one task per (b, token, kv-group), dynamically scheduled (causal
 * rows differ in length; the longest rows go first), each thread with its own slice of the
 * workspace.  The task kernel (gather, scores, online softmax, P V) is in sfa_kernels.inc.
 */
#include <stdlib.h>

#include <omp.h>

#include "../core/seqs.h"
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
    if (p->seqs) { /* varlen: tasks over the packed tokens; each on its sequence's problem */
        const spattn_seqs *s = p->seqs;
        const int64_t end = spattn_seq_q0(s, s->B), nv = end * N2;
#pragma omp parallel num_threads(pl.nt)
        {
            char *tb = ws + (size_t)omp_get_thread_num() * tbytes;
            spattn_sfa_seq sq;
            sfa_plan plb = pl; /* max_seqlen bounds every buffer of the sequence */
            plb.p = &sq.p;
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < nv; t++) {
                int64_t n2 = t % N2, tok = end - 1 - t / N2, b = spattn_seq_of_q(s, tok);
                spattn_sfa_seq_at(p, b, &sq);
                kn->fwd_task(&plb, b, tok - spattn_seq_q0(s, b), n2, tb);
            }
        }
        if (!ex->workspace) free(raw);
        return SPATTN_STATUS_SUCCESS;
    }
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
