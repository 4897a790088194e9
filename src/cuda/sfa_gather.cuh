// Pieces shared by the two Hopper sfa forwards (sfa_fwd.cu: 64 heads per CTA, sfa_fwd_small.cu:
// H <= 32): the selected-key gather of the producer warpgroup, the consumers' pre-scan of the
// index row and their load of the token's Q rows.  All write the 128-byte-swizzled layout wgmma
// reads: 64-column boxes (128-byte rows), chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4).
#pragma once
#include "hopper/hopper.cuh"
#include "sfa_common.cuh"

namespace sfa {

constexpr int GBK = 64;             // selected keys per gathered block
constexpr int GNBOX = DQK / 64;     // 9 boxes of 64 columns per key row (8 nope + 1 rope)
constexpr int GBOX = GBK * 128;     // one box of a block

// The column layout of a gathered block, in 64-column boxes: NBN boxes of k's value / nope part
// (D = 64 NBN), NBR of k_rope (Dr = 64 NBR), then, when V is a separate tensor, NBN boxes of v
// (else V is k's first D columns).  Mla: the DeepSeek shape every fast kernel takes; the
// small-head forward also takes separate-V shapes (Sep): Nsa (D 128, no rope: NSA-style
// selection), and D 128 + Dr 64 (NSA's d_k 192 / d_v 128), D 64 (Dr 0 or 64), D 192 (Dr 0 or 64), D 256.
template <int NBN_, int NBR_, bool SEPV_, bool PAD_ = false> struct Shape {
    static constexpr int NBN = NBN_, NBR = NBR_, NBK = NBN + NBR;  // NBK: the score's columns
    static constexpr bool SEPV = SEPV_;
    static constexpr int NBT = NBK + (SEPV ? NBN : 0);  // boxes per gathered block
    static constexpr int D = 64 * NBN, DR = 64 * NBR;
    // PAD (PadOf): the last value box and the rope box may be partial: the call's D
    // (Params::dn) in 64 (NBN - 1) + 8 .. 64 NBN, its Dr (Params::dr) in 8 .. 64 (NBR 1), the
    // columns past them zero-filled.  A separate instantiation, taken only by calls whose D or Dr
    // is not a whole box count: the tests cost the small-head forward 1.08x the time on
    // sfa_shapes.cases where nothing is partial (H200, 2026-12-05: the gather's address selects
    // nearly doubled its instructions per block).
    static constexpr bool PADV = PAD_;
    static_assert(NBR <= 1, "one rope box at most (Dr <= 64)");
    // the box holding V's columns 64 d .. 64 d + 63
    static __host__ __device__ constexpr int vbox(int d) { return SEPV ? NBK + d : d; }
};
using Mla = Shape<8, 1, false>;
// the same shape with partial last boxes (Params::dn / dr below its widths)
template <class S> using PadOf = Shape<S::NBN, S::NBR, S::SEPV, true>;
// whether the call needs the PadOf instantiation of S (host and device)
template <class S> __host__ __device__ inline bool padded(const Params &p) {
    return p.dn != S::D || (S::NBR == 1 && p.dr != S::DR);
}
template <int NBN, int NBR> using Sep = Shape<NBN, NBR, true>;
using Nsa = Sep<2, 0>;
// shared V (V = k's first D columns) at other widths: D 64 / 128 / 192 / 256, with or without the
// 64-wide rope part
template <int NBN, int NBR> using Shv = Shape<NBN, NBR, false>;
// The forward's kernel shapes (sfa_host.cu's fwd_shape chooses, sfa_fwd_small.cu's launcher
// instantiates): Mla (both forward kernels), then the separate-V and the other shared-V ones of
// the small-head kernel
enum FwdShape {
    SHAPE_MLA,
    SHAPE_NSA,
    SHAPE_SEP_128_64,
    SHAPE_SEP_64,
    SHAPE_SEP_256,
    SHAPE_SHV_128_64,
    SHAPE_SHV_128,
    SHAPE_SHV_256_64,
    SHAPE_SHV_256,
    SHAPE_SEP_64_64,  // from here on gated in fwd_shape (not yet run on a GPU)
    SHAPE_SEP_192,
    SHAPE_SEP_192_64,
    SHAPE_SHV_64,  // shared V with an odd count of value boxes (D 64 / 192, Dr 0 / 64)
    SHAPE_SHV_64_64,
    SHAPE_SHV_192,
    SHAPE_SHV_192_64,
    SHAPE_SEP_256_64
};
static_assert(Mla::NBK == GNBOX, "the Mla shape is the fast kernels' D + Dr");

// One producer thread's share of a block gather: 128 threads, 8 per key row (16-byte chunk ig of
// each box), rows grp + 16 r (r < 4).  Invalid slots (-1, out of range, past the causal limit)
// are zero-filled (src-size 0), never read.
// VL (varlen calls, Params::vl): a selected key is sequence-local; keys() turns it into a row of
// k: the base pointer starts at the sequence's first key row (packed keys), or the row comes from
// the block table (pages; k viewed as [num_pages * page_size] rows, the host checked that the
// page stride is page_size rows).  Only the row numbers change: copy() is the dense one.
template <typename T, bool VL = false, typename S = Mla> struct Gather {
    const T *kb, *krb, *vb;
    int64_t sk1, skr1, sv1;
    int grp, ig;
    bool lastin, ropein;  // this thread's chunk of the last value box lies before dn, of the
                          // rope box before dr (S::PADV)
    const int32_t *trow;  // VL with pages: the sequence's block-table row (else NULL)
    // the thread's column in a part w columns wide (value: dn, rope: dr): chunk ig, or 0 when the
    // chunk lies past a w < 64 (never read, but the zero-filled copies' addresses stay in the row)
    static __device__ __forceinline__ int col(int ig, int w) { return !S::PADV || ig * 8 < w ? ig * 8 : 0; }
    __device__ __forceinline__ Gather(const Params &p, int b, int n2, int t) {
        grp = t >> 3;
        ig = t & 7;
        lastin = (S::NBN - 1) * 64 + ig * 8 < p.dn;
        ropein = ig * 8 < p.dr;
        kb = static_cast<const T *>(p.k) + b * p.sk[0] + n2 * p.sk[2] + col(ig, p.dn);
        krb = static_cast<const T *>(p.kr) + b * p.skr[0] + n2 * p.skr[2] + col(ig, p.dr);
        vb = static_cast<const T *>(p.v) + b * p.sv[0] + n2 * p.sv[2] + col(ig, p.dn);
        sk1 = p.sk[1];
        skr1 = p.skr[1];
        sv1 = p.sv[1];
        trow = nullptr;
    }
    // VL: tk = the token's Params::vl.tok entry {sequence, first key row, keys, limit}
    __device__ __forceinline__ Gather(const Params &p, int n2, int t, const int4 &tk) {
        grp = t >> 3;
        ig = t & 7;
        lastin = (S::NBN - 1) * 64 + ig * 8 < p.dn;
        ropein = ig * 8 < p.dr;
        sk1 = p.sk[1];
        skr1 = p.skr[1];
        kb = static_cast<const T *>(p.k) + (int64_t)tk.y * sk1 + n2 * p.sk[2] + col(ig, p.dn);
        krb = static_cast<const T *>(p.kr) + (int64_t)tk.y * skr1 + n2 * p.skr[2] + col(ig, p.dr);
        sv1 = p.sv[1];
        vb = static_cast<const T *>(p.v) + (int64_t)tk.y * sv1 + n2 * p.sv[2] + col(ig, p.dn);
        trow = p.vl.table ? p.vl.table + (int64_t)tk.x * p.vl.tab_s0 : nullptr;
    }
    // keys of this thread's rows of block `blk` (-1: invalid); the four loads together, or one
    // after the other (Serial: the small-head forward, see key_of_serial)
    template <bool Serial = false>
    __device__ __forceinline__ void keys(const Params &p, const int32_t *irow, int64_t si3, int blk, int lim,
                                         int (&key)[4]) const {
#pragma unroll
        for (int r = 0; r < 4; r++)
            key[r] = Serial ? key_of_serial(p, irow, si3, blk * GBK + grp + 16 * r, lim)
                            : key_of(p, irow, si3, blk * GBK + grp + 16 * r, lim);
        if constexpr (VL) {
            if (trow) {
                // page of the key, then its row; an id outside [0, num_pages) (a table the
                // device check refuses: nothing is written then) only masks the key, so no read
                // leaves k
                const unsigned ps = (unsigned)p.vl.page_size;
#pragma unroll
                for (int r = 0; r < 4; r++)
                    if (key[r] >= 0) {
                        const unsigned u = (unsigned)key[r], slot = u / ps;
                        const int pg = __ldg(trow + (int64_t)slot * p.vl.tab_s1);
                        key[r] = (unsigned)pg < (unsigned)p.vl.num_pages ? pg * (int)ps + (int)(u - slot * ps) : -1;
                    }
            }
        }
    }
    // boxes [box0, box1) of this thread's rows into the block at dst; keys are reused by many
    // query tokens: 256-byte L2 sectors (a row's neighbouring box comes with it).  A chunk of a
    // last value box past dn or of the rope box past dr is zero-filled from the row's first chunk
    // of the same part (not read).
    __device__ __forceinline__ void copy(unsigned char *dst, const int (&key)[4], int box0, int box1) const {
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = grp + 16 * r, ok = key[r] >= 0;
            const T *nope = kb + (int64_t)(ok ? key[r] : 0) * sk1;
            const T *rope = krb + (int64_t)(ok ? key[r] : 0) * skr1;
            const T *val = S::SEPV ? vb + (int64_t)(ok ? key[r] : 0) * sv1 : nope;
#pragma unroll
            for (int x = box0; x < box1; x++) {
                const bool part = S::PADV && (x == S::NBN - 1 || (S::SEPV && x == S::NBK + S::NBN - 1));
                const bool rpart = S::PADV && S::NBR == 1 && x == S::NBN;
                const bool in = rpart ? ropein : !part || lastin;
                const T *src = x < S::NBN ? nope + x * 64 : x < S::NBK ? rope + (x - S::NBN) * 64 : val + (x - S::NBK) * 64;
                if (!in) src = x < S::NBN ? nope : x < S::NBK ? rope : val;
                asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(
                                 hop::smem_u32(dst + x * GBOX + hop::sw128(row, ig))),
                             "l"(src), "r"(ok && in ? 16 : 0)
                             : "memory");
            }
        }
    }
    // the block's valid flags (one thread of each row group writes them)
    __device__ __forceinline__ void flags(uint8_t *valid, const int (&key)[4]) const {
#pragma unroll
        for (int r = 0; r < 4; r++) valid[grp + 16 * r] = key[r] >= 0;
    }
};

// The last valid slot of an index row (-1: none), for the threads t0, t0 + stride, ... of whole
// warps: each warp's maximum goes into *s_last by atomicMax.  Rows whose remaining slots are all
// invalid end the consumers' loops there, so padded tails cost nothing.
__device__ __forceinline__ void prescan_last(const Params &p, const int32_t *irow, int64_t si3, int lim, int t0,
                                             int stride, int *s_last) {
    const int kmax = min(p.S2 - 1, lim);
    int last = -1;
    for (int e = t0; e < p.K; e += stride) {
        const int bi = __ldg(irow + e * si3);
        if (bi >= 0 && bi < p.nblk) {
            const long long k0 = (long long)bi << p.log2sbs;
            if (k0 <= kmax) last = max(last, (e << p.log2sbs) + (int)min((long long)p.sbs - 1, kmax - k0));
        }
    }
    for (int x = 16; x > 0; x >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, x));
    if ((threadIdx.x & 31) == 0 && last >= 0) atomicMax(s_last, last);
}
__device__ __forceinline__ int npairs_of(int last) { return last < 0 ? 0 : last / (2 * GBK) + 1; }

// The token's Q rows h < rows (zero past nh, past column dn, past rope column dr) into S::NBK boxes of `rows` rows (box stride
// rows * 128; or, with boxrows > 0, as rows row0 .. row0 + rows - 1 of boxes of boxrows rows: several tokens' rows
// side by side), by threads t0, t0 + stride, ...; one cp.async group (the caller waits).
template <typename T, typename S = Mla>
__device__ __forceinline__ void load_q(unsigned char *sQ, int rows, const Params &p, const T *qb, const T *qrb, int head0,
                                       int nh, int t0, int stride, int row0 = 0, int boxrows = 0) {
    const int bstride = (boxrows > 0 ? boxrows : rows) * 128;
    for (int x = t0; x < rows * S::NBK * 8; x += stride) {
        // chunks of the value part past dn and of the rope part past dr (partial boxes) zero-filled
        const int h = x / (S::NBK * 8), ch = x % (S::NBK * 8);
        const int ok = h < nh && (!S::PADV || (ch < 8 * S::NBN ? ch * 8 < p.dn : (ch - 8 * S::NBN) * 8 < p.dr));
        const T *src = !ok ? qb : ch < 8 * S::NBN ? qb + (int64_t)(head0 + h) * p.sq[2] + ch * 8
                                                  : qrb + (int64_t)(head0 + h) * p.sqr[2] + (ch - 8 * S::NBN) * 8;
        cp_async16(sQ + (ch >> 3) * bstride + hop::sw128(row0 + h, ch & 7), src, ok ? 16 : 0);
    }
    cp_async_commit();
}

// The union forms' Q (sfa_fwd.cu, sfa_bwd90.cu UN): 64 rows, row r = token s1 + (r >> lg2h), head
// head0 + (r & (H - 1)), Mla columns; rows of tokens past S1 (VL: or past cu_seqlens_q[B])
// zero-filled.  One cp.async group.
template <typename T, bool VL = false>
__device__ __forceinline__ void load_q_union(unsigned char *sQ, const Params &p, int b, int s1, int head0, int t0,
                                             int stride) {
    const T *q = static_cast<const T *>(p.q) + b * p.sq[0], *qr = static_cast<const T *>(p.qr) + b * p.sqr[0];
    for (int x = t0; x < 64 * GNBOX * 8; x += stride) {
        const int r = x / (GNBOX * 8), ch = x % (GNBOX * 8);
        const int tok = s1 + (r >> p.lg2h), h = head0 + (r & (p.H - 1)), ok = union_tok_ok<VL>(p, tok);
        const T *src = !ok ? q : ch < 64 ? q + (int64_t)tok * p.sq[1] + (int64_t)h * p.sq[2] + ch * 8
                                         : qr + (int64_t)tok * p.sqr[1] + (int64_t)h * p.sqr[2] + (ch - 64) * 8;
        cp_async16(sQ + (ch >> 3) * (64 * 128) + hop::sw128(r, ch & 7), src, ok ? 16 : 0);
    }
    cp_async_commit();
}

}  // namespace sfa
