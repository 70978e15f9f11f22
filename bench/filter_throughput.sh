#!/usr/bin/env bash
# Filter throughput on one GPU for 1, 2, 4 and 8 workers over the same fixed candidate set.
#   bench/filter_throughput.sh WORKSPACE [N] [WORKER_COUNTS...]
# WORKSPACE must hold composed candidates; the first N (by id) are filtered from scratch for each
# worker count, each with a cold inductor cache, and a table of tasks/min and the funnel printed.
set -euo pipefail
src=${1:?usage: bench/filter_throughput.sh WORKSPACE [N] [WORKER_COUNTS...]}
n=${2:-40}
shift $(( $# >= 2 ? 2 : 1 ))
counts=("$@")
[ ${#counts[@]} -eq 0 ] && counts=(1 2 4 8)
bin=${OPFORGE:-./build/opforge}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
printf '%-8s %-10s %-12s %-9s %-10s %-9s %-8s %s\n' workers wall_s tasks/min accepted spread_p50 under_3% retaken rejected_by_reason
for w in "${counts[@]}"; do
  tmp=$(mktemp -d)
  mkdir -p "$tmp/ws"
  "$py" - "$src/opforge.db" "$tmp/ws/opforge.db" "$n" <<'PY'
import sqlite3, sys, shutil
shutil.copy(sys.argv[1], sys.argv[2])
db = sqlite3.connect(sys.argv[2])
keep = [r[0] for r in db.execute("SELECT id FROM tasks ORDER BY id LIMIT ?", (int(sys.argv[3]),))]
db.execute("DELETE FROM filter_results") if db.execute("SELECT name FROM sqlite_master WHERE name='filter_results'").fetchone() else None
db.execute(f"DELETE FROM tasks WHERE id NOT IN ({','.join('?' * len(keep))})", keep)
db.commit()
PY
  start=$(date +%s.%N)
  TORCHINDUCTOR_CACHE_DIR="$tmp/inductor" "$bin" filter --workspace "$tmp/ws" --device cuda --workers "$w" 2> "$tmp/filter.log"
  end=$(date +%s.%N)
  wall=$("$py" -c "print($end - $start)")
  "$py" - "$tmp/ws/opforge.db" "$w" "$wall" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
import json, statistics
rows = db.execute("SELECT verdict, reason FROM filter_results").fetchall()
acc = sum(v == "accepted" for v, _ in rows)
eager = [json.loads(m)["eager"] for (m,) in db.execute("SELECT metrics FROM filter_results WHERE verdict='accepted'")]
sp = [e["spread"] for e in eager]
spread = f"{100 * statistics.median(sp):.2f}%" if sp else "-"
under = f"{100 * sum(x < 0.03 for x in sp) / len(sp):.0f}%" if sp else "-"
# tasks whose first set of trials was disturbed and taken again (timing.time_fn)
retaken = sum(e.get("attempts", 1) > 1 for e in eager)
reasons = {}
for v, r in rows:
    if v == "rejected":
        reasons[r] = reasons.get(r, 0) + 1
wall = float(sys.argv[3])
print(f"{sys.argv[2]:<8} {wall:<10.1f} {60 * len(rows) / wall:<12.1f} {acc:<9} {spread:<10} {under:<9} {retaken:<8} "
      + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())))
PY
  rm -rf "$tmp"
done
