// Shared device helpers of the sfa CUDA kernels (sfa_fwd*.cu, sfa_bwd*.cu, sfa_host.cu):
// kernel parameter block, index decoding, and thin wrappers over cp.async.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../core/internal.h"

namespace sfa {

// Packed variable-length / paged forward (sfa_host.cu, spattn_sfa_fwd_varlen): the kernels see
// the packed tensors as one batch of Tq tokens (B = 1, S1 = Tq, batch strides 0) and take each
// token's sequence from `tok`, written by a device pre-pass (the prefix sums never leave the
// device).  tok == NULL: a dense call.
struct Varlen {
    // per packed token: {sequence (-1: past cu_seqlens_q[B], nothing written), first key row of
    // the sequence (packed keys; 0 with pages), its key count, its causal limit (last allowed
    // sequence-local key, <= keys - 1)}; the pre-pass zeroes the key count of a token whose
    // lengths are invalid, so no key is read for it (its outputs are gated off anyway)
    const int4 *tok;
    const int32_t *table;  // block_table [B, max_pages] (NULL: packed keys); key j of sequence b
                           // is row table[b, j / page_size] * page_size + j % page_size of k
    int64_t tab_s0, tab_s1;
    int page_size, num_pages;
    int rows;  // rows of the key side (packed Tkv, or num_pages * page_size): the union form's key
               // space (its plan and blocks are in key-side rows, not sequence-local keys)
};

// Everything a fast kernel reads; element strides (int64) of the caller's tensors.
struct Params {
    const void *q, *qr, *k, *kr, *o, *dout;
    const float *lse_in;   // bwd: forward LSE
    void *out_o;           // fwd: O
    float *out_lse;        // fwd: LSE (may be NULL)
    void *dq, *dqr;        // bwd outputs
    const int32_t *idx;
    int64_t sq[4], sqr[4], sk[4], skr[4], so[4], sdo[4], slse[3], sidx[4];
    int64_t sdq[4], sdqr[4];
    int B, S1, S2, N1, N2, H, K, log2sbs, sbs, nblk, mode;
    float scale, scale_log2;  // scale and scale * log2(e)
    // bwd accumulation of dK (dV folded in): [B, S2, N2, 576] fp32 (atomic) or int64 fixed point
    float *acc_f32;
    unsigned long long *acc_i64;
    uint32_t *acc_flags;      // deterministic: a byte per acc_i64 element, non-finite adds (sfa_adds.cuh)
    const float *fix_scale;   // device scalar 2^F (deterministic path)
    // fwd (and bwd under stream capture): result of the index scan run just before (first bad
    // position, ~0 = none); the kernel writes nothing unless it is ~0 (NULL: no gate; gate_word)
    const unsigned long long *gate;
    Varlen vl;  // fwd, varlen calls only (last: the dense kernels' parameter offsets stay)
    // a separate value tensor (fwd of the small-head kernel's separate-V shapes, sfa::Sep in
    // sfa_gather.cuh; else NULL: V is k's first D columns); with pages, pages like k
    const void *v;
    int64_t sv[4];
    // The union forward (sfa_union.cu, fwd of the Mla shape at H = 4 .. 32): groups of ug = 64 / H
    // consecutive tokens of one (b, n2); ucnt[(b * N2 + n2) * ungroups + g] is -1 when the
    // gather kernels take group g (sparse, or an index repeated in a row), else the number of
    // 64-key blocks of the group's union, listed in ublk[g * ucap ..] (ascending) with each
    // token's selection in umask[(g * ucap + i) * ug + t] (bit j: key 64 ublk[..] + j).
    // Compacted groups (ucnt has UCOMPACT set; count = ucnt & ~UCOMPACT): the union's keys
    // themselves, ascending, in blocks of 64 (ukey[(g * ucap + i) * 64 + j], -1 past the last),
    // and umask's bit j is key ukey[.. + j]: fewer blocks when the tokens' selections leave gaps.
    // ucnt == NULL: no union pass in this call; ukey == NULL: no compacted group.
    const int *ucnt, *ublk, *ukey;
    const unsigned long long *umask;
    int ug, lg2h, ungroups, ucap;
    int lg2ug;  // log2(ug): a token's group is s1 >> lg2ug (the Mla union form: ug = 64 / H; the
                // group form of sfa_fwd_group.cu: ug = 16 / 8 / 4 at N = 8 / 16 / 32 heads)
    // The deterministic token-major backward in packed int32 fixed point (sfa_adds.cuh add_box<2>,
    // sfa_host.cu bwd_packed): acc_p32 [B, S2, N2, 576] int32, two columns per 64-bit integer add
    // (NULL in the probe pass: bounds only); acc_bound [B S2 N2][9 boxes]: per key row and 64-column
    // box, the sum over adds of (max |v| 2^F of the box's columns, rounded down) + 1, which bounds
    // every partial sum of the box's columns (exact int32 sums while below 2^31).
    int *acc_p32;
    unsigned long long *acc_bound;
    int probe_pt, probe_pb;  // the probe pass (> 1): every probe_pt-th CTA, every probe_pb-th block
    unsigned long long *probe_cnt;  // the probe pass: [0] += its CTAs' blocks, [1] += those it ran
    const int *run_if;       // non-NULL: the CTAs exit at once unless *run_if != 0 (the retry pass)
    // D and Dr of the call: q / k / v / o columns of the value / nope part, q_rope / k_rope
    // columns.  The kernels' shapes hold 64-column boxes (sfa::Shape: D = 64 NBN >= dn, DR = 64
    // NBR >= dr); the columns past dn of the last value box and past dr of the rope box are
    // zero-filled in every gathered block and Q / dO tile (D and Dr multiples of 8: a 16-byte
    // chunk lies wholly inside or outside), so S, dP, dK and dQ stay exact, and the outputs'
    // columns past them are never stored.
    int dn, dr;
};
constexpr int UCOMPACT = 1 << 30;  // Params::ucnt: the group's blocks are compacted keys (ukey)

constexpr int D = 512;     // value / nope width of the fast kernels
constexpr int DR = 64;     // rope width of the fast kernels
constexpr int DQK = D + DR;

// The index check's verdict for a gated kernel (Params::gate, or NULL: ungated): ~0 means every
// index is valid and the kernel may write its outputs.  A volatile load: another kernel wrote it.
__device__ __forceinline__ unsigned long long gate_word(const unsigned long long *gate) {
    return gate ? *reinterpret_cast<const volatile unsigned long long *>(gate) : ~0ull;
}

template <typename T> struct Ty;
template <> struct Ty<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
};
template <> struct Ty<float> {  // the simple kernels' fp32 inputs (maxabs of the fixed-point bound)
    static __device__ __forceinline__ float to_f(float x) { return x; }
    static __device__ __forceinline__ float from_f(float x) { return x; }
};
template <> struct Ty<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 v = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy; src_bytes = 0 zero-fills the destination (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Key of virtual slot v (v = entry * sbs + offset) of an index row, or -1 when the slot is
// padding, out of range (never read), past S2, or masked by the causal limit `lim`.  The load is
// unconditional (entry clamped to K - 1; K >= 1) so that a caller's several calls issue their
// loads together: with a test before each load, ptxas serialised the producer's 8 loads per
// block pair, each a full L2 latency (ncu, sfa17: 14 % of all stall samples).
__device__ __forceinline__ int key_of(const Params &p, const int32_t *row, int64_t sidx3, int v,
                                      int lim) {
    const int e = v >> p.log2sbs;
    const int bi = __ldg(row + (int64_t)min(e, p.K - 1) * sidx3);
    const int key = (int)(((unsigned)bi << p.log2sbs) + (unsigned)(v & (p.sbs - 1)));
    return e < p.K && bi >= 0 && bi < p.nblk && key < p.S2 && key <= lim ? key : -1;
}
// The same with the test before the load (loads serialised, one latency each): what the
// small-head forward keeps, measured faster there (H200, same call, medians of 10: the batched
// form took 1.11x the time on sfa18 (N1 4), 1.05-1.06x on sfa06 / sfa14 (N1 16), 1.03x on
// sfa03 / sfa09 (N1 32), but 0.87x on sfa16 and 0.96-0.98x on sfa15; loading a pair ahead
// was worse still, 1.18x on sfa18).  Not understood: ncu at its locked clock showed the batched
// form 1.3 % faster on sfa18, the producer then waiting on the consumers' releases.
__device__ __forceinline__ int key_of_serial(const Params &p, const int32_t *row, int64_t sidx3, int v,
                                             int lim) {
    const int e = v >> p.log2sbs;
    if (e >= p.K) return -1;
    const int bi = __ldg(row + (int64_t)e * sidx3);
    if (bi < 0 || bi >= p.nblk) return -1;
    const int key = (bi << p.log2sbs) + (v & (p.sbs - 1));
    return key >= p.S2 || key > lim ? -1 : key;
}

// A union row's token: before S1 (VL: S1 = Tq; and a token of a sequence, i.e. before
// cu_seqlens_q[B]: rows past it are zero, their outputs not written)
template <bool VL> __device__ __forceinline__ bool union_tok_ok(const Params &p, int tok) {
    if (tok >= p.S1) return false;
    if constexpr (VL) return __ldg(&p.vl.tok[tok].x) >= 0;
    return true;
}

// The CTA's query token s1 (VL: the packed token, b = 0): the pre-pass's info tk (VL only),
// the causal limit and the index row.  False for a VL token past cu_seqlens_q[B] (tk.x < 0):
// the CTA has nothing to do.
struct TokenRow {
    int4 tk;
    int lim;
    const int32_t *irow;
    int64_t si3;
};
template <bool VL>
__device__ __forceinline__ bool token_row(const Params &p, int b, int n2, int s1, TokenRow &r) {
    r.tk = make_int4(0, 0, 0, 0);
    if constexpr (VL) {
        r.tk = __ldg(p.vl.tok + s1);
        if (r.tk.x < 0) return false;
    }
    r.lim = VL ? r.tk.w : p.mode == 3 ? p.S2 - p.S1 + s1 : p.S2 - 1;
    r.irow = p.idx + b * p.sidx[0] + (int64_t)s1 * p.sidx[1] + n2 * p.sidx[2];
    r.si3 = p.sidx[3];
    return true;
}

}  // namespace sfa
