/* CUDA backend stand-in for builds without nvcc: every entry reports the backend missing. */
#include "internal.h"

#define NO_CUDA() \
    spattn_set_error(SPATTN_STATUS_BACKEND_UNAVAILABLE, "backend cuda: spattn was built without CUDA")

int spattn_cuda_backend_available(void) { return 0; }
size_t spattn_cuda_bsa_workspace(const spattn_bsa_problem *p, int backward) { (void)p; (void)backward; return 0; }
spattn_status spattn_cuda_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex) { (void)p; (void)ex; return NO_CUDA(); }
spattn_status spattn_cuda_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex) { (void)p; (void)ex; return NO_CUDA(); }
size_t spattn_cuda_bsa_varlen_workspace(const spattn_bsa_problem *p, int backward) { (void)p; (void)backward; return 0; }
spattn_status spattn_cuda_bsa_fwd_varlen(const spattn_bsa_problem *p, const spattn_exec *ex) { (void)p; (void)ex; return NO_CUDA(); }
spattn_status spattn_cuda_bsa_bwd_varlen(const spattn_bsa_problem *p, const spattn_exec *ex) { (void)p; (void)ex; return NO_CUDA(); }
size_t spattn_cuda_sfa_workspace(const spattn_sfa_problem *p, int backward) { (void)p; (void)backward; return 0; }
spattn_status spattn_cuda_sfa_check_indices(const spattn_sfa_problem *p, const spattn_exec *ex) { (void)p; (void)ex; return NO_CUDA(); }
spattn_status spattn_cuda_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) { (void)p; (void)ex; return NO_CUDA(); }
spattn_status spattn_cuda_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) { (void)p; (void)ex; return NO_CUDA(); }
spattn_status spattn_cuda_bsa_plan_make(struct spattn_bsa_plan *plan, const spattn_tensor *mask, const spattn_exec *ex) {
    (void)plan; (void)mask; (void)ex; return NO_CUDA();
}
void spattn_cuda_bsa_plan_free(struct spattn_bsa_plan *plan) { (void)plan; }
spattn_status spattn_cuda_ref_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex, float *o, float *lse) {
    (void)p; (void)ex; (void)o; (void)lse; return NO_CUDA();
}
spattn_status spattn_cuda_ref_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex, float *dq, float *dk, float *dv) {
    (void)p; (void)ex; (void)dq; (void)dk; (void)dv; return NO_CUDA();
}
spattn_status spattn_cuda_ref_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex, float *o, float *lse) {
    (void)p; (void)ex; (void)o; (void)lse; return NO_CUDA();
}
spattn_status spattn_cuda_ref_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex, float *dq, float *dq_rope,
                                      float *dk, float *dk_rope, float *dv) {
    (void)p; (void)ex; (void)dq; (void)dq_rope; (void)dk; (void)dk_rope; (void)dv; return NO_CUDA();
}
