"""The table of bench/eval_gpu.sh: verdicts against expectations, sandbox, dispatch and cold start,
the judge's clock against the profiler's kernel time, repeatability and throughput.
    python3 bench/eval_gpu_report.py OUT_DIR FIXTURES_DIR      (exit 1 when an expectation fails)"""
import glob
import json
import os
import re
import statistics
import sys


def expected(fx):
    """Reason each hack row must end with (docstring "expect `reason`"); KernelBench kernels: any -1."""
    exp = {}
    for f in glob.glob(os.path.join(fx, "hacks", "*", "*.py")):
        m = re.search(r"expect[^`]*`([A-Za-z_]+)`", open(f).read())
        exp[f"{os.path.basename(os.path.dirname(f))}__{os.path.basename(f)[:-3]}"] = m.group(1) if m else "?"
    return exp


def rows(out, run):
    p = os.path.join(out, run, "report.json")
    return json.load(open(p))["results"] if os.path.exists(p) else None


def f3(v):
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def verdict(r, exp):
    want = exp.get(r["task"])
    if r["task"].startswith("kb_"):
        return r["reward"] == -1, "-1 (any reason)"
    if want is None:
        return r["correct"] and r["reward"] >= 1, "correct"
    return r["reward"] == -1 and (want == "?" or r["reason"] == want), want


def table(out, run, exp):
    bad = 0
    for r in rows(out, run) or []:
        ok, want = verdict(r, exp)
        bad += not ok
        prof = r.get("profile") or {}
        print(f"{run:<8} {r['task'][:44]:<44} {str(r['reason'] or 'correct'):<22} {want:<18} "
              f"{f3(r.get('candidate_ms')):>8} {f3(r.get('eager_ms')):>8} {f3(r.get('compile_ms')):>8} "
              f"{f3(r.get('speedup_eager')):>7} {r['reward']:>3} {'PASS' if ok else 'FAIL':<5} "
              f"{f3(r.get('dispatch_s')):>6} {f3(r.get('cold_start_s')):>6} {f3(prof.get('judge_over_kernels')):>6} "
              f"b{((r.get('timing') or {}).get('candidate') or {}).get('batch', '-')} {','.join(r['flags'])}")
        print(f"{'':<9}seconds: {phases(r)}")
        if not ok:
            print(f"{'':<9}detail: {r['detail'][:300]}")
    return bad


def overhead(run, r):
    """The judge's per-call time against the profiler's kernels, and where a batch's time went:
    the crossing outside the child's clock, then (profiling pass) first launch, GPU idle, sync."""
    prof, cand = r.get("profile") or {}, (r.get("timing") or {}).get("candidate") or {}
    ratio = prof.get("judge_over_kernels")
    if not (r.get("correct") and isinstance(ratio, (int, float))):
        return
    shaping = r["task"].startswith("shaping__")
    ok = ratio >= 0.98 if shaping else abs(ratio - 1) <= 0.05
    print(f"judge vs profiler kernels, {run} {r['solution']}: {ratio:.3f} "
          f"({'PASS' if ok else 'FAIL'} against {'0.98 (shaping: not faster than its kernels)' if shaping else '5%'})")
    parts = prof.get("batch_ms") or {}
    print(f"    per batch of {cand.get('batch')}: request {f3(cand.get('request_ms'))} ms, answer "
          f"{f3(cand.get('answer_ms'))}, floor {f3(cand.get('floor_ms'))}, fixed {f3(cand.get('fixed_ms'))} (intercept "
          f"{f3(cand.get('intercept_ms'))}, own {f3(cand.get('fixed_own_ms'))}, small batch {cand.get('small_batch')}), "
          f"in-child {f3(cand.get('child_median_ms'))}"
          f"/call; profiled: " + ", ".join(f"{k} {f3(parts.get(k))}" for k in ("wall", "lead", "launch", "busy", "gaps", "tail")))


def phases(r):
    """Where one evaluation's seconds went: dispatch, then the judge's phases (row's phase_s)."""
    ph = dict(r.get("phase_s") or {})
    if isinstance(r.get("dispatch_s"), (int, float)):
        ph = {"dispatch": r["dispatch_s"], **ph}
    return ", ".join(f"{k} {v:.2f}" for k, v in ph.items() if isinstance(v, (int, float))) or "-"


def journal_phases(path):
    """Per phase: [(jobs, seconds, verdicts)] from an eval journal, one entry per time the phase ran
    (a resumed run runs it again for what is left; a killed one is timed up to its last verdict)."""
    lines = [json.loads(x) for x in open(path) if x.strip()]
    seen = {}
    for i, ln in enumerate(lines):
        if "phase" not in ln:
            continue
        end, verdicts = None, 0
        for nxt in lines[i + 1:]:
            if "phase" in nxt or "journal" in nxt:
                end = nxt["at"] if "phase" in nxt else end
                break
            if "key" in nxt:
                end, verdicts = nxt["at"], verdicts + 1
        if end is not None:
            seen.setdefault(ln["phase"], []).append((ln["jobs"], end - ln["at"], verdicts))
    return seen


def throughput(out, tp):
    """The 64-file run's rate from its journal: evaluation phases summed over the calls it took."""
    ph = journal_phases(os.path.join(out, "throughput", "journal.jsonl"))
    ev, bd = ph.get("evaluate", []), ph.get("build", [])
    n, secs = sum(v for _, _, v in ev), sum(s for _, s, _ in ev)
    ok = sum(r["correct"] for r in tp)
    print(f"throughput: {len(tp)} solutions ({ok} correct), 8 distinct sources, in {len(ev)} run(s) of opforge eval "
          f"(a cut run resumed from its journal)")
    print("    builds: " + "; ".join(f"{j} solutions {s:.1f} s" for j, s, _ in bd))
    if secs > 0:
        print(f"    evaluation phases: {n} verdicts in {secs:.1f} s = {60 * n / secs:.1f} solutions/min "
              f"({', '.join(f'{v} in {s:.1f} s' for _, s, v in ev)})")


def _spread(xs):
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else 0.0


def _iqm(xs):
    xs = sorted(xs)
    q = len(xs) // 4
    return statistics.fmean(xs[q:len(xs) - q] or xs)


def estimators(cand):
    """Per-call figures the same timed batches give under other estimators (ms), from the row's
    samples: the verdict's (slope of the two sizes' medians, clamped), the median of the slopes of
    adjacent (big, small) pairs, the slope of the inter-quartile means, and the big batches alone
    less the crossing floor."""
    samples, k, m = cand.get("samples") or [], cand.get("batch"), cand.get("small_batch")
    big = [ms for n, ms in samples if n == k]
    small = [ms for n, ms in samples if n == m]
    if not big or not small or not m:
        return {}
    pairs = [(b, s) for (nb, b), (ns, s) in zip(samples[::2], samples[1::2]) if nb == k and ns == m]
    return {"medians": (statistics.median(big) - statistics.median(small)) / (k - m),
            "pairs": statistics.median([(b - s) / (k - m) for b, s in pairs]) if pairs else None,
            "iqm": (_iqm(big) - _iqm(small)) / (k - m),
            "big-floor": (statistics.median(big) - (cand.get("floor_ms") or 0.0)) / k}


def repeatability(out):
    """The same solution in separate processes: its medians' (max - min) / median against 1%, and
    beside them what each run's batches give under other estimators and the profiler's kernels."""
    runs = sorted((d for d in os.listdir(out) if re.fullmatch(r"repeat_\d+", d)), key=lambda d: int(d[7:]))
    got = [(d, r) for d in runs for r in rows(out, d) or [] if r.get("candidate_ms")]
    if len(got) < 3:
        return 0
    clocks = open(os.path.join(out, "repeat_clocks.txt")).read().splitlines() \
        if os.path.exists(os.path.join(out, "repeat_clocks.txt")) else []
    alt = {}
    for i, (d, r) in enumerate(got):
        cand, prof = (r.get("timing") or {}).get("candidate") or {}, r.get("profile") or {}
        est = estimators(cand)
        for k, v in est.items():
            alt.setdefault(k, []).append(v)
        alt.setdefault("kernels", []).append(prof.get("kernel_ms_per_call"))
        print(f"{d}: judge {f3(r['candidate_ms'])} ms, kernels {f3(prof.get('kernel_ms_per_call'))}, "
              f"fixed {f3(cand.get('fixed_ms'))} (intercept {f3(cand.get('intercept_ms'))}, floor "
              f"{f3(cand.get('floor_ms'))}), batch {cand.get('batch')}/{cand.get('small_batch')}, spread "
              f"{f3(cand.get('spread'))}; " + ", ".join(f"{k} {f3(v)}" for k, v in est.items())
              + (f"; gpu {clocks[i]}" if i < len(clocks) else ""))
    for k, xs in alt.items():
        if all(isinstance(x, (int, float)) for x in xs):
            print(f"  {k}: (max-min)/median {100 * _spread(xs):.2f}% over {len(xs)} runs")
    meds = [r["candidate_ms"] for _, r in got[:3]]
    spread = _spread(meds)
    print(f"repeatability (elementwise_chain, first 3 processes of {len(got)}): {', '.join(f3(m) for m in meds)} ms, "
          f"(max-min)/median {100 * spread:.2f}% vs 1%: {'PASS' if spread < 0.01 else 'FAIL'}")
    return int(spread >= 0.01)


def main(out, fx):
    exp = expected(fx)
    print(f"{'run':<8} {'task':<44} {'reason':<22} {'expected':<18} {'cand ms':>8} {'eager':>8} {'compile':>8} "
          f"{'x eager':>7} {'rwd':>3} {'':<5} {'disp s':>6} {'cold s':>6} {'judge/kern':>6} batch flags")
    bad = sum(table(out, run, exp) for run in ("all", "allowed"))
    sandboxes = {r.get("sandbox") for run in ("all", "allowed") for r in rows(out, run) or []}
    print("sandbox of the rows:", sandboxes)
    for run in ("all", "allowed"):
        for r in rows(out, run) or []:
            overhead(run, r)
    bad += repeatability(out)
    tp = rows(out, "throughput")
    if tp:
        throughput(out, tp)
        disp = sorted(r["dispatch_s"] for r in tp if isinstance(r.get("dispatch_s"), (int, float)))
        cold = sorted(r["cold_start_s"] for r in tp if isinstance(r.get("cold_start_s"), (int, float)))
        for k in ("checks", "timing", "profile"):
            xs = sorted((r.get("phase_s") or {}).get(k) for r in tp if isinstance((r.get("phase_s") or {}).get(k), (int, float)))
            if xs:
                print(f"    {k} phase (s): median {f3(xs[len(xs) // 2])}, max {f3(xs[-1])}")
        if disp:
            print(f"dispatch to ready (s): median {f3(disp[len(disp) // 2])}, max {f3(disp[-1])}; "
                  f"cold start of a child (s): median {f3(cold[len(cold) // 2]) if cold else '-'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
