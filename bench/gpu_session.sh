#!/usr/bin/env bash
# What the GPU machine (docs/gpu.md) is asked to run, in the device calls of one session, with
# every result written under $OUT (default /tmp/out) so it comes back even when a call is cut.
#   bench/gpu_session.sh STEP...   steps run in order:
#     build       configure and build build-gpu (tests included unless BUILD_TESTS=OFF) against /opt/torch
#     eval        bench/eval_gpu.sh on GPU 0, then the eval GPU tests (ctest -L gpu)
#     agent       one scripted opforge agent episode through the judge (bench/agent_gpu.py)
#     throughput  bench/filter_throughput.sh over TP_N (default 20) fresh candidates at 8/4/2/1 workers on GPU 0
#                 (most telling row first, in case the call is cut)
#     serve       opforge serve judging the eval bench's solutions over HTTP (bench/serve_gpu.py)
#     trainer     opforge-trainer against transformers on GPU 0 (bench/trainer_gpu.py): generation tokens/s and
#                 one SFT step's time and peak memory for a random Qwen2.5-0.5B-shaped model (~3 min);
#                 TRAINER_ARGS adds bench/trainer_gpu.py options (e.g. --settings bf16,bf16-micro1)
#     checks      eval + throughput
#     dedupscale  build-gpu/bench/opforge_bench_dedup 100000 10000 1024 --no-exact: dedup's search at the
#                 issue's scale on that machine's cores (no GPU used; 87 s on the 2-core CPU machine)
#     kb          bench/kb_filter.sh over the KernelBench checkout carried in .kb/KernelBench (levels 1-3,
#                 8 workers on GPU 0): verdicts per level before/after the retry alone, compile_mismatch study;
#                 resumes /tmp/kbws or bench/results/kb_h200.db.gz (KB_FRESH=1 starts over); kb.db.gz comes back
#     corpus      opforge run --preset ops6k --count $COUNT (default 1000) on every GPU; resumable: /tmp/cws on a
#                 warm machine, else CORPUS_DB when given (e.g. bench/results/ops6k_h200.db.gz), else a new
#                 workspace on the committed H200 crawl (CRAWL_DB); corpus.db.gz comes back
#     release     issue #18's 6K release, resumable across calls (docs/release.md): opforge run --preset
#                 ops6k-release --kept $KEPT (6000) from /tmp/rws, else RELEASE_DB (default
#                 corpus/checkpoints/ops6k-<h100|h200>.db.gz by the GPU's model, the last call's checkpoint,
#                 committed), else the crawl; stops at RELEASE_TIMEOUT (480 s); ops6k-<model>.db.gz (the next
#                 checkpoint) and, once finished, release_export.tgz come back
#     shards      issue #16: SH_COUNT (96) candidates as one run and as 2 shards filtered together on GPU 0, merged and
#                 compared (bench/shards_h200.sh; shards.json and shards.txt come back)
#     resume      bench/trainer_resume_gpu.sh: opforge train sft on CUDA, 4 steps at once against 2 resumed to 4
#                 (a crash is run again under cuda-gdb for its backtrace)
#     lreval      the learning run's SFT eval again from .lr/lr.tgz with this tree's judge (judge_j workers, untimed): why
#                 answers get -1 or stay unjudged (lreval.jsonl, lreval.txt, lreval_judge.log come back)
#     precision   bench/precision_gpu.py: judge-13's precision check over PREC_N (120) accepted tasks of RELEASE_DB's
#                 checkpoint on GPU 0 (compile's ratio, which filter-7 bounds; TF32 and bf16 autocast against the
#                 1e-2 rule); precision.jsonl and precision.log come back (~4 min with 12 workers)
#     profstart   bench/profiler_startup.py: what a fresh process's first profiler sessions cost on GPU 0 (strict's
#                 checks paid 4-9 s of it in every child; ~80 s; profstart.txt and profstart.json come back)
#     hack        one folder of tests/fixtures/eval_gpu/hacks (HACK, default tf32_gemm) through opforge eval: each
#                 row's reason beside its expected one (hack.txt, hack.log come back)
#     audit       bench/retime_audit.py: AUDIT_N (200) records of AUDIT_DIR (corpus/ops6k-<model>) timed again
#     learning    bench/learning_run.py (issue #14's learning run) on GPU 0 over the export of the committed
#                 ops6k_h200.db.gz (191 train / 114 test); resumable: each call goes on in /tmp/lr and ends
#                 after a finished unit before LEARN_TIMEOUT (default 540 s), so run it 3 times back to back
#                 (LR_FRESH=1 starts over); results.json, summary.md, the png, learning_logs.tgz and lr.tgz
#                 come back: lr.tgz is /tmp/lr without checkpoints; put it in .lr/ and carry .lr, and a cold
#                 machine resumes from it (a unit cut without its checkpoint starts again)
#                 (with `build` in the same cold call: BUILD_TESTS=OFF BUILD_TARGETS="opforge opforge-trainer"
#                 LEARN_TIMEOUT=380: the build took 139 s on an H100, and 159 s + 420 s overran the 600)
# A machine kept warm between calls keeps build-gpu and /tmp, so a later call can skip `build`.
# At most 8 files come back from $OUT: each step writes few (the logs of a step in one file).
# Needs .device (../shared/device/pack-debs.sh) carried; CRAWL_DB (default bench/results/crawl_h200.db.gz,
# a crawl made on an H200, committed) saves the corpus and throughput steps a crawl.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
P=/opt/torch/.venv/bin/python3
B=$PWD/build-gpu/opforge
[ $# -gt 0 ] || { echo "usage: bench/gpu_session.sh build|eval|agent|serve|trainer|ppo-smoke|throughput|checks|kb|dedupscale|corpus|release|shards|resume|audit|precision|hack|profstart|learning|lreval..." >&2; exit 2; }
source .device/env.sh > /dev/null
export PATH=/opt/torch/.venv/bin:$PATH
# bubblewrap comes in .device (pack-debs.sh bubblewrap): the judge sandboxes every solution with it.
[ -x /opt/devdeps/usr/bin/bwrap ] && export OPFORGE_BWRAP=/opt/devdeps/usr/bin/bwrap
# .device packs Debian's reference BLAS (libblas3) so faiss links; at run time use the machine's own
# OpenBLAS where it has one, as a user's machine would (with reference sgemm dedup's 100k x 10k
# search had not finished training its inverted file after 300 s on 16 cores).
for d in /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/x86_64-linux-gnu/openblas-openmp; do
  [ -f "$d/libblas.so.3" ] && { export LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH; break; }
done
CRAWL_DB=${CRAWL_DB:-bench/results/crawl_h200.db.gz}
# The learning run's judge workers on GPU 0: about one per 12 GB (11 on an H200, 6 on an 80 GB H100),
# since a task of the corpus holds ~1 GB per input set in the worker and again in the solution's
# child; 12 on an H100 ran 29 of 92 answers out of memory (judged again alone, ~5 s each).
judge_j() { local mb; mb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
            echo "-j $(( ${mb:-80000} / 12000 > 1 ? ${mb:-80000} / 12000 : 1 ))"; }
stamp() { echo "== $(date +%T) $*" | tee -a "$OUT/steps.txt"; }
gpu_model() {  # h100, h200: the release's checkpoints and folders are one GPU model's (docs/release.md)
  nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]\+' | head -1 | tr H h
}
restore_ws() {  # WS DBGZ: a workspace from a carried database (none carried: the run crawls)
  mkdir -p "$1"
  [ -f "$1/opforge.db" ] || [ ! -f "$2" ] || gunzip -c "$2" > "$1/opforge.db"
}
# The frames of an opforge-trainer crash (its handler prints binary(+0xOFFSET)) resolved to functions.
resolve_stacks() {
  grep -ho 'opforge-trainer(+0x[0-9a-f]*)' "$@" 2> /dev/null | sed 's/.*(+\(0x[0-9a-f]*\))/\1/' | head -40 |
    xargs -r addr2line -f -C -e build-gpu/opforge-trainer | paste - - | sed 's/^/  at /'
}
steps=()
# A cold machine has no build-gpu: build first even when not asked.
[ -x "$B" ] || [ "${1:-}" = build ] || steps+=(build)
for step in "$@"; do
  if [ "$step" = checks ]; then steps+=(eval throughput); else steps+=("$step"); fi
done
for step in "${steps[@]}"; do
case $step in
  build)
    stamp build
    # serve needs cpp-httplib's library, brotli and OpenSSL's headers (pack-debs.sh libcpp-httplib0.11
    # libbrotli-dev libbrotli1 libssl-dev): when they are not carried the rest is built without it.
    conf2() { cmake -S . -B build-gpu -G Ninja -DOPFORGE_PYTHON=$P -DOPFORGE_BUILD_TESTS=${BUILD_TESTS:-ON} \
               -DOPFORGE_GPU_TESTS_ONLY=ON -DOPFORGE_SERVE="$1" -DOPFORGE_TRAINER="$2" -Wno-dev; }
    # The trainer needs find_package(Torch) against the machine's CUDA wheel: when that configure
    # fails, everything else is built without it (TRAINER=OFF forces that).
    conf() { conf2 "$1" "${TRAINER:-ON}" || { echo "== trainer off: its configure failed"; rm -rf build-gpu; conf2 "$1" OFF; }; }
    { conf ON || { echo "== serve off: its configure failed"; rm -rf build-gpu; conf OFF; }; } > /tmp/build.log 2>&1
    # BUILD_TARGETS (e.g. "opforge opforge-trainer"): only those, when a short call needs no bench binary.
    cmake --build build-gpu -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >> /tmp/build.log 2>&1 ||
      { echo "== serve and trainer off: the build failed"; rm -rf build-gpu; conf2 OFF OFF && cmake --build build-gpu -j"$(nproc)"; } >> /tmp/build.log 2>&1
    if ! [ -x "$B" ]; then
      tail -60 /tmp/build.log > "$OUT/build_failed.log"; tail -20 /tmp/build.log; exit 1
    fi
    grep "== .* off" /tmp/build.log
    tail -1 /tmp/build.log
    ;;
  eval)
    # The bench first (its figures are what the note needs), then the GPU tests with the time left
    # (their hack test builds one extension per hack folder: ~4 min on an H200).
    stamp "shared GPU memory across the sandbox (devshm selftest)"
    { PYTHONPATH=python $P -m opforge.devshm --selftest; PYTHONPATH=python $P -m opforge.devshm --selftest --bwrap; \
      $B sandbox-exec --probe --gpu; } 2>&1 | tee "$OUT/devshm.txt"
    stamp "eval bench"
    CUDA_VISIBLE_DEVICES=0 OPFORGE=$B KB=${KB:-.kb} THROUGHPUT=${THROUGHPUT:-1} RUNS=${RUNS:-all allowed repeat throughput} timeout "${EVAL_TIMEOUT:-420}" \
      bash bench/eval_gpu.sh /tmp/evg > "$OUT/eval.txt" 2>&1
    cat "$OUT/eval.txt"
    tar czf "$OUT/eval_reports.tgz" -C /tmp/evg --exclude cache . 2> /dev/null
    if [ "${CTEST_TIMEOUT:-330}" != 0 ]; then  # CTEST_TIMEOUT=0: the bench only
      stamp "eval gpu tests"
      # The bench built the same fixtures' extensions: the tests reuse them (keys are source hashes)
      mkdir -p build-gpu/tests/eval_cache && cp -rn /tmp/evg/cache/extensions build-gpu/tests/eval_cache/ 2> /dev/null
      (cd build-gpu && timeout "${CTEST_TIMEOUT:-330}" ctest -L gpu --output-on-failure) > "$OUT/ctest_gpu.txt" 2>&1
      tail -4 "$OUT/ctest_gpu.txt"
    fi
    ;;
  hack)
    # One folder of GPU hacks (HACK, default tf32_gemm) against its tasks under the strict, timed
    # judge, without the whole eval bench: each row's reason beside the one its docstring expects.
    h=tests/fixtures/eval_gpu/hacks/${HACK:-tf32_gemm}
    stamp "eval of $h on GPU 0"
    rm -rf /tmp/hk1 && mkdir -p /tmp/hk1/tasks
    for f in "$h"/*; do cp "tests/fixtures/eval_gpu/tasks/$(basename "$f" .py).py" /tmp/hk1/tasks/; done
    CUDA_VISIBLE_DEVICES=0 timeout "${HACK_TIMEOUT:-240}" $B eval --tasks /tmp/hk1/tasks --solutions "$h" --device cuda \
      --no-plots --require-sandbox --out /tmp/hk1/out > "$OUT/hack.log" 2>&1
    echo "eval rc $?" | tee "$OUT/hack.txt"
    $P - "$h" /tmp/hk1/out/report.json <<'PY' 2>&1 | tee -a "$OUT/hack.txt"
import json, pathlib, re, sys
for r in json.load(open(sys.argv[2]))["results"]:
    f = pathlib.Path(sys.argv[1]) / (r["solution"] + ".py")
    want = re.search(r"expect[^`]*`([A-Za-z_]+)`", f.read_text()) if f.exists() else None
    print(r["solution"], "reason", r.get("reason"), "expected", want and want.group(1), "reward", r.get("reward"),
          "precision", json.dumps(r.get("precision")), "max_error", r.get("max_error"))
PY
    ;;
  agent)
    # One scripted opforge agent episode (bench/agent_gpu.py): its scripts reach the judge on the GPU.
    stamp "opforge agent: a scripted episode on GPU 0"
    rm -rf /tmp/agt
    CUDA_VISIBLE_DEVICES=0 timeout "${AGENT_TIMEOUT:-420}" $P bench/agent_gpu.py "$B" /tmp/agt > "$OUT/agent.txt" 2>&1
    echo "agent bench rc $?" >> "$OUT/agent.txt"
    tar czf "$OUT/agent.tgz" -C /tmp/agt/run summary.json summary.md summary.png episodes.jsonl judge/serve.log \
      sft/rft.jsonl sft/rft.parquet sft/judge/serve.log 2> /dev/null
    tail -40 "$OUT/agent.txt"
    ;;
  serve)
    # The eval bench's solutions through opforge serve (bench/serve_gpu.py), beside the `all` run's
    # rewards when that ran first (its cache, baselines and builds, is shared).
    stamp "opforge serve on GPU 0"
    rm -rf /tmp/svt && mkdir -p /tmp/svt && cp tests/fixtures/eval_gpu/tasks/*.py /tmp/svt/
    [ -d "${KB:-.kb}/tasks" ] && cp "${KB:-.kb}"/tasks/*.py /tmp/svt/
    CUDA_VISIBLE_DEVICES=0 $B serve --tasks /tmp/svt --device cuda --port 0 --cache-dir /tmp/evg/cache \
      > /tmp/serve.out 2> /tmp/serve.log &
    spid=$!
    for _ in $(seq 240); do grep -q "listening on" /tmp/serve.out 2> /dev/null && break; sleep 0.5; done
    url=$(grep -o 'http://[^ ]*' /tmp/serve.out | head -1)
    if [ -n "$url" ]; then
      timeout "${SERVE_TIMEOUT:-400}" $P bench/serve_gpu.py "$url" tests/fixtures/eval_gpu --kb "${KB:-.kb}" \
        --eval-report /tmp/evg/all/report.json > "$OUT/serve.txt" 2>&1
      echo "serve bench rc $?" >> "$OUT/serve.txt"
    else
      echo "serve did not start" > "$OUT/serve.txt"
    fi
    kill "$spid"; wait "$spid"
    tail -40 /tmp/serve.log > "$OUT/serve_log_tail.txt"
    cat "$OUT/serve.txt"
    ;;
  trainer)
    # The build step builds build-gpu/opforge-trainer when the trainer's configure succeeds (TRAINER=ON).
    stamp "opforge-trainer vs transformers on GPU 0 (random Qwen2.5-0.5B shape)"
    if [ -x build-gpu/opforge-trainer ]; then
      mkdir -p /tmp/trn/logs  # progress (stderr) shown here and kept beside the processes' logs
      CUDA_VISIBLE_DEVICES=0 timeout "${TRAINER_TIMEOUT:-360}" $P bench/trainer_gpu.py build-gpu/opforge-trainer /tmp/trn \
        --device cuda --out "$OUT/trainer.json" ${TRAINER_ARGS:-} > "$OUT/trainer.txt" 2> >(tee /tmp/trn/logs/bench.log >&2)
      echo "trainer bench rc $?" >> "$OUT/trainer.txt"
      tar czf "$OUT/trainer_logs.tgz" -C /tmp/trn logs 2> /dev/null
    else
      echo "build-gpu/opforge-trainer was not built (grep 'trainer off' /tmp/build.log)" > "$OUT/trainer.txt"
    fi
    cat "$OUT/trainer.txt"
    ;;
  ppo-smoke)
    # train ppo's estimators on CUDA with the real judge (the tiny Qwen2 of tests/python/tiny_lm.py,
    # 2 steps of 2 tasks x 4 answers; a random model's answers are all -1, so rloo's advantages are 0
    # and its actor must come back unchanged), and the tokenizer's start in a first process (through
    # transformers) against a later one (its cache).
    stamp "train ppo --advantage rloo / gae on GPU 0, tiny Qwen2; tokenizer start, first and later process"
    rm -rf /tmp/ps && mkdir -p /tmp/ps/tasks
    cp tests/fixtures/eval/tasks/linear_relu.py tests/fixtures/eval/tasks/softmax_sum.py /tmp/ps/tasks/
    $P tests/python/tiny_lm.py make /tmp/ps/lm > /tmp/ps/make.log 2>&1 || tail -5 /tmp/ps/make.log
    for i in 1 2; do
      OPFORGE_TOKENIZER_CACHE=/tmp/ps/tokcache CUDA_VISIBLE_DEVICES=0 build-gpu/opforge-trainer --log-level debug generate \
        --model /tmp/ps/lm/qwen2 --prompt x --max-new-tokens 1 --device cuda 2>&1 | grep -i "tokenizer" | sed "s/^/process $i: /"
    done | tee "$OUT/ppo_smoke.txt"
    for adv in rloo gae; do
      CUDA_VISIBLE_DEVICES=0 timeout "${PS_TIMEOUT:-150}" build-gpu/opforge-trainer train ppo --actor /tmp/ps/lm/qwen2 \
        --tasks /tmp/ps/tasks --out /tmp/ps/$adv --steps 2 --batch 2 --rollouts-per-task 4 --max-new-tokens 12 --lr 1e-3 \
        --device cuda --advantage $adv --judge-arg=--trials --judge-arg=5 > /tmp/ps/$adv.log 2>&1
      echo "train ppo --advantage $adv rc $?" | tee -a "$OUT/ppo_smoke.txt"
      cat /tmp/ps/$adv/metrics.jsonl >> "$OUT/ppo_smoke.txt" 2> /dev/null
      $P -c "import sys; from safetensors.torch import load_file as L; a, b = L(sys.argv[1]), L(sys.argv[2]); \
print('actor after 2 steps: max |weight change|', max(float((a[k].float() - b[k].float()).abs().max()) for k in a if k in b))" \
        /tmp/ps/$adv/actor/model.safetensors /tmp/ps/lm/qwen2/model.safetensors 2>&1 | tail -1 | tee -a "$OUT/ppo_smoke.txt"
      echo "critic: $(ls /tmp/ps/$adv/critic 2> /dev/null | tr '\n' ' ')" | tee -a "$OUT/ppo_smoke.txt"
      tail -3 /tmp/ps/$adv.log >> "$OUT/ppo_smoke.txt"
    done
    tail -40 "$OUT/ppo_smoke.txt"
    ;;
  throughput)
    # TP_CPUS (e.g. 0-15) pins the bench to part of a bigger machine, to stand for a one-GPU one.
    stamp "filter throughput on GPU 0${TP_CPUS:+, cores $TP_CPUS}"
    restore_ws /tmp/fws "$CRAWL_DB"
    $B compose --workspace /tmp/fws --count 300 --workers 8 2> /dev/null
    CUDA_VISIBLE_DEVICES=0 OPFORGE=$B PYTHON=$P timeout "${TP_TIMEOUT:-420}" ${TP_CPUS:+taskset -c $TP_CPUS} bash bench/filter_throughput.sh /tmp/fws "${TP_N:-20}" 8 4 2 1 |
      tee "$OUT/filter_throughput.txt"
    ;;
  kb)
    stamp "KernelBench levels 1-3, import and filter, 8 workers on GPU 0"
    # Resumable: a warm machine's /tmp/kbws, else the database an earlier call brought back
    # (KB_DB, committed under bench/results/), else from nothing. Import is idempotent and the
    # filter judges what is pending, the retries alone included, so one call goes on from another.
    [ -n "${KB_FRESH:-}" ] && rm -rf /tmp/kbws /tmp/kbws.*
    restore_ws /tmp/kbws "${KB_DB:-bench/results/kb_h200.db.gz}"
    # KB_TIMEOUT bounds the filter; the report, the study and the workspace come back either way.
    CUDA_VISIBLE_DEVICES=0 OPFORGE=$B PYTHON=$P FILTER_TIMEOUT=${KB_TIMEOUT:-420} bash bench/kb_filter.sh .kb/KernelBench \
      /tmp/kbws 8 > "$OUT/kb.txt" 2>&1
    cat "$OUT/kb.txt"
    $P -c "import sqlite3; sqlite3.connect('/tmp/kbws/opforge.db').execute('PRAGMA wal_checkpoint(TRUNCATE)')"
    gzip -c /tmp/kbws/opforge.db > "$OUT/kb.db.gz"
    tar czf "$OUT/kb_reports.tgz" -C /tmp kbws.kb_report.json kbws.compile_mismatch.json kbws.filter.log 2> /dev/null
    ;;
  dedupscale)
    stamp "dedup search, 100k tasks x 10k references, $(nproc) cores"
    ldd build-gpu/bench/opforge_bench_dedup | grep -E "blas|lapack" | tee "$OUT/dedup_scale.txt"
    timeout 300 build-gpu/bench/opforge_bench_dedup 100000 10000 1024 --no-exact 2>&1 | tee -a "$OUT/dedup_scale.txt"
    ;;
  corpus)
    count=${COUNT:-1000}
    restore_ws /tmp/cws "${CORPUS_DB:-$CRAWL_DB}"
    stamp "opforge run --preset ops6k --count $count"
    timeout "${RUN_TIMEOUT:-500}" $B run --workspace /tmp/cws --preset ops6k --count "$count" 2> "$OUT/run.log"
    echo "run rc $?"
    { grep "run:" "$OUT/run.log" | tail -8; $B status --workspace /tmp/cws 2>&1; $P bench/filter_report.py /tmp/cws 2>&1
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$OUT/corpus.txt"
    cat "$OUT/corpus.txt"
    [ -d /tmp/cws/export/stats ] && tar -C /tmp/cws/export -czf "$OUT/export_stats.tar.gz" manifest.json README.md stats
    $P -c "import sqlite3; sqlite3.connect('/tmp/cws/opforge.db').execute('PRAGMA wal_checkpoint(TRUNCATE)')"
    gzip -c /tmp/cws/opforge.db > "$OUT/corpus.db.gz"
    ;;
  learning)
    # Resumable across calls (bench/learning_run.md): /tmp/lr keeps the run's state.json and the
    # trainer's checkpoints, so a call on a warm machine goes on where the last ended or was cut.
    # --stop-after-s ends a call after a finished unit 45 s before the timeout (a unit is not cut, the
    # judge stops and the results are written); the timeout is the fallback (SIGTERM: same, sooner).
    stamp "learning run on GPU 0 (resumes /tmp/lr)"
    [ -n "${LR_FRESH:-}" ] && rm -rf /tmp/lr .lr
    # A cold machine resumes from the compact copy the last call sent back (carry .lr: copy its
    # lr.tgz there); the driver starts again a unit whose checkpoint the copy leaves out.
    [ -d /tmp/lr ] || [ ! -f .lr/lr.tgz ] || { tar xzf .lr/lr.tgz -C /tmp && echo "restored /tmp/lr from .lr/lr.tgz"; }
    restore_ws /tmp/lws bench/results/ops6k_h200.db.gz
    [ -f /tmp/lws/export/manifest.json ] || $B export --workspace /tmp/lws --out /tmp/lws/export \
      --test-fraction 0.35 --no-plots --no-realism > /tmp/lws_export.log 2>&1
    lt=${LEARN_TIMEOUT:-540}
    # The judge gets one worker per 12 GB of GPU 0 left after the three PPO seeds that run side by
    # side (--parallel-seeds, ~10 GB each at most: peak_mem_gib 10.3 on the H200), at least 2
    # (LEARN_JUDGE; the driver makes it untimed): with serve's default of one per GPU the SFT eval
    # of 114 answers outlasted a 420 s call.
    mb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2> /dev/null | head -1)
    lj=$(( (${mb:-80000} - 30000) / 12000 )); [ "$lj" -ge 2 ] || lj=2
    # LEARN_ARGS: more options (e.g. "--bf16 --ppo-steps 30"); options a finished unit depends on
    # must stay the same across the calls of one run (the driver refuses a mismatch). The defaults
    # after the s28 run (docs/gpu.md): with the judge's checks at 0.0-0.6 s an answer, 16 prompts a
    # step in mini-batches of 16 answers (8 prompts in mini-batches of 8 gave a train reward that
    # swung 0.0-1.0 between steps with the task draw), an eval every 4 steps (every 2 was ~45% of
    # the PPO time) and every test task (114). LEARN_BUDGET 1140: the run's last unit may pass the
    # budget (1,215 s at 1200).
    # --ppo-advantage rloo (s30): in s29 (GAE, --kl-coef 0.05) pass@1 stayed flat from a 0.92 start,
    # in s28 (GAE, no KL) it rose early and then drifted. Most of a step's prompts had 4 answers of one
    # reward (all correct), whose whitened GAE advantages are the critic's error at unit scale: noise
    # that AdamW turns into full-size steps. RLOO gives such groups 0 and learns only from prompts
    # whose answers differ (metrics' mixed_groups); no KL (a per-answer KL sum would add its own noise).
    # --hidden 128 --ffn 352 (s33): the 3.54M model's SFT start was 0.92 (s29, s33), a few long or
    # odd test tasks below the ceiling, and 16 PPO steps of RLOO or GAE left it flat; its SFT never
    # reached the plateau rule in its time share either. A 1.03M model should plateau sooner and
    # lower, leaving PPO room to show what the reward teaches.
    CUDA_VISIBLE_DEVICES=0 timeout "$lt" $P bench/learning_run.py --corpus /tmp/lws/export --device cuda --out /tmp/lr \
      --opforge "$B" --stop-after-s $((lt - 45)) --time-budget-s "${LEARN_BUDGET:-1140}" --verify "${LEARN_VERIFY:-0}" \
      --judge-arg "${LEARN_JUDGE:--j $lj}" ${LEARN_ARGS:---hidden 128 --ffn 352 --test-tasks 0 --ppo-batch 16 --ppo-mini-batch 16 --eval-every 4 --sft-share 0.3 --ppo-lr 5e-5 --ppo-critic-lr 1e-4 --ppo-advantage rloo --parallel-seeds} > "$OUT/learning.txt" 2>&1
    echo "learning run rc $? (0: done, 3: partial, call again; 124: timeout)" >> "$OUT/learning.txt"
    resolve_stacks /tmp/lr/*.log >> "$OUT/learning.txt"
    cp /tmp/lr/results.json /tmp/lr/summary.md /tmp/lr/learning_run.png "$OUT"/ 2> /dev/null
    (cd /tmp/lr && tar czf "$OUT/learning_logs.tgz" $(ls -d *.log *.json sft/metrics.jsonl ppo_seed*/metrics.jsonl ppo_seed*/rollouts.jsonl \
      eval_*.jsonl verify/report/report.json 2> /dev/null) /tmp/lws_export.log 2> /dev/null)
    # The compact copy for a cold next call: one set of fp32 weights (~12 MB gzipped), since a file
    # that comes back holds at most 16 MiB (the first try, with a cut save's checkpoint.tmp, was 61 MB
    # and stayed behind). Until SFT is done, the initial weights (SFT starts again: its checkpoint is
    # not in the copy); then SFT's best model, which every PPO seed starts from (a seed cut without
    # its checkpoint starts again). checkpoint* also leaves out the .tmp and .old a cut save leaves.
    # No PPO trajectories (every token id and log-probability: at the CPU smoke run's ~2 KB an answer
    # gzipped, ~15 MB for a whole run): a finished seed keeps its rollouts.jsonl, an unfinished one
    # starts again and writes them anew.
    lr_skip=(--exclude=lr/.lock --exclude='lr/*/checkpoint*' --exclude='lr/*/rows' --exclude='lr/ppo_seed*/actor' --exclude='lr/ppo_seed*/critic'
             --exclude='lr/ppo_seed*/trajectories.jsonl'
             --exclude=lr/verify --exclude=lr/workspace)
    if $P -c "import json,sys; sys.exit(0 if json.load(open('/tmp/lr/state.json')).get('sft',{}).get('done') else 1)" 2> /dev/null
    then lr_skip+=(--exclude=lr/init_model --exclude=lr/sft/model)
    else lr_skip+=(--exclude=lr/sft/model --exclude=lr/sft/best_model); fi
    tar czf "$OUT/lr.tgz" -C /tmp "${lr_skip[@]}" lr && ls -la "$OUT/lr.tgz"
    tail -30 "$OUT/learning.txt"
    ;;
  lreval)
    # The learning run's SFT eval again, from the compact copy the last learning call sent back
    # (carry .lr), with a judge of this tree: which answers it gives -1 or leaves unjudged, and why
    # (its log; on an 80 GB H100 12 untimed workers ran out of memory on 8 answers, docs/gpu.md).
    stamp "learning run's SFT eval again (the judge under memory pressure)"
    [ -d /tmp/lr ] || tar xzf .lr/lr.tgz -C /tmp
    CUDA_VISIBLE_DEVICES=0 $B serve --tasks /tmp/lr/tasks_all.jsonl --port 0 --policy torch-allowed --device cuda \
      --max-batch 128 --untimed ${LEARN_JUDGE:-$(judge_j)} > /dev/null 2> "$OUT/lreval_judge.log" &
    spid=$!
    url=
    for _ in $(seq 180); do
      url=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/lreval_judge.log" | head -1); [ -n "$url" ] && break; sleep 1
    done
    CUDA_VISIBLE_DEVICES=0 timeout "${LRE_TIMEOUT:-300}" $B train eval --model /tmp/lr/sft/best_model \
      --tasks /tmp/lr/tasks_test.jsonl --max-new-tokens 756 --device cuda --batch 32 --out "$OUT/lreval.jsonl" \
      --judge-url "$url" --judge-concurrency 128 > "$OUT/lreval.txt" 2>&1
    echo "train eval rc $?" >> "$OUT/lreval.txt"
    kill "$spid"; wait "$spid"
    grep -E "alone|not judged|verdicts by reason" "$OUT/lreval_judge.log" "$OUT/lreval.txt" | tail -40
    ;;
  release)
    # Issue #18's production (docs/release.md): opforge run --preset ops6k-release --kept $KEPT, resumable
    # across calls: /tmp/rws on a warm machine, else the committed checkpoint RELEASE_DB, else the
    # committed crawl. Each call stops the run at RELEASE_TIMEOUT (a killed run resumes where it
    # stopped) and brings back the checkpoint to commit (the database, vacuumed: verdicts, metrics,
    # code; no cache), the run's log and, once the run finished, the export.
    # One checkpoint per GPU model (h100, h200): the filter's configuration holds the model, so a
    # release is one model's timings; whichever model's reaches KEPT first is released.
    gpu=$(gpu_model)
    ck=ops6k-${gpu:-gpu}
    src=corpus/checkpoints/$ck.db.gz
    # A model's first call starts from the H200's checkpoint: its 6,000 composed candidates are
    # reused, its verdicts (another model's, another filter's) are judged again (--rejudge-stale).
    [ -f "$src" ] || src=corpus/checkpoints/ops6k-h200.db.gz
    restore_ws /tmp/rws "${RELEASE_DB:-$src}"
    restore_ws /tmp/rws "$CRAWL_DB"
    refs=()
    for l in 1 2 3; do [ -d .kb/KernelBench/level$l ] && refs+=(--reference .kb/KernelBench/level$l); done
    stamp "opforge run --preset ops6k-release --kept ${KEPT:-6000} (decontaminated against ${#refs[@]} KernelBench levels)"
    # --rejudge-stale: verdicts of an older filter version (the checkpoint's 729 are filter-3's) are
    # judged again, so the release is one filter's; once they are, nothing is stale and it costs nothing.
    timeout "${RELEASE_TIMEOUT:-480}" $B run --workspace /tmp/rws --preset ops6k-release --kept "${KEPT:-6000}" \
      --rejudge-stale --out /tmp/rws/export "${refs[@]}" > /tmp/rws.out 2> >(tee -a /tmp/rws.log > "$OUT/release_run.log")
    echo "run rc $? (124: stopped at RELEASE_TIMEOUT, call again to go on)" | tee "$OUT/release.txt"
    { grep "run:" /tmp/rws.log | tail -20; $B status --workspace /tmp/rws 2>&1 | sed -n '/^filter:/,$p'
      $P bench/filter_report.py /tmp/rws 2>&1; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } >> "$OUT/release.txt"
    cat "$OUT/release.txt"
    rm -f /tmp/rws.ckpt.db
    $P -c "import sqlite3; sqlite3.connect('/tmp/rws/opforge.db').execute(\"VACUUM INTO '/tmp/rws.ckpt.db'\")"
    gzip -9c /tmp/rws.ckpt.db > "$OUT/$ck.db.gz"
    ls -l "$OUT/$ck.db.gz"
    [ -s /tmp/rws.out ] && tar -C /tmp/rws -czf "$OUT/release_export.tgz" export
    ;;
  shards)
    # Issue #16 on the GPU: SH_COUNT (96) candidates as one run and as 2 shards filtered together on
    # GPU 0, merged and compared (bench/shards_h200.sh); shards.json comes back.
    stamp "one run against 2 shards on GPU 0 ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
    CUDA_VISIBLE_DEVICES=0 P=$P timeout "${SH_TIMEOUT:-420}" bash bench/shards_h200.sh "$B" "$CRAWL_DB" "$OUT" > "$OUT/shards.txt" 2>&1
    echo "shards rc $?" >> "$OUT/shards.txt"
    tail -40 "$OUT/shards.txt"
    ;;
  resume)
    stamp "sft resumed on CUDA (bench/trainer_resume_gpu.sh)"
    CUDA_VISIBLE_DEVICES=0 timeout "${RESUME_TIMEOUT:-240}" bash bench/trainer_resume_gpu.sh build-gpu "$P" 2>&1 | tee "$OUT/resume.txt"
    resolve_stacks /tmp/resume-*/split4.log | tee -a "$OUT/resume.txt"
    ;;
  precision)
    stamp "precision check over accepted tasks on GPU 0 (bench/precision_gpu.py)"
    CUDA_VISIBLE_DEVICES=0 timeout "${PREC_TIMEOUT:-270}" $P bench/precision_gpu.py \
      --db "${RELEASE_DB:-corpus/checkpoints/ops6k-h200.db.gz}" --n "${PREC_N:-120}" --workers 12 \
      --budget-s "${PREC_BUDGET:-240}" --out "$OUT/precision.jsonl" > /dev/null 2> "$OUT/precision.log"
    tail -8 "$OUT/precision.log"
    ;;
  profstart)
    stamp "first profiler sessions of fresh processes on GPU 0 (bench/profiler_startup.py)"
    CUDA_VISIBLE_DEVICES=0 timeout "${PROF_TIMEOUT:-240}" $P bench/profiler_startup.py --out "$OUT/profstart.json" \
      > "$OUT/profstart.txt" 2>&1
    cat "$OUT/profstart.txt"
    ;;
  audit)
    # The release's re-timing audit (docs/release.md): AUDIT_N (200) random records of the export
    # (AUDIT_DIR, default corpus/ops6k-<this GPU's model>) timed again on GPU 0 beside their stored eager times.
    AUDIT_DIR=${AUDIT_DIR:-corpus/ops6k-$(gpu_model)}
    stamp "re-timing ${AUDIT_N:-200} records of $AUDIT_DIR on GPU 0"
    CUDA_VISIBLE_DEVICES=0 PYTHONPATH=python timeout "${AUDIT_TIMEOUT:-480}" $P bench/retime_audit.py \
      "$AUDIT_DIR" --sample "${AUDIT_N:-200}" --out "$OUT/retime_audit.json" > "$OUT/audit.txt" 2>&1
    echo "audit rc $?" >> "$OUT/audit.txt"
    cat "$OUT/audit.txt"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
done
