#!/usr/bin/env bash
# make test-ecosystem: the RL frameworks' own code calling opforge's reward (not part of make test:
# each framework gets its own pinned packages, downloaded once into ~/.cache/opforge).
#   OpenRLHF 0.11.2: its remote-reward client (SingleTurnAgentExecutor) against opforge serve on the
#   CPU fixtures, over HTTP and through the reward file python/opforge_rl/openrlhf.py. It ships for
#   Python 3.11 and pulls flash-attn, deepspeed and ray, so it is installed without its
#   dependencies, beside the two its client imports (aiohttp, pylatexenc).
#   verl 0.9.1 (tests/ecosystem/verl_check.py): its RLHFDataset reads `opforge export --format
#   verl` of a workspace of the fixtures; its single-turn agent loop (the LLM's answers given) and
#   RewardLoopManager (a ray actor running NaiveRewardManager) score two rollouts with
#   python/opforge_rl/verl.py's compute_score against opforge serve on that workspace; its
#   MultiTurnSFTDataset reads opforge.sft_parquet's parquet of an agent sft record. verl pins
#   transformers < 5.11 and pulls ray[default], wandb, peft, torchdata and more, so verl and each
#   package these imports need that the project venv lacks (or has at another version:
#   transformers, tokenizers) are installed without dependencies, each pinned; torch, numpy,
#   pandas, pyarrow, datasets, huggingface-hub, pydantic and pillow are the venv's (the folder
#   comes first on PYTHONPATH).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[ecosystem] $*" >&2; }
PY=.venv/bin/python3
# eco_dir NAME PINS: NAME's packages, one folder per set of pins.
eco_dir() { echo "${OPFORGE_CACHE:-$HOME/.cache/opforge}/eco-$1-$(echo "$2" | sha256sum | cut -c1-12)"; }
pip_target() { $PY -m pip install -q --disable-pip-version-check --target "$@"; }
PINS="openrlhf==0.11.2 aiohttp==3.14.5 pylatexenc==2.11"
ECO=$(eco_dir openrlhf "$PINS")
if [ ! -f "$ECO/.complete" ]; then
  log "installing $PINS into $ECO"
  rm -rf "$ECO"
  pip_target "$ECO" aiohttp==3.14.5 pylatexenc==2.11
  pip_target "$ECO" --no-deps openrlhf==0.11.2
  touch "$ECO/.complete"
fi
# What importing verl's RL and SFT datasets, reward loop (ray), agent loop and hydra config needs.
VERL_PINS="verl==0.9.1 transformers==5.10.4 tokenizers==0.22.2 tensordict==0.10.0 pyvers==0.1.0 cloudpickle==3.1.3
  orjson==3.13.0 ray==2.55.0 msgpack==1.2.4 protobuf==6.33.6 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  referencing==0.37.0 rpds-py==0.30.0 attrs==26.1.0 requests==2.34.2 urllib3==2.8.0 charset-normalizer==3.5.3
  omegaconf==2.3.0 hydra-core==1.3.2 antlr4-python3-runtime==4.9.3 codetiming==1.4.0 aiohttp==3.14.5
  multidict==6.7.1 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0
  cachetools==8.0.2 fastapi==0.115.12 starlette==0.46.2 uvicorn==0.55.0"
VERL=$(eco_dir verl "$VERL_PINS")
if [ ! -f "$VERL/.complete" ]; then
  log "installing verl 0.9.1 and its pins into $VERL"
  rm -rf "$VERL"
  pip_target "$VERL" --no-deps $VERL_PINS
  touch "$VERL/.complete"
fi
work=$(mktemp -d)
spids=""
# `|| true`: under set -e a failing kill (a serve that already died) would end the trap before rm.
trap 'for p in $spids; do kill $p 2> /dev/null || true; wait $p 2> /dev/null || true; done; rm -rf "$work"' EXIT
fx=tests/fixtures/eval
# serve TASKS NAME: opforge serve judging TASKS on the CPU, in the background (few trials: the
# rewards are checked, not the timings); sets $url.
serve() {
  build/opforge serve --tasks "$1" --device cpu --port 0 --cache-dir build/tests/eval_cache --state-dir "$work/$2" \
    --trials 5 --budget-s 1 --correct-trials 2 > "$work/$2.out" 2> "$work/$2.err" &
  local pid=$!
  spids="$spids $pid"
  for _ in $(seq 600); do
    grep -q "listening on" "$work/$2.out" 2> /dev/null && break
    kill -0 $pid 2> /dev/null || break  # it exited: its error is in $2.err
    sleep 0.2
  done
  url=$(grep -o 'http://[^ ]*' "$work/$2.out" | head -1 || true)  # no match: say so below, not exit here
  [ -n "$url" ] || { log "opforge serve did not start:"; tail -20 "$work/$2.err" >&2; exit 1; }
}
serve $fx/tasks state
log "OpenRLHF's reward client against $url"
PYTHONPATH="$ECO:python" $PY tests/ecosystem/openrlhf_check.py "$url" linear_relu $fx/solutions/linear_relu.py \
  $fx/hacks/returns_input.py
# verl_export WS OUT: the fixtures as workspace WS through the real import, filter and dedup,
# exported for verl into OUT. The filter skips its torch.compile check (about 30 s of compiling per
# task on a CPU) and keeps the fixtures' sizes (calibrated ones differ run to run, and so would the
# serve's baselines, cached by task code); split seed 1 puts one task on each side, so both parquet
# files are read. Chained with &&: `set -e` does not apply in a function whose status is tested.
verl_export() {
  build/opforge import --workspace "$1" $fx/tasks &&
    build/opforge filter --workspace "$1" --device cpu --trials 5 --skip-check compile --no-calibrate --min-ms 0 &&
    build/opforge dedup --workspace "$1" --no-kernelbench-names &&
    build/opforge export --workspace "$1" --out "$2" --format verl --test-fraction 0.5 --split-seed 1 --no-plots \
      --no-realism
}
ws="$work/ws"
log "a workspace of $fx/tasks, exported with --format verl"
verl_export "$ws" "$work/verl" > "$work/ws.log" 2>&1 || { tail -20 "$work/ws.log" >&2; exit 1; }
task=$(build/opforge tasks --workspace "$ws" --json | $PY -c 'import json, sys
print(next(t["id"] for t in map(json.loads, sys.stdin) if t["origin"]["path"].endswith("/linear_relu.py")))')
serve "$ws" ws_state
log "verl's datasets and reward loop against $url (task linear_relu = $task)"
mkdir "$work/verl_work"
# verl prints its progress on stdout: the summary is the last line.
HF_HUB_OFFLINE=1 HF_HOME="$work/hf" PYTHONPATH="$VERL:python" $PY tests/ecosystem/verl_check.py "$work/verl" "$url" \
  "$task" $fx/solutions/linear_relu.py $fx/hacks/returns_input.py "$work/verl_work" > "$work/verl.log" 2>&1 \
  || { tail -40 "$work/verl.log" >&2; exit 1; }
tail -1 "$work/verl.log"
log "passed"
