"""Probe a seed: it must build, run forward once and return tensors. Used by the crawler.

Candidates are alternative codes for the same operator (e.g. different input layouts); the
first that runs wins and the errors of the others are kept for the record.
"""
import time

import torch

from opforge import task as T
from opforge.normalize import normalize_code
from opforge.tracing import OpTracer


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_once(code, device):
    mod = T.load_module(code)
    model = T.build(mod, device)
    inputs = T.make_inputs(mod, device)
    with torch.no_grad():
        tracer = OpTracer(model)
        try:
            _sync(device)
            t0 = time.perf_counter()
            with tracer:
                out = model(*inputs)
            _sync(device)
            ms = (time.perf_counter() - t0) * 1e3
        except Exception as e:  # noqa: BLE001
            raise T.TaskError("forward_error", f"{type(e).__name__}: {e}") from None
    leaves = T.flatten_outputs(out)
    return {
        "ops": tracer.ops,
        "inputs": T.describe(inputs),
        "outputs": [T.describe(t) for t in leaves],
        "probe_ms": ms,
        "device": device,
    }


def probe(candidates, device="cpu"):
    device = T.resolve_device(device)
    errors = []
    for i, code in enumerate(candidates):
        try:
            res = run_once(code, device)
        except T.TaskError as e:
            errors.append({"candidate": i, "reason": e.reason, "message": str(e)[:1000]})
            continue
        res.update(ok=True, candidate=i, normalized=normalize_code(code), errors=errors)
        return res
    # The first candidate's failure is the most telling (it is the intended layout).
    first = errors[0] if errors else {"reason": "no_candidates", "message": "nothing to probe"}
    return {"ok": False, "reason": first["reason"], "message": first["message"], "errors": errors}
