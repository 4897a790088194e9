"""Input generators in plain Python (no NumPy, so the torch tests run where NumPy is absent).

Both return nested lists; wrap them with numpy.array / torch.tensor.
"""
from __future__ import annotations

import random
from typing import List


def block_mask(seed: int, b: int, n: int, sq: int, skv: int, bx: int, by: int, density: float = 0.5) -> List:
    """uint8-valued block mask [B, N, ceil(Sq/bx), ceil(Skv/by)], each block 1 with probability density."""
    r = random.Random(seed)
    nbx, nby = -(-sq // bx), -(-skv // by)
    return [[[[int(r.random() < density) for _ in range(nby)] for _ in range(nbx)] for _ in range(n)]
            for _ in range(b)]


def topk_indices(seed: int, b: int, s1: int, s2: int, n2: int, kk: int, sbs: int = 1, causal: bool = True,
                 pad_anywhere: bool = True, duplicates: bool = False) -> List:
    """int32-valued indices [B, S1, N2, K] per cases/README.md: min(K, allowed) distinct allowed
    blocks including the newest, in random order, -1 padding (anywhere in the row when
    pad_anywhere); with duplicates one selected block appears twice."""
    r = random.Random(seed)
    nblk = -(-s2 // sbs)
    out = []
    for _ in range(b):
        rows = []
        for i in range(s1):
            lim = s2 - s1 + i if causal else s2 - 1
            heads = []
            for _ in range(n2):
                row = [-1] * kk
                if lim >= 0:
                    last = min(lim // sbs, nblk - 1)
                    take = min(kk, last + 1)
                    sel = [last] + r.sample(range(last), take - 1)
                    if duplicates and take >= 2:
                        sel[-1] = sel[0]
                    r.shuffle(sel)
                    slots = r.sample(range(kk), take) if pad_anywhere else list(range(take))
                    for s, x in zip(slots, sel):
                        row[s] = x
                heads.append(row)
            rows.append(heads)
        out.append(rows)
    return out
