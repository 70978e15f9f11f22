#!/usr/bin/env python3
"""The filter's eager checks (filter.eager_checks: finite, deterministic, constant, input
sensitivity, judge_distinguishable with dead_compute) over accepted tasks of a filter database, one
child process per task with a time limit: which of them a newer filter would reject, and why. Made
for filter-9's dead_compute (false positives among tasks an older filter accepted).

    python3 bench/eager_checks_sweep.py --db corpus/checkpoints/ops6k-h200.db.gz --device cpu \
        --seconds 2400 --timeout-s 120 --out sweep.jsonl

Transformers modules first, then the rest in a seeded random order; one line per task on --out
(appended, so a cut run keeps what it measured) and a summary on stderr.
"""
import argparse
import collections
import gzip
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from opforge import filter as F
try:
    F.eager_checks(open(sys.argv[2]).read(), sys.argv[3], 1e-2, 1e-2)
    print("accepted")
except F.Reject as e:
    print(f"{e.reason}: {str(e)[:300]}")
"""


def accepted(db_path, seed):
    """(id, source, code) of the accepted tasks, transformers modules first; a .gz database is read
    into memory (sqlite3's deserialize), not unpacked to a file."""
    con = sqlite3.connect(":memory:")
    with (gzip.open if db_path.endswith(".gz") else open)(db_path, "rb") as f:
        con.deserialize(f.read())
    rows = con.execute("SELECT t.id, t.source, f.code FROM filter_results f JOIN tasks t ON t.id = f.task_id "
                       "WHERE f.verdict = 'accepted'").fetchall()
    random.Random(seed).shuffle(rows)
    return sorted(rows, key=lambda r: r[1] != "transformers")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seconds", type=float, default=2400, help="stop starting tasks after this long")
    ap.add_argument("--timeout-s", type=float, default=120, help="limit of one task")
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    end, counts = time.time() + a.seconds, collections.Counter()
    with open(a.out, "a") as out, tempfile.NamedTemporaryFile("w", suffix=".py") as task:
        for tid, source, code in accepted(a.db, a.seed):
            if time.time() > end:
                break
            task.seek(0), task.truncate(), task.write(code), task.flush()
            t0 = time.time()
            try:
                p = subprocess.run([sys.executable, "-c", CHILD, os.path.join(HERE, "..", "python"), task.name, a.device],
                                   capture_output=True, text=True, timeout=a.timeout_s)
                result = (p.stdout.strip().splitlines() or [f"error: {p.stderr[-300:]}"])[-1]
            except subprocess.TimeoutExpired:
                result = "timeout"
            counts[result.split(":")[0]] += 1
            out.write(json.dumps({"id": tid, "source": source, "result": result, "s": round(time.time() - t0, 1)}) + "\n")
            out.flush()
            print(f"{sum(counts.values())} tasks: {dict(counts)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
