// Pieces shared by the two key-major sfa backwards (sfa_bwd_small.cu: the Mla shape,
// sfa_bwd_kmaj.cu: the separate-V shapes): keys are the MMA rows, a step is 32 token-head rows
// (tokens of HP heads each) of one list of sfa_bwd_small.h.
#pragma once
#include <float.h>

#include "hopper/hopper.cuh"
#include "sfa_adds.cuh"
#include "sfa_bwd_small.h"
#include "sfa_gather.cuh"

namespace sfa {

// 4-byte async copy (src_bytes 0: zero-fill; src must still be a valid address).
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(hop::smem_u32(dst)), "l"(src), "r"(ok ? 4 : 0)
                 : "memory");
}

// A 64 x 32 accumulator (this thread's 16 values: element i = 4 j + 2 hh + e is key r0 + 8 hh,
// token-head row 8 j + 2 q4 + e) as the A fragments of the two k-steps of an m64 RS wgmma.
template <typename T> __device__ __forceinline__ void kmaj_pack_a(const float (&x)[16], uint32_t (&a)[2][4]) {
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) a[kk][r] = hop::elt<T>::pack(x[8 * kk + 2 * r], x[8 * kk + 2 * r + 1]);
}

// Byte offset of element (key, th) in a dS tile [32 token-head rows th][64 keys] (one 128-byte
// swizzled row per th: the K-major B operand of dQ^T).
__device__ __forceinline__ uint32_t kmaj_ds_at(int th, int key) { return hop::sw128(th, key >> 3) + (key & 7) * 2; }
// This thread's dS^T values (layout of kmaj_pack_a) into the dS tile.
template <typename T>
__device__ __forceinline__ void kmaj_store_ds(unsigned char *sds, const float (&d)[16], int q4, int r0) {
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const uint32_t pk = hop::elt<T>::pack(d[4 * j + 2 * hh + e], 0.f);
                *reinterpret_cast<uint16_t *>(sds + kmaj_ds_at(8 * j + 2 * q4 + e, r0 + 8 * hh)) = (uint16_t)pk;
            }
}

// The CTA's key block (producer thread t of 128): keys kb * 64 + row of (b, n2), all S::NBT boxes
// (K, rope, then V when separate), completing on kbar; rows past S2 and rows no visit of the
// list selects (bit clear in `used`) zero-filled.
template <typename T, class S>
__device__ __forceinline__ void kmaj_load_block(unsigned char *dst, uint64_t *kbar, const Params &p, int b, int n2, int kb,
                                                uint64_t used, int t) {
    const Gather<T, false, S> gat(p, b, n2, t);
    int key[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int k = kb * 64 + gat.grp + 16 * r;
        key[r] = k < p.S2 && ((used >> (gat.grp + 16 * r)) & 1) ? k : -1;
    }
    gat.copy(dst, key, 0, S::NBT);
    hop::cp_async_arrive_noinc(kbar);
}

// The producer's per-step loads beside Q / dO (thread t of 128): the visits' multiplicities
// [TT][64] (128 bytes per visit) at ms + cnt_off, and per token-head row th = tok * HP + h
// (head head0 + h) LSE2 at ms + lse_off and Delta at ms + delta_off (4 bytes each; zero for
// padding rows).  vs: the step's first visit, ntok its visits.
template <int HP>
__device__ __forceinline__ void kmaj_step_rows(unsigned char *ms, int cnt_off, int lse_off, int delta_off, const Params &p,
                                               const SmallLists &L, int b, int n2, int head0, int vs, int ntok, int t) {
    constexpr int NR = 32, TT = NR / HP;
    for (int x = t; x < TT * 8; x += 128) {
        const int tok = x >> 3, ok = tok < ntok;
        cp_async16(ms + cnt_off + x * 16, ok ? L.vmult + (int64_t)(vs + tok) * 32 + (x & 7) * 4 : L.vmult, ok ? 16 : 0);
    }
    if (t < 2 * NR) {
        const int th = t & (NR - 1), tok = th / HP, h = th % HP;
        const bool ok = tok < ntok && head0 + h < p.H;
        const int64_t r = ok ? ((int64_t)b * p.S1 + L.vtok[vs + tok]) * p.N1 + (int64_t)n2 * p.H + head0 + h : 0;
        cp_async4(ms + (t < NR ? lse_off : delta_off) + th * 4, (t < NR ? L.lse2 : L.delta) + r, ok);
    }
}

// dQ^T[box] = K^T dS^T of one 64-column box of the key block (M = 64 columns, N = 32 token-head
// rows, K = 64 keys: A = the box read MN-major, B = the step's dS tile at dsd), waited for.
template <typename T> __device__ __forceinline__ void kmaj_dq_tile(float (&q)[16], const unsigned char *kbox, uint64_t dsd) {
    const uint64_t ka = hop::desc_sw128(kbox, GBOX, 1024);
    hop::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        hop::elt<T>::template ssn<32, 1, 0>(q, hop::desc_add(ka, kk * 2048), hop::desc_add(dsd, kk * 32), kk > 0);
    hop::wgmma_commit();
    hop::wgmma_wait<0>();
    hop::reg_fence(q);
}

// A dQ^T tile (q[4 j + 2 hh + e] is column r0 + 8 hh of token-head row 8 j + 2 q4 + e) added to the
// dQ accumulator rows qrow (-1: none), columns col0 + .., rows of W: fp32 reds (a warp's
// instruction covers 4 rows x 8 consecutive columns), or int64 fixed point with one vote per
// tile for the all-finite case (straight-line integer adds), the flag path only when some value is not
// finite.
// Measured in sfa_bwd_kmaj.cu (H200, sfas01-04, same call): regrouping the fp32 values by two
// shuffle rounds into 4 red.v4 per lane instead of 16 scalar reds took 1.16-1.19x the time (the
// shuffles sit on the critical path, the adds' bytes do not).
__device__ __forceinline__ void kmaj_add_dq(const SmallLists &L, const float (&q)[16], const int (&qrow)[8], int col0, int W,
                                            int r0, bool det, float fsq) {
    bool fin = true;
#pragma unroll
    for (int i = 0; i < 16; i++) fin &= fabsf(q[i]) <= FLT_MAX;
    const int mode = !det ? 0 : __all_sync(0xffffffffu, fin) ? 1 : 2;
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (qrow[2 * j + e] < 0) continue;
            const int64_t rowq = (int64_t)qrow[2 * j + e] * W + col0 + r0;
            const float x0 = q[4 * j + e], x1 = q[4 * j + 2 + e];  // columns r0, r0 + 8
            if (mode == 0) {
                red_add_f32(L.dq_f32 + rowq, x0);
                red_add_f32(L.dq_f32 + rowq + 8, x1);
            } else if (mode == 1) {
                red_add_u64(L.dq_i64 + rowq, (unsigned long long)__float2ll_rn(x0 * fsq));
                red_add_u64(L.dq_i64 + rowq + 8, (unsigned long long)__float2ll_rn(x1 * fsq));
            } else {
                add_fix(L.dq_i64, L.dq_flags, rowq, x0, fsq);
                add_fix(L.dq_i64, L.dq_flags, rowq + 8, x1, fsq);
            }
        }
}

}  // namespace sfa
