#!/usr/bin/env bash
# The measured distribution behind dedup's default thresholds.
#   bench/dedup_similarity.sh CRAWLED_WORKSPACE [N]
# Composes N (default 2000) template candidates into a copy of the workspace, treats every
# candidate as accepted (dedup only reads code and ops; with no traced ops it reads them from the
# AST), runs `opforge dedup` with both thresholds off (1.01) and prints: how many are exact
# duplicates by normal form, the histogram of each task's cosine to its nearest other task, the
# share above candidate thresholds, and the closest pairs with their op sequences, so the
# threshold can be set between "the same task written differently" and "different tasks".
set -euo pipefail
src=${1:?usage: bench/dedup_similarity.sh CRAWLED_WORKSPACE [N]}
n=${2:-2000}
bin=${OPFORGE:-./build/opforge}
py=${PYTHON:-.venv/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/ws"
"$py" - "$src/opforge.db" "$tmp/ws/opforge.db" <<'PY'
import sqlite3, sys
src = sqlite3.connect(sys.argv[1])
src.execute("PRAGMA wal_checkpoint(FULL)")
dst = sqlite3.connect(sys.argv[2])
src.backup(dst)
for t in ("tasks", "filter_results", "dedup_results", "compose_failures"):
    if dst.execute("SELECT name FROM sqlite_master WHERE name=?", (t,)).fetchone():
        dst.execute(f"DELETE FROM {t}")
dst.commit()
PY
"$bin" compose --workspace "$tmp/ws" --count "$n" 2> "$tmp/compose.log"
"$py" - "$tmp/ws/opforge.db" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
# The composed op names in the tracer's spelling (torch.nn.X -> nn.X, torch.nn.functional.x -> F.x),
# standing in for the ops the filter would trace.
import json, re
def traced(name):
    return re.sub(r"^torch\.nn\.functional\.", "F.", re.sub(r"^torch\.nn\.(?!functional)", "nn.", name))
for tid, code, ops in db.execute("SELECT id, code, ops FROM tasks").fetchall():
    db.execute("INSERT INTO filter_results(task_id, verdict, code, ops) VALUES (?, 'accepted', ?, ?)",
               (tid, code, json.dumps([traced(o) for o in json.loads(ops)])))
db.commit()
PY
"$bin" dedup --workspace "$tmp/ws" --threshold 1.0 --within-threshold 1.0 2> "$tmp/dedup.log"
"$py" - "$tmp/ws/opforge.db" <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT d.task_id, d.kept, d.reason, d.task_similarity, d.nearest_task, t.ops FROM dedup_results d "
                  "JOIN tasks t ON t.id = d.task_id").fetchall()
ops = {r[0]: json.loads(r[5]) for r in rows}
exact = sum(r[2] == "exact_duplicate" for r in rows)
kb = sum(r[2] == "kernelbench_ops" for r in rows)
sims = sorted((r[3], r[0], r[4]) for r in rows if r[1] and r[3] is not None)
print(f"{len(rows)} candidates: {exact} exact duplicates by normal form, {kb} spell a KernelBench level-2 name, "
      f"{len(sims)} others with a nearest neighbour")
edges = [0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 0.99, 1.0001]
print("cosine to the nearest other task:")
for lo, hi in zip(edges, edges[1:]):
    k = sum(lo <= s < hi for s, _, _ in sims)
    print(f"  [{lo:.2f}, {min(hi, 1):.2f}{']' if hi > 1 else ')'} {k:6d} {'#' * int(60 * k / max(1, len(sims)))}")
for t in (0.9, 0.95, 0.98, 0.99):
    print(f"  share >= {t}: {100 * sum(s >= t for s, _, _ in sims) / max(1, len(sims)):.2f}%")
print("closest pairs (cosine, ops, nearest's ops):")
for s, a, b in sims[-8:][::-1]:
    print(f"  {s:.4f}  {' > '.join(ops.get(a, []))}   ~   {' > '.join(ops.get(b, []))}")
PY
