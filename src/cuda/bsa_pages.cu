// Paged bsa backward on CUDA: the fold of the backward's fp32 dK / dV scratch (rows b *
// max_seqlen_kv + key, written by the PG instantiation of bsa_bwd.cu) into the dk / dv pages.
// Every page row is written: the sum over the (sequence, key) pairs that map to it, in ascending
// sequence order (bitwise reproducible), 0 for rows nobody uses (the CPU's semantics,
// src/cpu/bsa_pages.h).  The inverse of the block table is built on the device: users per page
// (count), their offsets (one-CTA scan), the (b, slot) lists (fill, in atomic order), each list
// sorted by b (one thread per page; a page appears at most once per table row, so b is a total
// order).  Every kernel does nothing unless *err == ~0 (the table was checked before: ids in range).
#include "bsa_launch.h"

namespace {

constexpr int kScanThreads = 1024;

// used slot j of row b: j < ceil(Skv_b / page_size)
__device__ __forceinline__ bool pg_used(const bsa_pg_fold_args &a, long long x, int &b, int &j, int &pg) {
    b = (int)(x / a.max_pages);
    j = (int)(x - (long long)b * a.max_pages);
    if ((long long)j * a.page_size >= a.seq[b].w) return false;
    pg = a.table[(long long)b * a.tab_s0 + (long long)j * a.tab_s1];
    return true;
}

__global__ void bsa_pg_count_kernel(const bsa_pg_fold_args a) {
    if (*a.err != ~0ull) return;
    const long long n = a.B * a.max_pages;
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < n; x += (long long)gridDim.x * blockDim.x) {
        int b, j, pg;
        if (pg_used(a, x, b, j, pg)) atomicAdd(a.cnt + pg, 1);
    }
}

// start[p] = users of pages < p (start[num_pages] = all), cur = start: one CTA, a chunk per thread
__global__ void __launch_bounds__(kScanThreads) bsa_pg_scan_kernel(const bsa_pg_fold_args a) {
    __shared__ long long part[kScanThreads];
    if (*a.err != ~0ull) return;
    const long long np = a.num_pages, per = (np + kScanThreads - 1) / kScanThreads;
    const long long lo = min(np, threadIdx.x * per), hi = min(np, lo + per);
    long long s = 0;
    for (long long i = lo; i < hi; i++) s += a.cnt[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int o = 1; o < kScanThreads; o <<= 1) {  // inclusive Hillis-Steele scan of the chunk sums
        const long long v = threadIdx.x >= o ? part[threadIdx.x - o] : 0;
        __syncthreads();
        part[threadIdx.x] += v;
        __syncthreads();
    }
    s = part[threadIdx.x] - s;  // exclusive
    for (long long i = lo; i < hi; i++) {
        a.start[i] = (int)s;
        a.cur[i] = (int)s;
        s += a.cnt[i];
    }
    if (threadIdx.x == kScanThreads - 1) a.start[np] = (int)part[kScanThreads - 1];
}

__global__ void bsa_pg_fill_kernel(const bsa_pg_fold_args a) {
    if (*a.err != ~0ull) return;
    const long long n = a.B * a.max_pages;
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < n; x += (long long)gridDim.x * blockDim.x) {
        int b, j, pg;
        if (pg_used(a, x, b, j, pg)) a.list[atomicAdd(a.cur + pg, 1)] = make_int2(b, j);
    }
}

// insertion sort of each page's list by sequence (lists are short: 1 unless the page is shared)
__global__ void bsa_pg_sort_kernel(const bsa_pg_fold_args a) {
    if (*a.err != ~0ull) return;
    for (long long pg = blockIdx.x * (long long)blockDim.x + threadIdx.x; pg < a.num_pages;
         pg += (long long)gridDim.x * blockDim.x) {
        const int s = a.start[pg], e = a.start[pg + 1];
        for (int i = s + 1; i < e; i++) {
            const int2 v = a.list[i];
            int k = i - 1;
            for (; k >= s && a.list[k].x > v.x; k--) a.list[k + 1] = a.list[k];
            a.list[k + 1] = v;
        }
    }
}

// Every page row of dk and dv, 8 columns per thread (bsa_store8).
template <typename T> __global__ void bsa_pg_fold_kernel(const bsa_pg_fold_args a) {
    if (*a.err != ~0ull) return;
    const int cg = a.D / 8;
    const long long n = a.num_pages * a.page_size * a.Nkv * cg;
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < n; x += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(x % cg) * 8;
        long long y = x / cg;
        const int h = (int)(y % a.Nkv);
        y /= a.Nkv;
        const int r = (int)(y % a.page_size);
        const long long pg = y / a.page_size;
        float k[8], v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) k[i] = v[i] = 0.f;
        bool first = true;  // the first contribution is copied (a page of one sequence: its bits)
        for (int e = a.start[pg]; e < a.start[pg + 1]; e++) {
            const int2 u = a.list[e];
            const long long key = (long long)u.y * a.page_size + r;
            if (key >= a.seq[u.x].w) continue;
            const long long off = (((long long)u.x * a.max_kv + key) * a.Nkv + h) * a.D + c;
            const float4 k0 = *reinterpret_cast<const float4 *>(a.sdk + off), k1 = *reinterpret_cast<const float4 *>(a.sdk + off + 4);
            const float4 v0 = *reinterpret_cast<const float4 *>(a.sdv + off), v1 = *reinterpret_cast<const float4 *>(a.sdv + off + 4);
            const float kk[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
            const float vv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                k[i] = first ? kk[i] : k[i] + kk[i];
                v[i] = first ? vv[i] : v[i] + vv[i];
            }
            first = false;
        }
        T *dk = static_cast<T *>(a.dk) + pg * a.dk_s[0] + r * a.dk_s[1] + h * a.dk_s[2] + c * a.dk_s[3];
        T *dv = static_cast<T *>(a.dv) + pg * a.dv_s[0] + r * a.dv_s[1] + h * a.dv_s[2] + c * a.dv_s[3];
        bsa_store8<T>(dk, a.dk_s[3], k, 8);
        bsa_store8<T>(dv, a.dv_s[3], v, 8);
    }
}

unsigned grid_for(long long n, int threads) {
    const long long b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

}  // namespace

extern "C" cudaError_t spattn_bsa_launch_pg_fold(const bsa_pg_fold_args *a, cudaStream_t st) {
    cudaError_t e = cudaMemsetAsync(a->cnt, 0, (size_t)a->num_pages * 4, st);
    if (e != cudaSuccess) return e;
    const long long slots = a->B * a->max_pages;
    bsa_pg_count_kernel<<<grid_for(slots, 256), 256, 0, st>>>(*a);
    bsa_pg_scan_kernel<<<1, kScanThreads, 0, st>>>(*a);
    bsa_pg_fill_kernel<<<grid_for(slots, 256), 256, 0, st>>>(*a);
    bsa_pg_sort_kernel<<<grid_for(a->num_pages, 256), 256, 0, st>>>(*a);
    const long long rows = a->num_pages * a->page_size * a->Nkv * (a->D / 8);
    if (a->bf16) bsa_pg_fold_kernel<__nv_bfloat16><<<grid_for(rows, 256), 256, 0, st>>>(*a);
    else bsa_pg_fold_kernel<__half><<<grid_for(rows, 256), 256, 0, st>>>(*a);
    return cudaGetLastError();
}
