"""What a process's first profiler session costs on this machine, and what it depends on.

The judge's strict policy watches every checked call with the torch profiler (CPU activity, all
threads; python/opforge/candidate.py), and on the GPU each solution's child paid its first
session in its checks: 4.4-6.9 s on the H200, 4.3-8.9 s on an H100 (docs/gpu.md), against
0.11-0.19 s once warmed. This measures, in fresh processes (unsandboxed), each step of a child's
start and then its profiler sessions, in the order a variant names, so the next change to the
judge can be chosen from figures:

  default     the child's order: CPU session (strict's observer), again, then a CUDA session
              (the timed answers' profiling pass)
  cuda_first  the CUDA session first, then the CPU session
  one_thread  the CPU session without profile_all_threads (what watching all threads costs)

(KINETO_USE_DAEMON=1, which skips Kineto's CUPTI callback set-up, was tried on the CPU machine:
its import then waits for a dynolog daemon, 11.6 s against 4.2 s.)

  /opt/torch/.venv/bin/python3 bench/profiler_startup.py [--repeats 3] [--device cuda|cpu] [--out FILE.json]

Prints a table of medians (seconds) on stdout; the per-process figures go to --out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
t = time.perf_counter()
import torch
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile
r = {"import_s": time.perf_counter() - t}
dev = sys.argv[2]
if dev == "cuda":
    t = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    r["cuda_context_s"] = time.perf_counter() - t
x = torch.randn(256, 256, device=dev)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

def session(name, activities, **kw):
    t = time.perf_counter()
    try:
        with profile(activities=activities, **kw) as p:
            (x @ x).relu_()
            sync()
        n = len([e for e in p.events() if "::" in e.name])
        r[name + "_s"] = time.perf_counter() - t
        r[name + "_events"] = n
    except Exception as e:  # a variant that breaks a session is a finding, not a crash
        r[name + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"

kinds = {"cpu": dict(activities=[ProfilerActivity.CPU],
                    experimental_config=_ExperimentalConfig(profile_all_threads=True)),
         "one": dict(activities=[ProfilerActivity.CPU]),
         "cuda": dict(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])}
for step in sys.argv[1].split(","):
    if dev == "cuda" or not step.startswith("cuda"):
        session(step, **kinds[step.rstrip("0123456789")])
print(json.dumps(r))
"""

VARIANTS = {
    "default": ("cpu1,cpu2,cuda1", {}),
    "cuda_first": ("cuda1,cpu1", {}),
    "one_thread": ("one1,cpu1,cuda1", {}),
}


def one(order, env, device):
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, order, device], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300], "wall_s": time.perf_counter() - t}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["wall_s"] = time.perf_counter() - t
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per variant (default 3)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: no CUDA context or session")
    ap.add_argument("--out", help="per-process figures as JSON")
    args = ap.parse_args()
    runs = {}
    for name, (order, env) in VARIANTS.items():
        runs[name] = []
        for i in range(args.repeats):
            runs[name].append(one(order, env, args.device))
            print(f"[profiler_startup] {name} {i + 1}/{args.repeats}: {runs[name][-1]}", file=sys.stderr)
    cols = ["import_s", "cuda_context_s", "one1_s", "cpu1_s", "cpu2_s", "cuda1_s", "wall_s"]
    print("| variant | " + " | ".join(cols) + " | errors |")
    print("|---" * (len(cols) + 2) + "|")
    for name, rs in runs.items():
        med = [statistics.median([r[c] for r in rs if c in r]) if any(c in r for r in rs) else None for c in cols]
        errs = sorted({v for r in rs for k, v in r.items() if k.endswith("error")})
        print(f"| {name} | " + " | ".join("—" if m is None else f"{m:.2f}" for m in med) + f" | {'; '.join(errs)} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
