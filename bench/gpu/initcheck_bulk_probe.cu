// Does compute-sanitizer's initcheck see global memory written by a bulk copy from shared memory
// (cp.async.bulk.global.shared::cta, the TMA engine)?  The deterministic bsa backward's first
// dQ add of each query tile is such a store (rank 0 stores, the others add: no zeroing), and
// initcheck reports the postprocess's reads of those tiles as uninitialised while every value
// checks out.  Here: an uninitialised cudaMalloc buffer, written whole by one bulk copy (kernel
// 1) or by plain stores (kernel 2, the control), then read by a third kernel.
//   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/probe bench/gpu/initcheck_bulk_probe.cu
//   compute-sanitizer --tool initcheck /tmp/probe      (0 errors: initcheck tracks bulk copies)
#include <cstdio>
#include <cuda_runtime.h>

constexpr int N = 1024;

__global__ void bulk_write(float *dst) {
    __shared__ alignas(128) float s[N];
    for (int i = threadIdx.x; i < N; i += blockDim.x) s[i] = (float)i;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the copy engine sees s
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned src = (unsigned)__cvta_generic_to_shared(s);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(N * 4)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    }
}

__global__ void plain_write(float *dst) {
    for (int i = threadIdx.x; i < N; i += blockDim.x) dst[i] = (float)i;
}

__global__ void read_sum(const float *src, float *out) {
    float s = 0.f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) s += src[i];
    atomicAdd(out, s);
}

int main() {
    float *a, *b, *out;
    cudaMalloc(&a, N * 4);
    cudaMalloc(&b, N * 4);
    cudaMalloc(&out, 8);
    cudaMemset(out, 0, 8);
    bulk_write<<<1, 128>>>(a);
    plain_write<<<1, 128>>>(b);
    read_sum<<<1, 128>>>(a, out);      // initcheck reports here if it misses the bulk copy
    read_sum<<<1, 128>>>(b, out + 1);  // control: never reported
    float h[2];
    cudaMemcpy(h, out, 8, cudaMemcpyDeviceToHost);
    const float want = (float)N * (N - 1) / 2;
    printf("bulk-written sum %.0f, plain-written sum %.0f (want %.0f each): %s\n", h[0], h[1], want,
           h[0] == want && h[1] == want ? "values ok" : "VALUES WRONG");
    return h[0] == want && h[1] == want ? 0 : 1;
}
