#!/usr/bin/env python3
"""Upper bounds for the NSA-like forward (issue 12: sbs 64, D 128, separate V, 16 heads per key head,
K 16 blocks, S 8192, mode 3) under the suite's index generation (cases/README.md: the newest block
always, the others uniform over the allowed ones), for three kernel forms and two variants of the
third (3', 3'').  A model, not a measurement: the rates it takes are measured elsewhere (runbook,
"Design space of the NSA-like bar").
  python3 bench/models/nsa_reuse.py [S] [K] [H]
"""
import random
import sys

S = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
K = int(sys.argv[2]) if len(sys.argv) > 2 else 16
H = int(sys.argv[3]) if len(sys.argv) > 3 else 16
GATHER_TBS = 9.0      # measured L2 -> shared copy ceiling of 64-row gathers, TB/s (H200)
PADDED_TF = 550.0     # 64-row tile rate on padded work (the union forward at density 1: 572-592)
SMEM_BPC = 128.0      # shared-memory bytes per SM clock
MMA_FPC = 4096.0      # dense bf16 FLOP per SM clock (989 TFLOP/s / 132 SMs / 1.83 GHz)
CLK, SMS = 1.83e9, 132
BLK = 64 * 128 * 2 * 2  # K and V bytes of one 64-key block

random.seed(1)
def sel(t):
    r = t // 64 + 1  # allowed blocks (mode 3, S1 = S2)
    if r <= K:
        return set(range(r))
    s = set(random.sample(range(r - 1), K - 1))
    s.add(r - 1)
    return s

sels = [sel(t) for t in range(S)]
pairs = sum(len(s) for s in sels)  # (token, block) pairs: each 64 keys x H heads x 512 FLOP
flop_pair = 64 * H * 128 * 4
print(f"S {S}, K {K} blocks of 64, H {H}: {pairs} (token, block) pairs")
print(f"1. per-token gathers: {GATHER_TBS * flop_pair / BLK:.0f} TFLOP/s copy roofline")
for g in (2, 4, 8, 16):
    loaded = sum(len(set().union(*sels[i:i + g])) for i in range(0, S, g))
    print(f"   groups of {g:2d} tokens load {loaded / pairs:.3f} blocks per pair: copy roofline "
          f"{GATHER_TBS * flop_pair / BLK * pairs / loaded:.0f}")
rows = 64 // H
work = sum(len(set().union(*sels[i:i + rows])) * rows for i in range(0, S, rows))
print(f"2. 64-row tiles of {rows} tokens x {H} heads over their union (rows masked): {work / pairs:.2f}x the "
      f"useful MMA -> <= {PADDED_TF * pairs / work:.0f} TFLOP/s")
# 3. keys as the MMA rows, a group of G tokens sharing each gathered block, one m64nH SS GEMM per
# (token, block) for S^T = K Q^T and O^T += V^T P^T: per pair 2 x 8 k-steps reading a 2 KB A box
# and H x 32 bytes of B, plus the gathered block's copy into shared memory once per group
for g in (8, 16):
    loaded = sum(len(set().union(*sels[i:i + g])) for i in range(0, S, g))
    smem = 16 * (2048 + H * 32) + BLK * loaded / pairs
    cyc = max(smem / SMEM_BPC, flop_pair / MMA_FPC)
    print(f"3. keys as MMA rows, groups of {g:2d}: {smem / 1024:.1f} KB of shared memory per pair -> "
          f"<= {flop_pair / cyc * CLK * SMS / 1e12:.0f} TFLOP/s (copy roofline "
          f"{GATHER_TBS * flop_pair / BLK * pairs / loaded:.0f}); O^T of the group: {g * H * 128 * 4 // 1024} KB of registers")
# 3'. the same with the S^T of a consumer warpgroup's GW = 64 / H tokens as one m64n64 SS GEMM per
# block (sfa_fwd_group.cu since the thirty-fourth session: no per-token wait chain; the S^T of the
# tokens that did not select the block wasted), skipped where none of the GW selected it; O^T per
# pair as in 3.  Groups of G = 2 GW tokens (two consumer warpgroups).
if 64 % H == 0:
    gw = 64 // H
    g = 2 * gw
    loaded = sblk = 0
    for i in range(0, S, g):
        loaded += len(set().union(*sels[i:i + g]))
        for c in (0, 1):
            sblk += len(set().union(*sels[i + c * gw:i + (c + 1) * gw]))
    smem = (sblk * 2 * 16384 + pairs * (16384 + H * 128) + BLK * loaded) / pairs
    mma = (sblk * 64 * 64 * 128 * 2 + pairs * 64 * H * 128 * 2) / pairs
    cyc = max(smem / SMEM_BPC, mma / MMA_FPC)
    print(f"3'. one m64n64 S^T per warpgroup and block, groups of {g:2d}: {sblk / pairs:.2f} S^T GEMMs per pair, "
          f"{smem / 1024:.1f} KB of shared memory per pair, {mma / flop_pair:.2f}x the useful MMA -> "
          f"<= {flop_pair / cyc * CLK * SMS / 1e12:.0f} TFLOP/s (copy roofline "
          f"{GATHER_TBS * flop_pair / BLK * pairs / loaded:.0f})")
    # 3''. the O^T GEMM also over the warpgroup's GW tokens at once (m64n64 per d-tile, the P^T of
    # tokens without the block zero): one softmax a block, no per-token branch; the MMA of form 2
    smem2 = (sblk * (2 * 16384 + 16384 + 64 * 128) + BLK * loaded) / pairs
    mma2 = sblk * 2 * 64 * 64 * 128 * 2 / pairs
    cyc2 = max(smem2 / SMEM_BPC, mma2 / MMA_FPC)
    print(f"3''. S^T and O^T per warpgroup and block as m64n64: {smem2 / 1024:.1f} KB of shared memory per pair, "
          f"{mma2 / flop_pair:.2f}x the useful MMA -> <= {flop_pair / cyc2 * CLK * SMS / 1e12:.0f} TFLOP/s")
