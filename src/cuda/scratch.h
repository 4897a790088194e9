// Device scratch of one library call, shared by the bsa and sfa hosts: the caller's workspace
// (spattn_options.workspace, sized by spattn_*_workspace_size) or a stream-ordered allocation,
// freed stream-ordered when the call returns (after its launches are enqueued).
#pragma once
#include <cuda_runtime.h>

#include "../core/internal.h"

struct cuda_scratch {
    char *base = nullptr;
    bool owned = false;
    cudaStream_t st = nullptr;
    // `who` prefixes the error message ("bsa cuda", "sfa cuda").
    spattn_status get(const spattn_exec *ex, size_t bytes, const char *who) {
        st = (cudaStream_t)ex->stream;
        if (bytes == 0) return SPATTN_STATUS_SUCCESS;
        if (ex->workspace) {
            base = static_cast<char *>(ex->workspace);
            return SPATTN_STATUS_SUCCESS;
        }
        const cudaError_t e = cudaMallocAsync((void **)&base, bytes, st);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY, "%s: cudaMallocAsync(%zu bytes): %s", who, bytes,
                                    cudaGetErrorString(e));
        }
        owned = true;
        return SPATTN_STATUS_SUCCESS;
    }
    ~cuda_scratch() {
        if (owned) cudaFreeAsync(base, st);
    }
};
