"""What a candidate may do, and what it must not touch: the evaluator's strict guard, extension
loading with call counting, and the tamper snapshot.

Strict guard: while `ModelNew.forward` runs, a TorchFunctionMode refuses every torch-level API
call that is not allocation, a view or metadata (so `torch.matmul`, `F.*` and tensor methods such
as `x.sum()` are refused, with their Python names), and a TorchDispatchMode below it refuses
every aten op outside the same set (so compute reached any other way, including `at::matmul`
called from inside an extension, is refused too: intended, an extension must launch its own
kernels). Functions of the solution's own pybind extension are plain C++ calls: they reach the
dispatcher only for what they allocate, and their kernels never do. A refusal raises
ForbiddenOp *and* is recorded, so a solution that catches the exception and falls back to
something else is still caught.
"""
import functools
import time

import torch
import torch._dynamo  # noqa: F401 - importing dynamo wraps torch.manual_seed: do it before the snapshot
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class ForbiddenOp(RuntimeError):
    pass


# aten overload packets (op.overloadpacket.__name__) the candidate may reach during forward.
ALLOWED_ATEN = frozenset({
    # allocation (fills included: accumulators start at zero)
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "zero_", "fill_", "scalar_tensor",
    "lift_fresh", "resize_",
    # views and metadata
    "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze",
    "select", "slice", "narrow", "unbind", "split", "split_with_sizes", "chunk", "detach", "alias", "view_as_real",
    "view_as_complex", "diagonal", "unfold", "flatten", "movedim", "_reshape_alias", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_contiguous", "_local_scalar_dense", "is_same_size", "is_nonzero",
    "set_", "_has_compatible_shallow_copy_type", "record_stream",
    # layout copies: `.contiguous()` and `.clone()` move bytes, they compute nothing
    "clone", "copy_", "_copy_from", "_copy_from_and_resize", "contiguous",
})

# Python-level names (func.__name__) admitted by the function mode; the dispatch mode still
# checks what they do underneath (x[idx] with a tensor index reaches aten.index: refused).
ALLOWED_FUNCTIONS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "zero_", "fill_", "tensor", "as_tensor",
    "scalar_tensor",
    "__get__", "size", "stride", "dim", "ndimension", "numel", "nelement", "element_size", "storage_offset",
    "is_contiguous", "data_ptr", "get_device", "untyped_storage", "is_floating_point", "is_complex", "__len__",
    "dtype", "device", "shape",
    "view", "view_as", "reshape", "reshape_as", "as_strided", "t", "transpose", "permute", "expand", "expand_as",
    "squeeze", "unsqueeze", "select", "narrow", "unbind", "split", "chunk", "detach", "flatten", "unflatten",
    "movedim", "__getitem__", "__setitem__", "__iter__", "contiguous", "clone", "copy_", "item", "__index__",
    "__int__", "__float__", "__bool__", "__hash__", "__repr__", "__format__", "__len__", "record_stream",
    "is_nonzero", "set_",
})


def _name(func):
    mod = getattr(func, "__module__", None) or ""
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    qual = qual.replace("_VariableFunctionsClass.", "").replace("TensorBase.", "Tensor.")
    if mod.startswith("torch") and not qual.startswith("Tensor."):
        return f"{mod}.{qual}"
    return qual if qual.startswith("Tensor.") else f"torch.{qual}"


class _FunctionGuard(TorchFunctionMode):
    def __init__(self, violations):
        super().__init__()
        self.violations = violations

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # aten ops (from the dispatch guard calling through, or torch.ops.aten.* called directly)
        # are judged by the dispatch guard, which knows them by their aten name.
        if isinstance(func, torch._ops.OpOverload) or getattr(func, "__name__", None) in ALLOWED_FUNCTIONS:
            return func(*args, **(kwargs or {}))
        name = _name(func)
        self.violations.append(name)
        raise ForbiddenOp(f"{name} is not allowed in ModelNew.forward under --policy strict "
                          "(only allocation, views and the solution's own extension ops)")


class _DispatchGuard(TorchDispatchMode):
    def __init__(self, violations):
        super().__init__()
        self.violations = violations

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if packet not in ALLOWED_ATEN:
            name = str(func)
            self.violations.append(name)
            raise ForbiddenOp(f"{name} is not allowed in ModelNew.forward under --policy strict "
                              "(torch compute, also from inside an extension, is refused)")
        return func(*args, **(kwargs or {}))


class StrictGuard:
    """Context manager: the function mode outside, the dispatch mode inside. Reusable; the
    violations accumulate across entries so a swallowed refusal is still on record."""

    def __init__(self):
        self.violations = []

    def __enter__(self):
        self._f = _FunctionGuard(self.violations)
        self._d = _DispatchGuard(self.violations)
        self._f.__enter__()
        try:
            self._d.__enter__()
        except BaseException:
            self._f.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        try:
            self._d.__exit__(*exc)
        finally:
            self._f.__exit__(*exc)
        return False


class NoGuard:
    violations = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---------------------------------------------------------------------------------------------
# Extensions: loaded through the harness so their functions are counted (a strict candidate must
# call its extension: returning allocations alone computes nothing).

class ExtensionCalls:
    def __init__(self):
        self.count = 0
        self.modules = []

    def wrap(self, module):
        """Replaces the module's callables by counting wrappers, before the solution sees it."""
        for attr in dir(module):
            if attr.startswith("__"):
                continue
            fn = getattr(module, attr)
            if callable(fn) and not isinstance(fn, type):
                setattr(module, attr, self._counting(fn))
        self.modules.append(module)
        return module

    def _counting(self, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            self.count += 1
            return fn(*args, **kwargs)

        return call


class BuildFailed(Exception):
    """The compiler rejected the solution's sources; message holds the build log."""


def _sha(parts):
    import hashlib

    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def hooked_loaders(calls, extensions_dir):
    """Replacements of cpp_extension.load/load_inline for the time the solution is imported.
    Each build goes to extensions_dir/<name>_<hash of name, sources and flags>: equal sources
    share one build across solutions and runs, different sources under one name never overwrite
    each other (torch's own versioning only holds within one process). Compiler failures become
    BuildFailed; the modules' functions are counted. Returns (load, load_inline, orig_load,
    orig_load_inline)."""
    import os

    import torch.utils.cpp_extension as ce

    orig_load, orig_inline = ce.load, ce.load_inline

    def _build(orig, *args, **kwargs):
        kwargs.pop("build_directory", None)  # the harness's cache, not a path the solution picks
        parts = [repr(args), repr(sorted(kwargs.items()))]
        sources = kwargs.get("sources", args[1] if orig is orig_load and len(args) > 1 else [])
        for src in [sources] if isinstance(sources, str) else list(sources or []):
            if isinstance(src, str) and os.path.isfile(src):
                with open(src, "rb") as f:
                    parts.append(f.read())
        name = kwargs.get("name", args[0] if args else "extension")
        build_dir = os.path.join(extensions_dir, f"{name}_{_sha(parts)[:12]}")
        os.makedirs(build_dir, exist_ok=True)
        try:
            mod = orig(*args, build_directory=build_dir, **kwargs)
        except (RuntimeError, OSError, ImportError) as e:
            raise BuildFailed(str(e)) from None
        return calls.wrap(mod)

    return (functools.partial(_build, orig_load), functools.partial(_build, orig_inline), orig_load, orig_inline)


# ---------------------------------------------------------------------------------------------
# Tampering: identities of what the harness relies on, taken before any solution code runs.

def _targets():
    import opforge.timing as timing

    out = {
        "time.perf_counter": (time, "perf_counter"), "time.perf_counter_ns": (time, "perf_counter_ns"),
        "time.time": (time, "time"), "time.monotonic": (time, "monotonic"), "time.sleep": (time, "sleep"),
        "torch.cuda.synchronize": (torch.cuda, "synchronize"), "torch.cuda.Event": (torch.cuda, "Event"),
        "torch.cuda.Event.record": (torch.cuda.Event, "record"),
        "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
        "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
        "torch.cuda.Stream.synchronize": (torch.cuda.Stream, "synchronize"),
        "torch.cuda.current_stream": (torch.cuda, "current_stream"),
        "torch.cuda.is_available": (torch.cuda, "is_available"),
        "torch.allclose": (torch, "allclose"), "torch.isclose": (torch, "isclose"), "torch.equal": (torch, "equal"),
        "torch.manual_seed": (torch, "manual_seed"), "torch.randn": (torch, "randn"), "torch.rand": (torch, "rand"),
        "torch.Tensor.clone": (torch.Tensor, "clone"), "torch.Tensor.float": (torch.Tensor, "float"),
        "torch.Tensor.abs": (torch.Tensor, "abs"), "torch.Tensor.__sub__": (torch.Tensor, "__sub__"),
        "torch.Tensor.max": (torch.Tensor, "max"), "torch.Tensor.data_ptr": (torch.Tensor, "data_ptr"),
        "torch.Tensor.untyped_storage": (torch.Tensor, "untyped_storage"),
        "torch.nn.Module.__call__": (torch.nn.Module, "__call__"),
        "torch.nn.Module.load_state_dict": (torch.nn.Module, "load_state_dict"),
        "torch.nn.Module.state_dict": (torch.nn.Module, "state_dict"),
        "torch.nn.Module.eval": (torch.nn.Module, "eval"),
        "torch.no_grad": (torch, "no_grad"), "torch.compile": (torch, "compile"),
        "opforge.timing.time_fn": (timing, "time_fn"), "opforge.timing._flush_l2": (timing, "_flush_l2"),
        "opforge.timing.exclusive": (timing, "exclusive"), "opforge.timing.shared": (timing, "shared"),
        "StrictGuard.__enter__": (StrictGuard, "__enter__"), "StrictGuard.__exit__": (StrictGuard, "__exit__"),
        "_FunctionGuard.__torch_function__": (_FunctionGuard, "__torch_function__"),
        "_DispatchGuard.__torch_dispatch__": (_DispatchGuard, "__torch_dispatch__"),
    }
    return out


class TamperSnapshot:
    """Taken before the solution is imported; changed() names what was replaced since, and
    restore() puts the originals back so the next request in this worker is judged honestly."""

    def __init__(self):
        self.targets = _targets()
        self.original = {k: getattr(obj, attr, None) for k, (obj, attr) in self.targets.items()}

    def changed(self):
        return sorted(k for k, (obj, attr) in self.targets.items() if getattr(obj, attr, None) is not self.original[k])

    def restore(self):
        for k, (obj, attr) in self.targets.items():
            if getattr(obj, attr, None) is not self.original[k]:
                try:
                    setattr(obj, attr, self.original[k])
                except (AttributeError, TypeError):
                    pass
