#!/usr/bin/env python3
"""Producer / consumer timing of the sfa group forward (sfa_fwd_group.cu) from a step trace.

A debugging build (sfa_fwd_group.cu compiled with -DSPATTN_CTA_TRACE) run with STEP_FILE set
records, per CTA and union block i (the first 64), the SM clock of thread 0 of each warpgroup:
consumers (slots 0, 1) at 'top', 'masks' (mask mbarrier passed), 'full' (data mbarrier passed),
'S^T done', 'soft u0..u3' (a selected token's softmax done), 'O^T issued', 'O^T done',
'released'; the producer (slot 2) at 'top', 'fetched', 'empty' (its wait for a free stage passed),
'copies issued'.  step_trace.py prints the per-role gaps; this prints what crosses roles, over
the steps 2 .. n-3 of every CTA:
  - how far the producer runs ahead: its 'copies issued' of block i against consumer c's 'top'
    of block i (cycles; negative = the consumer arrived first and waited);
  - the copy latency seen by a consumer that waited: 'full' - 'copies issued' of the same block;
  - the share of a consumer's step spent waiting for masks / data, in the S^T GEMM, in softmax +
    O^T issue, in the O^T wait;
  - the time a stage waits for the slower consumer: |released_0 - released_1| of block i.
Usage: group_trace.py STEP_FILE   (main's marks; not those of docs/wip/sfa_group_stpipe.patch,
       whose consumer marks mean other points: step_trace.py STEP_FILE stpipe)
"""
import collections
import os
import statistics as st
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_trace  # noqa: E402  (the record reader)


def med(x):
    return st.median(x) if x else float('nan')


def main(path):
    run = step_trace.load(path)
    d = lambda a, b: ((b - a + 2**31) & 0xffffffff) - 2**31  # signed difference of 32-bit clocks
    lead, lat, skew = [], [], []
    share = collections.defaultdict(list)
    period = []
    ctas = sorted({k[0] for k in run})
    for blk in ctas:
        prod = run.get((blk, 2), {})
        cons = [run.get((blk, 0), {}), run.get((blk, 1), {})]
        n = max(prod) + 1 if prod else 0
        for i in range(2, n - 3):
            p = prod.get(i)
            if not p:
                continue
            for c in (0, 1):
                m, nx = cons[c].get(i), cons[c].get(i + 1)
                if not m or not m[0]:
                    continue
                lead.append(d(m[0], p[3]) * -1)
                if m[2] and m[1] and d(m[1], m[2]) > 64:
                    lat.append(d(p[3], m[2]))
                if nx and nx[0]:
                    per = d(m[0], nx[0])
                    period.append(per)
                    share['wait masks+data'].append(d(m[0], m[2]))
                    if m[3]:
                        share['S^T'].append(d(m[2], m[3]))
                        if m[8]:
                            share['softmax + O^T issue'].append(d(m[3], m[8]))
                        if m[9]:
                            share['O^T wait'].append(d(m[8], m[9]))
                        share['selected blocks'].append(1)
                    else:
                        share['skipped blocks'].append(1)
                    share['release + loop'].append(d(m[9] if m[9] else m[2], nx[0]))
            a, b = cons[0].get(i), cons[1].get(i)
            if a and b and a[10] and b[10]:
                skew.append(abs(d(a[10], b[10])))
    print(f'{len(ctas)} CTAs; consumer steps {len(period)}, period median {med(period):.0f} mean {st.mean(period) if period else 0:.0f} cycles')
    print(f'producer lead (copies issued before the consumer reaches the block): median {med(lead):.0f}, '
          f'share of blocks where the consumer came first {sum(x < 0 for x in lead) / max(1, len(lead)):.2f}')
    print(f'copy latency seen by a waiting consumer: n {len(lat)}, median {med(lat):.0f}, mean {st.mean(lat) if lat else 0:.0f} cycles')
    print(f'release skew between the consumers: median {med(skew):.0f}, mean {st.mean(skew) if skew else 0:.0f} cycles')
    tot = sum(period) or 1
    for k in ('wait masks+data', 'S^T', 'softmax + O^T issue', 'O^T wait', 'release + loop'):
        v = share[k]
        print(f'  {k:<22} n {len(v):7d} median {med(v):7.0f}  sum share {sum(v) / tot:5.2f}')
    print(f'  blocks with a selected token {len(share["selected blocks"])}, skipped {len(share["skipped blocks"])}')


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1])
