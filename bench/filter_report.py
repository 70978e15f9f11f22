"""Summarise a filtered workspace: funnel, reasons, time distributions, timing spread.

    python3 bench/filter_report.py WORKSPACE [--wall-s SECONDS]
"""
import argparse
import json
import sqlite3
import statistics


def q(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))] if values else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workspace")
    ap.add_argument("--wall-s", type=float, default=None)
    a = ap.parse_args()
    db = sqlite3.connect(f"{a.workspace}/opforge.db")
    rows = db.execute("SELECT verdict, reason, metrics, calibration FROM filter_results").fetchall()
    # Twins of an accepted task are recorded exact_duplicate without running (filter/README.md):
    # dedup's drop made early, so they count neither as judged nor in the acceptance.
    twins = sum(1 for r in rows if r[0] == "rejected" and r[1] == "exact_duplicate")
    rows = [r for r in rows if not (r[0] == "rejected" and r[1] == "exact_duplicate")]
    n = len(rows)
    acc = [r for r in rows if r[0] == "accepted"]
    print(f"judged {n}, accepted {len(acc)} ({100 * len(acc) / max(n, 1):.1f}%); twins not run (exact_duplicate): {twins}")
    if a.wall_s:
        print(f"throughput {60 * n / a.wall_s:.1f} tasks/min ({n} in {a.wall_s:.0f} s)")
    reasons = {}
    for r in rows:
        if r[0] == "rejected":
            reasons[r[1]] = reasons.get(r[1], 0) + 1
    print("rejected by reason:")
    for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<20} {v:>5}")
    m = [json.loads(r[2]) for r in acc]
    cal = sum(1 for r in acc if r[3] and json.loads(r[3]))
    print(f"accepted after calibration: {cal}")
    for key in ("eager_ms", "compile_ms", "compile_speedup", "compile_wall_s", "peak_mem_mb"):
        vals = [x[key] for x in m if isinstance(x.get(key), (int, float))]
        if vals:
            print(f"{key:<16} p10 {q(vals, .1):8.3f}  p50 {q(vals, .5):8.3f}  p90 {q(vals, .9):8.3f}  (n={len(vals)})")
    spreads = [x["eager"]["spread"] for x in m if "eager" in x]
    if spreads:
        print(f"eager timing spread (p90-p10)/median: median {100 * statistics.median(spreads):.2f}%, "
              f"p90 {100 * q(spreads, .9):.2f}%, share under 3%: {100 * sum(s < 0.03 for s in spreads) / len(spreads):.0f}%")
        # Sets of trials taken per task (timing.time_fn retakes a disturbed set); absent before that.
        attempts = [x["eager"].get("attempts", 1) for x in m if "eager" in x]
        print("eager trial sets taken: " + ", ".join(f"{k}: {attempts.count(k)}" for k in sorted(set(attempts))))
    cspreads = [x["compiled"]["spread"] for x in m if "compiled" in x]
    if cspreads:
        print(f"compiled timing spread: median {100 * statistics.median(cspreads):.2f}%, p90 {100 * q(cspreads, .9):.2f}%")
    # Where a task's time goes (metrics.phases, every judged task; lock waits are inside the phases too).
    ph = [json.loads(r[2]).get("phases") for r in rows]
    ph = [p for p in ph if p]
    if ph:
        print(f"time per judged task, seconds (n={len(ph)}): phase, mean, p50, p90, share of the total")
        keys = ["build_s", "inputs_s", "checks_s", "window_s", "conditioning_s", "compile_s", "timing_wait_s",
                "eager_timing_s", "compile_timing_s", "lock_wait_s"]
        total = sum(sum(v for k, v in p.items() if k != "lock_wait_s") for p in ph)
        for k in keys:
            vals = [p.get(k, 0.0) for p in ph]
            share = sum(vals) / total if total and k != "lock_wait_s" else float("nan")
            print(f"  {k:<17} {statistics.mean(vals):8.3f} {q(vals, .5):8.3f} {q(vals, .9):8.3f}  {100 * share:5.1f}%")
    dev = {x.get("device") for x in m}
    print(f"device: {', '.join(sorted(d for d in dev if d))}")


if __name__ == "__main__":
    main()
