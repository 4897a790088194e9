/* Placeholder until the CPU bsa kernels land (replaced by src/cpu/bsa_*.c). */
#include "../core/internal.h"
size_t spattn_cpu_bsa_workspace(const spattn_bsa_problem *p, int backward, int num_threads) {
    (void)p; (void)backward; (void)num_threads; return 0;
}
spattn_status spattn_cpu_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "bsa cpu: not built yet");
}
spattn_status spattn_cpu_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "bsa cpu: not built yet");
}
