// spattn's stream-ordered device memory (scratch.h): one pool per device whose memory is kept
// across calls.  The default pool gives its memory back at every synchronisation and maps it
// again on the next call's cudaMallocAsync (~60 us a call for tens of MB, H200: the sfa
// backward without a caller workspace took 1.11 ms on sfa04 with it, 0.89 ms with this pool).
// What the pool holds stays reserved for the process, as a caching allocator's memory does.
#include <mutex>
#include <string.h>

#include "scratch.h"

cudaMemPool_t spattn_kept_pool(int dev) {
    static std::mutex mu;
    static cudaMemPool_t pools[64];
    static bool tried[64];
    if (dev < 0 || dev >= 64) return nullptr;
    std::lock_guard<std::mutex> lock(mu);
    if (!tried[dev]) {
        tried[dev] = true;
        cudaMemPoolProps pr;
        memset(&pr, 0, sizeof pr);
        pr.allocType = cudaMemAllocationTypePinned;
        pr.location.type = cudaMemLocationTypeDevice;
        pr.location.id = dev;
        cudaMemPool_t mp = nullptr;
        if (cudaMemPoolCreate(&mp, &pr) == cudaSuccess) {
            uint64_t keep = UINT64_MAX;
            cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep);
            pools[dev] = mp;
        }
        cudaGetLastError();
    }
    return pools[dev];
}

cudaError_t spattn_stream_alloc(void **p, size_t bytes, cudaStream_t st) {
    int dev = -1;
    cudaMemPool_t mp = nullptr;
    if (!stream_capturing(st) && cudaGetDevice(&dev) == cudaSuccess && (mp = spattn_kept_pool(dev)) &&
        cudaMallocFromPoolAsync(p, bytes, mp, st) == cudaSuccess)
        return cudaSuccess;
    cudaGetLastError();
    return cudaMallocAsync(p, bytes, st);
}
