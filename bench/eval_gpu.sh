#!/usr/bin/env bash
# The evaluator on a GPU (H200): honest CUDA solutions, planted GPU reward hacks, and whether a
# candidate's timing repeats across processes within the 2% target.
#   bench/eval_gpu.sh [OUT_DIR]      (OPFORGE=path/to/opforge, default ./build/opforge; run from the repo root)
# 1. honest: every task of tests/fixtures/eval_gpu/tasks with its solution; expected correct.
# 2. each folder of tests/fixtures/eval_gpu/hacks, against only the tasks it targets (same run as 1); each must
#    get reward -1 with the reason its docstring names ("expect `reason`", hacks/README.md).
# 3. the honest elementwise_chain solution 3 times, each in its own `opforge eval` process:
#    candidate medians and their spread (max-min)/min against 2%.
# Reports go to OUT_DIR/<run>/report.json (logs OUT_DIR/<run>.log); a compact table to stdout.
# Extensions and baseline timings are cached in OUT_DIR/cache, so repeats time rather than build.
set -euo pipefail
bin=${OPFORGE:-./build/opforge}
fx=tests/fixtures/eval_gpu
out=${1:-${OUT_DIR:-eval_gpu_report}}
cache="$out/cache"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"

run_eval() {  # NAME TASKS SOLUTIONS: one opforge eval process
  local name=$1 tasks=$2 sols=$3 rc=0 start
  start=$(date +%s.%N)
  "$bin" eval --tasks "$tasks" --solutions "$sols" --device cuda --cache-dir "$cache" --no-plots \
    --out "$out/$name" > "$out/$name.log" 2>&1 || rc=$?
  python3 -c "import sys; print(f'== {sys.argv[1]}: {float(sys.argv[3]) - float(sys.argv[2]):.1f} s, rc {sys.argv[4]}')" \
    "$name" "$start" "$(date +%s.%N)" "$rc" >&2
  [ "$rc" = 0 ] || echo "   opforge eval failed, see $out/$name.log" >&2
}

# Honest solutions and every hack in ONE opforge eval process, so all extensions build in one
# parallel phase: each hack becomes its own task copy named <hack>__<task> with the hack as its
# solution (a hack is only run against the task it targets).
mkdir -p "$tmp/tasks" "$tmp/sols"
cp "$fx"/tasks/*.py "$tmp/tasks/"
cp -r "$fx"/solutions/* "$tmp/sols/"
for h in "$fx"/hacks/*/; do
  h=${h%/}
  for e in "$h"/*; do
    key=$(basename "$e" .py)
    [ -f "$fx/tasks/$key.py" ] || continue
    name="$(basename "$h")__$key"
    cp "$fx/tasks/$key.py" "$tmp/tasks/$name.py"
    if [ -d "$e" ]; then cp -r "$e" "$tmp/sols/$name"; else cp "$e" "$tmp/sols/$name.py"; fi
  done
done
run_eval all "$tmp/tasks" "$tmp/sols"
mkdir -p "$tmp/rep_sol" "$tmp/rep_tasks"
cp "$fx/solutions/elementwise_chain.py" "$tmp/rep_sol/" && cp "$fx/tasks/elementwise_chain.py" "$tmp/rep_tasks/"
for i in 1 2 3; do run_eval "repeat_$i" "$tmp/rep_tasks" "$tmp/rep_sol"; done

python3 - "$out" "$fx" <<'PY'
import glob, json, os, re, sys
out, fx = sys.argv[1], sys.argv[2]
# The reason each run should end with (None: correct): a hack's docstring says "expect `reason`"
# (the same rule as tests/test_eval_gpu.cpp; names from docs/reasons.md).
EXPECTED = {}  # task name -> reason; honest tasks: None
for f in glob.glob(os.path.join(fx, "hacks", "*", "*.py")):
    m = re.search(r"expect[^`]*`([A-Za-z_]+)`", open(f).read())
    hack = os.path.basename(os.path.dirname(f))
    EXPECTED[f"{hack}__{os.path.basename(f)[:-3]}"] = m.group(1) if m else "?"

def rows(run):
    p = os.path.join(out, run, "report.json")
    return json.load(open(p))["results"] if os.path.exists(p) else None

def ms(v):
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"

runs = sorted(d for d in os.listdir(out) if os.path.isdir(os.path.join(out, d)) and d != "cache")
print(f"{'run':<10} {'task':<36} {'reason':<22} {'expected':<22} {'cand ms':>8} {'eager':>8} {'compile':>8} "
      f"{'x eager':>7} {'rwd':>3}  verdict  sandbox")
bad = 0
for run in [r for r in runs if not r.startswith("repeat_")]:
    res = rows(run)
    if not res:
        print(f"{run:<26} " + ("(no report.json: see the log)" if res is None else "(no task matched its solutions)"))
        bad += 1
        continue
    for r in res:
        want = EXPECTED.get(r["task"], None)
        got = None if r["correct"] else r["reason"]
        ok = None if want == "?" else (got == want and (r["reward"] >= 1 if want is None else r["reward"] == -1))
        bad += ok is False
        se = r.get("speedup_eager")
        print(f"{run:<10} {r['task']:<36} {str(got or 'correct'):<22} {str(want or 'correct'):<22} "
              f"{ms(r.get('candidate_ms')):>8} {ms(r.get('eager_ms')):>8} {ms(r.get('compile_ms')):>8} "
              f"{(f'{se:.2f}' if se else '-'):>7} {r['reward']:>3}  {'PASS' if ok else ('FAIL' if ok is False else '?'):<7}  "
              f"{str(r.get('sandbox'))[:30]}")
        if ok is False and r.get("detail"):
            print(f"{'':<26}   detail: {r['detail'][:300]}")

meds = [r["candidate_ms"] for run in runs if run.startswith("repeat_") for r in rows(run) or []
        if r.get("candidate_ms")]
if len(meds) == 3:
    spread = (max(meds) - min(meds)) / min(meds)
    verdict = "PASS" if spread <= 0.02 else "FAIL"
    bad += verdict == "FAIL"
    print(f"repeatability (elementwise_chain, 3 processes): medians {', '.join(ms(m) for m in meds)} ms, "
          f"spread {100 * spread:.2f}% vs 2% target: {verdict}")
else:
    bad += 1
    print(f"repeatability: {len(meds)} of 3 runs gave a candidate time (see repeat_*.log)")
sys.exit(1 if bad else 0)
PY
