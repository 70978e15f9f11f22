"""Checks an exported corpus against its own code: every record's `ops` must be the op sequence
traced from its `code` now, the way the filter traced it (one forward on the seed-1 inputs under
OpTracer). Ops-6K's audit found labels that disagree with the code; this is the guard against that.

    python -m opforge.verify EXPORT_DIR [--device cpu|cuda]

Prints one JSON line per disagreeing record on stdout, a summary on stderr; exit status 1 when
any record disagrees or fails to run, 0 otherwise.
"""
import argparse
import glob
import gzip
import json
import os
import sys

import torch

from opforge import task as T
from opforge.tracing import OpTracer


def traced_ops(code, device="cpu"):
    """The op sequence of one forward of the task in `code` (as the filter records it)."""
    mod = T.load_module(code)
    model = T.build(mod, device)
    inputs = T.make_inputs(mod, device, seed=1)
    tracer = OpTracer(model)
    with torch.no_grad(), tracer:
        model(*inputs)
    return tracer.ops


def records(export_dir):
    shards = sorted(glob.glob(os.path.join(export_dir, "ops-*.jsonl")) +
                    glob.glob(os.path.join(export_dir, "ops-*.jsonl.gz")))
    if not shards:
        raise SystemExit(f"opforge.verify: no ops-*.jsonl[.gz] shards in {export_dir}; pass the --out folder of "
                         "`opforge export`")
    for path in shards:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield path, json.loads(line)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m opforge.verify", description=__doc__.split("\n\n")[0])
    ap.add_argument("export_dir")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    n = bad = 0
    for path, rec in records(a.export_dir):
        n += 1
        try:
            ops = traced_ops(rec["code"], a.device)
        except Exception as e:  # noqa: BLE001 - a record that no longer runs is a finding, not a crash
            bad += 1
            print(json.dumps({"id": rec.get("id"), "shard": os.path.basename(path), "error": f"{type(e).__name__}: {e}"}))
            continue
        if ops != rec["ops"]:
            bad += 1
            print(json.dumps({"id": rec.get("id"), "shard": os.path.basename(path), "recorded": rec["ops"],
                              "traced": ops}))
    print(f"opforge.verify: {n} records, {n - bad} match their traced ops, {bad} do not", file=sys.stderr)
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
