// Tile shapes of the block-sparse attention CUDA kernels, chosen in this one file by small pure
// functions (usable on the host and as compile-time constants in the kernels).
//
//   dpad(D)        head dim padded to the kernel's width (64 or 128; 0 = no fast kernel)
//   fwd90 tile     bm query rows (64 per consumer warpgroup) x bn keys per step, ring depth
//   dq tile        bm query rows (16 * mt per warp) x bn keys per step
//   dkdv tile      bn keys (16 per warp) x bm query rows per step
//   *_choose       the configuration for a problem (by its block sizes)
//
// On-chip capacity (fp16/bf16, dp = 128): fwd  Q 32 KB + K,V 2 stages 32-64 KB; dq  Q, dO
// 32-64 KB + K,V 2 stages 32-64 KB; dkdv K, V 32 KB + Q, dO 2 stages 64 KB: two CTAs per SM
// (228 KB).  Registers per thread stay under 255 (mma.sync keeps the O / dQ / dK+dV
// accumulators in registers: 64 fp32 per 16 x 128 tile per warp).
#ifndef SPATTN_BSA_TILES_H
#define SPATTN_BSA_TILES_H

#ifdef __CUDACC__
#define BSA_HD __host__ __device__ constexpr
#else
#define BSA_HD static inline
#endif

typedef struct bsa_tile {
    int bm;     // query rows per tile
    int bn;     // keys per tile
    int warps;  // warps per CTA
    int mt;     // 16-row mma tiles per warp (forward: each K/V fragment feeds mt mmas)
} bsa_tile;

// Padded head dim of the fast kernels; 0 when D needs the simple path.
BSA_HD int bsa_dpad(long long D) { return D <= 64 ? 64 : (D <= 128 ? 128 : 0); }

// Hopper forward (bsa_fwd.cu): bm query rows (64 per consumer warpgroup, 2 consumers) x bn keys
// per step, K and V each in a ring of `stages` shared-memory buffers.
// Shared memory (2-byte elements): Q 2 buffers of bm*dp*2 + (K + V) 2*stages*bn*dp*2 = 64 + 128 KB
// at dp 128, stages 2; 32 + 96 KB at dp 64, stages 3.  One persistent CTA of 384 threads per SM.
typedef struct bsa_fwd90_tile {
    int bm, bn, stages;
} bsa_fwd90_tile;
BSA_HD bsa_fwd90_tile bsa_fwd90_tile_for(int dp) {
    return dp == 128 ? bsa_fwd90_tile{128, 128, 2} : bsa_fwd90_tile{128, 128, 3};
}
// Key chunk of the Hopper forward's packed K/V tiles: the largest of 128, 64, 32 dividing the
// (clamped) mask block width by, or 16 when by is 16, so a chunk never straddles a mask block
// column ("chunked": each chunk has one mask bit per block row).  Otherwise 128: plain aligned
// tiles with a per-token mask on partial tiles.  Measured (H200): by = 80 as 16-key chunks ran
// 0.73x of aligned 128-key tiles (causal 48 x 80), hence no 16-key chunks for by = 48, 80, ...
BSA_HD int bsa_fwd90_chunk(long long by) {
    return by % 128 == 0 ? 128 : by % 64 == 0 ? 64 : by % 32 == 0 ? 32 : by == 16 ? 16 : 128;
}
// 1 when the forward's schedule carries, per chunk, the mask bits of the query tile's block
// rows (at most 32: bx >= 5 with 128-row tiles), so partial tiles need no mask reads; else the
// kernel reads the mask per token.
BSA_HD int bsa_fwd90_rowbits(long long bx, long long by, int chunk) {
    return by % chunk == 0 && bx >= 5;
}



// Hopper backward (bsa_bwd.cu): a key tile's list of (group head, query tile) pairs longer than
// bsa_bwd90_chunk() entries and more than twice the shortest list of the key tiles within 2 of it
// is split over several CTAs (chunks in list order); the partial dK / dV of a split row are summed
// in chunk order through an fp32 buffer (deterministic).  Without it one CTA walks a global key
// column (every query tile) while the others finish early.  bsa_bwd90_splits(): CTAs per key tile (at most 4: a CTA whose chunk is empty still
// takes an SM slot for a moment, and the grid is sized for the longest possible list);
// bsa_bwd90_chunk(): list entries per chunk (at least 32 steps, so a split pays for its extra
// K / V load and fp32 partial).
BSA_HD int bsa_bwd90_splits(long long G, long long nqt) {
    const long long n = G * nqt;
    return n <= 32 ? 1 : (n <= 128 ? (int)((n + 31) / 32) : 4);
}
BSA_HD int bsa_bwd90_chunk(long long G, long long nqt) {
    const long long n = G * nqt, s = bsa_bwd90_splits(G, nqt);
    return (int)((n + s - 1) / s);
}
// The split rows' fp32 dK / dV sums (2 x 128 keys x dp each) live in slots: at most
// bsa_bwd90_split_slots() of them (64 MiB at dp = 128; the same count at dp = 64, so that a plan,
// built before D is known, holds the slot choice), given to the first rows (in row order) that split;
// later candidates run unsplit (spattn_bsa_launch_bwd90 assigns them on the device, so the
// choice is deterministic).  A slot per key tile cost 1.3 GB on a 32-sequence 32K-token varlen
// batch, and its stream-ordered allocation outweighed the kernel (H200, 12.1 ms vs 2.9 ms).
BSA_HD long long bsa_bwd90_split_slots(long long G, long long nqt, long long key_rows, int dp) {
    (void)dp;
    const long long cap = (64ll << 20) / (2ll * 128 * 128 * 4);
    return bsa_bwd90_splits(G, nqt) > 1 ? (key_rows < cap ? key_rows : cap) : 0;
}
BSA_HD long long bsa_bwd90_kvbuf_bytes(long long G, long long nqt, long long key_rows, int dp) {
    return bsa_bwd90_split_slots(G, nqt, key_rows, dp) * 2 * 128 * dp * 4;
}
// The backward's semaphore area in bytes (zeroed by the Delta kernel): per dQ accumulator tile
// its order / claim semaphore, per key tile a split row's chunk counter and its slot, per
// accumulator tile its count of landed adds (the non-deterministic mode's; bsa_bwd.cu).
BSA_HD long long bsa_bwd90_sem_bytes(long long acc_tiles, long long key_rows) {
    return (2 * acc_tiles + 2 * key_rows) * 4;
}

#endif
