// Tile shapes of the block-sparse attention CUDA kernels, chosen in this one file by small pure
// functions (usable on the host and as compile-time constants in the kernels).
//
//   dpad(D)        head dim padded to the kernel's width (64 or 128; 0 = no fast kernel)
//   fwd tile       bm query rows (16 per warp) x bn keys per step
//   dq tile        bm query rows (16 per warp) x bn keys per step
//   dkdv tile      bn keys (16 per warp) x bm query rows per step
//
// On-chip capacity (fp16/bf16, dp = 128): fwd  Q 32 KB + K,V 2 stages 64 KB = 96 KB;
// dq  Q, dO 32 KB + K,V 2 stages 64 KB = 96 KB; dkdv K, V 32 KB + Q, dO 2 stages 64 KB = 97 KB:
// two CTAs per SM (228 KB).  Registers per thread stay under 255 (O / dQ / dK+dV accumulators
// 64..128 fp32, one 16 x bn score tile and one 16 x bn dP tile).
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
} bsa_tile;

// Padded head dim of the fast kernels; 0 when D needs the simple path.
BSA_HD int bsa_dpad(long long D) { return D <= 64 ? 64 : (D <= 128 ? 128 : 0); }

// Forward: 8 warps x 16 query rows share each K/V tile (halves K/V traffic per query vs 64-row
// tiles); 64 keys per step keeps the score tile at 32 registers.
BSA_HD bsa_tile bsa_fwd_tile(int dp) { return bsa_tile{128, 64, 8}; (void)dp; }
// dQ: 4 warps x 16 query rows, 64 keys per step (Q and dO stay in shared memory).
BSA_HD bsa_tile bsa_dq_tile(int dp) { return bsa_tile{64, 64, 4}; (void)dp; }
// dK/dV: 4 warps x 16 keys (dK + dV accumulators 2 x 64 registers at dp = 128), 64 query rows
// per step.
BSA_HD bsa_tile bsa_dkdv_tile(int dp) { return bsa_tile{64, 64, 4}; (void)dp; }

#endif
