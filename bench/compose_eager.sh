#!/usr/bin/env bash
# How many template candidates build and run in eager at their chosen sizes (issue 3's 95% bar).
#   bench/compose_eager.sh WORKSPACE [COUNT]
# Composes COUNT candidates into a copy of WORKSPACE (which must be crawled), writes each as a
# KernelBench file and probes them all with `opforge crawl --add` on the CPU. Prints a table.
set -euo pipefail
src=${1:?usage: bench/compose_eager.sh WORKSPACE [COUNT]}
count=${2:-2000}
bin=${OPFORGE:-./build/opforge}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/ws" "$tmp/files"
cp "$src/opforge.db" "$tmp/ws/"
sqlite3 "$tmp/ws/opforge.db" "DELETE FROM tasks; DELETE FROM compose_failures;" 2>/dev/null || true
start=$(date +%s.%N)
"$bin" compose --workspace "$tmp/ws" --count "$count" 2> "$tmp/compose.log"
end=$(date +%s.%N)
python3 - "$tmp/ws/opforge.db" "$tmp/files" <<'PY'
import sqlite3, sys, os
db = sqlite3.connect(sys.argv[1])
for tid, code in db.execute("SELECT id, code FROM tasks"):
    open(os.path.join(sys.argv[2], f"t_{tid}.py"), "w").write(code)
PY
"$bin" crawl --workspace "$tmp/probe" --sources none --add "$tmp/files" --timeout-s 120 2> "$tmp/probe.log"
echo "compose: $count candidates in $(printf '%.1f' "$(python3 -c "print($end - $start)")") s"
sqlite3 "$tmp/ws/opforge.db" "SELECT 'bucket ' || b || ': ' || n || ' (' || printf('%.1f', 100.0*n/$count) || '%)' FROM (SELECT json_extract(provenance,'\$.bucket') AS b, count(*) AS n FROM tasks GROUP BY b) ORDER BY b"
sqlite3 "$tmp/probe/opforge.db" "SELECT 'eager on cpu: ' || sum(status='runnable') || '/' || count(*) || ' run (' || printf('%.1f', 100.0*sum(status='runnable')/count(*)) || '%)' FROM seeds"
sqlite3 "$tmp/probe/opforge.db" "SELECT '  failed: ' || reason || ' x' || count(*) || ': ' || substr(min(detail), 1, 120) FROM seeds WHERE status='skipped' GROUP BY reason ORDER BY count(*) DESC"
