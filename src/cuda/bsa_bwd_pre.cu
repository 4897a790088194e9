// Preprocess of the block-sparse attention backward (bsa_bwd.cu):
//   bsa_delta_kernel  Delta = rowsum(dO * O), lse2 = LSE * log2(e) (+inf on empty rows); also
//                     zeroes the backward's semaphores (the dQ accumulator needs none: the
//                     first add of each query tile is a store, bsa_bwd.cu)
//   VL (packed variable-length backward): rows (head n, packed token t) of [1, N, T, D] views,
//   Delta / lse2 [N][Tq]; tokens past cu_q[B] (= seq[B-1].x + .y) are not read, nor is anything
//   when the prefix sums are bad (*p.vl.err != ~0: the backward kernel then reads none of it).
#include <math.h>

#include "bsa_common.cuh"
#include "bsa_launch.h"
#include "hopper/hopper.cuh"

// Rows of the Delta / lse2 arrays: row = slab * len + i, slab = b * N + n (VL: slab = n, len = Tq,
// b = 0, i = the packed token; tokens at or past cu_q[B] are not read).  A pass's rows are found
// from one division of its first row (64-bit divisions per row and lane were most of the first
// grid-stride kernel's time: ~100 instructions each).
struct DeltaPos {
    long long slab;
    int i;
};
template <bool VL> __device__ __forceinline__ long long delta_len(const bsa_params &p) {
    if constexpr (VL) return p.vl.Tq;
    else return p.Sq;
}
template <bool VL> __device__ __forceinline__ DeltaPos delta_pos(const bsa_params &p, long long row) {
    const long long len = delta_len<VL>(p), slab = row / len;
    return {slab, (int)(row - slab * len)};
}
// the position `off` rows after `q` (off >= 0)
template <bool VL> __device__ __forceinline__ DeltaPos delta_next(const bsa_params &p, DeltaPos q, int off) {
    const long long len = delta_len<VL>(p);
    long long i = (long long)q.i + off;
    while (i >= len) {
        i -= len;
        q.slab++;
    }
    q.i = (int)i;
    return q;
}
template <bool VL>
__device__ __forceinline__ bool delta_bni(const bsa_params &p, DeltaPos q, long long tq, int &b, int &n, int &i) {
    i = q.i;
    if constexpr (VL) {
        b = 0;
        n = (int)q.slab;
        return q.i < tq;
    } else {
        b = (int)(q.slab / p.N);
        n = (int)(q.slab - (long long)b * p.N);
        return true;
    }
}

__device__ __forceinline__ float delta_lse(const bsa_params &p, int b, int n, int i) {
    return p.lse[(long long)b * p.lse_s0 + (long long)n * p.lse_s1 + (long long)i * p.lse_s2];
}
__device__ __forceinline__ void delta_store(float *delta, float *lse2, long long row, float l, float acc) {
    delta[row] = acc;
    lse2[row] = l == -INFINITY ? INFINITY : l * BSA_LOG2E;
}

// Grid-stride (a few CTAs per SM): the launch of one 8-row CTA per 8 rows cost more than the
// rows (bsa17: 24.7 us for 33 MB of O and dO, ~1.3 TB/s; ncu, H200, 2026-12-03).  Rows of 16-byte
// chunks (o and dout `vec`, D % 8 == 0, D <= 256): L lanes per row (a power of two >= D / 8),
// 32 / L rows per warp and pass, UNR passes' loads in flight before the sums.
template <typename T, bool VL>
__global__ void __launch_bounds__(256, 4) bsa_delta_kernel(const bsa_params p, float *delta, float *lse2, uint4 *zero,
                                                        long long zero16) {
    // the backward kernel (its programmatic dependent) may be scheduled once every CTA of this one
    // has started: it loads K / V meanwhile and waits for this kernel's end before reading its output
    hop::griddep_launch();
    const long long gt = blockIdx.x * (long long)blockDim.x + threadIdx.x, nt = (long long)gridDim.x * blockDim.x;
    // the backward's semaphores are zeroed here (no separate memset launch)
    for (long long x = gt; x < zero16; x += nt) zero[x] = make_uint4(0, 0, 0, 0);
    long long rows, tq = 0;
    if constexpr (VL) {
        if (*p.vl.err != ~0ull) return;
        const int4 last = p.vl.seq[p.B - 1];
        tq = (long long)last.x + last.y;  // cu_q[B] (< 2^31)
        rows = (long long)p.N * p.vl.Tq;
    } else {
        rows = (long long)p.B * p.N * p.Sq;
    }
    const int lane = threadIdx.x & 31;
    const long long warp = gt >> 5, nwarps = nt >> 5;
    if (p.o.vec && p.dout.vec && !(p.D & 7) && p.D <= 256) {
        constexpr int UNR = 4;
        const int nch = p.D >> 3, lg = nch <= 1 ? 0 : 32 - __clz(nch - 1), L = 1 << lg;
        const int sub = lane >> lg, j = lane & (L - 1), rpw = 32 >> lg;
        for (long long r0 = warp * rpw * UNR; r0 < rows; r0 += nwarps * rpw * UNR) {
            uint4 a[UNR], c[UNR];
            float lv[UNR];   // LSE of the row (lane j = 0), loaded with the row
            unsigned okm = 0;  // bit u: row u of the pass is read (and, by lane j = 0, written)
            const DeltaPos q0 = delta_pos<VL>(p, r0);
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const long long row = r0 + u * rpw + sub;
                int b = 0, n = 0, i = 0;
                const bool ok = row < rows && j < nch && delta_bni<VL>(p, delta_next<VL>(p, q0, u * rpw + sub), tq, b, n, i);
                a[u] = c[u] = make_uint4(0, 0, 0, 0);
                lv[u] = 0.f;
                if (ok) {
                    okm |= 1u << u;
                    if (j == 0) lv[u] = delta_lse(p, b, n, i);
                    a[u] = __ldcs(reinterpret_cast<const uint4 *>(reinterpret_cast<const T *>(p.o.p) + b * p.o.s0 +
                                                                  n * p.o.s1 + i * p.o.s2) + j);
                    c[u] = __ldcs(reinterpret_cast<const uint4 *>(reinterpret_cast<const T *>(p.dout.p) + b * p.dout.s0 +
                                                                  n * p.dout.s1 + i * p.dout.s2) + j);
                }
            }
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const T *ae = reinterpret_cast<const T *>(&a[u]), *ce = reinterpret_cast<const T *>(&c[u]);
                float acc = 0.f;
#pragma unroll
                for (int k = 0; k < 8; k++) acc += bsa_t<T>::tof(ae[k]) * bsa_t<T>::tof(ce[k]);
                for (int off = L >> 1; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
                if (j == 0 && (okm >> u & 1)) delta_store(delta, lse2, r0 + u * rpw + sub, lv[u], acc);
            }
        }
        return;
    }
    for (long long row = warp; row < rows; row += nwarps) {  // any strides: a warp per row
        int b, n, i;
        if (!delta_bni<VL>(p, delta_pos<VL>(p, row), tq, b, n, i)) continue;
        const T *o = reinterpret_cast<const T *>(p.o.p) + b * p.o.s0 + n * p.o.s1 + i * p.o.s2;
        const T *d = reinterpret_cast<const T *>(p.dout.p) + b * p.dout.s0 + n * p.dout.s1 + i * p.dout.s2;
        float acc = 0.f;
        for (int x = lane; x < p.D; x += 32) acc += bsa_t<T>::tof(o[x * p.o.s3]) * bsa_t<T>::tof(d[x * p.dout.s3]);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) delta_store(delta, lse2, row, delta_lse(p, b, n, i), acc);
    }
}

extern "C" cudaError_t spattn_bsa_launch_delta(const bsa_params *p, int bf16, float *delta, float *lse2, void *zero,
                                               size_t zero_bytes, cudaStream_t st) {
    uint4 *z = static_cast<uint4 *>(zero);
    const long long z16 = (long long)(zero_bytes / 16);
    if (zero_bytes % 16) {  // never with the workspace layouts (16-byte multiples); kept exact anyway
        cudaError_t e = cudaMemsetAsync(static_cast<char *>(zero) + z16 * 16, 0, zero_bytes % 16, st);
        if (e != cudaSuccess) return e;
    }
    const bool vl = p->vl.seq != nullptr;
    const long long rows = vl ? (long long)p->N * p->vl.Tq : (long long)p->B * p->N * p->Sq;
    // 64 rows per CTA pass at D 128 (8 warps x 2 rows x 4 loads in flight), grid-stride over as
    // many CTAs as are resident at once (4 per SM: 64 registers): the one-pass waves of the grid
    // capped at 8 per SM (1024 CTAs, 3 resident per SM at 70 registers, on bsa17) each paid a full
    // memory round trip at partial occupancy
    const unsigned blocks = hop::grid_cap((rows + 63) / 64, 4);
    if (vl) {
        if (bf16)
            bsa_delta_kernel<__nv_bfloat16, true><<<blocks, 256, 0, st>>>(*p, delta, lse2, z, z16);
        else
            bsa_delta_kernel<__half, true><<<blocks, 256, 0, st>>>(*p, delta, lse2, z, z16);
    } else if (bf16) {
        bsa_delta_kernel<__nv_bfloat16, false><<<blocks, 256, 0, st>>>(*p, delta, lse2, z, z16);
    } else {
        bsa_delta_kernel<__half, false><<<blocks, 256, 0, st>>>(*p, delta, lse2, z, z16);
    }
    return cudaGetLastError();
}
