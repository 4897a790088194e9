// Microbenchmark for the sfa backward's column-split cluster (sfa runbook, "The adds taken apart"):
// two CTAs of a cluster hold the same 64 rows and key block but half of the 576 columns each, so
// per key block each sends its fp32 partial S and dP (64 x 64 each: 32 KB, 32 floats a thread of
// two 128-thread warpgroups) into the partner's shared memory and adds the partner's to its own.
// What does one such exchange cost per block, alone and after a block's worth of other work?
//   build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I src/cuda bench/gpu/dsmem_exchange.cu -o dsmem_exchange
//   run:   ./dsmem_exchange [iters=2000]
// Per iteration j (slot s = j % 2): W rounds of 32 dependent FMAs a thread (the block's other
// work), wait until the partner has read slot s of two iterations ago (its arrival on our
// `empty[s]`), 8 x st.shared::cluster.v4 of the 32 values into the partner's slot s, a release
// arrival on the partner's `full[s]`, an acquire wait on our own `full[s]`, read the partner's 32
// values and add them (S = own + partner's, the same sum in both CTAs), arrive on the partner's
// `empty[s]`.  Variants: no exchange (the work alone), exchange after the work, and "early"
// (the values sent first, the work done while they travel, then the wait: the pipelining the
// kernel would need).  Time per iteration from CUDA events over the grid (one CTA per SM, 66
// clusters on an H200's 132 SMs), median of 10 after a warm-up (roofline.cuh).
#include "hopper/hopper.cuh"
#include "roofline.cuh"

constexpr int NT = 256;                           // two consumer warpgroups
constexpr int SLOT = NT * 32 * 4;                 // 32 KB: partial S and dP of a block
constexpr int SMEM = 2 * SLOT + 64 + 160 * 1024;  // + padding: one CTA per SM

__device__ __forceinline__ uint32_t mapa(uint32_t a, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void remote_arrive(uint32_t cluster_addr) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr) : "memory");
}
__device__ __forceinline__ void wait_cluster(uint64_t *b, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::"r"(
            hop::smem_u32(b)),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void st_cluster_v4(uint32_t a, float x, float y, float z, float w) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}

// MODE 0: work only; 1: work, then exchange; 2: send, work, then wait and add
template <int MODE>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT, 1) xchg_kernel(int iters, int work, float *sink) {
    extern __shared__ __align__(16) unsigned char sm[];
    float *slot = reinterpret_cast<float *>(sm);                 // [2][32][NT]: value i of thread t at i * NT + t
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + 2 * SLOT);  // [2]
    uint64_t *empty = full + 2;                                    // [2]
    const int t = threadIdx.x;
    const uint32_t peer = cluster_rank() ^ 1;
    if (t == 0) {
        for (int s = 0; s < 2; s++) {
            hop::mbar_init(full + s, NT);
            hop::mbar_init(empty + s, NT);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync();
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = (t * 32 + i) * 1e-6f;
    const uint32_t pslot = mapa(hop::smem_u32(slot), peer), pfull = mapa(hop::smem_u32(full), peer), pempty = mapa(hop::smem_u32(empty), peer);
    auto send = [&](int s) {
        const uint32_t base = pslot + s * SLOT + t * 16;  // 16-byte groups of 4 values, thread-interleaved
#pragma unroll
        for (int g = 0; g < 8; g++) st_cluster_v4(base + g * NT * 16, v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]);
        remote_arrive(pfull + s * 8);
    };
    auto recv = [&](int s, uint32_t par) {
        wait_cluster(full + s, par);
        const float4 *src = reinterpret_cast<const float4 *>(reinterpret_cast<unsigned char *>(slot) + s * SLOT) + t;
#pragma unroll
        for (int g = 0; g < 8; g++) {
            const float4 x = src[g * NT];
            v[4 * g] += x.x;
            v[4 * g + 1] += x.y;
            v[4 * g + 2] += x.z;
            v[4 * g + 3] += x.w;
        }
        remote_arrive(pempty + s * 8);
    };
    auto compute = [&]() {
#pragma unroll 1
        for (int k = 0; k < work; k++)
#pragma unroll
            for (int i = 0; i < 32; i++) v[i] = fmaf(v[i], 0.9999f, 1e-7f);
    };
    for (int j = 0; j < iters; j++) {
        const int s = j & 1;
        const uint32_t par = (j >> 1) & 1;
        if (MODE == 0) {
            compute();
        } else if (MODE == 1) {
            compute();
            wait_cluster(empty + s, par ^ 1);  // the partner has read what we sent two iterations ago
            send(s);
            recv(s, par);
        } else {
            wait_cluster(empty + s, par ^ 1);
            send(s);
            compute();
            recv(s, par);
        }
    }
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) acc += v[i];
    if (acc == 12345.f) sink[t] = acc;  // keeps the work
    cluster_sync();                      // no CTA leaves while its partner may still arrive on it
}

template <int MODE> static float run(void *flush, int iters, int work, int grid, float *sink) {
    CK(cudaFuncSetAttribute(xchg_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    return median_ms(flush, [](int) {}, [&] { xchg_kernel<MODE><<<grid, NT, SMEM>>>(iters, work, sink); });
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 2000;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int grid = sms / 2 * 2;
    float *sink;
    void *flush;
    CK(cudaMalloc(&sink, NT * sizeof(float)));
    CK(cudaMalloc(&flush, kFlushBytes));
    printf("grid %d CTAs (clusters of 2), %d threads, %d iterations, 32 KB sent per CTA and iteration\n", grid, NT, iters);
    printf("%6s %14s %14s %14s %12s %12s\n", "work", "work only us", "+exchange us", "early send us", "exch cost", "early cost");
    for (int work : {0, 8, 32, 64, 128, 256}) {
        const float u0 = run<0>(flush, iters, work, grid, sink) * 1e3f / iters;
        const float u1 = run<1>(flush, iters, work, grid, sink) * 1e3f / iters;
        const float u2 = run<2>(flush, iters, work, grid, sink) * 1e3f / iters;
        printf("%6d %14.3f %14.3f %14.3f %12.3f %12.3f\n", work, u0, u1, u2, u1 - u0, u2 - u0);
        if (work == 0) printf("       (32 KB each way in %.3f us: %.1f GB/s per SM)\n", u1, 32768.f / (u1 * 1e3f));
    }
    CK(cudaFree(sink));
    CK(cudaFree(flush));
    return 0;
}
