"""The strict policy as data, stated once and imported by everything that enforces it: the guard
inside a solution's child (eval_guard.py), the judge's reading of the child's evidence (judge.py)
and the judge's static checks (static_check.py). No torch import: the static checks run in a
process that stays light.

Under --policy strict, ModelNew.forward may only allocate, take views and read metadata, and call
the solution's own extension (evaluator/README.md, "The strict policy").
"""

# Python-level names (func.__name__) the guard admits in forward; the dispatch level still checks
# what they do underneath (x[idx] with a tensor index reaches aten.index: refused).
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

# aten overload packets (op.overloadpacket.__name__) a strict candidate may reach: allocation
# (fills included: accumulators start at zero), views and metadata, and layout copies
# (`.contiguous()` and `.clone()` move bytes, they compute nothing).
ALLOWED_ATEN = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "zero_", "fill_", "scalar_tensor",
    "lift_fresh", "resize_",
    "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze",
    "select", "slice", "narrow", "unbind", "split", "split_with_sizes", "chunk", "detach", "alias", "view_as_real",
    "view_as_complex", "diagonal", "unfold", "flatten", "movedim", "_reshape_alias", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "is_contiguous", "_local_scalar_dense", "is_same_size", "is_nonzero",
    "set_", "_has_compatible_shallow_copy_type", "record_stream",
    "clone", "copy_", "_copy_from", "_copy_from_and_resize", "contiguous",
})
