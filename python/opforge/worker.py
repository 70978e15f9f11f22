"""Request dispatch of an `opforge worker` process.

Every request is one JSON object {"op": NAME, "args": {...}}; every reply is one JSON object
{"ok": true, "result": ...} or {"ok": false, "error": TYPE, "message": TEXT, "traceback": TEXT}.
An exception in a handler is an answer, not a crash: only a dead process is a crash.
"""
import importlib
import json
import math
import os
import platform
import sys
import traceback

import torch  # imported once per worker: the reason workers are long-lived

# op name -> "module:function"; modules are imported on first use so a worker that only probes
# never pays for what the crawler's enumeration imports.
HANDLERS = {
    "ping": "opforge.worker:ping",
    "probe": "opforge.probe:probe",
    "enumerate": "opforge.crawl:enumerate_ops",
    "normalize": "opforge.normalize:normalize_request",
    "compose_offline": "opforge.composers:compose_offline",
    "judge": "opforge.filter:judge",
    "filter_checks": "opforge.filter:registered_checks",
    "features": "opforge.features:features",
    "plots": "opforge.plots:plots",
    "write_verl": "opforge.verl_export:write_verl",
    "eval_compile": "opforge.judge:eval_compile",
    "eval_solution": "opforge.judge:eval_solution",
    "eval_baselines": "opforge.judge:eval_baselines",
    "eval_prestart": "opforge.judge:eval_prestart",
    "eval_plots": "opforge.eval_plots:eval_plots",
    "realism_trace": "opforge.realism:trace_codes",
    "realism_figures": "opforge.realism:figures_of",
    "trace_family": "opforge.model_stats:trace_family",
    "merge_stats": "opforge.model_stats:merge_stats",
}


def _versions():
    from importlib import metadata

    def ver(pkg):
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": ver("transformers"),
        "cuda_available": torch.cuda.is_available(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "pid": os.getpid(),
    }
    if torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name(0)
        info["device_uuid"] = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
        info["cuda"] = torch.version.cuda
    return info


def startup(_arg=""):
    return json.dumps({"ready": True, **_versions()})


def ping(**kwargs):
    return {"pong": True, **kwargs}


def _finite(obj):
    """obj with every inf and NaN number made null (what the C++ side reads as "no figure")."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _dumps(reply):
    """JSON as the C++ side parses it: Python writes inf as `Infinity`, which is not JSON, and a
    reply it cannot parse was a worker crash, the verdict of a correct answer (red-team, s38)."""
    try:
        return json.dumps(reply, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(reply), allow_nan=False)


def handle(line):
    try:
        req = json.loads(line)
        op = req.get("op")
        if op not in HANDLERS:
            raise ValueError(f"unknown op {op!r}; known: {sorted(HANDLERS)}")
        mod_name, fn_name = HANDLERS[op].split(":")
        fn = getattr(importlib.import_module(mod_name), fn_name)
        result = fn(**req.get("args", {}))
        return _dumps({"ok": True, "result": result})
    # SystemExit too: task code calling sys.exit() must not end the worker.
    except (Exception, SystemExit) as e:  # noqa: BLE001 - every failure becomes an answer
        return json.dumps(
            {
                "ok": False,
                "error": type(e).__name__,
                "message": str(e)[:2000],
                "traceback": traceback.format_exc()[-4000:],
            }
        )
