#!/usr/bin/env python3
"""Per-step timeline of the bsa backward's consumer warpgroups (a debugging build, not a test).

With cmake -DSPATTN_CTA_TRACE=ON and STEP_FILE set, thread 0 of each consumer warpgroup of
bsa_bwd90 records the SM clock (clock64, low 32 bits) at fixed marks of each of its first 64
steps, and the launcher appends
  "S <ctas> <steps> <marks>"  then one line per (CTA, consumer, step) that ran:
  "<block> <consumer> <step> <clock at mark 0> ... <clock at mark marks-1>"   (0 = not reached)
This prints, over the steps 2 .. n-3 of every CTA (no pipeline fill / drain), the median and
mean cycles between consecutive marks of each consumer and the step period.
e.g. STEP_FILE=/tmp/s.txt build-trace/tools/spattn bench --backend cuda --suite bsa
     --case '^bsa02_' --pass bwd --repeats 1 --warmup 0; python3 bench/gpu/step_trace.py /tmp/s.txt
Usage: step_trace.py STEP_FILE [names [producer_names]]   (the last kernel in the file; names:
       comma-separated labels of the marks, default those of bsa_bwd.cu; a kernel whose producer
       marks too (warpgroup slot 2, e.g. sfa_fwd_group.cu) gets producer_names; the preset
       "group" names both of sfa_fwd_group.cu's, "stpipe" those of docs/wip/sfa_group_stpipe.patch)
"""
import collections
import statistics as st
import sys

NAMES = ('top', 'NB_DSE', 'full', 'S^T done', 'P packed', 'dP^T done', 'dS formed', 'dS stored',
         'dV+dK done', 'NB_DS', 'dQ done', 'dqempty', 'staged')
GROUP = ('top', 'masks', 'full', 'S^T done', 'soft u0', 'soft u1', 'soft u2', 'soft u3', 'O^T issued',
         'O^T done', 'released')
GROUP_PRODUCER = ('top', 'fetched', 'empty', 'copies issued')
# docs/wip/sfa_group_stpipe.patch's marks (block i + 1's S^T issued before block i's softmax)
STPIPE = ('top', 'next data', 'next S^T issued', 'wait<1>', 'soft u0', 'soft u1', 'soft u2', 'soft u3',
          'O^T issued', 'O^T + next S^T done', 'released')


def load(path):
    """The last kernel's records: {(block, warpgroup slot): {step: [clock at each mark]}}."""
    runs, cur = [], None
    for line in open(path):
        if line.startswith('S '):
            cur = collections.defaultdict(dict)
            runs.append(cur)
        elif cur is not None and line.strip():
            v = list(map(int, line.split()))
            cur[(v[0], v[1])][v[2]] = v[3:]
    return runs[-1]


def main(path, names, pnames=None):
    run = load(path)
    for c in (0, 1, 2):
        nm = pnames if c == 2 and pnames else names
        label = lambda k: nm[k] if k < len(nm) else f'm{k}'
        gaps = collections.defaultdict(list)  # (from mark, to mark) -> cycles
        period = []
        for (blk, cc), steps in run.items():
            if cc != c or len(steps) < 6:
                continue
            n = max(steps) + 1
            for it in range(2, n - 3):
                m, nx = steps.get(it), steps.get(it + 1)
                if not m or not nx or not nx[0]:
                    continue
                prev = 0
                for k in range(1, len(m)):
                    if m[k]:
                        gaps[(prev, k)].append((m[k] - m[prev]) & 0xffffffff)
                        prev = k
                period.append((nx[0] - m[0]) & 0xffffffff)
                gaps[(prev, -1)].append((nx[0] - m[prev]) & 0xffffffff)
        role = 'producer' if c == 2 else f'consumer {c}'
        if not period:
            if c < 2:
                print(f'{role}: no steps')
            continue
        print(f'{role}: {len(period)} steps, period median {st.median(period):.0f} mean {st.mean(period):.0f} cycles')
        for (a, b) in sorted(gaps, key=lambda x: (x[0], x[1] if x[1] >= 0 else 99)):
            g = gaps[(a, b)]
            print(f'  {label(a):>12} -> {label(b) if b >= 0 else "next top":<12} n {len(g):6d} median {st.median(g):7.0f}  mean {st.mean(g):7.0f}')

if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if len(sys.argv) > 2 and sys.argv[2] in ('group', 'stpipe'):
        main(sys.argv[1], GROUP if sys.argv[2] == 'group' else STPIPE, GROUP_PRODUCER)
    else:
        main(sys.argv[1], sys.argv[2].split(',') if len(sys.argv) > 2 else NAMES,
             sys.argv[3].split(',') if len(sys.argv) > 3 else None)
