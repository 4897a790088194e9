// Scatter-add roofline of the sfa backward on the GPU: how fast can one CTA per query token add a
// 576-wide dK/dV row into each of its K selected keys' accumulators, and nothing else?  A
// token-major backward must do exactly this once per (token, selected key) pair, so
//   TF_max(H) = pairs/s * 5440 * H   (backward FLOPs per pair and head: S 2*576, dP 2*512,
//                                      dQ 2*576, dK 2*576, dV 2*512)
// bounds it at H heads per CTA.  docs/runbooks/sparse_flash_attention.md (issue 13 plan) needs
// these numbers to choose between a token-major and a key-major backward.
// Variants (each CTA: 128 threads, a 64-key block at a time; values from registers or staged):
//   red_v4_f32   red.global.add.v4.f32 from registers (fast mode, 16 B per instruction)
//   red_v2_f32   red.global.add.v2.f32 (what the mma.sync backward issues)
//   atom_u64     atom.global.add.u64 (int64 fixed point: the deterministic mode, 8 B per element)
//   bulk_f32     fp32 rows staged in shared memory, cp.reduce.async.bulk .add.f32, 2304 B per row
//   bulk_u64     int64 rows staged in shared memory (32 rows at a time: 147 KB), cp.reduce.async.bulk
//                .add.u64, 4608 B per row: the deterministic mode's adds without one LSU instruction
//                per element, if the bulk engine's integer adds keep up
// Every variant's sum is checked (exact: the values are multiples of 1/8).
// Accumulator rows: S2 = 8192 (fits L2 as fp32: 18.9 MB) and 32768 (75 MB, beyond it).
//   build: nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 bench/gpu/scatter_roofline.cu -o scatter_roofline
//   run:   ./scatter_roofline [tokens=4096] [K=2048] [ctas_per_sm=0]
// ctas_per_sm > 0 limits the CTAs resident on an SM (through shared memory) for the register
// variants: 2 = 8 warps per SM issuing adds, as the sfa backward's two consumer warpgroups; 1 = 4
// warps, its producer warpgroup.  (The bulk variants already run one CTA per SM: 147 KB staged.)
// Timing: CUDA events, L2 flushed (256 MB memset) before each of 10 repeats, median.
#include <stdint.h>

#include "roofline.cuh"

constexpr int COLS = 576;  // dK row (512 + 64 rope; dV folded into the first 512)
constexpr int BK = 64;     // keys per block

enum Variant { RED_V4 = 0, RED_V2 = 1, ATOM_U64 = 2, BULK = 3, BULK_U64 = 4 };
constexpr int FIX = 1 << 20;  // fixed-point scale of the int64 variants

// Thread t of the CTA owns columns [t * 4.5 ...): for simplicity 128 threads x 4 columns = 512 plus
// 64 rope columns by threads 0-15 (as a real kernel's tile mapping would spread them).
template <int V>
__global__ void __launch_bounds__(128) scatter_kernel(const int32_t *idx, int K, float *accf, unsigned long long *acci) {
    extern __shared__ __align__(128) float stage[];  // BULK: [BK][COLS]; BULK_U64: [BK / 2][COLS] int64
    const int t = threadIdx.x;
    const int32_t *row = idx + (int64_t)blockIdx.x * K;
    const float v = 1.0f + (blockIdx.x & 7) * 0.125f;  // the value added (exact in fp32 and fixed point)
    for (int b = 0; b < K / BK; b++) {
        if constexpr (V == BULK_U64) {
            unsigned long long *st = reinterpret_cast<unsigned long long *>(stage);
            const unsigned long long iv = (unsigned long long)(long long)(v * FIX);
            for (int h = 0; h < 2; h++) {  // two halves of 32 keys (a whole block of int64 rows is 295 KB)
                if (t < BK / 2) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
                __syncthreads();  // the previous half's rows have been read out
                for (int x = t; x < BK / 2 * COLS; x += 128) st[x] = iv;
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncthreads();
                if (t < BK / 2) {
                    const int key = __ldg(row + b * BK + h * (BK / 2) + t);
                    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.u64 [%0], [%1], %2;\n" ::"l"(
                                     acci + (int64_t)key * COLS),
                                 "r"((uint32_t)__cvta_generic_to_shared(st + t * COLS)), "r"(COLS * 8)
                                 : "memory");
                    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                }
            }
        } else if constexpr (V == BULK) {
            for (int x = t; x < BK * COLS; x += 128) stage[x] = v;
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
            if (t < BK) {
                const int key = __ldg(row + b * BK + t);
                asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                                 accf + (int64_t)key * COLS),
                             "r"((uint32_t)__cvta_generic_to_shared(stage + t * COLS)), "r"(COLS * 4)
                             : "memory");
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            }
            __syncthreads();
        } else {
            for (int r = 0; r < BK; r++) {
                const int key = __ldg(row + b * BK + r);
                if (V == RED_V4) {
                    float *dst = accf + (int64_t)key * COLS;
                    for (int c = t * 4; c < COLS; c += 128 * 4)
                        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + c), "f"(v), "f"(v), "f"(v),
                                     "f"(v)
                                     : "memory");
                } else if (V == RED_V2) {
                    float *dst = accf + (int64_t)key * COLS;
                    for (int c = t * 2; c < COLS; c += 128 * 2)
                        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst + c), "f"(v), "f"(v) : "memory");
                } else {
                    unsigned long long *dst = acci + (int64_t)key * COLS;
                    const unsigned long long iv = (unsigned long long)(long long)(v * FIX);
                    for (int c = t; c < COLS; c += 128) atomicAdd(dst + c, iv);
                }
            }
        }
    }
    if ((V == BULK && t < BK) || (V == BULK_U64 && t < BK / 2)) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

static int g_ctas_per_sm = 0;

template <int V>
static float run(const int32_t *idx, int T, int K, float *accf, unsigned long long *acci, size_t acc_bytes, void *flush) {
    int smem = V == BULK ? BK * COLS * 4 : V == BULK_U64 ? BK / 2 * COLS * 8 : 0;
    // fewer resident CTAs: shared memory the register variants do not use (227 KB per SM, 1 KB
    // of it reserved per CTA)
    if (!smem && g_ctas_per_sm > 0) smem = 227 * 1024 / g_ctas_per_sm - 1024;
    if (smem) CK(cudaFuncSetAttribute(scatter_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return median_ms(
        flush, [&](int) { CK(cudaMemset(V == ATOM_U64 || V == BULK_U64 ? (void *)acci : (void *)accf, 0, acc_bytes)); },
        [&] { scatter_kernel<V><<<T, 128, smem>>>(idx, K, accf, acci); });
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 4096, K = argc > 2 ? atoi(argv[2]) : 2048;
    g_ctas_per_sm = argc > 3 ? atoi(argv[3]) : 0;
    if (T < 1 || K < BK || K % BK || g_ctas_per_sm < 0 || g_ctas_per_sm > 16) {
        fprintf(stderr, "usage: scatter_roofline [tokens] [K, a multiple of 64] [ctas_per_sm, 0 (no limit) .. 16]\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs; %d tokens x %d rows of %d fp32 added per run; CTAs per SM %s\n", prop.name,
           prop.multiProcessorCount, T, K, COLS, g_ctas_per_sm > 0 ? argv[3] : "unlimited");
    void *flush;
    CK(cudaMalloc(&flush, kFlushBytes));
    printf("%-8s %-11s %9s %9s %8s | TF bound at H = 4 / 16 / 64\n", "S2", "variant", "ms", "Gpairs/s", "TB/s");
    for (int S2 : {8192, 32768}) {
        float *accf;
        unsigned long long *acci;
        const size_t nf = (size_t)S2 * COLS;
        CK(cudaMalloc(&accf, nf * 4));
        CK(cudaMalloc(&acci, nf * 8));
        int32_t *idx;
        CK(cudaMalloc(&idx, (size_t)T * K * 4));
        std::vector<int32_t> h((size_t)T * K);
        uint64_t s = 0x9E3779B97F4A7C15ull;
        for (size_t i = 0; i < h.size(); i++) {  // distinct keys per token (as top-k selects), random order
            if (i % K == 0) s ^= i;
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            h[i] = (int32_t)((i % K) * (S2 / K) + s % (uint64_t)(S2 / K));  // one key per stratum of S2 / K
        }
        CK(cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        // each variant's accumulator after its last repeat sums to what was added
        double want = 0;
        for (int tk = 0; tk < T; tk++) want += (1.0 + (tk & 7) * 0.125) * K * COLS;
        auto sum_ok = [&](bool i64) {
            double g = 0;
            if (i64) {
                std::vector<unsigned long long> hi(nf);
                CK(cudaMemcpy(hi.data(), acci, nf * 8, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < nf; i++) g += (double)(long long)hi[i] / FIX;
            } else {
                std::vector<float> hf(nf);
                CK(cudaMemcpy(hf.data(), accf, nf * 4, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < nf; i++) g += hf[i];
            }
            return g == want;
        };
        struct R {
            const char *name;
            float ms;
            int bytes;  // per element
            bool ok;
        } rs[5];
        rs[0] = {"red_v4_f32", run<RED_V4>(idx, T, K, accf, acci, nf * 4, flush), 4, sum_ok(false)};
        rs[1] = {"red_v2_f32", run<RED_V2>(idx, T, K, accf, acci, nf * 4, flush), 4, sum_ok(false)};
        rs[2] = {"atom_u64", run<ATOM_U64>(idx, T, K, accf, acci, nf * 8, flush), 8, sum_ok(true)};
        rs[3] = {"bulk_f32", run<BULK>(idx, T, K, accf, acci, nf * 4, flush), 4, sum_ok(false)};
        rs[4] = {"bulk_u64", run<BULK_U64>(idx, T, K, accf, acci, nf * 8, flush), 8, sum_ok(true)};
        for (const R &r : rs) {
            const double pairs = (double)T * K / (r.ms * 1e-3);
            const double tbs = pairs * COLS * r.bytes / 1e12;
            const double f = pairs * 5440 / 1e12;  // TF per head
            printf("%-8d %-11s %9.4f %9.3f %8.2f | %5.0f / %5.0f / %5.0f  sum %s\n", S2, r.name, r.ms, pairs / 1e9, tbs, 4 * f,
                   16 * f, 64 * f, r.ok ? "ok" : "WRONG");
        }
        CK(cudaFree(accf));
        CK(cudaFree(acci));
        CK(cudaFree(idx));
    }
    CK(cudaFree(flush));
    return 0;
}
