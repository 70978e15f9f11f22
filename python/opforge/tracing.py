"""Derive a task's operator sequence by running it, never by trusting what generated it.

Two sources, merged in call order:
- calls of submodules of the root Model (forward hooks): recorded by class, e.g. "nn.Conv2d",
  "transformers.LlamaMLP"; what they call inside is theirs, not recorded separately;
- torch functions and Tensor methods called directly in Model.forward (a TorchFunctionMode),
  e.g. "torch.relu", "F.gelu", "Tensor.view".
Metadata queries (shape, size, dim, ...) are not operators and are left out.
"""
import torch
from torch.overrides import TorchFunctionMode

# Tensor methods and getters that read metadata or convert, not compute.
_METADATA = {
    "__get__", "size", "dim", "numel", "stride", "is_contiguous", "data_ptr", "element_size",
    "__len__", "__format__", "__repr__", "__bool__", "__index__", "__int__", "__float__", "__iter__",
    "__hash__", "is_floating_point", "is_complex", "nelement", "ndimension",
    "storage_offset", "untyped_storage", "get_device", "__reduce_ex__", "__setstate__", "__deepcopy__",
    "__contains__", "tolist", "item", "has_names", "_is_view", "is_leaf", "requires_grad_",
}
_DUNDER = {
    "add": "torch.add", "radd": "torch.add", "iadd": "torch.add",
    "sub": "torch.sub", "rsub": "torch.sub", "isub": "torch.sub",
    "mul": "torch.mul", "rmul": "torch.mul", "imul": "torch.mul",
    "truediv": "torch.div", "rtruediv": "torch.div", "itruediv": "torch.div", "div": "torch.div",
    "floordiv": "torch.floor_divide", "rfloordiv": "torch.floor_divide",
    "matmul": "torch.matmul", "rmatmul": "torch.matmul", "pow": "torch.pow", "rpow": "torch.pow",
    "neg": "torch.neg", "abs": "torch.abs", "mod": "torch.remainder", "and": "torch.bitwise_and",
    "or": "torch.bitwise_or", "xor": "torch.bitwise_xor", "invert": "torch.bitwise_not",
    "lt": "torch.lt", "le": "torch.le", "gt": "torch.gt", "ge": "torch.ge", "eq": "torch.eq", "ne": "torch.ne",
    "getitem": "Tensor.__getitem__", "setitem": "Tensor.__setitem__",
}
_PRIVATE_NS = {"_linalg": "torch.linalg.", "_fft": "torch.fft.", "_special": "torch.special.", "_nested": "torch.nested."}


def op_name(func):
    """A stable public name for a function seen by __torch_function__, or None to skip it."""
    name = getattr(func, "__name__", None)
    if name is None:
        return None
    if name in _METADATA or (name.startswith("_") and not name.startswith("__")):
        return None  # metadata and private helpers (torch._set_grad_enabled) are not operators
    qual = getattr(func, "__qualname__", "") or ""
    module = getattr(func, "__module__", None) or ""
    objclass = getattr(func, "__objclass__", None)
    if objclass is not None or qual.startswith(("TensorBase.", "Tensor.", "_TensorBase.")):
        if name.startswith("__") and name.endswith("__"):
            core = name[2:-2]
            return _DUNDER.get(core, f"Tensor.{name}")
        return f"Tensor.{name}"
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        return f"F.{name}"
    for ns, prefix in _PRIVATE_NS.items():
        if module == f"torch._C.{ns}":
            short = ns.lstrip("_") + "_"
            return prefix + (name[len(short):] if name.startswith(short) else name)
    if module in ("torch.linalg", "torch.fft", "torch.special"):
        return f"{module}.{name}"
    if module.startswith("torch"):
        return f"torch.{name}"
    return f"{module}.{name}" if module else name


def module_name(mod):
    cls = type(mod)
    m = cls.__module__
    if m.startswith("torch.nn"):
        return f"nn.{cls.__name__}"
    if m.startswith("transformers"):
        return f"transformers.{cls.__name__}"
    return None  # a class written in the task itself: trace through it


class OpTracer(TorchFunctionMode):
    """Records the operator sequence of one forward call of `root`."""

    def __init__(self, root):
        super().__init__()
        self.root = root
        self.ops = []
        self._depth = 0
        self._stack = []
        self._handles = []

    def _pre(self, mod, args):
        if mod is self.root:
            return
        name = module_name(mod)
        counted = name is not None
        self._stack.append(counted)
        if counted:
            if self._depth == 0:
                self.ops.append(name)
            self._depth += 1

    def _post(self, mod, args, out):
        if mod is self.root or not self._stack:
            return
        if self._stack.pop():
            self._depth -= 1

    def __enter__(self):
        reg = torch.nn.modules.module
        self._handles = [
            reg.register_module_forward_pre_hook(self._pre),
            reg.register_module_forward_hook(self._post, always_call=True),
        ]
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self._depth == 0:
            name = op_name(func)
            if name:
                self.ops.append(name)
        return func(*args, **(kwargs or {}))
