// CUDA backend: device query, plus placeholders for the operator kernels until they land
// (src/cuda/bsa_*.cu and src/cuda/sfa_*.cu replace the placeholders below).
#include <cuda_runtime.h>

#include "../core/internal.h"

extern "C" int spattn_cuda_backend_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

// ---- placeholders (bsa) ----
extern "C" size_t spattn_cuda_bsa_workspace(const spattn_bsa_problem *p, int backward) { (void)p; (void)backward; return 0; }
extern "C" spattn_status spattn_cuda_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "bsa cuda: not built yet");
}
extern "C" spattn_status spattn_cuda_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "bsa cuda: not built yet");
}
// ---- placeholders (sfa) ----
extern "C" size_t spattn_cuda_sfa_workspace(const spattn_sfa_problem *p, int backward) { (void)p; (void)backward; return 0; }
extern "C" spattn_status spattn_cuda_sfa_check_indices(const spattn_sfa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda: not built yet");
}
extern "C" spattn_status spattn_cuda_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda: not built yet");
}
extern "C" spattn_status spattn_cuda_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex) {
    (void)p; (void)ex; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda: not built yet");
}
// ---- placeholders (reference kernels; replaced by src/cuda/bsa_ref.cu and sfa_ref.cu) ----
extern "C" spattn_status spattn_cuda_ref_bsa_fwd(const spattn_bsa_problem *p, const spattn_exec *ex, float *o, float *lse) {
    (void)p; (void)ex; (void)o; (void)lse; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "bsa cuda ref: not built yet");
}
extern "C" spattn_status spattn_cuda_ref_bsa_bwd(const spattn_bsa_problem *p, const spattn_exec *ex, float *dq, float *dk, float *dv) {
    (void)p; (void)ex; (void)dq; (void)dk; (void)dv; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "bsa cuda ref: not built yet");
}
extern "C" spattn_status spattn_cuda_ref_sfa_fwd(const spattn_sfa_problem *p, const spattn_exec *ex, float *o, float *lse) {
    (void)p; (void)ex; (void)o; (void)lse; return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda ref: not built yet");
}
extern "C" spattn_status spattn_cuda_ref_sfa_bwd(const spattn_sfa_problem *p, const spattn_exec *ex, float *dq, float *dq_rope,
                                                 float *dk, float *dk_rope, float *dv) {
    (void)p; (void)ex; (void)dq; (void)dq_rope; (void)dk; (void)dk_rope; (void)dv;
    return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED, "sfa cuda ref: not built yet");
}
