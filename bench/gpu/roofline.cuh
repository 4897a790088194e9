// Shared by the stand-alone roofline programs of bench/gpu/ (gather_roofline.cu,
// scatter_roofline.cu): a CUDA error check and the median of 10 timed launches, each after an
// L2 flush (a 256 MB memset) and one untimed warm-up.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

constexpr size_t kFlushBytes = 256u << 20;

// before(r) runs untimed before repeat r (resets, ...), launch() is timed with CUDA events.
template <typename Before, typename Launch> static float median_ms(void *flush, Before before, Launch launch) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ts;
    for (int r = 0; r < 11; r++) {
        before(r);
        CK(cudaMemset(flush, r, kFlushBytes));
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r) ts.push_back(ms);  // the first is a warm-up
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}
