#!/usr/bin/env bash
# `opforge train sft` resumed on CUDA (the CPU tests cover the CPU): a tiny random Qwen2
# (tests/python/tiny_lm.py) trained 4 steps at once, and 2 steps then resumed to 4, saving a
# checkpoint every step so the resumed run replaces a checkpoint it loaded (the path a learning
# run's second SFT chunk takes). Prints whether the two end with the same weights; a crash is
# run again under cuda-gdb (the GPU machine has no gdb) and its backtrace printed.
#   bench/trainer_resume_gpu.sh BUILD_DIR PYTHON
set -uo pipefail
B=${1:-build-gpu} P=${2:-python3}
W=$(mktemp -d /tmp/resume-XXXX)
"$P" tests/python/tiny_lm.py make "$W/lm" > /dev/null || { echo "tiny_lm.py make failed"; exit 1; }
"$P" - "$W/data.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as fh:
    for i in range(12):
        fh.write(json.dumps({"messages": [{"role": "user", "content": f"write op {i % 3}"},
                                          {"role": "assistant", "content": "def forward(self, x): return x"}]}) + "\n")
EOF
sft() {  # OUT STEPS [runner...]
  local out=$1 steps=$2; shift 2
  "$@" "$B/opforge-trainer" train sft --model "$W/lm/qwen2" --data "$W/data.jsonl" --val "$W/data.jsonl" \
    --out "$W/$out" --steps "$steps" --batch 4 --lr 1e-3 --save-every 1 --device cuda
}
sft whole 4 > "$W/whole.log" 2>&1; echo "whole run (4 steps): rc $?"
sft split 2 > "$W/split2.log" 2>&1; echo "split run, first 2 steps: rc $?"
sft split 4 > "$W/split4.log" 2>&1; rc=$?
echo "split run, resumed to 4: rc $rc"
grep -h "resuming" "$W/split4.log"
if [ $rc -ne 0 ]; then
  tail -5 "$W/split4.log"
  G=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2> /dev/null)
  rm -rf "$W/split" && sft split 2 > /dev/null 2>&1
  [ -n "$G" ] && sft split 4 "$G" -q -batch -ex run -ex bt --args 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -40
  exit 1
fi
"$P" - "$W" <<'EOF'
import sys, torch
from safetensors.torch import load_file
w = sys.argv[1]
a, b = (load_file(f"{w}/{r}/model/model.safetensors") for r in ("whole", "split"))
diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
print(f"resumed vs uninterrupted: {'bitwise identical' if all(torch.equal(a[k], b[k]) for k in a) else 'differ'}"
      f" (max abs difference {diff:.3g} over {len(a)} tensors)")
EOF
