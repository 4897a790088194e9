// Pinned host word and event of the early verdict (verdict.h).
#include "verdict.h"

unsigned long long *spattn_verdict_host_word(void) {
    static thread_local unsigned long long *h_word = nullptr;
    if (!h_word) {
        void *hp = nullptr;
        if (cudaHostAlloc(&hp, 64, cudaHostAllocPortable) != cudaSuccess) {
            cudaGetLastError();
            return nullptr;
        }
        h_word = static_cast<unsigned long long *>(hp);
    }
    return h_word;
}

cudaEvent_t spattn_verdict_event(int dev) {
    static thread_local cudaEvent_t evs[64];
    if (dev < 0 || dev >= 64) return nullptr;
    if (!evs[dev] && cudaEventCreateWithFlags(&evs[dev], cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        evs[dev] = nullptr;
    }
    return evs[dev];
}
