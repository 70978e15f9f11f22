#!/usr/bin/env bash
# KernelBench's levels 1-3 imported and filtered on one GPU, with the verdicts per level before
# (first attempt, under the workers' shared memory) and after (the retry alone), then why the
# level-3 compile_mismatch problems differ (bench/compile_mismatch.py).
#   bench/kb_filter.sh KB_CHECKOUT WORKSPACE [WORKERS]    (OPFORGE, PYTHON as in filter_throughput.sh)
# KB_CHECKOUT is a user's KernelBench checkout (its KernelBench/level1..3 folders); not ours to ship.
set -uo pipefail
bin=${OPFORGE:-./build/opforge}
py=${PYTHON:-python3}
kb=$1 ws=$2 workers=${3:-8}
root=$kb
[ -d "$kb/KernelBench/level1" ] && root=$kb/KernelBench
for l in 1 2 3; do "$bin" import --workspace "$ws" "$root/level$l" 2>> "$ws.import.log" | tail -1; done
start=$(date +%s)
# FILTER_TIMEOUT cuts the filter, not the report: what was judged is reported either way (resumable).
timeout "${FILTER_TIMEOUT:-3600}" "$bin" filter --workspace "$ws" --device cuda --workers "$workers" 2> "$ws.filter.log"
echo "filter rc $?, $(( $(date +%s) - start )) s with $workers workers"
grep -E "filter:|alone" "$ws.filter.log" | tail -4
$py bench/kb_report.py "$ws" --json "$ws.kb_report.json"
mapfile -t mism < <($py -c "
import json, sys
for r in json.load(open(sys.argv[1]))['compile_mismatch']: print(r['path'])" "$ws.kb_report.json")
[ ${#mism[@]} -gt 0 ] && $py bench/compile_mismatch.py "${mism[@]}" --json "$ws.compile_mismatch.json"
