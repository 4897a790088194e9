/* Placeholder until the CPU sfa kernels land (replaced by src/cpu/sfa_*.c). */
#include "../core/internal.h"
size_t spattn_cpu_sfa_workspace(const spattn_sfa_problem *p, int backward, int num_threads) {
    (void)p; (void)backward; (void)num_threads; return 0;
}
spattn_status spattn_cpu_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cpu: not built yet");
}
spattn_status spattn_cpu_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cpu: not built yet");
}
