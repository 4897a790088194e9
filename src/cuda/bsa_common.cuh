// Device helpers shared by the block-sparse attention kernels (bsa_fwd.cu, bsa_bwd.cu):
// mma.sync m16n8k16 (fp16 / bf16 -> fp32), ldmatrix, cp.async, swizzled shared-memory tiles,
// and the tensor views / kernel parameters the host fills.
#ifndef SPATTN_BSA_COMMON_CUH
#define SPATTN_BSA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "bsa_tiles.h"

#define BSA_LOG2E 1.4426950408889634f
#define BSA_LN2 0.6931471805599453f

// A strided 4-d view [B, H, S, D] (element strides) of a device tensor.
struct bsa_view {
    void *p;
    long long s0, s1, s2, s3;
    int vec;  // 1: s3 == 1, s2/s1/s0 multiples of 8 and p 16-byte aligned (16-byte copies)
};

// Schedule lists (device workspace): row r has cnt[r] entries list[r * stride + e],
// entry = tile * 2 + partial.
struct bsa_sched {
    const int *cnt;
    const int *list;
    int stride;
    const int *order;  // rows heaviest first (a permutation of the rows; launch order only): the forward's,
                       // and the key-major rows of the non-deterministic backward
};

struct bsa_mask_view {
    const uint8_t *p;
    long long s0, s1, s2, s3;
};

// Packed variable-length forward / backward (spattn_bsa_fwd_varlen / spattn_bsa_bwd_varlen;
// bsa_vl_prep_kernel fills it): the tensors are [1, H, T, D] views of the packed [T, H, D] ones,
// the mask keeps its batch index.
struct bsa_varlen {
    const int4 *seq;                // [B] {first query row, Sq_b, first key row, Skv_b}
    const void *tm;                 // [B][3] (forward: q, k, v), [B][4] (forward: q, k, v, o when
                                    // O is TMA-stored; backward: q, k, v, dO)
                                    // CUtensorMap: base at the sequence's first row, rows = its
                                    // length (TMA zero-fills past its end)
    const unsigned long long *err;  // ~0: prefix sums valid; else nothing may be written
    long long Tq, Tkv;              // packed token counts (backward: Delta / lse2 are [N][Tq];
                                    // forward: Tq bounds the grid)
    long long ntile;                // backward: dQ accumulator tiles per head (bsa_vl_qtile)
    // paged K / V (forward; table NULL: packed): key j of sequence b is row j % page_size of page
    // table[b * tab_s0 + (j / page_size) * tab_s1]; the kernel's maps of k / v are the page pool
    // (D, Nkv, page_size, num_pages) in boxes of 2^lr rows, tm [B][3] holds q and, for k and v,
    // the pool with the rows of a page cut to those of the sequence's last page
    const int *table;
    long long tab_s0, tab_s1;
    int page_size, lr;
};

// A count of the edge tests: the sequence's in a varlen instantiation, the call's in a dense one
// (read from the parameters at each use there, as before the varlen forms: nothing kept live).
template <bool VL> __device__ __forceinline__ int bsa_len(int seq_count, int call_count) {
    if constexpr (VL) return seq_count;
    else return call_count;
}
// Backward, varlen: the dQ accumulator tile of query tile m (64 rows) of a sequence starting at
// packed row q0, per head: q0 / 64 + b + m.  Sequence b's tiles end at or before sequence
// b + 1's first (floor((q0 + S) / 64) >= floor(q0 / 64) + floor(S / 64)), so no two sequences
// share a tile, without a scan; Tq / 64 + B + 1 tiles per head cover every sequence.
__host__ __device__ __forceinline__ long long bsa_vl_qtile(long long q0, int b, int m) { return q0 / 64 + b + m; }

struct bsa_params {
    bsa_view q, k, v, o, dout, dq, dk, dv;
    bsa_mask_view mask;
    float *lse;  // forward output (may be NULL)
    long long lse_s0, lse_s1, lse_s2;
    const float *lse2;   // backward: lse * log2(e), +inf on empty rows, [B*N*Sq]
    const float *delta;  // backward: rowsum(dO * O), [B*N*Sq]
    int B, N, Nkv, G, Sq, Skv, D, bx, by, nbx, nby;
    float scale, scale_log2;
    float inv_bx, inv_by;  // 1/bx, 1/by (bsa_div)
    bsa_sched sq;  // query-major (forward or dQ)
    bsa_sched sk;  // key-major (dK/dV): entry = (g * nqt + m) * 2 + partial
    int nqt;       // query tiles of the key-major list
    bsa_varlen vl;  // varlen forward only (last: the dense kernels' parameter offsets stay)
};

// ---- element types ------------------------------------------------------------------------
template <typename T> struct bsa_t;
template <> struct bsa_t<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float tof(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half fromf(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct bsa_t<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float tof(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 fromf(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// v[0 .. n) (n <= 8) to dst[k * s3] in T: one 16-byte store when all 8 go to a contiguous,
// 16-byte aligned row, else element by element.
template <typename T> __device__ __forceinline__ void bsa_store8(T *dst, long long s3, const float *v, int n) {
    if (n == 8 && s3 == 1 && !(reinterpret_cast<uintptr_t>(dst) & 15)) {
        uint4 w;
        w.x = bsa_t<T>::pack(v[0], v[1]);
        w.y = bsa_t<T>::pack(v[2], v[3]);
        w.z = bsa_t<T>::pack(v[4], v[5]);
        w.w = bsa_t<T>::pack(v[6], v[7]);
        *reinterpret_cast<uint4 *>(dst) = w;
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < n) dst[(long long)k * s3] = bsa_t<T>::fromf(v[k]);
}

// 2^x with the SFU (ex2.approx; 2^-inf = 0).
__device__ __forceinline__ float bsa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// j / d for 0 <= j, 1 <= d: float reciprocal, then one correction step (exact for j < 2^24;
// integer division beyond).
__device__ __forceinline__ int bsa_div(int j, int d, float inv) {
    if (j >= (1 << 24)) return j / d;
    int q = __float2int_rz((float)j * inv);
    q += (q + 1) * d <= j;
    q -= q * d > j;
    return q;
}

// ---- shared memory: tiles [rows][DP] of 2-byte elements, 16-byte chunks XOR-swizzled by row ----
template <int DP> __device__ __forceinline__ int bsa_swz(int row, int col) {
    // element offset of (row, col); col a multiple of 8 for 16-byte accesses
    return row * DP + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t bsa_smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void cp_async16(uint32_t saddr, const void *g, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(g), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A fragment (16 x 16, row-major source) at (r0, k0) of a swizzled tile.
template <int DP>
__device__ __forceinline__ void bsa_lda(const __half *s, int r0, int k0, int lane, uint32_t *a) {
    int row = r0 + (lane & 15), col = k0 + ((lane >> 4) << 3);
    ldsm_x4(bsa_smem_u32(s + bsa_swz<DP>(row, col)), a[0], a[1], a[2], a[3]);
}
// B fragments of two n8 tiles (n0, n0+8) x k16 from a tile stored [n][k] (e.g. K for Q K^T).
template <int DP>
__device__ __forceinline__ void bsa_ldb_nk(const __half *s, int n0, int k0, int lane, uint32_t *b) {
    int row = n0 + (lane & 7) + ((lane >> 4) << 3), col = k0 + (((lane >> 3) & 1) << 3);
    ldsm_x4(bsa_smem_u32(s + bsa_swz<DP>(row, col)), b[0], b[1], b[2], b[3]);
}
// B fragments of two n8 tiles (n0, n0+8) x k16 from a tile stored [k][n] (e.g. V for P V).
template <int DP>
__device__ __forceinline__ void bsa_ldb_kn(const __half *s, int k0, int n0, int lane, uint32_t *b) {
    int row = k0 + (lane & 7) + (((lane >> 3) & 1) << 3), col = n0 + ((lane >> 4) << 3);
    ldsm_x4_t(bsa_smem_u32(s + bsa_swz<DP>(row, col)), b[0], b[1], b[2], b[3]);
}

// Loads rows [r0, r0 + ROWS) x [0, DP) of view (b, h) into a swizzled tile; rows >= S and
// columns >= D are zero.  16-byte cp.async when the view allows it, else plain loads.
template <int ROWS, int DP, int NT, typename T>
__device__ __forceinline__ void bsa_load_tile(__half *s, const bsa_view &v, int b, int h, int r0, int S, int D,
                                              int tid) {
    constexpr int CH = DP / 8;
    const T *base = reinterpret_cast<const T *>(v.p) + (long long)b * v.s0 + (long long)h * v.s1;
    if (v.vec) {
#pragma unroll
        for (int i = tid; i < ROWS * CH; i += NT) {
            int row = i / CH, ch = i % CH;
            int gr = r0 + row, gc = ch * 8;
            bool ok = gr < S && gc < D;
            const T *g = base + (ok ? (long long)gr * v.s2 + gc : 0);
            cp_async16(bsa_smem_u32(s + bsa_swz<DP>(row, gc)), g, ok ? 16 : 0);
        }
    } else {
        for (int i = tid; i < ROWS * CH; i += NT) {
            int row = i / CH, ch = i % CH;
            int gr = r0 + row, gc = ch * 8;
            __align__(16) T tmp[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                bool ok = gr < S && gc + e < D;
                tmp[e] = ok ? base[(long long)gr * v.s2 + (long long)(gc + e) * v.s3] : bsa_t<T>::fromf(0.f);
            }
            *reinterpret_cast<uint4 *>(s + bsa_swz<DP>(row, gc)) = *reinterpret_cast<uint4 *>(tmp);
        }
    }
}

// Stores a swizzled [ROWS][DP] tile (of T) to rows [r0, r0 + ROWS) of view (b, h), only rows < S
// and columns < D.
template <int ROWS, int DP, int NT, typename T>
__device__ __forceinline__ void bsa_store_tile(const __half *s, const bsa_view &v, int b, int h, int r0, int S,
                                               int D, int tid) {
    constexpr int CH = DP / 8;
    T *base = reinterpret_cast<T *>(v.p) + (long long)b * v.s0 + (long long)h * v.s1;
    for (int i = tid; i < ROWS * CH; i += NT) {
        int row = i / CH, ch = i % CH;
        int gr = r0 + row, gc = ch * 8;
        if (gr >= S || gc >= D) continue;
        uint4 val = *reinterpret_cast<const uint4 *>(s + bsa_swz<DP>(row, gc));
        if (v.vec) {
            *reinterpret_cast<uint4 *>(base + (long long)gr * v.s2 + gc) = val;
        } else {
            const T *t = reinterpret_cast<const T *>(&val);
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (gc + e < D) base[(long long)gr * v.s2 + (long long)(gc + e) * v.s3] = t[e];
        }
    }
}

// Writes a warp's fp32 accumulator tile (16 rows x DP, mma C layout, scaled by mul[row half])
// as T into a swizzled smem tile at rows [r0, r0 + 16).
template <int DP, typename T>
__device__ __forceinline__ void bsa_acc_to_smem(__half *s, const float (*acc)[4], int r0, int lane, float mul0,
                                                float mul1) {
    int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int nt = 0; nt < DP / 8; nt++) {
        int col = nt * 8 + 2 * c;
        uint32_t lo = bsa_t<T>::pack(acc[nt][0] * mul0, acc[nt][1] * mul0);
        uint32_t hi = bsa_t<T>::pack(acc[nt][2] * mul1, acc[nt][3] * mul1);
        *reinterpret_cast<uint32_t *>(s + bsa_swz<DP>(r0 + g, col & ~7) + (col & 7)) = lo;
        *reinterpret_cast<uint32_t *>(s + bsa_swz<DP>(r0 + g + 8, col & ~7) + (col & 7)) = hi;
    }
}

__device__ __forceinline__ bool bsa_mask_at(const bsa_mask_view &m, int b, int h, int rb, int cb) {
    return __ldg(m.p + (long long)b * m.s0 + (long long)h * m.s1 + (long long)rb * m.s2 + (long long)cb * m.s3) != 0;
}

#endif
