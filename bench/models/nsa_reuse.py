#!/usr/bin/env python3
"""Upper bounds for the NSA-like forward (issue 12: sbs 64, D 128, separate V, 16 heads per key head,
K 16 blocks, S 8192, mode 3) under the suite's index generation (cases/README.md: the newest block
always, the others uniform over the allowed ones), for four kernel forms and variants of the third
(3', 3'') and fourth (4a, 4b).  A model, not a measurement: the rates it takes are measured
elsewhere (runbook, "Design space of the NSA-like bar"), and the one it hinges on, shared-memory
operand reads at SMEM_BPC bytes a clock for narrow SS GEMMs, held on the H100 (wgmma_rate.cu: SS
m64n16 323-365 TFLOP/s, RS 386-521).
What it does not see (measured, H100, 2026-12-05, sfas01): the kernels run at 27-38 % of these
bounds, limited by latency and issue, not by shared memory or copies; form 4c (bound 415) ran at
77 TFLOP/s, 0.70x form 3 (bound 285, 107) and 0.69x 3' (bound 286, 111: landed, sfa_fwd_group.cu),
with 36 % more instructions.  Rank forms by instructions and dependent waits per pair first.
  python3 bench/models/nsa_reuse.py [S] [K] [H]
"""
import functools
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

@functools.lru_cache(maxsize=None)
def unions(g):
    """blocks the groups of g consecutive tokens load (their unions), summed"""
    return sum(len(set().union(*sels[i:i + g])) for i in range(0, S, g))

def wg_blocks(g, parts):
    """(block, part) pairs of groups of g tokens split into parts (lists of offsets in the
    group) where a part has a token that selected the block"""
    n = 0
    for i in range(0, S, g):
        for part in parts:
            n += len(set().union(*(sels[i + j] for j in part if i + j < S)))
    return n

def bound(smem, mma):
    cyc = max(smem / SMEM_BPC, mma / MMA_FPC)
    return flop_pair / cyc * CLK * SMS / 1e12

def roof(loaded):
    return GATHER_TBS * flop_pair / BLK * pairs / loaded

print(f"S {S}, K {K} blocks of 64, H {H}: {pairs} (token, block) pairs")
print(f"1. per-token gathers: {GATHER_TBS * flop_pair / BLK:.0f} TFLOP/s copy roofline")
for g in (2, 4, 8, 16):
    loaded = unions(g)
    print(f"   groups of {g:2d} tokens load {loaded / pairs:.3f} blocks per pair: copy roofline {roof(loaded):.0f}")
rows = 64 // H
work = unions(rows) * rows
print(f"2. 64-row tiles of {rows} tokens x {H} heads over their union (rows masked): {work / pairs:.2f}x the "
      f"useful MMA -> <= {PADDED_TF * pairs / work:.0f} TFLOP/s")
# 3. keys as the MMA rows, a group of G tokens sharing each gathered block, one m64nH SS GEMM per
# (token, block) for S^T = K Q^T and O^T += V^T P^T: per pair 2 x 8 k-steps reading a 2 KB A box
# and H x 32 bytes of B, the P^T store (64 x H x 2 bytes), plus the gathered block's copy into
# shared memory once per group
for g in (8, 16):
    loaded = unions(g)
    smem = 16 * (2048 + H * 32) + 64 * H * 2 + BLK * loaded / pairs
    print(f"3. keys as MMA rows, groups of {g:2d}: {smem / 1024:.1f} KB of shared memory per pair -> "
          f"<= {bound(smem, flop_pair):.0f} TFLOP/s (copy roofline {roof(loaded):.0f}); "
          f"O^T of the group: {g * H * 128 * 4 // 1024} KB of registers")
# 3'. one m64n64 S^T per warpgroup and block (sfa_fwd_group.cu since 7a409d6): the S^T of a
# consumer warpgroup's GW = 64 / H tokens as one SS m64n64 GEMM per block (8 k-steps, A 2 KB + B
# 2 KB each; the tokens that did not select the block wasted), skipped where none of the GW
# selected it; per pair the P^T store (64 x H x 2 bytes) and the O^T as in 3 (SS m64nH, 2 d-tiles
# x 4 k-steps of A 2 KB + B H x 32 bytes).  Groups of G = 2 GW tokens (two consumer warpgroups).
# (The thirty-fourth session's lines left out the P^T stores and, for 3'', the second d-tile of
# O^T; corrected in the thirty-fifth.)
P_ST = 64 * H * 2                 # one pair's P^T into shared memory
OT_SS = 8 * (2048 + H * 32)       # one pair's O^T, SS m64nH
if 64 % H == 0:
    gw = 64 // H
    g = 2 * gw
    loaded = unions(g)
    sblk = wg_blocks(g, [range(0, gw), range(gw, g)])
    smem = (sblk * 8 * 4096 + pairs * (P_ST + OT_SS) + BLK * loaded) / pairs
    mma = (sblk * 64 * 64 * 128 * 2 + pairs * 64 * H * 128 * 2) / pairs
    print(f"3'. one m64n64 S^T per warpgroup and block, groups of {g:2d}: {sblk / pairs:.2f} S^T GEMMs per pair, "
          f"{smem / 1024:.1f} KB of shared memory per pair, {mma / flop_pair:.2f}x the useful MMA -> "
          f"<= {bound(smem, mma):.0f} TFLOP/s (copy roofline {roof(loaded):.0f})")
    # 3''. the O^T GEMM also over the warpgroup's GW tokens at once (SS m64n64 per d-tile, the P^T of
    # tokens without the block zero): one softmax a block, no per-token branch; per (block,
    # warpgroup) S^T 32 KB + P^T 8 KB + O^T 32 KB of shared memory
    smem2 = (sblk * (8 * 4096 + 64 * 64 * 2 + 8 * 4096) + BLK * loaded) / pairs
    mma2 = sblk * 2 * 64 * 64 * 128 * 2 / pairs
    print(f"3''. S^T and O^T per warpgroup and block as m64n64: {smem2 / 1024:.1f} KB of shared memory per pair, "
          f"{mma2 / flop_pair:.2f}x the useful MMA -> <= {bound(smem2, mma2):.0f} TFLOP/s")
# 4. keys as MMA rows with A from registers (RS): a block's K (S^T = K Q^T) and V^T (O^T = V^T P^T)
# loaded into fragments by ldmatrix once per block and warpgroup (16 + 16 KB), then reused by every
# token of that warpgroup which selected the block; per pair only the B operands (Q^T and P^T, 8 k-
# steps of H x 32 bytes each) and the P^T store.  Whether RS m64nH runs at the peak rate is what
# bench/gpu/wgmma_rate.cu's n16 / n32 lines measure (not yet run).  Registers a consumer thread
# (H = 16): O^T 16 a token, S^T 8 a token in flight, m and l 8 a token, K and V^T fragments 32 each.
#  4a. the two warpgroups split the group's tokens: a block both need is loaded by both.
#  4b. they split O^T's two d-tiles, token t's S^T and softmax on warpgroup t % 2 (P^T and the
#      rescale factors through shared memory, as P^T is anyway): K by each warpgroup with a token
#      that selected the block, V^T's half by each warpgroup wherever any token did.
B_PAIR = 2 * 8 * H * 32 + P_ST
if H == 16:
    for g in (8, 16):
        loaded = unions(g)
        copy = BLK * loaded / pairs
        half = g // 2
        smem_a = wg_blocks(g, [range(0, half), range(half, g)]) * 32768 / pairs + B_PAIR + copy
        regs_a = half * (16 + 8 + 8) + 64
        smem_b = (wg_blocks(g, [range(0, g, 2), range(1, g, 2)]) * 16384 + loaded * 16384) / pairs + B_PAIR + copy
        regs_b = g * 8 + half * (8 + 8) + 32 + 16
        mma = flop_pair / 2
        print(f"4a. RS, groups of {g:2d}, tokens split: {smem_a / 1024:.1f} KB of shared memory per pair -> <= "
              f"{bound(smem_a, mma):.0f} TFLOP/s, ~{regs_a} registers a consumer thread besides addresses")
        print(f"4b. RS, groups of {g:2d}, d-tiles split: {smem_b / 1024:.1f} KB of shared memory per pair -> <= "
              f"{bound(smem_b, mma):.0f} TFLOP/s, ~{regs_b} registers (copy roofline {roof(loaded):.0f})")
# 4c. 4b at G = 256 / H (at most 16) within a consumer thread's ~224 registers: S^T as SS (K from
# shared memory, 8 k-steps of A 2 KB + B H x 32 bytes per pair, no K fragments), V^T's half as
# fragments, the softmax state in shared memory (both warpgroups read the rescale factors there
# anyway): O^T 128 + V^T 16 + S^T slots 32 registers (written and measured: 0.70x form 3; in git
# history, c67bea4:docs/wip/sfa_group_dsplit.patch)
if H in (8, 16, 32):
    g = min(16, 256 // H)
    loaded = unions(g)
    smem_c = 8 * (2048 + H * 32) + loaded * 16384 / pairs + 8 * H * 32 + P_ST + BLK * loaded / pairs
    print(f"4c. groups of {g}, d-tiles split, S^T SS: {smem_c / 1024:.1f} KB of shared memory per pair -> <= "
          f"{bound(smem_c, flop_pair / 2):.0f} TFLOP/s, ~{g * H // 2 + 16 + 32} registers (copy roofline {roof(loaded):.0f})")
