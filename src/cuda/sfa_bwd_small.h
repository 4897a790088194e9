// Device buffers of the key-major sfa backward (sfa_bwd_small.cu), carved by sfa_host.cu from the
// caller's workspace: the per-call token lists of each (b, n2, 64-key block) and the dQ
// accumulator.  Sizes depend on shapes only (sfa_host.cu: small_parts).
#pragma once
#include <stdint.h>

#include "sfa_common.cuh"

namespace sfa {

struct SmallLists {
    uint32_t *bitmap;     // [B * N2 * nkb][s1w]: bit s1 = token s1 selects a key of the block
    uint32_t *wpre;       // same shape: set bits of the list before this word
    int *len, *off;       // [nl] list lengths, [nl + 1] offsets into the visits
    int *vtok;            // [visits] token s1 of each visit, lists in increasing s1
    uint32_t *vmult;      // [visits][32]: uint16 multiplicity of each of the block's 64 keys
    unsigned long long *kused;  // [nl]: bit k = some visit selects key k of the block (the kernels
                                // load the other rows as zeros: a NaN there, e.g. a page slot no
                                // sequence uses, times dS = 0 would be NaN in dQ)
    float *lse2, *delta;  // [B, S1, N1]: LSE * log2(e) (+inf: no key), rowsum(dO O)
    unsigned long long *dq_i64;  // [B, S1, N1, D + Dr] dQ accumulator: int64 fixed point (deterministic)
    uint32_t *dq_flags;          // its non-finite flags, a byte per element (sfa_adds.cuh)
    float *dq_f32;               // or fp32 (deterministic = 0)
    const float *fix_scale_q;    // device scalar 2^Fq of the dQ fixed point
    int nkb, s1w;                // key blocks per (b, n2), 32-token words per list
    int dv;                      // columns of o / dout (Delta's row sums)
    int ww;                      // sfa_bwd_kmaj.cu: 32-token words per CTA window
};

}  // namespace sfa

// sfa_bwd_kmaj.cu: the main kernel for the shapes other than Mla (sfa::FwdShape values)
extern "C" cudaError_t spattn_sfa_bwd_kmaj_launch(const sfa::Params *p, const sfa::SmallLists *L, int is_bf16, int shape,
                                                  cudaStream_t st);
