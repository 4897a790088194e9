// Small wrappers over the Hopper (sm_90a) machinery the spattn kernels use: wgmma shared-memory
// descriptors and ordering, setmaxnreg, named barriers, and (through CCCL's <cuda/ptx>) mbarrier
// waits and TMA tile loads.  The wgmma instructions themselves are in wgmma_ops.cuh (generated).
//
// Shared-memory tiles are written by TMA with the 128-byte swizzle: a tile of R rows x 64
// 2-byte columns is R * 128 bytes, 8-row groups ("atoms") of 1024 bytes, every atom 1024-byte
// aligned.  A head dim of 128 is two such column boxes, one after the other.
#ifndef SPATTN_HOPPER_CUH
#define SPATTN_HOPPER_CUH

#include <cuda.h>
#include <cuda/ptx>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "wgmma_ops.cuh"

namespace hop {

namespace ptx = cuda::ptx;

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// The dynamic shared memory base rounded up to 1024 bytes (128-byte swizzle atoms).  Pointer
// arithmetic on the __shared__ array (not an integer round trip) keeps the compiler aware that the
// result is shared: otherwise every access through it is a generic LD.E / ST.E, slower than LDS /
// STS and opaque to compute-sanitizer's racecheck.
__device__ __forceinline__ unsigned char *align1024(unsigned char *smem) {
    return smem + ((1024u - (smem_u32(smem) & 1023u)) & 1023u);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile (rows of 128
// bytes; the chunk index is XORed with the row within its 8-row atom).
__device__ __forceinline__ uint32_t sw128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

// 2^x (MUFU; flushes denormals).  Softmax in base 2 with the scale folded into log2(e) * scale.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Matrix descriptor, 128-byte swizzle.  K-major operand (rows of 64 elements along K): lbo is
// unused, sbo = 1024 (next 8-row atom).  MN-major operand (rows of 64 elements along M/N, one
// row per k): lbo = bytes between 64-column boxes along M/N, sbo = 1024 (next 8 k-rows).
__device__ __forceinline__ uint64_t desc_sw128(const void *p, uint32_t lbo, uint32_t sbo) {
    const uint64_t a = smem_u32(p);
    return ((a & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

// Descriptor d advanced by `bytes` (a multiple of 16).  Volatile so that the compiler recomputes
// it at each use instead of hoisting a table of 64-bit descriptors out of the loop (which spills).
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) {
    uint64_t r;
    asm volatile("add.s64 %0, %1, %2;\n" : "=l"(r) : "l"(d), "l"((uint64_t)(bytes >> 4)));
    return r;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Hides a value from the compiler, so that a loop-invariant address it would otherwise recompute
// at every use (rematerialised from the lane index to save a register) is held in one.
__device__ __forceinline__ void opaque(uint32_t &x) { asm volatile("" : "+r"(x)); }
__device__ __forceinline__ void opaque(unsigned long long &x) { asm volatile("" : "+l"(x)); }
// Keeps the compiler from moving reads/writes of registers that an in-flight wgmma uses across
// the wait (the asm statements of wgmma_ops.cuh touch them only at issue in its view).
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}

template <int R> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }

// Named barrier `id` (1..15; 0 is __syncthreads) over `n` threads.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
// Syncs named barrier `id` over `n` threads and returns whether `c` held in any of them.
__device__ __forceinline__ bool bar_red_or(bool c, int id, int n) {
    uint32_t r;
    asm volatile(
        "{\n.reg .pred p, q;\n"
        "setp.ne.u32 p, %1, 0;\n"
        "bar.red.or.pred q, %2, %3, p;\n"
        "selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(r)
        : "r"((uint32_t)c), "r"(id), "r"(n)
        : "memory");
    return r != 0;
}
// Arrives at named barrier `id` (counted towards `n`) without waiting.
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// Four 8 x 8 b16 matrices from the mma fragment layout (a register each: row lane / 4, columns
// 2 (lane % 4) + {0, 1}) to shared memory transposed; lane i gives the address of row i % 8 of
// matrix i / 8 of the stored (transposed) matrices.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

// The same for two matrices (lanes 0-15 give the addresses).
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
    asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1) : "memory");
}

// Inter-CTA ordering through a global counter: spin until *p == v (acquire at gpu scope), and
// the matching release increment (orders this thread's earlier writes, and those of the threads
// that met it at a barrier, before the count is seen).
// Polls with relaxed loads, then one acquire load of the value seen: every ld.acquire.gpu
// invalidates the SM's L1 (CCTL.IVALL in the SASS), so acquiring on each poll evicted the
// cached lists and LSE / Delta rows of the CTA's other warps (measured on the H200, bsa
// deterministic backward: 0.988x the time, random masks 0.95-0.97x).
__device__ __forceinline__ void spin_until_eq(const int *p, int v) {
    int x;
    do {
        asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
    } while (x != v);
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
}
__device__ __forceinline__ void release_add(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void release_inc(int *p) { release_add(p, 1); }
// spin until *p >= v, then an acquire load (as spin_until_eq)
__device__ __forceinline__ void spin_until_ge(const int *p, int v) {
    int x;
    do {
        asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
    } while (x < v);
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
}

// ---- mbarrier -----------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t *b, uint32_t count) { ptx::mbarrier_init(b, count); }
// The retry loop lives inside one asm statement: a C++ loop is a divergent path to ptxas, which
// then serialises wgmma chains that straddle the wait (warning C7520).
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(b)),
        "r"(parity)
        : "memory");
}
// The same with a suspend-time hint (ns): a waiting thread sleeps until the phase completes or
// the hint expires instead of retrying after the system's own limit
__device__ __forceinline__ void mbar_wait_hint(uint64_t *b, uint32_t parity, uint32_t ns) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, %2;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(b)),
        "r"(parity), "r"(ns)
        : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    (void)ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, b);
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
    (void)ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, b, bytes);
}

// Orders this thread's generic-proxy shared-memory writes (st.shared) before later async-proxy
// reads (wgmma operands, TMA stores) once a barrier has been passed.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// the same for global memory: this thread's completed bulk-async writes before its later generic
// accesses (e.g. a release that publishes them to generic readers)
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
// One arrival on `b` once all of this thread's earlier cp.async copies have landed (the barrier's
// expected count includes it: .noinc).
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t *b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(b)) : "memory");
}

// ---- TMA ----------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap *m) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(m)) : "memory");
}
// 4-d tile load (coordinates innermost first) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_4d(void *dst, const CUtensorMap *m, int c0, int c1, int c2, int c3,
                                            uint64_t *bar) {
    const int32_t c[4] = {c0, c1, c2, c3};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, m, c, bar);
}

// 4-d tile prefetch into L2 (no shared memory, no completion): data a later CTA will load.
__device__ __forceinline__ void tma_prefetch_4d(const CUtensorMap *m, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                     reinterpret_cast<uint64_t>(m)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// 4-d tile store (coordinates innermost first) from shared memory (written by the generic proxy:
// fence_proxy_async and a barrier first); rows / columns past the tensor are not written.
// Completes as a bulk group: bulk_commit(), then bulk_wait_read() before the source is reused or
// the CTA exits.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap *m, const void *src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     reinterpret_cast<uint64_t>(m)),
                 "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// ---- launch ---------------------------------------------------------------------------------
// Programmatic dependent launch: a kernel launched with launch_pdl may start while
// the kernel before it in the stream runs (once every CTA of that one has executed
// griddep_launch() or exited).  griddep_wait() returns when that kernel has completed and its
// writes are visible (at once when there is none); every thread calls it before reading what the
// previous kernel wrote, and before it exits, so that this grid completes after the previous one.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void griddep_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
template <typename... KArgs, typename... Args>
static inline cudaError_t launch_pdl(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                     Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<Args &&>(args)...);
}

// Raises a kernel's dynamic shared-memory limit once per device (bit d of *done_mask; devices
// beyond 63 set it on every call).
template <typename K> static inline cudaError_t set_smem(K kern, size_t smem, unsigned long long *done_mask) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const unsigned long long bit = dev < 64 ? 1ull << dev : 0ull;
    if (bit && (*done_mask & bit)) return cudaSuccess;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess) *done_mask |= bit;
    return e;
}

// The current device's SM count, read once per device (0 when it cannot be read; the error is
// cleared, so a following launch's cudaGetLastError does not report it).
static inline int sm_count() {
    static int cache[64];
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (dev < 64 && cache[dev] > 0) return cache[dev];
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (dev < 64) cache[dev] = n;
    return n;
}
// A grid-stride launch's CTA count: `units` of work, at most per_sm CTAs per SM (132 SMs when the
// count cannot be read), at least 1.
static inline unsigned grid_cap(long long units, int per_sm) {
    const int sms = sm_count();
    const long long cap = (long long)per_sm * (sms > 0 ? sms : 132);
    return (unsigned)(units < 1 ? 1 : units < cap ? units : cap);
}

// ---- element types ------------------------------------------------------------------------
template <typename T> struct elt;
template <> struct elt<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t v) { return __half22float2(*reinterpret_cast<__half2 *>(&v)); }
    template <int TA, int TB> static __device__ __forceinline__ void ss128(float (&d)[64], uint64_t a, uint64_t b, int s) { wgmma_ss_m64n128k16_f16<TA, TB>(d, a, b, s); }
    template <int TA, int TB> static __device__ __forceinline__ void ss64(float (&d)[32], uint64_t a, uint64_t b, int s) { wgmma_ss_m64n64k16_f16<TA, TB>(d, a, b, s); }
    template <int TB> static __device__ __forceinline__ void rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int s) { wgmma_rs_m64n128k16_f16<TB>(d, a, b, s); }
    template <int TB> static __device__ __forceinline__ void rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int s) { wgmma_rs_m64n64k16_f16<TB>(d, a, b, s); }
    template <int TA, int TB> static __device__ __forceinline__ void ss256(float (&d)[128], uint64_t a, uint64_t b, int s) { wgmma_ss_m64n256k16_f16<TA, TB>(d, a, b, s); }
    template <int TB> static __device__ __forceinline__ void rs256(float (&d)[128], const uint32_t (&a)[4], uint64_t b, int s) { wgmma_rs_m64n256k16_f16<TB>(d, a, b, s); }
    // m64nNk16 for the narrow N of the sfa small-head kernel (N = 8, 16, 32)
    template <int N, int TA, int TB> static __device__ __forceinline__ void ssn(float (&d)[N / 2], uint64_t a, uint64_t b, int s) {
        if constexpr (N == 8) wgmma_ss_m64n8k16_f16<TA, TB>(d, a, b, s);
        else if constexpr (N == 16) wgmma_ss_m64n16k16_f16<TA, TB>(d, a, b, s);
        else wgmma_ss_m64n32k16_f16<TA, TB>(d, a, b, s);
    }
};
template <> struct elt<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    // bf16 -> fp32 is exact as bit shifts on the 32-bit register.  __bfloat1622float2 split the
    // register into its 16-bit halves and rebuilt it (PRMT pairs) where it is also a wgmma A
    // operand: ~40 instructions ahead of the bsa backward's dP^T / dV issue, 2.5 % of its time
    // at base clocks (nvdisasm; ncu, H200)
    static __device__ __forceinline__ float2 unpack(uint32_t v) {
        return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
    }
    template <int TA, int TB> static __device__ __forceinline__ void ss128(float (&d)[64], uint64_t a, uint64_t b, int s) { wgmma_ss_m64n128k16_bf16<TA, TB>(d, a, b, s); }
    template <int TA, int TB> static __device__ __forceinline__ void ss64(float (&d)[32], uint64_t a, uint64_t b, int s) { wgmma_ss_m64n64k16_bf16<TA, TB>(d, a, b, s); }
    template <int TB> static __device__ __forceinline__ void rs128(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int s) { wgmma_rs_m64n128k16_bf16<TB>(d, a, b, s); }
    template <int TB> static __device__ __forceinline__ void rs64(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int s) { wgmma_rs_m64n64k16_bf16<TB>(d, a, b, s); }
    template <int TA, int TB> static __device__ __forceinline__ void ss256(float (&d)[128], uint64_t a, uint64_t b, int s) { wgmma_ss_m64n256k16_bf16<TA, TB>(d, a, b, s); }
    template <int TB> static __device__ __forceinline__ void rs256(float (&d)[128], const uint32_t (&a)[4], uint64_t b, int s) { wgmma_rs_m64n256k16_bf16<TB>(d, a, b, s); }
    // m64nNk16 for the narrow N of the sfa small-head kernel (N = 8, 16, 32)
    template <int N, int TA, int TB> static __device__ __forceinline__ void ssn(float (&d)[N / 2], uint64_t a, uint64_t b, int s) {
        if constexpr (N == 8) wgmma_ss_m64n8k16_bf16<TA, TB>(d, a, b, s);
        else if constexpr (N == 16) wgmma_ss_m64n16k16_bf16<TA, TB>(d, a, b, s);
        else wgmma_ss_m64n32k16_bf16<TA, TB>(d, a, b, s);
    }
};

}  // namespace hop

#endif
