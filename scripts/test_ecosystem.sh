#!/usr/bin/env bash
# make test-ecosystem: the RL frameworks' own code calling opforge's reward (not part of make test:
# each framework gets its own pinned packages, downloaded once into ~/.cache/opforge).
#   OpenRLHF 0.11.2: its remote-reward client (SingleTurnAgentExecutor) against opforge serve on the
#   CPU fixtures, over HTTP and through the reward file python/opforge_rl/openrlhf.py. It ships for
#   Python 3.11 and pulls flash-attn, deepspeed and ray, so it is installed without its
#   dependencies, beside the two its client imports (aiohttp, pylatexenc).
# verl's dataset class and reward manager are not covered yet (verl 0.9.1 pins transformers < 5.11).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[ecosystem] $*" >&2; }
PY=.venv/bin/python3
PINS="openrlhf==0.11.2 aiohttp==3.14.5 pylatexenc==2.11"
ECO="${OPFORGE_CACHE:-$HOME/.cache/opforge}/eco-openrlhf-$(echo "$PINS" | sha256sum | cut -c1-12)"
if [ ! -f "$ECO/.complete" ]; then
  log "installing $PINS into $ECO"
  rm -rf "$ECO"
  $PY -m pip install -q --disable-pip-version-check --target "$ECO" aiohttp==3.14.5 pylatexenc==2.11
  $PY -m pip install -q --disable-pip-version-check --no-deps --target "$ECO" openrlhf==0.11.2
  touch "$ECO/.complete"
fi
work=$(mktemp -d)
trap 'kill $spid 2> /dev/null; wait $spid 2> /dev/null; rm -rf "$work"' EXIT
fx=tests/fixtures/eval
build/opforge serve --tasks $fx/tasks --device cpu --port 0 --cache-dir build/tests/eval_cache --state-dir "$work/state" \
  --trials 5 --budget-s 1 --correct-trials 2 > "$work/out" 2> "$work/err" &
spid=$!
for _ in $(seq 600); do grep -q "listening on" "$work/out" 2> /dev/null && break; sleep 0.2; done
url=$(grep -o 'http://[^ ]*' "$work/out" | head -1)
[ -n "$url" ] || { log "opforge serve did not start:"; tail -20 "$work/err" >&2; exit 1; }
log "OpenRLHF's reward client against $url"
PYTHONPATH="$ECO:python" $PY tests/ecosystem/openrlhf_check.py "$url" linear_relu $fx/solutions/linear_relu.py \
  $fx/hacks/returns_input.py
log "passed"
