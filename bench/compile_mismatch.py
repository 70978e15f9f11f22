"""Why a task's torch.compile output differs from eager: TF32, the tolerance, or a real difference.

    python3 bench/compile_mismatch.py TASK.py... [--device cuda] [--json OUT]

For each task (KernelBench format) the outputs of five runs on one input set are compared against
a float64 run of the same weights and inputs, the closest thing to the true value:
  eager          the defaults (cuDNN convolutions in TF32, matmuls in float32)
  eager_fp32     TF32 off everywhere (torch.backends.cudnn.allow_tf32 = False)
  compiled       torch.compile with the defaults
  compiled_fp32  torch.compile with TF32 off
Per pair: the largest absolute difference, the output's scale (largest |float64| value), the share
of elements outside allclose(rtol=1e-2, atol=1e-2) (the filter's and the judge's rule), and the
largest difference relative to the output's scale, and whether the pair passes the agreement rule
of python/opforge/tolerance.py (atol in units of max(1, mean |ref|)).
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from opforge import task as T  # noqa: E402
from opforge import tolerance as tol  # noqa: E402


def _run(model, inputs):
    with torch.no_grad():
        return [t.detach() for t in T.flatten_outputs(model(*[x.clone() if torch.is_tensor(x) else x
                                                                for x in inputs]))]


def _double(inputs):
    return [x.double() if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs]


def _tf32(on):
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default: matmuls stay float32


def _compare(a, b, truth):
    diff = max(((x.double() - y.double()).abs().max().item() if x.numel() else 0.0) for x, y in zip(a, b))
    scale = max((t.abs().max().item() if t.numel() else 0.0) for t in truth)
    outside = sum((~torch.isclose(x.double(), y.double(), rtol=1e-2, atol=1e-2)).sum().item() for x, y in zip(a, b))
    total = sum(x.numel() for x in a)
    truth_b = [t.to(x.dtype) for t, x in zip(b, a)]
    return {"max_abs": diff, "scale": scale, "rel_to_scale": diff / scale if scale else None,
            "outside_allclose": outside / max(total, 1), "allclose": outside == 0,
            "mean_scale": max(tol.scale_of(t) for t in truth_b), "rule": tol.close(a, truth_b)}


def study(path, device):
    mod = T.load_module(Path(path).read_text())
    model = T.build(mod, device)
    inputs = T.make_inputs(mod, device, seed=1)
    runs = {}
    _tf32(True)
    runs["eager"] = _run(model, inputs)
    runs["compiled"] = _run(torch.compile(model), inputs)
    _tf32(False)
    torch._dynamo.reset()
    runs["eager_fp32"] = _run(model, inputs)
    runs["compiled_fp32"] = _run(torch.compile(model), inputs)
    truth = _run(model.double(), _double(inputs))
    _tf32(True)
    pairs = {"compiled vs eager": ("compiled", "eager"), "compiled_fp32 vs eager_fp32": ("compiled_fp32", "eager_fp32"),
             "eager vs float64": ("eager", None), "eager_fp32 vs float64": ("eager_fp32", None),
             "compiled vs float64": ("compiled", None), "compiled_fp32 vs float64": ("compiled_fp32", None)}
    out = {}
    for name, (a, b) in pairs.items():
        out[name] = _compare(runs[a], runs[b] if b else truth, truth)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="+")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    report = {}
    for p in a.tasks:
        name = Path(p).stem
        try:
            report[name] = study(p, a.device)
        except Exception as e:  # noqa: BLE001 - one task's failure is its row, not the end of the study
            report[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        torch._dynamo.reset()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        print(f"== {name}", file=sys.stderr)
        for pair, r in report[name].items():
            if isinstance(r, dict):
                print(f"  {pair:<28} max|diff| {r['max_abs']:.4g}  scale {r['scale']:.4g}  outside allclose "
                      f"{100 * r['outside_allclose']:.4f}%  rel {r['rel_to_scale'] or 0:.3g}  mean|ref| {r['mean_scale']:.3g}  "
                      f"rule {'pass' if r['rule'] else 'FAIL'}")
            else:
                print(f"  {pair}: {r}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
