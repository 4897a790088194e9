#!/usr/bin/env python3
"""Per-CTA time breakdown of a kernel from a globaltimer trace (a debugging build, not a test).

The trace comes from a debugging build: cmake -DSPATTN_CTA_TRACE=ON compiles the marks of
src/cuda/cta_trace.cuh into the sfa 64-head forward (sfa_fwd90: n = its block pairs) and the sfa
small-head forward (sfa_fwd_small: n = block pairs, t1 = the first S^T of consumer 0, t2 = its
last P V), the bsa backward (bsa_bwd90, dense calls with TMA stores: n = the key tile's steps,
t1 = K / V landed, t2 = consumer 0's last step done, t3 = its dK / dV stores issued), and for the
bsa forward it was a throw-away patch of the same shape (docs/runbooks/block_sparse_attention.md,
"Where a CTA's time goes").  One consumer thread per CTA records
  t0 kernel entry, t1 first S ready, t2 last P V done, t3 stores issued, the CTA's loop count and %smid,
and the launcher, when TRACE_FILE is set, synchronises and appends
  "K <grid>"  then one line per CTA:  "<block> <t0> <t1> <t2> <t3> <n> <smid>"
e.g. TRACE_FILE=/tmp/t.txt build-trace/tools/spattn bench --backend cuda --suite sfa --case '^sfa04_'
     --pass fwd --repeats 3; python3 bench/gpu/cta_trace.py /tmp/t.txt
Usage: cta_trace.py TRACE_FILE   (the last kernel in the file is analysed)
"""
import collections
import statistics as st
import sys


def main(path):
    runs, cur = [], None
    for line in open(path):
        if line.startswith('K '):
            cur = []
            runs.append(cur)
        elif cur is not None and line.strip():
            cur.append(list(map(int, line.split())))
    if not runs:
        sys.exit('%s: no "K <grid>" record' % path)
    r = [x for x in runs[-1] if x[1] and x[4]]
    t_lo, t_hi = min(x[1] for x in r), max(x[4] for x in r)
    span = (t_hi - t_lo) / 1e3
    print('CTAs %d, span %.1f us' % (len(r), span))
    pro = [(x[2] - x[1]) / 1e3 for x in r]
    epi = [(x[4] - x[3]) / 1e3 for x in r]
    print('prologue (start -> first S ready) us: median %.2f mean %.2f' % (st.median(pro), st.mean(pro)))
    print('epilogue (last P V done -> stores issued) us: median %.2f mean %.2f' % (st.median(epi), st.mean(epi)))
    xs = [x[5] - 1 for x in r]
    ys = [(x[3] - x[2]) / 1e3 for x in r]
    if len(set(xs)) > 1:  # main loop time against the tile count
        mx, my = st.mean(xs), st.mean(ys)
        a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        print('main loop: %.3f us per tile + %.2f us per row' % (a, my - a * mx))
    else:
        print('main loop: %.2f us per row of %d tiles' % (st.mean(ys), xs[0] + 1))
    by_sm = collections.defaultdict(list)
    for x in r:
        by_sm[x[6]].append(x)
    gaps, idle_end, busy = [], [], []
    for rows in by_sm.values():
        rows.sort(key=lambda x: x[1])
        gaps += [(q[1] - p[4]) / 1e3 for p, q in zip(rows, rows[1:])]
        idle_end.append((t_hi - rows[-1][4]) / 1e3)
        busy.append(sum(x[4] - x[1] for x in rows) / 1e3)
    if gaps:
        print('gap between CTAs on an SM us: median %.2f mean %.2f' % (st.median(gaps), st.mean(gaps)))
    print('idle at the end per SM us: median %.2f max %.2f' % (st.median(idle_end), max(idle_end)))
    print('SMs %d, busy %.1f %% of the span' % (len(by_sm), 100 * st.mean(busy) / span))


if __name__ == '__main__':
    main(sys.argv[1])
