"""Loading a KernelBench-format task: the one place every stage turns code into a model.

A task is Python source defining `class Model(nn.Module)`, `get_inputs()` and
`get_init_inputs()`. Failures are raised as TaskError with a fixed reason code, which callers
record as data.
"""
import contextlib
import random
import types

import torch


class TaskError(Exception):
    """An expected failure of a task, with a reason code from a fixed set."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


def load_module(code, name="opforge_task"):
    mod = types.ModuleType(name)
    mod.__file__ = f"<{name}>"
    try:
        compiled = compile(code, mod.__file__, "exec")
    except SyntaxError as e:
        raise TaskError("syntax_error", f"line {e.lineno}: {e.msg}") from None
    try:
        exec(compiled, mod.__dict__)
    except Exception as e:  # noqa: BLE001
        reason = "import_error" if isinstance(e, ImportError) else "load_error"
        raise TaskError(reason, f"{type(e).__name__}: {e}") from None
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, attr):
            raise TaskError("bad_format", f"the task defines no `{attr}` (KernelBench format needs "
                                          "class Model, get_inputs() and get_init_inputs())")
    return mod


def seed_everything(seed):
    random.seed(seed)
    torch.manual_seed(seed)


def to_device(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    return value


def build(mod, device, seed=0):
    """Instantiates Model(*get_init_inputs()) on `device`, deterministically."""
    seed_everything(seed)
    try:
        init = mod.get_init_inputs()
        model = mod.Model(*init)
    except Exception as e:  # noqa: BLE001
        raise TaskError("init_error", f"{type(e).__name__}: {e}") from None
    try:
        return model.to(device)
    except Exception as e:  # noqa: BLE001
        raise TaskError("init_error", f"moving to {device}: {type(e).__name__}: {e}") from None


def make_inputs(mod, device, seed=1, on_device=False):
    """get_inputs() with the RNG seeded, moved to `device`. on_device: drawn there (the factory
    functions under torch.device), not on the CPU and copied: a GiB of torch.randn is seconds of
    a CPU core beside milliseconds of a GPU."""
    seed_everything(seed)
    try:
        with torch.device(device) if on_device else contextlib.nullcontext():
            inputs = mod.get_inputs()
    except Exception as e:  # noqa: BLE001
        raise TaskError("input_error", f"{type(e).__name__}: {e}") from None
    return [to_device(x, device) for x in inputs]


def flatten_outputs(out):
    """Leaves of an output structure; raises TaskError unless they are all tensors (≥ 1).

    Iterative on purpose: a recursive closure is a reference cycle that keeps every leaf (a GiB
    output on a GPU task) alive until the cyclic collector runs, and timing disables it."""
    leaves, stack = [], [out]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            leaves.append(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(v[k] for k in sorted(v, reverse=True))
        else:
            raise TaskError("no_tensor_output", f"forward returned a {type(v).__name__}, not tensors")
    if not leaves:
        raise TaskError("no_tensor_output", "forward returned no tensor")
    return leaves


def describe(value):
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    return {"value": repr(value)[:80], "type": type(value).__name__}


def resolve_device(device):
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for, but torch sees no CUDA device")
    return device
