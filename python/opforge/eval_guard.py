"""What a candidate may do under the strict policy, observed from inside its own child process
(python/opforge/candidate.py): the guard, and the counting of its extension's calls. Evidence the
judge weighs, never the judge itself (the judge's own checks are in python/opforge/judge.py).

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

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class ForbiddenOp(RuntimeError):
    pass


from opforge.policy import ALLOWED_ATEN, ALLOWED_FUNCTIONS  # noqa: E402 - the policy as data, stated once


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
