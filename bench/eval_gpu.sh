#!/usr/bin/env bash
# The judge on a GPU (H200): every solution in its own sandboxed child; honest CUDA solutions,
# planted GPU hacks, KernelBench's public adversarial kernels, repeatability and throughput.
#   bench/eval_gpu.sh [OUT_DIR]      (OPFORGE=path/to/opforge, default ./build/opforge; from the repo root)
#   KB=DIR   optional: KernelBench's level-1 problem 1 and its three adversarial kernels, laid out as
#            DIR/tasks/<name>.py and DIR/hacks/<name>.py (kb_<kernel>__1_Square_matrix_multiplication_.py);
#            KernelBench's code is not ours: a user's checkout, carried for the measurement only.
# Runs (each one `opforge eval` process, reports in OUT_DIR/<run>/report.json, logs OUT_DIR/<run>.log):
#   all        strict: tasks/ with solutions/, released/ (CUDA Agent's released layout), every hack folder of
#              hacks/ against the task it targets, and the KernelBench kernels: honest rows must be correct,
#              hacks reward -1 with the reason their docstring names ("expect `reason`")
#   allowed    the honest solutions, the hacks and KernelBench kernels again under --policy torch-allowed:
#              hacks still -1 (isolation, not only the guard)
#   repeat_N   the elementwise solution in REPEATS (3) processes: spread of the candidate medians against 1%
#   throughput 64 solution files (8 distinct extension sources x 8 copies) of elementwise_chain; a run
#              cut by a call's limit resumes from OUT_DIR/throughput/journal.jsonl when started again
#              (TP_WORKERS=N: N judge workers sharing the GPU, the timing lock between them)
# RUNS="all allowed repeat throughput" (the default) picks which; THROUGHPUT=0 drops the last.
set -euo pipefail
bin=${OPFORGE:-./build/opforge}
fx=tests/fixtures/eval_gpu
out=${1:-${OUT_DIR:-eval_gpu_report}}
cache="$out/cache"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"

run_eval() {  # NAME TASKS SOLUTIONS [ARGS...]: one opforge eval process
  local name=$1 tasks=$2 sols=$3 rc=0 start
  shift 3
  start=$(date +%s.%N)
  "$bin" eval --tasks "$tasks" --solutions "$sols" --device cuda --cache-dir "$cache" --no-plots --require-sandbox \
    --out "$out/$name" "$@" > "$out/$name.log" 2>&1 || rc=$?
  python3 -c "import sys; print(f'== {sys.argv[1]}: {float(sys.argv[3]) - float(sys.argv[2]):.1f} s, rc {sys.argv[4]}')" \
    "$name" "$start" "$(date +%s.%N)" "$rc" >&2
  [ "$rc" = 0 ] || { echo "   opforge eval failed, see $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; }
}

add_as() {  # SRC NAME TASK DIR: SRC (file or folder) becomes solution NAME of a copy of TASK
  cp "$3" "$4/tasks/$2.py"
  if [ -d "$1" ]; then cp -r "$1" "$4/sols/$2"; else cp "$1" "$4/sols/$2.py"; fi
}

mkdir -p "$tmp/all/tasks" "$tmp/all/sols" "$tmp/hk/tasks" "$tmp/hk/sols"
cp "$fx"/tasks/*.py "$tmp/all/tasks/"
cp -r "$fx"/solutions/* "$tmp/all/sols/"
# The honest rows under torch-allowed too: no observer over their timed calls (its cost, if any, shows)
cp "$fx"/tasks/*.py "$tmp/hk/tasks/"
cp -r "$fx"/solutions/* "$tmp/hk/sols/"
for e in "$fx"/released/*; do add_as "$e" "released__$(basename "$e")" "$fx/tasks/$(basename "$e").py" "$tmp/all"; done
# Shaping: correct, slows its small batches on purpose; must not come out faster than its kernels
for e in "$fx"/shaping/*.py; do
  for d in all hk; do add_as "$e" "shaping__$(basename "$e" .py)" "$fx/tasks/$(basename "$e")" "$tmp/$d"; done
done
for h in "$fx"/hacks/*/; do
  h=${h%/}
  for e in "$h"/*; do
    key=$(basename "$e" .py)
    [ -f "$fx/tasks/$key.py" ] || continue
    for d in all hk; do add_as "$e" "$(basename "$h")__$key" "$fx/tasks/$key.py" "$tmp/$d"; done
  done
done
if [ -n "${KB:-}" ] && [ -d "$KB/hacks" ]; then
  for e in "$KB"/hacks/*.py; do
    n=$(basename "$e" .py)
    for d in all hk; do cp "$KB/tasks/$n.py" "$tmp/$d/tasks/"; cp "$e" "$tmp/$d/sols/"; done
  done
fi
runs=" ${RUNS:-all allowed repeat throughput} "
[ "${THROUGHPUT:-1}" = 1 ] || runs=${runs/ throughput / }
want() { [[ $runs == *" $1 "* ]]; }
# Every run but throughput judges afresh: an earlier call's verdicts in OUT_DIR are not its figures.
want all && run_eval all "$tmp/all/tasks" "$tmp/all/sols" --fresh
want allowed && run_eval allowed "$tmp/hk/tasks" "$tmp/hk/sols" --policy torch-allowed --fresh
mkdir -p "$tmp/rep/sols" "$tmp/rep/tasks"
cp "$fx/solutions/elementwise_chain.py" "$tmp/rep/sols/" && cp "$fx/tasks/elementwise_chain.py" "$tmp/rep/tasks/"
if want repeat; then  # REPEATS=N (default 3) processes; the GPU's clocks before each go to repeat_clocks.txt
  for i in $(seq 1 "${REPEATS:-3}"); do
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader \
      >> "$out/repeat_clocks.txt" 2>/dev/null || true
    run_eval "repeat_$i" "$tmp/rep/tasks" "$tmp/rep/sols" --fresh
  done
fi
if want throughput; then
  mkdir -p "$tmp/tp/sols" "$tmp/tp/tasks"
  for i in 0 1 2 3 4 5 6 7; do
    for j in 0 1 2 3 4 5 6 7; do
      cp "$fx/tasks/elementwise_chain.py" "$tmp/tp/tasks/tp_${i}_${j}.py"
      # a distinct extension source per i: a comment in the CUDA code changes its build's key
      sed "0,/#include <torch\/extension.h>/s//#include <torch\/extension.h>\n\/\/ variant $i/" \
        "$fx/solutions/elementwise_chain.py" > "$tmp/tp/sols/tp_${i}_${j}.py"
    done
  done
  run_eval throughput "$tmp/tp/tasks" "$tmp/tp/sols" --trials 30 ${TP_WORKERS:+--workers $TP_WORKERS}
fi
python3 bench/eval_gpu_report.py "$out" "$fx"
