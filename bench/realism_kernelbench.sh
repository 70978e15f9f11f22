#!/usr/bin/env bash
# The realism tool's calibration (docs/realism.md): KernelBench's three levels, side by side.
#   bench/realism_kernelbench.sh KERNELBENCH_CHECKOUT
# Expected from the issue that defined the figures: level 2 100% / 77% / 20%, level 3 100% / 99% /
# 70% (heavy / vocabulary / pairs), within a few points. KernelBench's code is read, not shipped.
set -euo pipefail
kb=${1:?usage: bench/realism_kernelbench.sh KERNELBENCH_CHECKOUT}
bin=${OPFORGE:-./build/opforge}
"$bin" realism --tasks "$kb/KernelBench/level1" --tasks "$kb/KernelBench/level2" --tasks "$kb/KernelBench/level3" \
  2>/dev/null
