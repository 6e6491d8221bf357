#!/usr/bin/env python3
"""Compares two judge runs (the `judge.csv` that `kvgate-sim --judge` writes),
or summarises one as a Markdown table (`--pivot`).

    python3 sim/scripts/judge_compare.py BEFORE.csv AFTER.csv [--policy kvgate]
    python3 sim/scripts/judge_compare.py --pivot JUDGE.csv

Prints, per scenario, each policy's makespan over the seed's best fixed cap
(geometric mean over seeds) before and after, its hit rate, p99 turn latency
and longest wait, and the verdict of kvgate against the best cap and against
ThunderAgent (wins below 0.98, ties within 2%, loses above 1.02). Ends with
every policy's geometric mean over all scenarios and seeds. Standard library
only, so it runs anywhere the simulator does.
"""
from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict


def load(path: str) -> dict[tuple[str, str], list[dict[str, str]]]:
    rows: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows[(r["scenario"], r["policy"])].append(r)
    return rows


def geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary(rs: list[dict[str, str]]) -> dict[str, float]:
    return {
        "ratio": geo([float(r["ratio_to_cap_best"]) for r in rs]),
        "hit": 100 * sum(float(r["hit_rate"]) for r in rs) / len(rs),
        "p99": sum(float(r["p99_turn_latency_s"]) for r in rs) / len(rs),
        "wait": max(float(r["max_wait_s"]) for r in rs),
        "bound": geo([float(r["makespan_over_bound"]) for r in rs]),
    }


def verdict(x: float) -> str:
    return "wins" if x < 0.98 else ("loses" if x > 1.02 else "ties")


def pivot(path: str) -> None:
    """Per scenario: each policy's makespan over the best cap (geometric mean
    over seeds), then kvgate's and the best cap's hit rate, p99 turn and
    longest wait; a last row of geometric means over every scenario and seed."""
    rows = load(path)
    scenarios = list(dict.fromkeys(s for s, _ in rows))
    policies = [p for p in dict.fromkeys(p for _, p in rows) if not p.startswith("cap-best")]
    cap_rows = lambda s: [  # noqa: E731
        {"hit_rate": r["cap_best_hit_rate"], "p99_turn_latency_s": "nan", "max_wait_s": "nan"}
        for r in rows[(s, "kvgate")]
    ]
    head = ["scenario"] + [f"{p} x best cap" for p in policies] + [
        "kvgate hit %", "best cap hit %", "kvgate p99 turn", "kvgate max wait"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for s in scenarios:
        cells = [f"`{s}`"] + [f"{summary(rows[(s, p)])['ratio']:.3f}" if (s, p) in rows else "-" for p in policies]
        k = summary(rows[(s, "kvgate")])
        cap_hit = 100 * sum(float(r["hit_rate"]) for r in cap_rows(s)) / len(cap_rows(s))
        cells += [f"{k['hit']:.1f}", f"{cap_hit:.1f}", f"{k['p99']:.0f} s", f"{k['wait']:.0f} s"]
        print("| " + " | ".join(cells) + " |")
    overall = ["**all**"] + [
        f"**{geo([float(r['ratio_to_cap_best']) for (s, q), rs in rows.items() if q == p for r in rs]):.3f}**"
        for p in policies] + [""] * 4
    print("| " + " | ".join(overall) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pivot", metavar="JUDGE_CSV", help="summarise one judge run as a Markdown table and stop")
    ap.add_argument("before", nargs="?")
    ap.add_argument("after", nargs="?")
    ap.add_argument("--policy", default="kvgate", help="the policy whose verdicts are tracked (default kvgate)")
    ap.add_argument("--peer", default="thunderagent", help="the peer it is held against (default thunderagent)")
    a = ap.parse_args()
    if a.pivot:
        pivot(a.pivot)
        return
    if not (a.before and a.after):
        ap.error("give BEFORE.csv and AFTER.csv, or --pivot JUDGE.csv")
    before, after = load(a.before), load(a.after)
    scenarios = list(dict.fromkeys(s for s, _ in after))
    policies = list(dict.fromkeys(p for _, p in after))
    print(f"{'scenario':<18} {'policy':<22} {'x cap-best':>17} {'hit %':>13} {'p99 turn s':>15} {'max wait s':>15}")
    moved = []
    for s in scenarios:
        for p in policies:
            if (s, p) not in after or p.startswith("cap-best"):
                continue
            n = summary(after[(s, p)])
            o = summary(before[(s, p)]) if (s, p) in before else None
            fmt = lambda k, w, d: (f"{o[k]:.{d}f} -> " if o else "") + f"{n[k]:.{d}f}"  # noqa: E731
            print(f"{s:<18} {p:<22} {fmt('ratio', 6, 3):>17} {fmt('hit', 5, 1):>13} {fmt('p99', 6, 1):>15} {fmt('wait', 6, 0):>15}")
        if (s, a.policy) in after and (s, a.peer) in after:
            k, t = summary(after[(s, a.policy)]), summary(after[(s, a.peer)])
            now = (verdict(k["ratio"]), verdict(k["ratio"] / t["ratio"]))
            if (s, a.policy) in before and (s, a.peer) in before:
                kb, tb = summary(before[(s, a.policy)]), summary(before[(s, a.peer)])
                was = (verdict(kb["ratio"]), verdict(kb["ratio"] / tb["ratio"]))
                if was != now:
                    moved.append(f"{s}: {a.policy} {was[0]} -> {now[0]} against the best cap "
                                 f"({kb['ratio']:.3f} -> {k['ratio']:.3f}), {was[1]} -> {now[1]} against {a.peer} "
                                 f"({kb['ratio'] / tb['ratio']:.3f} -> {k['ratio'] / t['ratio']:.3f})")
    print("\noverall, geometric mean over every scenario and seed of makespan over the best cap:")
    for p in policies:
        if p.startswith("cap-best"):
            continue
        n = geo([float(r["ratio_to_cap_best"]) for (s, q), rs in after.items() if q == p for r in rs])
        o = [float(r["ratio_to_cap_best"]) for (s, q), rs in before.items() if q == p and s in scenarios for r in rs]
        print(f"  {p:<22} " + (f"{geo(o):.4f} -> " if o else "") + f"{n:.4f}")
    print("\nverdicts that moved (wins < 0.98 <= ties <= 1.02 < loses):")
    for m in moved or ["none"]:
        print("  " + m)


if __name__ == "__main__":
    main()
