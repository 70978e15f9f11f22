#!/usr/bin/env bash
# What decontamination catches: disguised copies of every KernelBench problem (bench/disguise.py:
# light = docstrings, comments and names gone; resize = + sizes doubled; rewrite = + functional
# spellings swapped), and what it costs tasks that are not copies (N graph candidates composed
# from a crawl). Every file is treated as accepted (dedup reads code, and ops from the AST when
# none were traced), then `opforge dedup --reference` against the checkout itself.
#   bench/decontam_recall.sh KB_CHECKOUT CRAWLED_WORKSPACE [N]     (OPFORGE, PYTHON as elsewhere)
set -euo pipefail
kb=${1:?usage: bench/decontam_recall.sh KB_CHECKOUT CRAWLED_WORKSPACE [N]}
src=${2:?a crawled workspace}
n=${3:-1000}
bin=${OPFORGE:-./build/opforge}
py=${PYTHON:-.venv/bin/python3}
root=$kb
[ -d "$kb/KernelBench" ] && root=$kb/KernelBench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" bench/disguise.py "$root" "$tmp/copies" >&2
for level in light resize rewrite; do
  ws=$tmp/ws_$level
  "$bin" import --workspace "$ws" "$tmp/copies/$level" 2> /dev/null
  "$py" bench/decontam_report.py accept "$ws"
  "$bin" dedup --workspace "$ws" --reference "$root" 2> "$tmp/dedup_$level.log"
  "$py" bench/decontam_report.py report "$ws" "$level"
done
mkdir -p "$tmp/wsu"
"$py" -c "import sqlite3, sys; s = sqlite3.connect(sys.argv[1]); d = sqlite3.connect(sys.argv[2]); s.backup(d)
for t in ('tasks', 'filter_results', 'dedup_results', 'compose_failures'):
    if d.execute('SELECT name FROM sqlite_master WHERE name=?', (t,)).fetchone(): d.execute(f'DELETE FROM {t}')
d.commit()" "$src/opforge.db" "$tmp/wsu/opforge.db"
"$bin" compose --workspace "$tmp/wsu" --count "$n" 2> "$tmp/compose.log"
"$bin" filter --workspace "$tmp/wsu" --device cpu --limit 1 2> /dev/null  # the filter's tables, one real verdict
"$py" bench/decontam_report.py accept "$tmp/wsu"
"$bin" dedup --workspace "$tmp/wsu" --reference "$root" 2> "$tmp/dedup_unrelated.log"
"$py" bench/decontam_report.py report "$tmp/wsu" "graph candidates"
