#!/usr/bin/env bash
# How real the composers' candidates look, and how many distinct structures they give
# (docs/realism.md, "What the composers make" and "Limits, measured").
#   bench/compose_realism.sh WORKSPACE [COUNT] [DEVICE] [REFERENCE...]
# Composes COUNT candidates with each offline backend (template, graph) into copies of WORKSPACE
# (which must be crawled), sized for DEVICE (cpu or cuda; graph only), then prints
# `opforge realism` for both side by side (with each REFERENCE folder, e.g. a KernelBench
# checkout's KernelBench/level2) and, per bucket, how many candidates have a distinct normal
# form (dedup's exact-duplicate key: names and numbers do not count).
set -euo pipefail
src=${1:?usage: bench/compose_realism.sh WORKSPACE [COUNT] [DEVICE] [REFERENCE...]}
count=${2:-2000}
device=${3:-cpu}
shift $(( $# < 3 ? $# : 3 ))
bin=${OPFORGE:-./build/opforge}
py=${OPFORGE_PYTHON:-./.venv/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
refs=()
for r in "$@"; do refs+=(--tasks "$r"); done
for backend in template graph; do
  mkdir -p "$tmp/$backend"
  cp "$src/opforge.db" "$tmp/$backend/"
  sqlite3 "$tmp/$backend/opforge.db" "DELETE FROM tasks; DELETE FROM compose_failures;" 2>/dev/null || true
  "$bin" compose --workspace "$tmp/$backend" --backend "$backend" --device "$device" --count "$count" \
    2> "$tmp/$backend.log"
done
"$bin" realism --tasks "$tmp/template" --tasks "$tmp/graph" "${refs[@]}" 2>/dev/null
echo
for backend in template graph; do
  echo "distinct normal forms per bucket ($backend):"
  PYTHONPATH=python "$py" - "$tmp/$backend/opforge.db" <<'PY'
import collections, sqlite3, sys
from opforge.features import features_of
db = sqlite3.connect(sys.argv[1])
norms, n = collections.defaultdict(set), collections.Counter()
for bucket, code in db.execute("SELECT json_extract(provenance, '$.bucket'), code FROM tasks"):
    norms[bucket].add(features_of(code)["normal"])
    n[bucket] += 1
for b in sorted(n):
    print(f"  bucket {b:<13} {len(norms[b]):>6} of {n[b]:>6}")
print(f"  all           {sum(len(v) for v in norms.values()):>6} of {sum(n.values()):>6}")
PY
done
