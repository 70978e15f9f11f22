"""Re-times a random sample of an exported corpus on this machine's GPU: the release audit of
docs/release.md. Each sampled record's eager forward is timed again with the filter's own timing
(opforge.timing.time_fn: L2 flush, device-wide sync, median of 20 trials, one retake when the
spread passes 3%) on the record's seed-1 inputs, and set beside the eager time the filter stored.

    python bench/retime_audit.py EXPORT_DIR [--sample 200] [--seed 0] [--device cuda] [--out FILE.json]

Prints a summary table on stdout (share still inside the 1-100 ms window, median drift, the
largest drifts) and writes every row to --out. Task code is the corpus's own (composed by
opforge, judged by its filter), so it runs in this process; a record that fails is a row with
its error, and the audit goes on.
"""
import argparse
import glob
import gzip
import json
import os
import random
import statistics
import sys
import time

import torch

from opforge import task as T
from opforge import timing


def records(export_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(export_dir, "*.jsonl*"))):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    if not rows:
        raise SystemExit(f"retime_audit: no *.jsonl or *.jsonl.gz records in {export_dir}: give an export folder")
    return rows


def retime(rec, device):
    mod = T.load_module(rec["code"])
    model = T.build(mod, device)
    inputs = T.make_inputs(mod, device, seed=1, on_device=True)
    with torch.no_grad():
        stats = timing.time_fn(lambda: model(*inputs), device, trials=20, retries=1)
    del model, inputs
    torch.cuda.empty_cache() if device == "cuda" else None
    return stats


def row_of(rec, device, window):
    stored = (rec.get("metrics") or {}).get("eager_ms")
    row = {"id": rec["id"], "stored_ms": stored}
    try:
        stats = retime(rec, device)
    except Exception as e:  # noqa: BLE001 - a record that fails is a finding, not the end of the audit
        row["error"] = f"{type(e).__name__}: {e}"[:300]
        return row
    ms = stats["median_ms"]
    row.update(ms=ms, spread=stats.get("spread"), in_window=window[0] <= ms <= window[1])
    if stored:
        row["drift"] = ms / stored - 1.0
    return row


def summary(rows, window):
    timed = [r for r in rows if "ms" in r]
    drifts = [r["drift"] for r in timed if "drift" in r]
    out = {"sampled": len(rows), "timed": len(timed), "errors": len(rows) - len(timed),
           "in_window": sum(r["in_window"] for r in timed), "window_ms": list(window)}
    if drifts:
        out.update(median_drift=statistics.median(drifts), median_abs_drift=statistics.median(abs(d) for d in drifts),
                   within_10pct=sum(abs(d) <= 0.10 for d in drifts))
    return out


def print_table(s, rows):
    print(f"sampled {s['sampled']}, timed {s['timed']}, errors {s['errors']}")
    if s["timed"]:
        print(f"inside {s['window_ms'][0]:g}-{s['window_ms'][1]:g} ms: {s['in_window']} of {s['timed']} "
              f"({100.0 * s['in_window'] / s['timed']:.1f}%)")
    if "median_drift" in s:
        print(f"drift (now / stored - 1): median {100 * s['median_drift']:+.1f}%, median |drift| "
              f"{100 * s['median_abs_drift']:.1f}%, within 10%: {s['within_10pct']} of {s['timed']}")
    worst = sorted((r for r in rows if "drift" in r), key=lambda r: -abs(r["drift"]))[:5]
    for r in worst:
        print(f"  {r['id']}  stored {r['stored_ms']:.3f} ms  now {r['ms']:.3f} ms  drift {100 * r['drift']:+.1f}%")
    for r in (r for r in rows if "error" in r):
        print(f"  {r['id']}  error {r['error']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export_dir")
    ap.add_argument("--sample", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--min-ms", type=float, default=1.0)
    ap.add_argument("--max-ms", type=float, default=100.0)
    ap.add_argument("--out", help="write every row and the summary here (JSON)")
    a = ap.parse_args()
    recs = records(a.export_dir)
    sample = random.Random(a.seed).sample(recs, min(a.sample, len(recs)))
    window, rows, t0 = (a.min_ms, a.max_ms), [], time.time()
    for i, rec in enumerate(sample, 1):
        rows.append(row_of(rec, a.device, window))
        if i % 20 == 0 or i == len(sample):
            print(f"retime_audit: {i}/{len(sample)} in {time.time() - t0:.0f} s", file=sys.stderr)
    s = summary(rows, window)
    s.update(device=torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu", torch=torch.__version__,
             records=len(recs), seed=a.seed)
    print_table(s, rows)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"summary": s, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
