#!/usr/bin/env python3
"""Turns one `cargo bench` run into the markdown table of benches/README.md.

Reads criterion's estimates (target/criterion/**/new/estimates.json) and the
figures the custom-harness benches wrote (target/kvgate-bench/*.json), and
prints every figure in absolute terms and as a ratio to the naive baseline
measured in the same run, with the machine named and each target checked.

    cargo bench && python3 benches/report.py > /tmp/table.md
"""

import json
import os
import pathlib
import platform
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))


def criterion_medians():
    """full id ("open_1t/kvgate/hot") -> median ns per iteration."""
    out = {}
    for bench in (TARGET / "criterion").glob("**/new/benchmark.json"):
        meta = json.loads(bench.read_text())
        est = json.loads((bench.parent / "estimates.json").read_text())
        out[meta["full_id"]] = est["median"]["point_estimate"]
    return out


def load(name):
    path = TARGET / "kvgate-bench" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def machine():
    model, cores = "unknown CPU", os.cpu_count()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            if key.strip() == "Hypervisor vendor":
                model += f" ({value.strip()} guest)"
    except OSError:
        pass
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    return f"{model}, {cores} cores, {platform.system()} {platform.release()}, {rustc}"


def ns(v):
    if v is None:
        return "n/a"
    if v < 1e3:
        return f"{v:.1f} ns"
    if v < 1e6:
        return f"{v / 1e3:.1f} µs"
    if v < 1e9:
        return f"{v / 1e6:.2f} ms"
    return f"{v / 1e9:.2f} s"


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "n/a"


def main():
    c = criterion_medians()
    instr = load("instructions") or {}
    lat = load("latency")
    mem = load("memory")
    mutex = c.get("floor/mutex_lock_parking_lot")
    out = []
    p = out.append
    p(f"Machine: {machine()}.\n")

    p("### Floor\n")
    p("| operation | time | instructions |")
    p("|---|---:|---:|")
    for key, label in [
        ("floor/atomic_increment", "uncontended atomic increment (`fetch_add`)"),
        ("floor/mutex_lock_parking_lot", "uncontended mutex lock + unlock (parking_lot)"),
        ("floor/mutex_lock_std", "uncontended mutex lock + unlock (std)"),
        ("floor/clock_read", "one monotonic clock read (`Instant::now`)"),
        ("floor/clock_read_gate", "one read of the gate's clock (`MonotonicClock::now_ns`)"),
        ("floor/siphash_session_id", "SipHash of a 14-byte session id (`RandomState`)"),
    ]:
        i = instr.get(key)
        p(f"| {label} | {ns(c.get(key))} | {f'{i:.0f}' if i else 'n/a'} |")
    p("\nInstruction counts include the measuring loop's own ~15 instructions.\n")

    p("### Open path, one thread (`acquire` + `release`, usage below the watermark)\n")
    p("| case | time | × naive | × mutex lock | instructions | instr. × naive |")
    p("|---|---:|---:|---:|---:|---:|")
    for key, base in [
        ("open_1t/kvgate/hot", "open_1t/naive/hot"),
        ("open_1t/kvgate/distinct", "open_1t/naive/distinct"),
        ("open_1t/core/hot", "open_1t/naive/hot"),
        ("open_1t/naive/hot", "open_1t/naive/hot"),
        ("open_1t/naive/distinct", "open_1t/naive/distinct"),
        ("open_1t/naive_with_registry/hot", "open_1t/naive/hot"),
    ]:
        t, i = c.get(key), instr.get(key)
        ib = instr.get(base)
        p(
            f"| `{key.removeprefix('open_1t/')}` | {ns(t)} | {ratio(t, c.get(base))} | "
            f"{ratio(t, mutex)} | {f'{i:.0f}' if i else 'n/a'} | {ratio(i, ib) if i else 'n/a'} |"
        )
    p(
        "\n`core` is the sans-IO machine alone (time given, no clock read, no parker); "
        "`naive_with_registry` adds the reference proxy's per-attempt registry "
        "(what its preemption costs).\n"
    )

    p("### Open path, threads (time per operation, all threads together)\n")
    p("| threads | kvgate distinct | naive distinct | throughput × naive | kvgate hot | naive hot | throughput × naive |")
    p("|---:|---:|---:|---:|---:|---:|---:|")
    for t in (2, 4, 8):
        kd, nd = c.get(f"open_mt/kvgate/distinct/{t}"), c.get(f"open_mt/naive/distinct/{t}")
        kh, nh = c.get(f"open_mt/kvgate/hot/{t}"), c.get(f"open_mt/naive/hot/{t}")
        p(f"| {t} | {ns(kd)} | {ns(nd)} | {ratio(nd, kd)} | {ns(kh)} | {ns(nh)} | {ratio(nh, kh)} |")
    kw, nw = c.get("open_mt/kvgate/distinct_10k_windows/8"), c.get("open_mt/naive/distinct_10k_windows/8")
    p(f"| 8, 10,000 windows held | {ns(kw)} | {ns(nw)} | {ratio(nw, kw)} | | | |")
    p(
        "\n`hot`: every thread uses one session, so kvgate's overlapping attempts "
        "preempt each other as the seed says (a preempted attempt counts as an operation).\n"
    )

    cpo = load("cpu_per_op")
    if cpo:
        p("Wall and CPU time per operation over 8 alternating rounds (min / median), `cpu_per_op`:\n")
        p("| design | threads | wall min | wall median | CPU min | CPU median |")
        p("|---|---:|---:|---:|---:|---:|")
        for r in cpo["cpu_per_op"]:
            p(
                f"| {r['design']} | {r['threads']} | {ns(r['wall_min_ns'])} | {ns(r['wall_median_ns'])} | "
                f"{ns(r['cpu_min_ns'])} | {ns(r['cpu_median_ns'])} |"
            )
        p(
            "\nCPU time that grows from 1 to 8 threads is contention (cache lines moving "
            "between the two cores); wall time at 8 threads is about CPU time / 2 only when "
            "both cores are free.\n"
        )

    p("### Pressure paths and stats, one thread\n")
    p("| case | kvgate | naive | × naive | kvgate instr. | naive instr. | instr. × naive |")
    p("|---|---:|---:|---:|---:|---:|---:|")
    for case in ["reserved_session", "reserved_session_10k_windows", "resident_prefix"]:
        k, n = c.get(f"pressure/{case}/kvgate"), c.get(f"pressure/{case}/naive")
        ki, ni = instr.get(f"pressure/{case}/kvgate"), instr.get(f"pressure/{case}/naive")
        p(
            f"| `{case}` | {ns(k)} | {ns(n)} | {ratio(k, n)} | {f'{ki:.0f}' if ki else '–'} | "
            f"{f'{ni:.0f}' if ni else '–'} | {ratio(ki, ni) if ki else '–'} |"
        )
    k, n = c.get("stats_8t/kvgate"), c.get("stats_8t/naive")
    p(f"| `stats()` while 8 threads acquire | {ns(k)} | {ns(n)} | {ratio(k, n)} | – | – | – |")
    p(
        "\n`reserved_session_10k_windows`: 10,000 other sessions hold grace windows "
        "(the naive design scans them all on every call). The naive `stats()` is the "
        "only gate-wide figure the reference has: the number of reservations.\n"
    )

    if lat:
        p("### Wake-up: release → admission of the one waiter that can now proceed\n")
        p("| waiters | kvgate p50 | kvgate p99 | naive p50 | naive p99 | p99 × naive | kvgate probes/admission | naive probes/admission |")
        p("|---:|---:|---:|---:|---:|---:|---:|---:|")
        rows = {(r["design"], r["waiters"]): r for r in lat["wakeup"]}
        for w in sorted({r["waiters"] for r in lat["wakeup"]}):
            k, n = rows[("kvgate", w)], rows[("naive", w)]
            p(
                f"| {w} | {ns(k['p50_ns'])} | {ns(k['p99_ns'])} | {ns(n['p50_ns'])} | "
                f"{ns(n['p99_ns'])} | {ratio(k['p99_ns'], n['p99_ns'])} | "
                f"{k['probes_per_admission']:.1f} | {n['probes_per_admission']:.1f} |"
            )
        p(f"\n{lat['wakeup'][0]['samples']} samples per row.\n")
        p("### Preemption: newer attempt begins → older waiter returns `Preempted`\n")
        p("| waiters | kvgate p50 | kvgate p99 | naive p50 | naive p99 | p99 × naive |")
        p("|---:|---:|---:|---:|---:|---:|")
        rows = {r["design"]: r for r in lat["preemption"]}
        k, n = rows["kvgate"], rows["naive"]
        p(
            f"| {k['waiters']} | {ns(k['p50_ns'])} | {ns(k['p99_ns'])} | {ns(n['p50_ns'])} | "
            f"{ns(n['p99_ns'])} | {ratio(k['p99_ns'], n['p99_ns'])} |"
        )
        p("\nThe naive waiter notices its abort flag only at its next poll (5 s).\n")

    if mem:
        p("### Memory per tracked session (live heap bytes, id bytes excluded)\n")
        p("| design | sessions in grace | bytes per session | × naive | after expiry | after retention | after finish | after finish + grace |")
        p("|---|---:|---:|---:|---:|---:|---:|---:|")
        rows = {r["design"]: r for r in mem["memory"]}
        nb = rows["naive"]["bytes_per_session"]
        for d in ("kvgate", "naive"):
            r = rows[d]
            p(
                f"| {d} | {r['sessions']:,} | {r['bytes_per_session']:.1f} | "
                f"{r['bytes_per_session'] / nb:.2f}× | {r['after_expiry']:,} | "
                f"{r['after_retention']:,} | {r['after_finish']:,} | {r['after_finish_grace']:,} |"
            )
        p(
            "\nStages are live bytes above the empty gate. kvgate keeps an expired "
            "session's record (its stats) until `session_retention` (600 s) passes; a "
            "finish drops the record at once and leaves its 16-byte timer hint until "
            "the window's deadline (`idle_grace`).\n"
        )

    p("### Targets\n")
    p("| target | measured | met |")
    p("|---|---|---|")

    def target(name, measured, ok):
        p(f"| {name} | {measured} | {'yes' if ok else '**no**'} |")

    kh = c.get("open_1t/kvgate/hot")
    if kh and mutex:
        target("open path ≤ 10× one mutex lock", f"{ratio(kh, mutex)} ({ns(kh)} vs {ns(mutex)})", kh <= 10 * mutex)
    nh = c.get("open_1t/naive/hot")
    if kh and nh:
        target("open path not slower than naive", f"{ratio(kh, nh)} of naive", kh <= nh)
    kd, nd = c.get("open_mt/kvgate/distinct/8"), c.get("open_mt/naive/distinct/8")
    if kd and nd:
        target("8-thread throughput ≥ 2× naive", f"{ratio(nd, kd)}", nd >= 2 * kd)
    if lat:
        k = {r["waiters"]: r for r in lat["wakeup"] if r["design"] == "kvgate"}.get(256)
        if k:
            target("wake-up p99 < 1 ms, 256 waiters", ns(k["p99_ns"]), k["p99_ns"] < 1e6)
        k = {r["design"]: r for r in lat["preemption"]}["kvgate"]
        target(f"preemption p99 < 1 ms, {k['waiters']} waiters", ns(k["p99_ns"]), k["p99_ns"] < 1e6)
    if mem:
        r = {r["design"]: r for r in mem["memory"]}["kvgate"]
        target(
            f"≤ 256 B per session ({r['sessions']:,} sessions)",
            f"{r['bytes_per_session']:.1f} B",
            r["bytes_per_session"] <= 256,
        )
        back = r["after_retention"] == 0 and r["after_finish_grace"] == 0
        target(
            "back to baseline after expiry (+ retention) / finish (+ grace)",
            f"{r['after_retention']:,} B / {r['after_finish_grace']:,} B",
            back,
        )
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
