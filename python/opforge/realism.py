"""How much a set of tasks looks like the compute of real models (docs/realism.md).

One granularity everywhere, for our tasks, a reference folder and the real models alike:
- an op is a torch function after alias normalisation: `F.relu`, `torch.relu`, `Tensor.relu`,
  `Tensor.relu_` and `nn.ReLU` (which calls `F.relu`) are all `relu`; only the outermost call is
  seen (a TorchFunctionMode is off while its handler runs), so `F.layer_norm` is one op;
- shape, view, metadata, conversion and tensor-creation calls are not ops (`SKIP`);
- a pair is two consecutive ops in call order; an edge is producer -> consumer in the dataflow
  (views pass their producer through).
Everything is traced on the meta device: no memory and no compute, so a 7B-wide layer or a
KernelBench level-3 network traces in milliseconds. What cannot run on meta (data-dependent
control flow) is reported as untraced, never guessed.
"""
import math

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from opforge import task as T
from opforge.tracing import _DUNDER, op_name

# Calls that compute nothing a kernel writer would write: views and reshapes, metadata,
# dtype/device conversion, copies and tensor creation.
SKIP = {
    "view", "view_as", "reshape", "reshape_as", "permute", "transpose", "t", "contiguous", "flatten",
    "unflatten", "squeeze", "unsqueeze", "expand", "expand_as", "chunk", "split", "split_with_sizes",
    "tensor_split", "unbind", "narrow", "select", "getitem", "setitem", "movedim", "moveaxis",
    "swapaxes", "swapdims", "as_strided", "to", "type", "type_as", "float", "double", "half", "bfloat16",
    "int", "long", "bool", "cuda", "cpu", "detach", "clone", "copy", "new_zeros", "new_ones", "new_empty",
    "new_full", "new_tensor", "zeros", "ones", "empty", "full", "arange", "tensor", "as_tensor",
    "zeros_like", "ones_like", "empty_like", "full_like", "rand", "randn", "randint", "rand_like",
    "randn_like", "linspace", "eye", "broadcast_to", "atleast_1d", "atleast_2d", "atleast_3d",
    "requires_grad", "retain_grad", "numpy", "pin_memory", "share_memory_", "unfold_copy",
    "is_nonzero", "is_floating_point", "is_contiguous", "element_size", "get_device", "dim_order",
    "finfo", "iinfo", "fill", "zero", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
    "feature_alpha_dropout", "is_tensor", "is_grad_enabled", "result_type", "can_cast", "promote_types",
}
# Names that mean the same computation.
ALIASES = {
    "multiply": "mul", "divide": "div", "true_divide": "div", "subtract": "sub", "rsub": "sub",
    "clip": "clamp", "absolute": "abs", "arccos": "acos", "arcsin": "asin", "arctan": "atan",
    "arctan2": "atan2", "arccosh": "acosh", "arcsinh": "asinh", "arctanh": "atanh", "negative": "neg",
    "greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne",
    "special.expit": "sigmoid", "special.erf": "erf", "special.exp2": "exp2", "special.expm1": "expm1",
    "special.log1p": "log1p", "special.logsumexp": "logsumexp", "special.softmax": "softmax",
    "special.log_softmax": "log_softmax", "special.logit": "logit", "special.round": "round",
    "special.sinc": "sinc", "special.i0": "i0", "special.erfinv": "erfinv", "special.psi": "digamma",
    "special.digamma": "digamma", "special.gammaln": "lgamma", "fix": "trunc", "concat": "cat",
    "concatenate": "cat", "linalg.matmul": "matmul", "linalg.vector_norm": "norm", "max_pool2d_with_indices": "max_pool2d",
    "max_pool1d_with_indices": "max_pool1d", "max_pool3d_with_indices": "max_pool3d",
}
# The compute a kernel is built around: GEMMs (recurrent cells are GEMMs too), convolutions, attention.
HEAVY = {
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "bilinear", "tensordot",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution",
    "scaled_dot_product_attention", "multi_head_attention_forward", "lstm", "gru", "rnn_tanh", "rnn_relu",
    "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
}
_PREFIXES = ("torch.nn.functional.", "torch.", "F.", "Tensor.", "nn.")


def canonical(name):
    """The normalised op of a traced name (`F.relu_` -> `relu`), or None when it is not an op."""
    if name is None:
        return None
    for p in _PREFIXES:
        if name.startswith(p):
            name = name[len(p):]
            break
    if name.startswith("_VF."):
        name = name[4:]
    if name.startswith("__") and name.endswith("__"):
        mapped = _DUNDER.get(name[2:-2])  # __iadd__, __radd__ -> torch.add
        return canonical(mapped) if mapped and mapped != "Tensor." + name else None
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]  # in place: the same computation
    name = ALIASES.get(name, name)
    if name in SKIP or name.startswith("_"):
        return None
    return name


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


class RealismTracer(TorchFunctionMode):
    """Records ops in call order, the shape of each op's widest tensor input, and dataflow edges."""

    def __init__(self):
        super().__init__()
        self.ops, self.shapes, self.edges = [], [], []
        self._producer = WeakIdKeyDictionary()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = canonical(op_name(func))
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        if op is None:
            # A view or copy passes its input's producer on, so x.view(...).relu() is an edge.
            src = next((self._producer[t] for t in inputs if t in self._producer), None)
            if src is not None:
                for t in _tensors(out):
                    self._producer[t] = src
            return out
        for t in inputs:
            src = self._producer.get(t)
            if src is not None:
                self.edges.append((src, op))
        self.ops.append(op)
        # The layout an op sees is its widest input's (addmm's bias comes first, its matrix after).
        self.shapes.append(list(max(inputs, key=lambda t: t.dim()).shape) if inputs else [])
        for t in _tensors(out):
            self._producer[t] = op
        return out


def trace_model(model, inputs):
    """Traces one forward of `model` (already on meta) on `inputs`; returns the tracer."""
    tracer = RealismTracer()
    with torch.no_grad(), tracer:
        model(*inputs)
    return tracer


def trace_task(code):
    """{"ops", "shapes", "edges"} of one forward of a KernelBench-format task, traced on meta,
    or {"error": TEXT} when it cannot be (data-dependent control flow, a broken file)."""
    try:
        mod = T.load_module(code, "opforge_realism")
        with torch.device("meta"):
            T.seed_everything(0)
            model = mod.Model(*mod.get_init_inputs())
            inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
        tracer = trace_model(model, inputs)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a task that cannot trace is a counted fact
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"ops": tracer.ops, "shapes": tracer.shapes, "edges": [list(e) for e in tracer.edges]}


# -- figures ------------------------------------------------------------------------------------
def layout_of(shape):
    """A coarse layout name of an op's input: its rank (what N·C·H·W versus B·S·D distinguishes)."""
    return {0: "scalar", 1: "vector", 2: "rows", 3: "seq", 4: "image", 5: "volume"}.get(len(shape), "nd")


def figures(traces, stats):
    """The realism figures of traced tasks against the real-model tables `stats` (model_stats)."""
    vocab = set(stats["ops"])
    pairs = {tuple(p.split(" -> ")) for p in stats["pairs"]}
    n = untraced = multi = heavy = occ = in_vocab = npairs = real_pairs = 0
    for tr in traces:
        n += 1
        if "error" in tr:
            untraced += 1
            continue
        ops = tr["ops"]
        occ += len(ops)
        in_vocab += sum(op in vocab for op in ops)
        for a, b in zip(ops, ops[1:]):
            npairs += 1
            real_pairs += (a, b) in pairs
        if len(ops) >= 2:
            multi += 1
            heavy += any(op in HEAVY for op in ops)

    def share(a, b):
        return None if b == 0 else round(100.0 * a / b, 1)

    return {"tasks": n, "untraced": untraced, "multi_op": multi, "heavy_share": share(heavy, multi),
            "vocab_share": share(in_vocab, occ), "pair_share": share(real_pairs, npairs),
            "op_occurrences": occ, "pairs": npairs,
            "median_ops": _median([len(t["ops"]) for t in traces if "error" not in t]), **_distributions(traces)}


HEAVY_KIND = {"conv": "convolution", "scaled": "attention", "multi": "attention", "lstm": "recurrent",
              "gru": "recurrent", "rnn": "recurrent"}


def _distributions(traces):
    """Where the tasks' compute sits: op inputs by layout, each task's first input by size
    (log2 of its elements), and which kind of heavy op the tasks hold (GEMM, convolution, ...)."""
    layouts, sizes, kinds = {}, {}, {}
    for tr in traces:
        if "error" in tr:
            continue
        for s in tr["shapes"]:
            layouts[layout_of(s)] = layouts.get(layout_of(s), 0) + 1
        if tr["shapes"]:
            key = f"2^{int(log_size(tr['shapes'][0]))}"
            sizes[key] = sizes.get(key, 0) + 1
        for kind in sorted({_heavy_kind(op) for op in tr["ops"] if op in HEAVY}):
            kinds[kind] = kinds.get(kind, 0) + 1
    by_exp = lambda kv: int(kv[0][2:])  # noqa: E731
    return {"layouts": dict(sorted(layouts.items())), "input_sizes": dict(sorted(sizes.items(), key=by_exp)),
            "heavy_kinds": dict(sorted(kinds.items()))}


def _heavy_kind(op):
    return next((v for k, v in HEAVY_KIND.items() if op.startswith(k)), "gemm")


def _median(xs):
    if not xs:
        return None
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def log_size(shape):
    return round(math.log2(max(1, math.prod(shape))), 1)


# -- worker handlers ------------------------------------------------------------------------------
def trace_codes(codes):
    """Handler `realism_trace`: the trace of each code, in order (errors as values)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # task files warn on construction; the figures do not care
        return [trace_task(c) for c in codes]


def figures_of(traces, stats_path):
    """Handler `realism_figures`: the figures of `traces` against the table at `stats_path`."""
    import json

    with open(stats_path) as f:
        stats = json.load(f)
    out = figures(traces, stats)
    errors = [t["error"] for t in traces if "error" in t]
    out["untraced_examples"] = sorted(set(errors))[:5]
    return out
