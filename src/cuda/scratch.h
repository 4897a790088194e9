// Device scratch of one library call, shared by the bsa and sfa hosts: the caller's workspace
// (spattn_options.workspace, sized by spattn_*_workspace_size) or a stream-ordered allocation from
// spattn's kept pool, freed stream-ordered when the call returns (after its launches are enqueued).
#pragma once
#include <cuda_runtime.h>

#include "../core/internal.h"

// True while `st` is being captured into a CUDA graph.  A call then cannot read a device verdict
// back (no synchronisation is allowed, and a captured read-back runs only at replay): the sfa
// forward still gates its writes on the device check; calls that need the verdict before their
// kernels refuse with NOT_SUPPORTED (capture_refusal) before enqueuing anything, so the capture
// stays valid.
static inline bool stream_capturing(cudaStream_t st) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(st, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusActive;
}
static inline spattn_status capture_refusal(const char *what) {
    return spattn_set_error(SPATTN_STATUS_NOT_SUPPORTED,
                            "%s cannot be captured into a CUDA graph: it reads its input checks back to the "
                            "host (one synchronisation) before its kernels run; call it outside stream capture",
                            what);
}

// spattn's pool of device dev (pool.cu): stream-ordered, its memory kept across calls; NULL when
// it cannot be made (ordinal >= 64, creation failed).
cudaMemPool_t spattn_kept_pool(int dev);
// A stream-ordered allocation from that pool on the current device; under stream capture, or
// without the pool, cudaMallocAsync (a graph's own memory).  Freed with cudaFreeAsync.
cudaError_t spattn_stream_alloc(void **p, size_t bytes, cudaStream_t st);

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
        const cudaError_t e = spattn_stream_alloc((void **)&base, bytes, st);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return spattn_set_error(SPATTN_STATUS_OUT_OF_MEMORY, "%s: stream-ordered allocation of %zu bytes: %s", who,
                                    bytes, cudaGetErrorString(e));
        }
        owned = true;
        return SPATTN_STATUS_SUCCESS;
    }
    ~cuda_scratch() {
        if (owned) cudaFreeAsync(base, st);
    }
};
