#!/usr/bin/env python3
"""Ablation summary: each rule/variant against base/variant."""
import csv, math, os, sys
from collections import defaultdict
root = os.environ.get('OUT', '/tmp/kvgate-ablation')
def load(path):
    rows = defaultdict(dict)
    with open(path) as f:
        for r in csv.DictReader(f):
            if r['policy'] != 'kvgate': continue
            rows[r['scenario']][r['seed']] = r
    return rows
def gm(xs):
    xs = list(xs); return math.exp(sum(math.log(x) for x in xs)/len(xs))
out = []
rules = sys.argv[1:] or sorted(d for d in os.listdir(root) if os.path.isdir(f'{root}/{d}') and d not in ('base','capcache'))
for rule in rules:
    if not os.path.isdir(f'{root}/{rule}'): continue
    for v in sorted(os.listdir(f'{root}/{rule}')):
        p = f'{root}/{rule}/{v}/judge.csv'; b = f'{root}/base/{v}/judge.csv'
        if not (os.path.exists(p) and os.path.exists(b)): continue
        A, B = load(p), load(b)
        ra = [float(A[s][k]['ratio_to_cap_best']) for s in B for k in B[s]]
        rb = [float(B[s][k]['ratio_to_cap_best']) for s in B for k in B[s]]
        ga, gb = gm(ra), gm(rb)
        changes = []
        for s in B:
            a = gm(float(A[s][k]['ratio_to_cap_best']) for k in B[s])
            bb = gm(float(B[s][k]['ratio_to_cap_best']) for k in B[s])
            p99 = max(float(A[s][k]['p99_turn_latency_s'])/max(float(B[s][k]['p99_turn_latency_s']),1e-9) for k in B[s])
            mw = max(float(A[s][k]['max_wait_s'])-float(B[s][k]['max_wait_s']) for k in B[s])
            changes.append((a/bb-1, s, p99, mw))
        changes.sort()
        worst = changes[-1]; best = changes[0]
        unfinished = sum(1 for s in A for k in A[s] if A[s][k]['finished'] != 'true')
        print(f"{rule:16} {v:8} base {gb:.4f} off {ga:.4f} ({(ga/gb-1)*100:+.2f}%)  worst {worst[1]} {worst[0]*100:+.1f}%  best {best[1]} {best[0]*100:+.1f}%  maxp99x {max(c[2] for c in changes):.2f} maxwait+ {max(c[3] for c in changes):.0f}s unfin {unfinished}")
