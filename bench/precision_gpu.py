#!/usr/bin/env python3
"""The judge's precision check (judge-13, tolerance.precision_ratio) on a GPU, over accepted tasks
of a filter database: how near torch.compile's output is to float64 (filter-7 rejects a task whose
compile output is past tolerance.PRECISION_RATIO, so this says how many it would lose), and how far
float32 work done in a lower precision is (TF32 matmuls and convolutions, bf16 autocast), with
whether the 1e-2 rule alone would pass it (the hole the check closes).

    python3 bench/precision_gpu.py --db corpus/checkpoints/ops6k-h200.db.gz --n 64 --workers 8 \
        --budget-s 240 --out precision.jsonl

One line per task on --out (and stdout); a summary on stderr at the end. Tasks run in --workers
processes on --device (cuda:0); a task that fails (memory, an op without float64) is a line with its error.
"""
import argparse
import gzip
import json
import multiprocessing as mp
import os
import random
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def accepted_codes(db_path, n, seed):
    """(task id, code) of n accepted tasks, drawn with seed (a .gz database is unpacked first)."""
    path = db_path
    if db_path.endswith(".gz"):
        fd, path = tempfile.mkstemp(suffix=".db")
        with gzip.open(db_path, "rb") as src, os.fdopen(fd, "wb") as dst:
            dst.write(src.read())
    rows = sqlite3.connect(path).execute(
        "SELECT task_id, code FROM filter_results WHERE verdict = 'accepted' AND code IS NOT NULL ORDER BY task_id"
    ).fetchall()
    random.Random(seed).shuffle(rows)
    return rows[:n]


def _ratio(outs, refs, truth, numel):
    from opforge import tolerance as tol

    outs = [o.to(r.dtype) if o.is_floating_point() and r.is_floating_point() else o for o, r in zip(outs, refs)]
    worst, _ = tol.precision_check(outs, refs, truth, numel)
    return worst, tol.close(outs, refs)


def measure(item, device="cuda:0"):
    """The ratios of one task: compile, TF32 and bf16 autocast against eager float32 and float64."""
    import torch

    from opforge import task as T
    from opforge import tolerance as tol

    task_id, code = item
    row = {"task": task_id}
    t0 = time.perf_counter()
    try:
        tol.exact_fp32()
        mod = T.load_module(code, name=f"t_{task_id[:12]}")
        model = T.build(mod, device, seed=0).eval()
        inputs = T.make_inputs(mod, device, seed=1, on_device=True)
        numel = tol.input_numel(inputs)
        with torch.no_grad():
            ref = T.flatten_outputs(model(*inputs))
            truth = tol.float64_outputs(model, inputs, T.flatten_outputs)
            row["compile"], _ = _ratio(T.flatten_outputs(torch.compile(model)(*inputs)), ref, truth, numel)
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            row["tf32"], row["tf32_passes_rule"] = _ratio(T.flatten_outputs(model(*inputs)), ref, truth, numel)
            tol.exact_fp32()
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
                row["bf16"], row["bf16_passes_rule"] = _ratio(T.flatten_outputs(model(*inputs)), ref, truth, numel)
    except Exception as e:  # noqa: BLE001 - a task's failure is its line, the run goes on
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        torch._dynamo.reset()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def summary(rows, limit):
    ok = [r for r in rows if "error" not in r]

    def share(key, pred):
        vals = [r[key] for r in ok if r.get(key) is not None]
        return f"{sum(pred(v) for v in vals)}/{len(vals)}"

    comp = sorted(r["compile"] for r in ok if r.get("compile") is not None)
    lines = [f"tasks {len(rows)}, measured {len(ok)}, failed {len(rows) - len(ok)}",
             f"compile: ratio > {limit}: {share('compile', lambda v: v > limit)}; median "
             f"{comp[len(comp) // 2] if comp else None}, max {comp[-1] if comp else None}",
             f"tf32 (changes the output at all): ratio > {limit}: {share('tf32', lambda v: v > limit)}; "
             f"passes the 1e-2 rule: {share('tf32_passes_rule', bool)}",
             f"bf16 autocast: ratio > {limit}: {share('bf16', lambda v: v > limit)}; "
             f"passes the 1e-2 rule: {share('bf16_passes_rule', bool)}",
             "caught by the check and passed by the rule alone: tf32 "
             f"{sum(1 for r in ok if r.get('tf32_passes_rule') and (r.get('tf32') or 0) > limit)}, bf16 "
             f"{sum(1 for r in ok if r.get('bf16_passes_rule') and (r.get('bf16') or 0) > limit)}"]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="a filter database (.db or .db.gz) with accepted tasks")
    ap.add_argument("--n", type=int, default=64, help="tasks drawn at random from the accepted ones")
    ap.add_argument("--workers", type=int, default=8, help="processes sharing cuda:0")
    ap.add_argument("--budget-s", type=float, default=240.0, help="no task is started after this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda:0", help="cuda:0, or cpu for a try of the script itself")
    ap.add_argument("--out", default="precision.jsonl")
    a = ap.parse_args()
    from opforge import tolerance as tol

    items = accepted_codes(a.db, a.n, a.seed)
    print(f"precision_gpu: {len(items)} tasks, {a.workers} workers", file=sys.stderr)
    start, rows = time.time(), []
    ctx = mp.get_context("spawn")
    with ctx.Pool(a.workers, maxtasksperchild=4) as pool, open(a.out, "w") as out:
        pending = [pool.apply_async(measure, (it, a.device)) for it in items]
        for k, p in enumerate(pending):
            left = a.budget_s - (time.time() - start)
            if left <= 0:
                break
            try:
                row = p.get(timeout=left)
            except mp.TimeoutError:
                break
            rows.append(row)
            line = json.dumps(row)
            print(line, file=out, flush=True)
            print(line, flush=True)
            print(f"[{k + 1}/{len(items)}] {time.time() - start:.0f} s", file=sys.stderr)
        pool.terminate()
    print(summary(rows, tol.PRECISION_RATIO), file=sys.stderr)


if __name__ == "__main__":
    main()
