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

// bsa: src/cuda/bsa_host.cu (fast kernels bsa_sched/fwd/bwd.cu)
// (sfa: src/cuda/sfa_host.cu, sfa_fwd*.cu, sfa_bwd90.cu, sfa_bwd_small.cu)
// ---- placeholders (reference kernels; replaced by src/cuda/bsa_ref.cu and sfa_ref.cu) ----
// (sfa reference kernels: src/cuda/sfa_ref.cu)
