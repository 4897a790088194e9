// Top-k sparse flash attention backward for Hopper (sm_90a), more than 32 query heads per key
// head: D = 512 (value / nope part) + Dr = 64 (rope), shared key/value (dV folded into dK's first
// 512 columns), any sbs, modes 0 and 3, GQA.
//
// One CTA = one query token (b, s1, n2) and 64 of its H = N1 / N2 heads (zero-padded; padded rows
// get LSE = +inf, so P = dS = 0).  Q (64 x 576) and dO (64 x 512) stay in shared memory for the
// whole index row; the selected keys come in blocks of 64 rows (576 columns), gathered by the
// producer warpgroup exactly as in the forward (sfa_gather.cuh: cp.async, zero-filled invalid
// slots, the block's key ids in shared memory).  Per block, two consumer warpgroups:
//   1. S = Q K^T and dP = dO V^T (V = K's first 512 columns), SS wgmma; warpgroup c takes keys
//      32c..32c+31 (m64n32: 68 k-steps each), so both hold fp32 P and dP of their keys and
//      dS = scale P (dP - Delta) is formed in fp32 before any rounding;
//   2. P and dS (bf16/fp16) go to two 64 x 64 tiles [key][head] in shared memory, transposed by
//      stmatrix (after a rendezvous: the other warpgroup has finished reading the previous block's);
//   3. dQ += dS K (A = dS MN-major, B = the key block MN-major), accumulated in registers over the
//      whole row and stored once: warpgroup 0 owns columns 0-255 (4 boxes), 1 owns 256-575 (5);
//   4. dKV = dS^T Q + P^T dO (A = the same tiles read K-major, B = Q / dO MN-major), one 64-key x
//      64-column box at a time (warpgroup 0: boxes 0-3 and the rope box 8; 1: boxes 4-7: 13 units
//      of 64 x 64 x 64 MMA each, with step 3), added to the per-key accumulator of sfa_host.cu:
//        deterministic: packed int32 fixed point (exact integer adds, order-free, bitwise
//        reproducible; sfa_adds.cuh add_box_p32);
//        deterministic = 0: fp32 red.global.add.v4 (one 16-byte add per lane pair and row).
//      The key buffer is released (to the producer's next gather) once both warpgroups' dQ GEMMs
//      have read it, so the next gather overlaps step 4.  Each warpgroup issues its first box's
//      GEMM before its dQ GEMM and that box's adds while dQ runs: adds overlap only tensor work
//      already queued (sfa runbook, "The adds taken apart": 0.97x the time with fp32 adds, 0.98x
//      deterministic, H200).
// Shared memory: Q 72 KB + dO 64 KB + one key block 72 KB + P, dS 16 KB = 224 KB: one key buffer
// (a second does not fit next to resident Q and dO).
// VL = true: the packed variable-length / paged form (sfa::Varlen, spattn_sfa_bwd_varlen; as
// sfa_fwd.cu's): a CTA = one packed token (B = 1, S1 = Tq over views with batch stride 0); its
// sequence's causal limit and first key row come from the pre-pass's table (one load per CTA,
// tokens past cu_seqlens_q[B] exit).  The producer's key ids are rows of the key side: packed
// row (first key row + sequence-local key) or page row (page * page_size + key % page_size, from
// the block table, sfa::Gather<T, true>), so the consumers' adds go to accumulator rows
// [key-side rows, N2, 576] with no other change (b = 0).  Only if-constexpr branches: the dense
// instantiation is unchanged.
// UN = true: the union form at H = 4 .. 32 heads per key head (the forward's groups, sfa_union.cu's
// plan): a CTA = a group of ug = 64 / H consecutive tokens of one (b, n2), row r = token
// s1 + r / H, head r % H; the blocks are the group's union (64 contiguous keys, or 64 packed
// keys of a compacted group), each row masked to its token's selection (P = dS = 0 elsewhere).
// Every MMA row is used and a key's dK / dV row is added once per group instead of once per
// token.  The plain form's CTAs of tokens whose group the union kernel took exit at once.
// VL and UN together (the varlen backward at H = 4 .. 32): groups of ug consecutive packed tokens
// of one sequence, blocks of 64 key-side rows (sfa_union.cu's VL plan), so the producer's key ids
// are rows already; rows of tokens past cu_seqlens_q[B] are zero and write nothing.
#include <type_traits>
#include <math.h>

#include "hopper/hopper.cuh"
#include "sfa_adds.cuh"
#include "sfa_gather.cuh"

namespace {

using sfa::Params;

constexpr int BH = 64;            // query heads per CTA (MMA rows)
constexpr int BK = sfa::GBK;      // keys per block
constexpr int NBOX = sfa::GNBOX;  // 9 boxes of 64 columns per Q / key row
constexpr int BOX = sfa::GBOX;    // one 64-row box: 8 KB
constexpr int OFF_Q = 0, OFF_DO = NBOX * BOX, OFF_K = OFF_DO + 8 * BOX, OFF_P = OFF_K + NBOX * BOX;
constexpr int OFF_DS = OFF_P + BOX, OFF_LSE = OFF_DS + BOX, OFF_DELTA = OFF_LSE + 64 * 4;
constexpr int UMAX = 16;  // UN: tokens per group at most (H >= 4)
constexpr int OFF_KEY = OFF_DELTA + 64 * 4, OFF_UMK = OFF_KEY + 2 * BK * 4, OFF_BAR = OFF_UMK + 2 * UMAX * 8;
constexpr int OFF_LAST = OFF_BAR + 6 * 8;
constexpr int SMEM = OFF_LAST + 16 + 1024;  // + alignment slack
static_assert(SMEM <= 232448, "fits in 227 KB");

// named barriers: NB_Q over the 256 consumer threads; NB_SCAN over all 384
enum { NB_Q = 1, NB_SCAN = 2 };

struct Smem {
    unsigned char *q, *dout, *k, *p, *ds;
    float *lse2, *delta;  // [64] per head row: LSE * log2(e) (+inf: P = 0), rowsum(dO O)
    int *key;             // [2][64] key ids of the block (-1: invalid slot), by block parity
    unsigned long long *umk;  // UN: [2][UMAX] the tokens' masks of the block (bit j: key j), by parity
    uint64_t *rdy, *vbar, *fre;  // rdy[2]: boxes 0-3 / 4-8 landed; vbar: key ids; fre: buffer free
    // the consumers' rendezvous around the P / dS tiles (256 arrivals each): pw, the previous
    // block's tiles are read; pr, this block's are written.  mbarriers, not named barriers: the
    // two warpgroups run different instantiations of consume (two PCs, which synccheck reports)
    uint64_t *pw, *pr;
    int *last;
};

// dO rows h < nh (zero past nh) into 8 boxes of 64 rows, by threads t0, t0 + stride, ...
template <typename T>
__device__ __forceinline__ void load_do(unsigned char *sdo, const Params &p, const T *dob, int head0, int nh, int t0,
                                        int stride) {
    for (int x = t0; x < BH * 64; x += stride) {
        const int h = x >> 6, ch = x & 63, ok = h < nh;
        const T *src = ok ? dob + (int64_t)(head0 + h) * p.sdo[2] + ch * 8 : dob;
        sfa::cp_async16(sdo + (ch >> 3) * BOX + hop::sw128(h, ch & 7), src, ok ? 16 : 0);
    }
}

// UN: dO rows r = token s1 + r / H, head head0 + r % H (rows of tokens past S1 zero; VL: also
// past cu_seqlens_q[B], whose dO may be anything)
template <typename T, bool VL>
__device__ __forceinline__ void load_do_union(unsigned char *sdo, const Params &p, int b, int s1, int head0, int t0,
                                              int stride) {
    const T *dob = static_cast<const T *>(p.dout) + b * p.sdo[0];
    for (int x = t0; x < BH * 64; x += stride) {
        const int r = x >> 6, ch = x & 63, tok = s1 + (r >> p.lg2h), ok = sfa::union_tok_ok<VL>(p, tok);
        const T *src = ok ? dob + (int64_t)tok * p.sdo[1] + (int64_t)(head0 + (r & (p.H - 1))) * p.sdo[2] + ch * 8 : dob;
        sfa::cp_async16(sdo + (ch >> 3) * BOX + hop::sw128(r, ch & 7), src, ok ? 16 : 0);
    }
}

// Consumer warpgroup C (0 or 1); see the file comment for the split of the work.
template <typename T, int C, bool UN, bool VL>
__device__ __forceinline__ void consume(const Params &p, const Smem &s, int nblk, int b, int n2, int s1, int head0,
                                        int nh) {
    const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31, q4 = lane & 3;
    const int r0 = warp * 16 + (lane >> 2);  // this thread's rows r0, r0 + 8 (heads, or keys in step 4)
    const float sl2 = p.scale_log2, scale = p.scale;
    const float l2a = s.lse2[r0], l2b = s.lse2[r0 + 8], da = s.delta[r0], db = s.delta[r0 + 8];
    // adds: packed int32 fixed point (deterministic: p.acc_bound set) or fp32 (sfa_adds.cuh)
    const bool det = p.acc_bound != nullptr;
    const float fs = det && p.fix_scale ? *p.fix_scale : 1.f;  // NULL: the probe's first pass
    const int64_t base = ((int64_t)b * p.S2 * p.N2 + n2) * sfa::DQK;  // accumulator row of key 0
    const int utA = UN ? r0 >> p.lg2h : 0, utB = UN ? (r0 + 8) >> p.lg2h : 0;  // UN: the rows' tokens

    constexpr int QB = C == 0 ? 0 : 4;  // first dQ box: boxes 0-3 (C = 0) or 4-7 plus 8 (C = 1)
    float dq[128], dqr[C == 1 ? 32 : 1];
#pragma unroll
    for (int i = 0; i < 128; i++) dq[i] = 0.f;
#pragma unroll
    for (int i = 0; i < (C == 1 ? 32 : 1); i++) dqr[i] = 0.f;

    const uint64_t qd = hop::desc_sw128(s.q, 16, 1024), dod = hop::desc_sw128(s.dout, 16, 1024);
    const uint64_t kd = hop::desc_sw128(s.k + C * 32 * 128, 16, 1024);   // this warpgroup's 32 keys
    // P and dS are stored transposed, [64 keys][64 rows]: K-major as the A of the dK / dV boxes
    // (dS^T Q, P^T dO), MN-major as the A of dQ = dS K
    const uint64_t dsd = hop::desc_sw128(s.ds, 16, 1024), pd = hop::desc_sw128(s.p, 16, 1024);  // K-major
    const uint64_t dsmn = hop::desc_sw128(s.ds, BOX, 1024);                                      // MN-major
    auto kmaj = [](uint64_t d, int kk) { return hop::desc_add(d, (kk >> 2) * BOX + (kk & 3) * 32); };
    auto mnmaj = [](uint64_t d, int kk) { return hop::desc_add(d, kk * 16 * 128); };  // 16 k-rows per step
    auto boxd = [](const unsigned char *tile, int box) { return hop::desc_sw128(tile + box * BOX, BOX, 1024); };

    for (int j = 0; j < nblk; j++) {
        const uint32_t ph = j & 1;
        const int *key = s.key + ph * BK;
        // ---- 1. S and dP of this warpgroup's 32 keys (boxes 0-3 first: the first half to land)
        float sa[16], dpa[16];
        hop::mbar_wait(s.rdy + 0, ph);
        hop::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) hop::elt<T>::template ssn<32, 0, 0>(sa, kmaj(qd, kk), kmaj(kd, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < 16; kk++) hop::elt<T>::template ssn<32, 0, 0>(dpa, kmaj(dod, kk), kmaj(kd, kk), kk > 0);
        hop::wgmma_commit();
        hop::mbar_wait(s.rdy + 1, ph);
        hop::wgmma_fence();
#pragma unroll
        for (int kk = 16; kk < 36; kk++) hop::elt<T>::template ssn<32, 0, 0>(sa, kmaj(qd, kk), kmaj(kd, kk), 1);
#pragma unroll
        for (int kk = 16; kk < 32; kk++) hop::elt<T>::template ssn<32, 0, 0>(dpa, kmaj(dod, kk), kmaj(kd, kk), 1);
        hop::wgmma_commit();
        hop::wgmma_wait<0>();
        hop::reg_fence(sa);
        hop::reg_fence(dpa);

        // ---- P = exp2(S scale log2e - LSE2), dS = scale P (dP - Delta); invalid keys: P = 0
        hop::mbar_wait(s.vbar, ph);
        uint32_t pk[8], dk[8];  // packed pairs: [2 j + h] = row r0 + 8 h, columns 8 j + 2 q4 (+1)
        // UN: each row its token's mask (rows r0, r0 + 8: tokens utA, utB)
        const unsigned long long wma = UN ? s.umk[ph * UMAX + utA] : 0ull, wmb = UN ? s.umk[ph * UMAX + utB] : 0ull;
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const int col = C * 32 + 8 * jj + 2 * q4;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const unsigned long long wm = h ? wmb : wma;
                const bool v0 = UN ? (wm >> col) & 1 : key[col] >= 0, v1 = UN ? (wm >> (col + 1)) & 1 : key[col + 1] >= 0;
                const float l2 = h ? l2b : l2a, dl = h ? db : da;
                const float p0 = v0 ? hop::ex2(sa[4 * jj + 2 * h] * sl2 - l2) : 0.f;
                const float p1 = v1 ? hop::ex2(sa[4 * jj + 2 * h + 1] * sl2 - l2) : 0.f;
                pk[2 * jj + h] = hop::elt<T>::pack(p0, p1);
                dk[2 * jj + h] = hop::elt<T>::pack(v0 ? scale * p0 * (dpa[4 * jj + 2 * h] - dl) : 0.f,
                                                   v1 ? scale * p1 * (dpa[4 * jj + 2 * h + 1] - dl) : 0.f);
            }
        }
        // ---- 2. into the shared tiles, once the other warpgroup has read the previous block's
        hop::mbar_arrive(s.pw);
        hop::mbar_wait(s.pw, ph);
        // stmatrix .trans: pk / dk[2 jj + h] is the 8 x 8 block of rows 16 warp + 8 h .. and keys
        // 8 jj .. of this warpgroup's 32; lane i addresses key row i % 8 of block i / 8 (16 bytes of rows)
        {
            const int m = lane >> 3;
#pragma unroll
            for (int jp = 0; jp < 2; jp++) {
                const uint32_t off = hop::sw128(C * 32 + 8 * (2 * jp + (m >> 1)) + (lane & 7), 2 * warp + (m & 1));
                hop::stmatrix_x4_trans(hop::smem_u32(s.p) + off, pk[4 * jp], pk[4 * jp + 1], pk[4 * jp + 2], pk[4 * jp + 3]);
                hop::stmatrix_x4_trans(hop::smem_u32(s.ds) + off, dk[4 * jp], dk[4 * jp + 1], dk[4 * jp + 2], dk[4 * jp + 3]);
            }
        }
        hop::fence_proxy_async();
        hop::mbar_arrive(s.pr);
        hop::mbar_wait(s.pr, ph);

        const int ka = key[r0], kb = key[r0 + 8];
        // ---- 4. dKV boxes: dS^T Q (+ P^T dO on the value columns), one 64-key x 64-column box at
        // a time; one straight-line group per kind of box, chosen at compile time (the P^T dO steps
        // under a run-time condition made ptxas add an empty m64n8 wgmma to every box)
        auto dkv = [&](float (&acc)[32], int box, auto value_box) {
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
                hop::elt<T>::template ss64<0, 1>(acc, hop::desc_add(dsd, kk * 32), mnmaj(boxd(s.q, box), kk), kk > 0);
            if constexpr (decltype(value_box)::value) {
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    hop::elt<T>::template ss64<0, 1>(acc, hop::desc_add(pd, kk * 32), mnmaj(boxd(s.dout, box), kk), 1);
            }
            hop::wgmma_commit();
        };
        float bma = 0.f, bmb = 0.f;  // packed int32: rows ka / kb's max |v| over the boxes
        auto add = [&](const float (&acc)[32], int box) {
            if (det) sfa::add_box_p32(p, acc, ka, kb, lane, base, box * 64, fs, bma, bmb);
            else sfa::add_box<0>(p, acc, ka, kb, lane, base, box * 64, fs);
        };
        {
            // the first box's GEMM, then 3. dQ += dS K (4 k-steps of 16 keys): the first box's adds
            // are issued while the tensor pipe runs dQ (adds overlap only queued tensor work;
            // runbook, "The adds taken apart"), and the key buffer is released once dQ is done
            float acc[32];
            dkv(acc, QB, std::true_type{});
            hop::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const uint64_t a = mnmaj(dsmn, kk);
                hop::elt<T>::template ss256<1, 1>(dq, a, mnmaj(boxd(s.k, QB), kk), 1);
                if constexpr (C == 1) hop::elt<T>::template ss64<1, 1>(dqr, a, mnmaj(boxd(s.k, 8), kk), 1);
            }
            hop::wgmma_commit();
            hop::wgmma_wait<1>();
            hop::reg_fence(acc);
            add(acc, QB);
            hop::wgmma_wait<0>();  // dQ has read the key buffer
            hop::mbar_arrive(s.fre);
        }
        // the other boxes: a loop, not unrolled (9 unrolled copies of the GEMM and add code
        // overflowed the instruction cache, ncu on sfa07); the adds branch once per box on the mode
#pragma unroll 1
        for (int i = 1; i < (C == 0 ? 5 : 4); i++) {
            const int box = C == 0 ? (i < 4 ? i : 8) : 4 + i;
            float acc[32];
            if (box < 8) dkv(acc, box, std::true_type{});
            else dkv(acc, 8, std::false_type{});  // the rope columns: no value part
            hop::wgmma_wait<0>();
            hop::reg_fence(acc);
            add(acc, box);
        }
        if (det) sfa::add_row_bound(p, ka, kb, lane, base, fs, bma, bmb);
        hop::reg_fence(dq);
        if constexpr (C == 1) hop::reg_fence(dqr);
    }

    if (p.acc_bound && !p.acc_p32) return;  // the probe pass (a sample of the blocks): no dQ
    // ---- dQ / dQ_rope, rows h < nh (UN: rows of tokens before S1, row -> (token, head))
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = r0 + 8 * h;
        const int tok = UN ? s1 + (row >> p.lg2h) : s1, hd = UN ? head0 + (row & (p.H - 1)) : head0 + row;
        if (UN ? !sfa::union_tok_ok<VL>(p, tok) : row >= nh) continue;
        T *dqb = static_cast<T *>(p.dq) + b * p.sdq[0] + (int64_t)tok * p.sdq[1];
        T *dqrb = static_cast<T *>(p.dqr) + b * p.sdqr[0] + (int64_t)tok * p.sdqr[1];
        T *d = dqb + (int64_t)hd * p.sdq[2] + QB * 64 + 2 * q4;
#pragma unroll
        for (int jj = 0; jj < 32; jj++)
            *reinterpret_cast<uint32_t *>(d + 8 * jj) = hop::elt<T>::pack(dq[4 * jj + 2 * h], dq[4 * jj + 2 * h + 1]);
        if constexpr (C == 1) {
            T *dr = dqrb + (int64_t)hd * p.sdqr[2] + 2 * q4;
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
                *reinterpret_cast<uint32_t *>(dr + 8 * jj) = hop::elt<T>::pack(dqr[4 * jj + 2 * h], dqr[4 * jj + 2 * h + 1]);
        }
    }
}

// VL: the producer's key ids as rows of the key side.  The gather is built with first key row 0
// (vl_gather), so a packed sequence-local key becomes its packed row here (the rows of a sequence
// are contiguous); with pages the table already gave the page row (first key row 0).
__device__ __forceinline__ void vl_key_rows(const int4 &tk, int (&key)[4]) {
#pragma unroll
    for (int r = 0; r < 4; r++)
        if (key[r] >= 0) key[r] += tk.y;
}
template <typename T, bool VL>
__device__ __forceinline__ sfa::Gather<T, VL> vl_gather(const Params &p, int b, int n2, int t, const int4 &tk) {
    if constexpr (VL) return sfa::Gather<T, VL>(p, n2, t, make_int4(tk.x, 0, tk.z, tk.w));
    else return sfa::Gather<T, VL>(p, b, n2, t);
}

template <typename T, bool VL, bool UN>
__global__ void __launch_bounds__(384, 1) sfa_bwd90_kernel(const __grid_constant__ Params p) {
    // under stream capture the index check's verdict is a device word (sfa_host.cu): a bad index
    // and the CTA writes nothing (its key ids are masked in range anyway); NULL otherwise
    if (sfa::gate_word(p.gate) != ~0ull) return;
    if (p.run_if && !*reinterpret_cast<const volatile int *>(p.run_if)) return;  // a retry pass not needed
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = hop::align1024(smem_raw);
    Smem s;
    s.q = sm + OFF_Q;
    s.dout = sm + OFF_DO;
    s.k = sm + OFF_K;
    s.p = sm + OFF_P;
    s.ds = sm + OFF_DS;
    s.lse2 = reinterpret_cast<float *>(sm + OFF_LSE);
    s.delta = reinterpret_cast<float *>(sm + OFF_DELTA);
    s.key = reinterpret_cast<int *>(sm + OFF_KEY);
    s.umk = reinterpret_cast<unsigned long long *>(sm + OFF_UMK);
    s.rdy = reinterpret_cast<uint64_t *>(sm + OFF_BAR);
    s.vbar = s.rdy + 2;
    s.fre = s.rdy + 3;
    s.pw = s.rdy + 4;
    s.pr = s.rdy + 5;
    s.last = reinterpret_cast<int *>(sm + OFF_LAST);

    const int ngroups = UN ? p.ungroups : (p.H + BH - 1) / BH;
    // the probe pass (sfa_host.cu): CTA x stands for CTA x probe_pt of the full grid and runs
    // blocks po, po + pb, po + 2 pb, .. of its row, po = x % pb (else pt = pb = 1, po = 0): the
    // first block rotates over the CTAs because sorted rows hold a key in about the same block of
    // every row (blocks 0, pb, .. alone overstated the rows of the smallest keys pb-fold: a retry
    // on every packed 32k-token varlen call, H200)
    const int pt = p.probe_pt > 1 ? p.probe_pt : 1, pb = p.probe_pb > 1 ? p.probe_pb : 1;
    const int po = (int)(blockIdx.x % pb);
    auto sampled = [&](int L) { return L > po ? (L - po + pb - 1) / pb : 0; };  // of a row's L blocks
    const int vx = (int)blockIdx.x * pt;
    // UN: the token group (longest first), s1 its first token
    const int s1 = UN ? (ngroups - 1 - vx) * p.ug : p.S1 - 1 - vx / ngroups;
    const int g = UN ? 0 : vx % ngroups;
    const int b = blockIdx.y / p.N2, n2 = blockIdx.y % p.N2;
    const int head0 = n2 * p.H + g * BH, nh = UN ? BH : min(BH, p.H - g * BH);
    const int64_t ugi = UN ? (int64_t)blockIdx.y * p.ungroups + ngroups - 1 - vx : 0;
    const int ucraw = UN ? __ldg(p.ucnt + ugi) : 0;  // -1: the plain form takes the group
    if (UN && ucraw < 0) return;
    const int ucnt = ucraw & ~sfa::UCOMPACT;
    // the plain form: a token whose group the union form took is done there
    if (!UN && p.ucnt && __ldg(p.ucnt + (int64_t)blockIdx.y * p.ungroups + (s1 >> (6 - p.lg2h))) >= 0) return;
    // VL: s1 is the packed token (b = 0, batch strides 0); tokens past cu_seqlens_q[B] exit
    sfa::TokenRow tr;
    if (!sfa::token_row<VL>(p, b, n2, s1, tr)) return;
    const int4 tk = tr.tk;
    const int lim = tr.lim;
    const int32_t *irow = tr.irow;
    const int64_t si3 = tr.si3;
    const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0), t = threadIdx.x & 127;

    if (threadIdx.x == 0) {
        hop::mbar_init(s.rdy + 0, 128);
        hop::mbar_init(s.rdy + 1, 128);
        hop::mbar_init(s.vbar, 16);
        hop::mbar_init(s.fre, 256);
        hop::mbar_init(s.pw, 256);
        hop::mbar_init(s.pr, 256);
        *s.last = -1;
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // ------------------------------------------------------------------ producer
        hop::setmaxnreg_dec<40>();
        const sfa::Gather<T, VL> gat = vl_gather<T, VL>(p, b, n2, t, tk);
        int nb = UN ? sampled(ucnt) : 1;  // block po is gathered before the scan's answer (harmless when there is none)
        for (int j = 0; j < nb; j++) {
            int key[4];
            const int jb = po + j * pb;  // the row's block (the probe: every pb-th)
            if constexpr (UN) {
                if (ucraw & sfa::UCOMPACT) {  // the union's keys, 64 per block (-1 past the last)
                    const int *kl = p.ukey + (ugi * p.ucap + jb) * BK + gat.grp;
#pragma unroll
                    for (int r = 0; r < 4; r++) key[r] = __ldg(kl + 16 * r);
                } else {  // 64 contiguous keys; those no token of the group selects zero-filled
                          // (a NaN row times dS = 0 would be NaN in dQ)
                    const int k0 = __ldg(p.ublk + ugi * p.ucap + jb) * BK + gat.grp;
                    unsigned long long u = 0ull;
                    for (int tt = 0; tt < p.ug; tt++) u |= __ldg(p.umask + (ugi * p.ucap + jb) * p.ug + tt);
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        key[r] = k0 + 16 * r < (VL ? p.vl.rows : p.S2) && ((u >> (gat.grp + 16 * r)) & 1) ? k0 + 16 * r : -1;
                }
            } else {
                gat.keys(p, irow, si3, jb, lim, key);
            }
            if constexpr (VL && !UN) vl_key_rows(tk, key);  // UN + VL: the plan's keys are key-side rows
            if (j > 0) hop::mbar_wait(s.fre, (j - 1) & 1);
            gat.copy(s.k, key, 0, 4);
            hop::cp_async_arrive_noinc(s.rdy + 0);
            gat.copy(s.k, key, 4, NBOX);
            hop::cp_async_arrive_noinc(s.rdy + 1);
            if (gat.ig == 0) {
#pragma unroll
                for (int r = 0; r < 4; r++) s.key[(j & 1) * BK + gat.grp + 16 * r] = key[r];
                if (UN && gat.grp < p.ug) s.umk[(j & 1) * UMAX + gat.grp] = __ldg(p.umask + (ugi * p.ucap + jb) * p.ug + gat.grp);
                hop::mbar_arrive(s.vbar);
            }
            if (!UN && j == 0) {
                hop::bar_sync(NB_SCAN, 384);
                const int last = *s.last;
                nb = last < 0 ? 0 : sampled(last / BK + 1);
            }
        }
        sfa::cp_async_wait<0>();
        return;
    }

    // ------------------------------------------------------------------------------- consumers
    hop::setmaxnreg_inc<232>();
    const int c = wg - 1, tc = t + c * 128;
    const T *qb = static_cast<const T *>(p.q) + b * p.sq[0] + (int64_t)s1 * p.sq[1];
    const T *qrb = static_cast<const T *>(p.qr) + b * p.sqr[0] + (int64_t)s1 * p.sqr[1];
    const T *dob = static_cast<const T *>(p.dout) + b * p.sdo[0] + (int64_t)s1 * p.sdo[1];
    if constexpr (UN) {
        load_do_union<T, VL>(s.dout, p, b, s1, head0, tc, 256);
        sfa::load_q_union<T, VL>(s.q, p, b, s1, head0, tc, 256);  // commits both copies' group
    } else {
        load_do<T>(s.dout, p, dob, head0, nh, tc, 256);
        sfa::load_q<T>(s.q, BH, p, qb, qrb, head0, nh, tc, 256);  // commits both copies' group
        sfa::prescan_last(p, irow, si3, lim, tc, 256, s.last);
    }
    {
        // Delta = rowsum(dO O) in fp32 (4 threads per head row, 128 columns each) and LSE * log2(e)
        // (UN: row h = token s1 + h / H, head h % H)
        const int h = tc >> 2, part = tc & 3;
        const int tok = UN ? s1 + (h >> p.lg2h) : s1, hd = UN ? head0 + (h & (p.H - 1)) : head0 + h;
        const bool hv = UN ? sfa::union_tok_ok<VL>(p, tok) : h < nh;
        float sum = 0.f;
        if (hv) {
            const T *orow = static_cast<const T *>(p.o) + b * p.so[0] + (int64_t)tok * p.so[1] + (int64_t)hd * p.so[2];
            const T *drow = static_cast<const T *>(p.dout) + b * p.sdo[0] + (int64_t)tok * p.sdo[1] + (int64_t)hd * p.sdo[2];
#pragma unroll 4
            for (int x = 0; x < 16; x++) {
                const int col = part * 128 + x * 8;
                const uint4 ov = *reinterpret_cast<const uint4 *>(orow + col);
                const uint4 dv = *reinterpret_cast<const uint4 *>(drow + col);
                const uint32_t *oe = reinterpret_cast<const uint32_t *>(&ov);
                const uint32_t *de = reinterpret_cast<const uint32_t *>(&dv);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 a = hop::elt<T>::unpack(oe[e]), d = hop::elt<T>::unpack(de[e]);
                    sum += a.x * d.x + a.y * d.y;
                }
            }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (part == 0) s.delta[h] = sum;
        if (part == 1) {
            float l2 = INFINITY;  // padded rows and rows without a valid key: P = 0
            if (hv) {
                const float lse = p.lse_in[b * p.slse[0] + (int64_t)tok * p.slse[1] + (int64_t)hd * p.slse[2]];
                if (lse > -INFINITY) l2 = lse * 1.4426950408889634f;
            }
            s.lse2[h] = l2;
        }
    }
    sfa::cp_async_wait<0>();
    hop::fence_proxy_async();
    hop::bar_sync(NB_Q, 256);
    const int last = *s.last;
    const int nblk = UN ? sampled(ucnt) : last < 0 ? 0 : sampled(last / BK + 1);
    if (p.probe_cnt && tc == 0) {  // the probe's share of the blocks (integer sums: deterministic)
        atomicAdd(p.probe_cnt, (unsigned long long)(UN ? ucnt : last < 0 ? 0 : last / BK + 1));
        atomicAdd(p.probe_cnt + 1, (unsigned long long)nblk);
    }
    if (!UN) hop::bar_arrive(NB_SCAN, 384);
    if (c == 0) consume<T, 0, UN, VL>(p, s, nblk, b, n2, s1, head0, nh);
    else consume<T, 1, UN, VL>(p, s, nblk, b, n2, s1, head0, nh);
}

template <typename T, bool VL, bool UN = false> cudaError_t launch(const Params &p, cudaStream_t st) {
    static unsigned long long done = 0;
    const cudaError_t e = hop::set_smem(sfa_bwd90_kernel<T, VL, UN>, SMEM, &done);
    if (e != cudaSuccess) return e;
    const int ngroups = (p.H + BH - 1) / BH;
    // VL: S1 = Tq, B = 1; UN: one CTA per token group
    const long long pt = p.probe_pt > 1 ? p.probe_pt : 1;
    dim3 grid((unsigned)(((UN ? (long long)p.ungroups : (long long)p.S1 * ngroups) + pt - 1) / pt), (unsigned)(p.B * p.N2));
    sfa_bwd90_kernel<T, VL, UN><<<grid, 384, SMEM, st>>>(p);
    return cudaGetLastError();
}

}  // namespace

// Launcher used by sfa_host.cu (the accumulator and fix_scale of p are set; p->vl.tok set: the
// varlen form, the accumulator's rows are the key side's rows).
extern "C" cudaError_t spattn_sfa_bwd90_launch(const sfa::Params *p, int is_bf16, cudaStream_t st) {
    if (p->vl.tok) return is_bf16 ? launch<__nv_bfloat16, true>(*p, st) : launch<__half, true>(*p, st);
    return is_bf16 ? launch<__nv_bfloat16, false>(*p, st) : launch<__half, false>(*p, st);
}

// The union form (p->ucnt set by sfa_union.cu's plan, H = 4 .. 32; p->vl.tok set: the varlen form,
// groups of packed tokens over key-side rows): the groups it took; spattn_sfa_bwd90_launch
// afterwards runs the tokens of the others.
extern "C" cudaError_t spattn_sfa_union_bwd_launch(const sfa::Params *p, int is_bf16, cudaStream_t st) {
    if (p->vl.tok) return is_bf16 ? launch<__nv_bfloat16, true, true>(*p, st) : launch<__half, true, true>(*p, st);
    return is_bf16 ? launch<__nv_bfloat16, false, true>(*p, st) : launch<__half, false, true>(*p, st);
}
