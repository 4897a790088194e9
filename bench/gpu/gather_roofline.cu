// Gather roofline of the sfa forward on the GPU: how fast can one CTA per query token bring its
// K selected key rows (576 bf16 = 1152 bytes each) into shared memory with 16-byte cp.async,
// 8 threads per row, B buffers of 64 rows in flight, and nothing else?  The sfa forward moves
// exactly these bytes, so  TF_max(H) = R * 2 * (576 + 512) * H / 1152  bounds it at H heads per
// CTA (a gather is shared by the H heads of a token).  Variants: plain cp.async.cg, with the
// L2::256B prefetch, and with an L2 evict_last policy; keys that fit in L2 (S2 = 8192, 9.4 MB)
// and that press it (S2 = 32768, 37.7 MB).
//   build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 bench/gpu/gather_roofline.cu -o gather_roofline
//   run:   ./gather_roofline [tokens=4096] [K=2048]
// Timing: CUDA events, L2 flushed (256 MB memset) before each of 10 repeats, median.
#include <stdint.h>

#include "roofline.cuh"

constexpr int ROW = 1152;           // bytes per key row (576 bf16)
constexpr int CH = ROW / 16;        // 16-byte chunks per row
constexpr int BK = 64;              // rows per buffer

enum Variant { PLAIN = 0, PREFETCH = 1, EVICT_LAST = 2 };

template <int V>
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, uint64_t pol) {
    if (V == PLAIN)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
    else if (V == PREFETCH)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
    else
        asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "l"(pol)
                     : "memory");
}

// One CTA per token, 128 threads: 8 threads per row (row = 16 rows per pass), NB buffers.
template <int V, int NB>
__global__ void __launch_bounds__(128) gather_kernel(const unsigned char *keys, const int32_t *idx, int K,
                                                     unsigned *sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    uint64_t pol = 0;
    if (V == EVICT_LAST) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
    const int t = threadIdx.x, grp = t >> 3, ig = t & 7;
    const int32_t *row = idx + (int64_t)blockIdx.x * K;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
    const int nblk = K / BK;
    for (int b = 0; b < nblk; b++) {
        const uint32_t buf = base + (b % NB) * BK * ROW;
#pragma unroll
        for (int r = 0; r < BK / 16; r++) {
            const int rr = grp + 16 * r;
            const unsigned char *src = keys + (int64_t)__ldg(row + b * BK + rr) * ROW;
#pragma unroll
            for (int c = ig; c < CH; c += 8) cp16<V>(buf + rr * ROW + c * 16, src + c * 16, pol);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group %0;\n" ::"n"(NB - 1) : "memory");  // NB - 1 buffers stay in flight
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    if (t == 0) atomicAdd(sink, sm[blockIdx.x % (NB * BK * ROW)]);
}

template <int V, int NB>
static float run(const unsigned char *keys, const int32_t *idx, int T, int K, unsigned *sink, void *flush) {
    const int smem = NB * BK * ROW;
    CK(cudaFuncSetAttribute(gather_kernel<V, NB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return median_ms(flush, [](int) {}, [&] { gather_kernel<V, NB><<<T, 128, smem>>>(keys, idx, K, sink); });
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 4096, K = argc > 2 ? atoi(argv[2]) : 2048;
    if (T < 1 || K < BK || K % BK) {
        fprintf(stderr, "usage: gather_roofline [tokens] [K, a multiple of 64]\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs; %d tokens x %d rows of %d bytes per run\n", prop.name, prop.multiProcessorCount, T, K, ROW);
    void *flush;
    unsigned *sink;
    CK(cudaMalloc(&flush, kFlushBytes));
    CK(cudaMalloc(&sink, 4));
    printf("%-8s %-10s %3s %9s %8s | TF bound at H = 4 / 8 / 16 / 64\n", "S2", "variant", "B", "ms", "TB/s");
    for (int S2 : {8192, 32768}) {
        unsigned char *keys;
        int32_t *idx;
        CK(cudaMalloc(&keys, (size_t)S2 * ROW));
        CK(cudaMemset(keys, 1, (size_t)S2 * ROW));
        CK(cudaMalloc(&idx, (size_t)T * K * 4));
        std::vector<int32_t> h((size_t)T * K);
        uint64_t s = 0x9E3779B97F4A7C15ull;
        for (auto &x : h) {  // uniform random keys (the suite's rows are distinct; no matter here)
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            x = (int32_t)(s % (uint64_t)S2);
        }
        CK(cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        struct R {
            const char *name;
            int nb;
            float ms;
        } rs[] = {{"plain", 2, run<PLAIN, 2>(keys, idx, T, K, sink, flush)},
                  {"prefetch", 1, run<PREFETCH, 1>(keys, idx, T, K, sink, flush)},
                  {"prefetch", 2, run<PREFETCH, 2>(keys, idx, T, K, sink, flush)},
                  {"prefetch", 3, run<PREFETCH, 3>(keys, idx, T, K, sink, flush)},
                  {"evict_last", 2, run<EVICT_LAST, 2>(keys, idx, T, K, sink, flush)},
                  {"evict_last", 3, run<EVICT_LAST, 3>(keys, idx, T, K, sink, flush)}};
        for (const R &r : rs) {
            const double tbs = (double)T * K * ROW / (r.ms * 1e-3) / 1e12;
            const double f = 2.0 * 1088 / ROW * tbs;  // TF per head
            printf("%-8d %-10s %3d %9.4f %8.2f | %5.0f / %5.0f / %5.0f / %5.0f\n", S2, r.name, r.nb, r.ms, tbs, 4 * f,
                   8 * f, 16 * f, 64 * f);
        }
        CK(cudaFree(keys));
        CK(cudaFree(idx));
    }
    CK(cudaFree(flush));
    CK(cudaFree(sink));
    return 0;
}
