#!/usr/bin/env bash
# Times `opforge eval` on the CPU fixtures: a cold run (builds the extension, measures the
# baselines) and a warm one (both cached), and prints the report of the warm run.
# Usage: bench/eval_cpu.sh [BUILD_DIR]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/build}/opforge"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fx="$root/tests/fixtures/eval"
for run in cold warm; do
  start=$(date +%s.%N)
  "$bin" eval --tasks "$fx/tasks" --solutions "$fx/solutions" --out "$tmp/$run" --cache-dir "$tmp/cache" \
    --device cpu --no-plots >"$tmp/$run.md"
  end=$(date +%s.%N)
  printf '%-5s %6.1f s\n' "$run" "$(echo "$end - $start" | bc)"
done
cat "$tmp/warm.md"
