"""Judge-side static evidence about a candidate solution: what its Python source does, and what its
built extension imports. Computed in the judge's own process from the solution's files and the
built `.so`, so nothing the solution runs (in its sandboxed child) can forge it. Everything the
child reports about itself (the strict guard's refusals, extension call counts) is advisory; this
module is the part that is not.

Two inputs, two checks:

* `check_source(files, strict=True)`: the solution's Python (model_new.py or the single .py) is
  parsed with `ast` (never imported, never run) and walked against the allow-lists below. Every
  finding is kind `suspicious_source`. With `strict=False` (`--policy torch-allowed`) only the
  dangerous findings remain (imports, introspection, tampering); the compute rules (torch
  functions, tensor methods and operators inside `forward`) are strict-only.
* `imported_symbols(so_path)` + `check_symbols(symbols, strict=True)`: the undefined dynamic
  symbols of the built extension, demangled, judged against symbol rules (kinds `forbidden_op`,
  `dynamic_symbol_lookup`, `callback_tampering`, `process_control`). `check_libraries` judges the
  libraries the loader will pull in (DT_NEEDED) and the search paths it will use (RPATH/RUNPATH),
  kind `unexpected_library`. `check_extension(so_path)` runs both.

Reading the .so: a compact ELF64 little-endian reader of our own (struct), not `nm`. Why:
  - the file is untrusted bytes (a solution can overwrite its build output or steer the linker);
    a bounds-checked pure-Python reader cannot be crashed or exploited the way a C parser can;
  - it reads what the dynamic loader reads: PT_DYNAMIC -> DT_SYMTAB/DT_STRTAB, with the symbol
    count from DT_HASH/DT_GNU_HASH and the relocations. `nm -D` reads the *section headers*
    (.dynsym), which the loader ignores: a crafted file can point them at a benign table while the
    loader binds the real one. We read both views and take their union;
  - it also yields DT_NEEDED and RPATH/RUNPATH, which nm does not show (a solution that links
    `libevil.so` imports only `evil_fn`, an innocent-looking unknown C symbol; the library is the
    evidence);
  - no binutils needed to *list* symbols.
Demangling is the one thing done outside: `c++filt` (binutils) in a child process, fed only names
that look like Itanium-mangled ones (`_Z[A-Za-z0-9_.$]+`), with a timeout and an output cap, so a
demangler bomb cannot take the judge down. Without c++filt, `imported_symbols` raises
StaticCheckError (demangle=False gives the raw names; `check_symbols` still flags raw mangled names
of at::/torch::/c10:: conservatively).

What static evidence cannot see (documented limits, the runtime guard covers part of them): code
that computes an address from a known one and walks libtorch's ELF in memory; raw `syscall`
instructions in inline asm; Python reached from C++ through the generic C API
(PyEval_GetBuiltins -> __import__ -> torch.matmul: pybind11 itself imports those symbols);
helpers reached through indirections the AST walk does not resolve.

No torch import at module level (nor anywhere): the judge calls this without a torch of its own.
"""
from __future__ import annotations

import ast
import fnmatch
import os
import re
import shutil
import struct
import subprocess
import threading
from dataclasses import dataclass

# ---------------------------------------------------------------------------------------------
# Findings

SUSPICIOUS_SOURCE = "suspicious_source"
FORBIDDEN_OP = "forbidden_op"
DYNAMIC_SYMBOL_LOOKUP = "dynamic_symbol_lookup"
CALLBACK_TAMPERING = "callback_tampering"
PROCESS_CONTROL = "process_control"
UNEXPECTED_LIBRARY = "unexpected_library"


@dataclass(frozen=True)
class Finding:
    kind: str  # the judge flag it maps to (one of the constants above)
    file: str  # source file name, or the .so path ("" when judging a bare symbol list)
    line: int  # 1-based source line; 0 for symbols and libraries
    what: str  # human-readable: what was seen and why it is refused


class StaticCheckError(Exception):
    """The input could not be analysed (not ELF64 LE, malformed, no c++filt...). The caller should
    treat it as evidence against the solution, not as a pass."""


# =============================================================================================
# Source rules (data). Names are compared after `ast` parsing, so identifiers are already
# NFKC-normalised (a full-width `ｅｖａｌ` is `eval` here too).
# =============================================================================================

# The strict policy's allow-lists, shared with the guard (python/opforge/policy.py, no torch).
from opforge.policy import ALLOWED_ATEN, ALLOWED_FUNCTIONS  # noqa: E402

# Modules a solution may import, and for `from M import name` which names (None: any public name).
# Everything else imported is a finding: numpy/ctypes/gc/sys/inspect/threading/subprocess/
# importlib/builtins/pickle/time/... are the doors to the harness, the reference model, the timer
# or the process. torch.nn.functional is admitted as an import (it adds no capability beyond
# `torch.nn.functional` as an attribute); its *calls* are compute, refused in forward under strict.
ALLOWED_IMPORTS = {
    "torch": None,
    "torch.nn": None,
    "torch.nn.functional": None,
    "torch.utils.cpp_extension": {"load", "load_inline", "CUDA_HOME"},  # the harness hooks these two
    "math": None,
    "typing": None,
    "functools": None,
    "os": {"path", "sep", "getcwd"},  # `environ` only as `os.environ.get`, see OS_ALLOWED
    "os.path": None,
    "cuda_extension": None,  # CUDA Agent layout: the harness registers the built kernels under it
    "__future__": None,
}

# Dotted names that are modules once imported (binding one as a plain value, `t = torch` or
# `f(os)`, hands the whole module to code the attribute rules cannot follow).
KNOWN_MODULES = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "torch.utils", "torch.utils.cpp_extension", "torch.cuda",
    "torch.backends", "torch.linalg", "torch.fft", "torch.special", "torch.nn.init", "torch.nn.modules",
    "math", "typing", "functools", "os", "os.path",
})

# Uses of os that are allowed: building paths next to the solution, reading the environment.
OS_PATH_FUNCS = frozenset({
    "join", "dirname", "basename", "abspath", "realpath", "exists", "isfile", "isdir", "splitext", "split",
    "normpath", "relpath", "expanduser", "sep", "getsize",
})
OS_ALLOWED = frozenset({"os.environ.get", "os.getcwd", "os.sep", "os.path"} | {f"os.path.{f}" for f in OS_PATH_FUNCS})

# torch.utils.cpp_extension: the two loaders the harness wraps (anything else, e.g.
# _import_module_from_library, loads code around the call counting).
CPP_EXTENSION_ALLOWED = frozenset({"load", "load_inline", "CUDA_HOME"})

# torch namespaces and functions that reach below the guard, run other code, or change global
# state the harness or the reference model depend on. Refused under every policy.
TORCH_DANGEROUS = (
    "torch._C", "torch._dynamo", "torch._inductor", "torch._ops", "torch._library",  # internals / modes
    "torch.ops", "torch.library", "torch.classes",  # ops by name, registering kernels into the dispatcher
    "torch.overrides",  # TorchFunctionMode & co: the guard's own machinery
    "torch.utils._python_dispatch",  # TorchDispatchMode
    "torch.compile", "torch.jit", "torch.fx", "torch.export",  # other compilers than the solution's own
    "torch.autograd", "torch.profiler",  # autograd Functions, profiler callbacks
    "torch.hub", "torch.load", "torch.save", "torch.package",  # downloads / unpickling = code execution
    "torch.distributed", "torch.multiprocessing",  # processes and sockets
    "torch.manual_seed", "torch.seed", "torch.set_rng_state", "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all", "torch.cuda.set_rng_state", "torch.random",  # the harness seeds the RNG
    "torch.set_default_dtype", "torch.set_default_device", "torch.set_default_tensor_type",
    "torch.set_float32_matmul_precision", "torch.use_deterministic_algorithms", "torch.set_flush_denormal",
    "torch.set_num_threads", "torch.set_num_interop_threads",  # global numerics / speed of the reference
    "torch.utils.cpp_extension._",  # private loaders (prefix: any _name)
)

# Names of the mode stack and torch-function disabling, wherever they appear (attribute, name,
# import): they switch the strict guard off.
MODE_NAMES = frozenset({
    "DisableTorchFunction", "DisableTorchFunctionSubclass", "_pop_mode", "_push_mode", "_pop_mode_temporarily",
    "_disable_current_modes", "_get_current_dispatch_mode", "_set_torch_function_mode", "_pop_torch_function_stack",
    "_push_on_torch_function_stack", "_len_torch_function_stack", "_get_function_stack_at",
    "_unset_infra_mode", "_ExcludeDispatchKeyGuard", "_DisableTorchDispatch", "_EnablePythonDispatcher",
})

# Calls that run strings as code, reach globals/frames, or touch files. `getattr`/`setattr`/
# `delattr`/`hasattr` are fine with a literal attribute name (we then judge that attribute like
# `obj.name`); with a computed one they can reach anything the dunder rule would refuse.
DANGEROUS_BUILTINS = frozenset({"exec", "eval", "compile", "__import__", "globals", "vars", "locals", "open",
                                "breakpoint"})
ATTR_BUILTINS = frozenset({"getattr", "setattr", "delattr", "hasattr"})

# Dunders allowed as attributes / names / string literals / method definitions. Any other dunder
# (__class__, __dict__, __globals__, __code__, __closure__, __builtins__, __subclasses__, __mro__,
# __getattr__ definitions, __torch_function__, __call__ overrides...) walks out of the sandboxed
# object graph or changes how the harness's calls behave.
ALLOWED_DUNDER_ATTRS = frozenset({"__init__", "__name__", "__file__"})
ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__file__", "__all__"})
ALLOWED_DUNDER_STRINGS = frozenset({"__init__", "__name__", "__file__", "__main__"})
ALLOWED_DUNDER_DEFS = frozenset({"__init__"})

# Frame / tracing attributes: walk the call stack into the harness (the reference model, the
# timer), or install a tracer.
FRAME_ATTRS = frozenset({"f_locals", "f_back", "f_globals", "f_builtins", "f_code", "f_trace", "gi_frame", "cr_frame",
                         "ag_frame", "tb_frame", "tb_next", "_getframe", "setprofile", "settrace", "gi_code"})

# Attribute names that are stdlib modules: `torch.os`, `typing.sys`, `F.torch.ctypes`... every big
# package re-exports the modules it imported, so an allowed import is a door to a forbidden one.
ESCAPE_ATTRS = frozenset({"os", "sys", "ctypes", "builtins", "importlib", "inspect", "subprocess", "gc", "threading",
                          "multiprocessing", "signal", "socket", "pickle", "marshal", "_thread", "posix", "runpy",
                          "pkgutil", "mmap", "shutil", "tempfile", "platform", "types", "weakref", "copyreg",
                          "traceback", "faulthandler", "atexit", "resource", "fcntl", "codecs", "dis", "linecache",
                          "site", "warnings", "contextlib", "operator", "time", "io", "pathlib", "glob"})
# ...of which these are too common as honest attribute names to refuse on an arbitrary object;
# they are refused only on chains rooted at an imported module (`torch.time`, `typing.io`).
ESCAPE_ATTRS_MODULE_ONLY = frozenset({"time", "io", "types", "operator", "warnings", "contextlib", "glob", "site",
                                      "codecs", "dis", "platform", "resource", "pathlib", "traceback", "weakref"})

# typing helpers that evaluate strings (an eval in disguise).
TYPING_DANGEROUS = frozenset({"typing.get_type_hints", "typing.ForwardRef"})

# nn.Module API the harness calls on the candidate (load_state_dict(strict=False), eval(), __call__
# -> forward...): overriding them changes what the harness observes.
NN_MODULE_API = frozenset({
    "load_state_dict", "state_dict", "_load_from_state_dict", "_save_to_state_dict", "eval", "train", "to", "cuda",
    "cpu", "half", "float", "double", "type", "apply", "_apply", "parameters", "named_parameters", "buffers",
    "named_buffers", "modules", "named_modules", "children", "named_children", "register_buffer",
    "register_parameter", "register_module", "add_module", "zero_grad", "requires_grad_", "share_memory",
    "_call_impl", "_wrapped_call_impl", "_get_name",
})

# Module hooks run code around the harness's own calls (also on the reference model, for the
# global ones): `register_forward_hook`, `register_module_forward_hook`, load_state_dict hooks...
HOOK_ATTR = re.compile(r"^_?register_\w*hook\w*$")

# Keyword arguments of load/load_inline whose values reach the compiler and linker. They must be
# literal lists of strings so they can be judged; the runtime effect of whatever gets through is
# also covered by the .so checks (imports, DT_NEEDED, RUNPATH).
BUILD_FLAG_KWARGS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_sycl_cflags")
# Flag prefixes/substrings that run other programs at build time (-B, -fplugin, -ccbin, specs,
# response files), or rewrite linking (wrap/defsym/scripts/rpath/dynamic linker).
BUILD_FLAG_DENY_PREFIX = ("-B", "-specs", "--specs", "-wrapper", "@", "-fplugin", "-include", "-imacros", "-ccbin",
                          "--compiler-bindir", "-fuse-ld", "-Xlinker", "-T", "-x", "-o", "--output")
BUILD_FLAG_DENY_SUBSTR = ("--wrap", "rpath", "dynamic-linker", "-Wl,-T", "--script", "-fplugin", "-ccbin",
                          "--defsym", "execstack", "unresolved-symbols", "LD_PRELOAD", "audit", ",-B", "=-B",
                          "-Xlinker", "--compiler-bindir", "-specs", "-wrapper")
# Libraries a solution may link with -l: torch's own, CUDA runtime/driver, BLAS, cuDNN, OpenMP,
# libm/libstdc++. (-ldl is refused: dlopen/dlsym are the symbol rules' dynamic_symbol_lookup.)
LINKABLE_LIBS = frozenset({"c10", "c10_cuda", "torch", "torch_cpu", "torch_cuda", "torch_python", "cudart", "cuda",
                           "cublas", "cublasLt", "cudnn", "openblas", "blas", "cblas", "lapack", "lapacke", "mkl_rt",
                           "gomp", "omp", "iomp5", "m", "stdc++", "pthread", "gcc_s", "nvToolsExt"})
LINK_DIR_PREFIXES = ("/usr/local/cuda", "/usr/lib", "/usr/local/lib", "/lib", "/opt/")

# --- strict (compute) rules, applied to `forward` and every local function it references -------

# torch namespaces whose calls are not compute: streams, devices, build. (Their dangerous members
# are refused by TORCH_DANGEROUS before this applies.)
FORWARD_TORCH_OK_NAMESPACES = ("torch.cuda", "torch.backends", "torch.utils.cpp_extension", "torch.version")
# ...except these members of them, which do compute (collectives, reductions, jiterator kernels).
FORWARD_TORCH_DENY = ("torch.cuda.comm", "torch.cuda.nccl", "torch.cuda.jiterator", "torch.cuda.sparse")
# torch attributes that are values, not functions (dtypes, memory formats, layouts, constants):
# fine to pass around; any other torch.<lowercase> taken as a value under strict is a function
# whose later calls (`ops[0](x)`, `functools.partial(torch.mm, x)`) the call rules cannot see.
TORCH_VALUE_NAMES = frozenset({
    "float", "float32", "float64", "double", "half", "float16", "bfloat16", "int", "int8", "int16", "int32", "int64",
    "long", "short", "uint8", "uint16", "uint32", "uint64", "bool", "complex32", "complex64", "complex128", "cfloat",
    "cdouble", "chalf", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "qint8", "quint8",
    "qint32", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format", "strided", "sparse_coo",
    "inf", "nan", "pi", "e",
})
# Tensor attributes (not methods) that are fine to read as values.
TENSOR_VALUE_ATTRS = frozenset({"ndim", "is_cuda", "is_cpu", "is_meta", "layout", "requires_grad", "T", "mT", "H",
                                "mH", "real", "imag", "data", "grad", "names", "is_sparse", "is_quantized", "is_leaf",
                                "itemsize", "nbytes", "grad_fn", "output_nr"})
# torch.<name> calls beyond ALLOWED_FUNCTIONS that compute nothing.
FORWARD_TORCH_EXTRA = frozenset({"device", "Size", "is_tensor", "is_grad_enabled", "no_grad", "inference_mode",
                                 "get_default_dtype", "is_floating_point", "is_complex", "numel"})
# Methods of Python containers/strings: fine on non-tensors (`shape.append(n)`, `d.get(k)`).
# Deliberately absent: names that are also tensor compute methods (add, sort, max, sum, index...).
PY_METHODS_OK = frozenset({"append", "extend", "insert", "pop", "get", "items", "keys", "values", "join", "format",
                           "setdefault", "startswith", "endswith", "lower", "upper", "strip", "replace", "encode",
                           "decode", "update", "copy", "count", "popleft", "appendleft",
                           # CUDA streams and events
                           "synchronize", "record", "wait_stream", "wait_event", "query", "elapsed_time"})
# Builtins that hand tensors on element by element (for a, b in zip(x, w): a * b).
ITERATING_BUILTINS = frozenset({"zip", "enumerate", "reversed", "list", "tuple", "iter", "sorted", "map", "filter"})
# Calls among ALLOWED_FUNCTIONS that return metadata, not tensors (x.size(0) * 2 is shape math).
METADATA_RESULTS = frozenset({"size", "stride", "dim", "ndimension", "numel", "nelement", "element_size",
                              "storage_offset", "is_contiguous", "data_ptr", "get_device", "untyped_storage",
                              "is_floating_point", "is_complex", "__len__", "item", "__index__", "__int__",
                              "__float__", "__bool__", "__hash__", "__repr__", "__format__", "is_nonzero", "dtype",
                              "device", "shape", "__get__", "__iter__", "__setitem__", "record_stream"})
TENSOR_RESULTS = ALLOWED_FUNCTIONS - METADATA_RESULTS
# Attributes of tensors that are tensors (views) / of layers that are parameters.
TENSOR_VIEW_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag", "data", "grad"})
PARAM_ATTRS = frozenset({"weight", "bias", "running_mean", "running_var", "in_proj_weight", "in_proj_bias",
                         "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"})
# Builtins that compute when given tensors (sum(tensors) adds, max(a, b) compares...).
TENSOR_BUILTINS = frozenset({"sum", "max", "min", "abs", "pow", "round", "divmod", "sorted", "any", "all"})
# Type annotations / defaults that make a forward parameter a non-tensor.
SCALAR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "complex"})
_CMP_COMPUTE = (ast.Lt, ast.Gt, ast.LtE, ast.GtE, ast.Eq, ast.NotEq)


def _dunder(name):
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _is_none(node):
    return isinstance(node, ast.Constant) and node.value is None


def _walk_body(fn):
    """Nodes of a function without descending into nested defs/classes (judged on their own when
    referenced); lambdas and comprehensions are part of the body."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))


# =============================================================================================
# Source analysis
# =============================================================================================

class _GetattrLiteral(ast.NodeTransformer):
    """getattr(obj, "name"[, default]) -> obj.name, so the attribute rules judge the literal."""

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if (isinstance(f, ast.Name) and f.id == "getattr" and 2 <= len(node.args) <= 3 and not node.keywords
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            return ast.copy_location(ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Load()), node)
        return node


_EXT = "<ext>"  # canonical root of modules returned by load/load_inline
_LOADERS = ("torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline")


class _Source:
    def __init__(self, file, tree, strict):
        self.file = file
        self.strict = strict
        self.findings = []
        self._seen = set()
        self.tree = _GetattrLiteral().visit(tree)
        ast.fix_missing_locations(self.tree)
        self.parent = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.aliases = {}  # Name -> set of canonical dotted chains
        self.module_names = set()  # Names bound to module objects
        self.defs = {}  # function/method name -> [FunctionDef]
        self.classes = {}  # local class name -> ClassDef
        self.self_attrs = {}  # self.X -> set of chains (ext, torch functions...)
        self.self_kind = {}  # self.X -> "layer:<chain>" | "local:<Class>" | "tensor"
        self.factories = set()  # local functions returning an extension module

    # --- helpers ------------------------------------------------------------------------------

    def add(self, node, what, kind=SUSPICIOUS_SOURCE):
        line = getattr(node, "lineno", 0) or 0
        key = (line, what)
        if key not in self._seen:
            self._seen.add(key)
            self.findings.append(Finding(kind, self.file, line, what))

    def resolve(self, node):
        """Canonical dotted chains an expression may denote ('torch.nn.functional.relu', '<ext>.fn')."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, set())
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return set(self.self_attrs.get(node.attr, ()))
            return {f"{c}.{node.attr}" for c in self.resolve(node.value)}
        if isinstance(node, ast.Call):
            if self._is_ext_call(node):
                return {_EXT}
        return set()

    def _is_ext_call(self, call):
        f = call.func
        if any(c in _LOADERS for c in self.resolve(f)):
            return True
        if isinstance(f, ast.Name) and f.id in self.factories:
            return True
        if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"
                and f.attr in self.factories):
            return True
        return False

    @staticmethod
    def _roots(chains):
        return {c.split(".", 1)[0] for c in chains}

    # --- collection ---------------------------------------------------------------------------

    def _merged(self, vals, start):
        """What a name may hold over all its assignments; it is the extension only if every
        assignment is (a `_ext = None` placeholder of a lazily built extension does not count)."""
        chains, all_ext = set(start), True
        for v in vals:
            if _is_none(v):
                continue
            r = self.resolve(v) if v is not None else set()
            chains |= r
            all_ext &= _EXT in r
        if not all_ext:
            chains.discard(_EXT)
        return chains

    def collect(self):
        names = {}  # Name -> list of value nodes (None: bound by something we do not resolve)
        selfs = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self._bind(a.asname, {a.name}, module=True)
                    else:
                        root = a.name.split(".", 1)[0]
                        self._bind(root, {root}, module=True)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name == "*":
                        continue
                    chain = f"{node.module}.{a.name}"
                    self._bind(a.asname or a.name, {chain}, module=chain in KNOWN_MODULES)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if node.value is None:
                    continue
                for t in targets:
                    pairs = [(t, node.value)]
                    if isinstance(t, (ast.Tuple, ast.List)):
                        vals = node.value.elts if (isinstance(node.value, (ast.Tuple, ast.List))
                                                   and len(node.value.elts) == len(t.elts)) else [None] * len(t.elts)
                        pairs = list(zip(t.elts, vals))
                    for tgt, val in pairs:
                        if isinstance(tgt, ast.Name):
                            names.setdefault(tgt.id, []).append(val)
                        elif (isinstance(tgt, ast.Attribute) and isinstance(tgt.value, ast.Name)
                              and tgt.value.id == "self"):
                            selfs.setdefault(tgt.attr, []).append(val)
            elif isinstance(node, ast.Call):
                # self.register_buffer("name", tensor) makes self.name a tensor
                f = node.func
                if (isinstance(f, ast.Attribute) and f.attr in ("register_buffer", "register_parameter")
                        and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    self.self_kind[node.args[0].value] = "tensor"
        import_aliases = {k: set(v) for k, v in self.aliases.items()}
        for _ in range(4):  # fixed point: aliases of aliases, factories of factories
            for name, vals in names.items():
                chains = self._merged(vals, import_aliases.get(name, ()))
                if chains:
                    self.aliases[name] = chains
            for attr, vals in selfs.items():
                chains = self._merged(vals, ())
                if chains:
                    self.self_attrs[attr] = chains
            for fname, fdefs in self.defs.items():
                rets = [n for d in fdefs for n in ast.walk(d) if isinstance(n, ast.Return) and n.value is not None]
                rets = [r for r in rets if not _is_none(r.value)]
                if rets and all(_EXT in self.resolve(r.value) for r in rets):
                    self.factories.add(fname)
        for attr, vals in selfs.items():
            for v in vals:
                if isinstance(v, ast.Call):
                    fch = self.resolve(v.func)
                    if isinstance(v.func, ast.Name) and v.func.id in self.classes:
                        self.self_kind.setdefault(attr, f"local:{v.func.id}")
                    elif any(c in ("torch.nn.Parameter", "torch.nn.parameter.Parameter") for c in fch) or any(
                            c.startswith("torch.") and c.rsplit(".", 1)[1] in TENSOR_RESULTS for c in fch):
                        self.self_kind[attr] = "tensor"
                    else:
                        layer = [c for c in fch if c.startswith("torch.nn.") and c.rsplit(".", 1)[1][:1].isupper()]
                        if layer:
                            self.self_kind[attr] = f"layer:{sorted(layer)[0]}"

    def _bind(self, name, chains, module=False):
        self.aliases.setdefault(name, set()).update(chains)
        if module:
            self.module_names.add(name)

    # --- dangerous rules (every policy) -------------------------------------------------------

    def check_dangerous(self):
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self._check_import(node, a.name, None)
            elif isinstance(node, ast.ImportFrom):
                if node.level or not node.module:
                    self.add(node, f"relative import (from {'.' * node.level}{node.module or ''} import ...)")
                    continue
                for a in node.names:
                    self._check_import(node, node.module, a.name)
            elif isinstance(node, ast.Name):
                self._check_name(node)
            elif isinstance(node, ast.Attribute):
                self._check_attribute(node)
            elif isinstance(node, ast.Call):
                self._check_call(node)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if isinstance(sub, ast.Attribute) and sub.ctx.__class__ is not ast.Load:
                            self._check_attr_store(node, sub.value, sub.attr)
            elif isinstance(node, ast.ClassDef):
                self._check_class(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _dunder(node.name) and node.name not in ALLOWED_DUNDER_DEFS:
                    self.add(node, f"defines special method {node.name} (changes how the harness's calls behave)")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if _dunder(node.value) and node.value.isidentifier() and node.value not in ALLOWED_DUNDER_STRINGS:
                    self.add(node, f"string literal {node.value!r} (a dunder name spelled as data)")

    def _check_import(self, node, module, name):
        if module not in ALLOWED_IMPORTS:
            dangerous = self._torch_dangerous(module)
            why = f" ({dangerous})" if dangerous else ""
            self.add(node, f"imports {module}{why}: not among the allowed imports "
                           "(torch, torch.nn, torch.utils.cpp_extension, math, typing, functools, os.path, "
                           "cuda_extension)")
            return
        if name is None:
            return
        if name == "*":
            self.add(node, f"from {module} import * (star imports hide what is bound)")
            return
        allowed = ALLOWED_IMPORTS[module]
        chain = f"{module}.{name}"
        if allowed is not None and name not in allowed:
            self.add(node, f"from {module} import {name}: only {', '.join(sorted(allowed))} may be imported from "
                           f"{module}")
        elif name.startswith("_") and module != "__future__":
            self.add(node, f"from {module} import {name} (private name)")
        elif self._torch_dangerous(chain) or name in MODE_NAMES or name in ESCAPE_ATTRS:
            self.add(node, f"from {module} import {name} (reaches {chain})")
        elif chain in TYPING_DANGEROUS:
            self.add(node, f"from {module} import {name} (evaluates strings as code)")

    @staticmethod
    def _torch_dangerous(chain):
        for p in TORCH_DANGEROUS:
            if p.endswith("._"):
                if chain.startswith(p):
                    return p.rstrip("_") + "_*"
            elif chain == p or chain.startswith(p + "."):
                return p
        return None

    def _check_name(self, node):
        n = node.id
        parent = self.parent.get(node)
        if n in DANGEROUS_BUILTINS:
            self.add(node, f"uses builtin {n} (code from strings, globals/frames or files)")
        elif n in ATTR_BUILTINS:
            if not (isinstance(parent, ast.Call) and parent.func is node):
                self.add(node, f"uses {n} as a value (an attribute access the rules cannot see)")
        elif _dunder(n) and n not in ALLOWED_DUNDER_NAMES:
            self.add(node, f"name {n} (interpreter internals)")
        elif n in MODE_NAMES:
            self.add(node, f"name {n} (torch-function / dispatch mode stack: switches the strict guard off)")
        literal_attr_query = (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
                              and parent.func.id in ATTR_BUILTINS and parent.args and parent.args[0] is node
                              and len(parent.args) >= 2 and isinstance(parent.args[1], ast.Constant)
                              and isinstance(parent.args[1].value, str))
        if (isinstance(node.ctx, ast.Load) and n in self.module_names and not literal_attr_query
                and not (isinstance(parent, ast.Attribute) and parent.value is node)
                and not (self._roots(self.aliases.get(n, ())) <= {"cuda_extension"})):
            self.add(node, f"module {n} used as a value (hands the whole module to code the rules cannot follow)")

    def _check_attribute(self, node):
        a = node.attr
        parent = self.parent.get(node)
        if _dunder(a) and a not in ALLOWED_DUNDER_ATTRS:
            if a == "__class__" and not isinstance(node.ctx, ast.Load):
                self.add(node, "assigns __class__ (swaps the object's type)")
            else:
                self.add(node, f"attribute {a} (walks out into interpreter internals)")
        if a in FRAME_ATTRS:
            self.add(node, f"attribute {a} (frames / tracing: reaches the harness's stack)")
        if a in MODE_NAMES:
            self.add(node, f"attribute {a} (torch-function / dispatch mode stack: switches the strict guard off)")
        if HOOK_ATTR.match(a):
            self.add(node, f"attribute {a} (module hooks run code around the harness's calls)")
        chains = self.resolve(node)
        roots = self._roots(chains) - {_EXT}
        if a in ESCAPE_ATTRS and (a not in ESCAPE_ATTRS_MODULE_ONLY or roots):
            self.add(node, f"attribute .{a} (a module reached through another: {a} is not an allowed import)")
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # judge the chain once, at its outermost attribute
        for c in sorted(chains):
            root = c.split(".", 1)[0]
            if root in (_EXT, "cuda_extension"):
                continue
            parts = c.split(".")
            d = self._torch_dangerous(c) if root == "torch" else None
            if d:
                self.add(node, f"uses {c} ({d} reaches below the strict guard, runs other code or changes "
                               "global state)")
            elif any(p.startswith("_") and not _dunder(p) for p in parts[1:]):
                self.add(node, f"uses {c} (private API of an imported module)")
            elif root == "os" and c not in OS_ALLOWED and not (c.startswith("os.path.") and parts[2] in OS_PATH_FUNCS):
                self.add(node, f"uses {c} (only os.path.*, os.environ.get, os.getcwd and os.sep are allowed)")
            elif c.startswith("torch.utils.cpp_extension.") and parts[3] not in CPP_EXTENSION_ALLOWED:
                self.add(node, f"uses {c} (only load/load_inline of cpp_extension: the harness counts their calls)")
            elif c in TYPING_DANGEROUS:
                self.add(node, f"uses {c} (evaluates strings as code)")
            elif (c in KNOWN_MODULES and isinstance(node.ctx, ast.Load)
                  and not (isinstance(parent, ast.Call) and parent.func is node)):
                self.add(node, f"module {c} used as a value (hands the whole module to code the rules cannot "
                               "follow)")

    def _check_call(self, node):
        f = node.func
        if isinstance(f, ast.Name) and f.id in ATTR_BUILTINS:
            lit = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            if not lit or node.keywords:
                self.add(node, f"{f.id} with a computed attribute name (can reach any attribute the rules refuse)")
            elif f.id in ("setattr", "delattr"):
                self._check_attr_store(node, node.args[0], node.args[1].value)
                if _dunder(node.args[1].value) and node.args[1].value not in ALLOWED_DUNDER_ATTRS:
                    self.add(node, f"{f.id} of {node.args[1].value} (interpreter internals)")
                elif node.args[1].value in FRAME_ATTRS | MODE_NAMES:
                    self.add(node, f"{f.id} of {node.args[1].value}")
            elif f.id == "hasattr" and _dunder(node.args[1].value) and node.args[1].value not in ALLOWED_DUNDER_ATTRS:
                self.add(node, f"hasattr of {node.args[1].value} (interpreter internals)")
        elif isinstance(f, ast.Name) and f.id == "type" and len(node.args) == 3:
            self.add(node, "type(name, bases, dict) (builds a class at run time, out of the rules' sight)")
        if any(c in _LOADERS for c in self.resolve(f)):
            self._check_build_call(node)

    def _check_attr_store(self, node, base, attr):
        chains = self.resolve(base)
        if chains and not (isinstance(base, ast.Name) and base.id == "self"):
            what = sorted(chains)[0].replace(_EXT, "extension module")
            self.add(node, f"assigns {what}.{attr} (patches an imported module: timers, sync, comparison, "
                           "the harness or the extension's functions)")
        elif isinstance(base, ast.Name) and base.id in self.classes:
            self.add(node, f"assigns {base.id}.{attr} (patches a class after its definition)")
        if attr == "forward" and not (isinstance(base, ast.Name) and base.id in self.aliases):
            self.add(node, "assigns a forward attribute (replaces the method the checks judge)")

    def _check_class(self, node):
        for b in node.bases:
            for c in self.resolve(b):
                if c == "torch.Tensor" or c.startswith("torch.Tensor.") or c in ("torch.nn.Parameter",
                                                                                   "torch.nn.parameter.Parameter"):
                    self.add(node, f"class {node.name} subclasses {c} (tensor subclasses intercept torch calls)")
                elif (self.strict and c.startswith("torch.nn.") and c not in ("torch.nn.Module",)
                      and not any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "forward"
                                  for s in node.body)):
                    self.add(node, f"class {node.name} inherits the forward of {c} (torch compute)")
        for k in node.keywords:
            self.add(node, f"class {node.name} passes {k.arg}= to its class statement (metaclass tricks)")
        module_class = self._is_module_class(node, set())
        for s in node.body:
            if module_class and isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name in NN_MODULE_API:
                self.add(s, f"{node.name} overrides nn.Module.{s.name} (the harness calls it)")
            elif isinstance(s, (ast.Assign, ast.AnnAssign)):
                tg = s.targets if isinstance(s, ast.Assign) else [s.target]
                for t in tg:
                    if isinstance(t, ast.Name) and (t.id == "forward" or t.id in NN_MODULE_API):
                        self.add(s, f"{node.name} binds {t.id} by assignment (replaces what the checks judge)")

    def _is_module_class(self, node, seen):
        seen.add(node.name)
        for b in node.bases:
            if any(c.startswith("torch.nn.") for c in self.resolve(b)):
                return True
            if isinstance(b, ast.Name) and b.id in self.classes and b.id not in seen:
                if self._is_module_class(self.classes[b.id], seen):
                    return True
        return False

    def _check_build_call(self, node):
        for kw in node.keywords:
            if kw.arg is None:
                self.add(node, "load/load_inline with **kwargs (build options cannot be judged)")
                continue
            if kw.arg not in BUILD_FLAG_KWARGS:
                continue
            v = kw.value
            if not (isinstance(v, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                                                 for e in v.elts)):
                self.add(node, f"{kw.arg} is not a literal list of strings (build flags cannot be judged)")
                continue
            for e in v.elts:
                flag = e.value
                for word in flag.split():
                    bad = next((p for p in BUILD_FLAG_DENY_PREFIX if word.startswith(p)), None) \
                        or next((s for s in BUILD_FLAG_DENY_SUBSTR if s in word), None)
                    if bad:
                        self.add(node, f"{kw.arg} contains {word!r} ({bad}: runs other programs or rewrites "
                                       "linking)")
                    elif kw.arg == "extra_ldflags" and word.startswith("-l") and word[2:] not in LINKABLE_LIBS:
                        self.add(node, f"{kw.arg} links {word!r} (only torch, CUDA runtime, BLAS, cuDNN, OpenMP)")
                    elif kw.arg == "extra_ldflags" and word.startswith("-L") and not word[2:].startswith(
                            LINK_DIR_PREFIXES):
                        self.add(node, f"{kw.arg} adds library directory {word!r} (outside system/CUDA dirs)")

    # --- strict compute rules -----------------------------------------------------------------

    def check_compute(self):
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                self._torch_function_as_value(node)
        todo = [d for d in self.defs.get("forward", [])]
        scanned = set()
        while todo:
            fn = todo.pop()
            if id(fn) in scanned:
                continue
            scanned.add(id(fn))
            self._scan_function(fn)
            for n in _walk_body(fn):
                ref = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
                if ref and ref != "__init__":
                    todo.extend(d for d in self.defs.get(ref, []) if id(d) not in scanned)

    def _torch_function_as_value(self, node):
        parent = self.parent.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # not outermost
        if isinstance(parent, ast.Call) and parent.func is node:
            return  # a call: judged by the call rules where it matters
        if isinstance(node, ast.Name) and node.id in self.module_names:
            return
        for c in sorted(self.resolve(node)):
            if not c.startswith("torch.") or c in KNOWN_MODULES or c in _LOADERS:
                continue
            if c.startswith(tuple(p + "." for p in FORWARD_TORCH_OK_NAMESPACES)) and \
                    not c.startswith(tuple(p + "." for p in FORWARD_TORCH_DENY)):
                continue
            leaf = c.rsplit(".", 1)[1]
            if leaf in TORCH_VALUE_NAMES or leaf in ALLOWED_FUNCTIONS or leaf[:1].isupper():
                continue
            self.add(node, f"torch function {c} taken as a value (calls through it cannot be judged: torch "
                           "compute under strict)")

    def _scan_function(self, fn):
        tnames = set()
        if fn.name == "forward":
            args = fn.args.posonlyargs + fn.args.args
            defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
            for i, (a, d) in enumerate(zip(args, defaults)):
                if i == 0 and a.arg in ("self", "cls"):
                    continue
                ann = a.annotation
                if isinstance(ann, ast.Name) and ann.id in SCALAR_ANNOTATIONS:
                    continue
                if isinstance(d, ast.Constant) and d.value is not None:
                    continue
                tnames.add(a.arg)
            if fn.args.vararg:
                tnames.add(fn.args.vararg.arg)
        for _ in range(4):  # propagate through local assignments
            before = len(tnames)
            for n in _walk_body(fn):
                if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    if self._tensorish(n.value, tnames):
                        for t in targets:
                            for s in ast.walk(t):
                                if isinstance(s, ast.Name):
                                    tnames.add(s.id)
                elif isinstance(n, (ast.For, ast.comprehension)) and self._tensorish(n.iter, tnames):
                    for s in ast.walk(n.target):
                        if isinstance(s, ast.Name):
                            tnames.add(s.id)
            if len(tnames) == before:
                break
        where = f"in {fn.name}()"
        for n in _walk_body(fn):
            if isinstance(n, ast.Call):
                self._compute_call(n, tnames, where)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
                parent = self.parent.get(n)
                if not (isinstance(parent, ast.Call) and parent.func is n) and not (
                        isinstance(parent, ast.Attribute) and parent.value is n) and not self.resolve(n) \
                        and n.attr not in ALLOWED_FUNCTIONS and n.attr not in TENSOR_VALUE_ATTRS \
                        and n.attr not in PARAM_ATTRS and self._tensorish(n.value, tnames):
                    self.add(n, f"tensor method .{n.attr} taken as a value {where} (calls through it cannot be "
                                "judged)")
            elif isinstance(n, ast.BinOp):
                if isinstance(n.op, ast.MatMult):
                    self.add(n, f"matrix multiply operator @ {where} (torch compute)")
                elif self._tensorish(n.left, tnames) or self._tensorish(n.right, tnames):
                    self.add(n, f"tensor arithmetic ({type(n.op).__name__}) {where} (torch compute)")
            elif isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd, ast.Invert)):
                if self._tensorish(n.operand, tnames):
                    self.add(n, f"tensor operator ({type(n.op).__name__}) {where} (torch compute)")
            elif isinstance(n, ast.Compare):
                sides = [n.left] + n.comparators
                for i, op in enumerate(n.ops):
                    l, r = sides[i], sides[i + 1]
                    if isinstance(op, _CMP_COMPUTE) and (self._tensorish(l, tnames) or self._tensorish(r, tnames)):
                        self.add(n, f"tensor comparison ({type(op).__name__}) {where} (torch compute)")
                    elif isinstance(op, (ast.In, ast.NotIn)) and self._tensorish(r, tnames):
                        self.add(n, f"tensor membership test {where} (torch compute)")
            elif isinstance(n, ast.AugAssign):
                if isinstance(n.op, ast.MatMult) or self._tensorish(n.target, tnames) or self._tensorish(n.value,
                                                                                                         tnames):
                    self.add(n, f"in-place tensor arithmetic ({type(n.op).__name__}=) {where} (torch compute)")
            elif isinstance(n, ast.Subscript):
                if self._tensorish(n.slice, tnames) and self._tensorish(n.value, tnames):
                    self.add(n, f"indexing a tensor with a tensor {where} (gather/scatter is torch compute)")

    def _compute_call(self, n, tnames, where):
        f = n.func
        chains = self.resolve(f)
        if chains:
            for c in sorted(chains):
                root = c.split(".", 1)[0]
                if root in (_EXT, "cuda_extension", "math", "typing", "functools", "os"):
                    continue
                if root == "torch":
                    if (c.startswith(tuple(p + "." for p in FORWARD_TORCH_OK_NAMESPACES)) or c in _LOADERS) and \
                            not c.startswith(tuple(p + "." for p in FORWARD_TORCH_DENY)):
                        continue
                    leaf = c.rsplit(".", 1)[1]
                    if leaf in ALLOWED_FUNCTIONS or (c.count(".") == 1 and leaf in FORWARD_TORCH_EXTRA):
                        continue
                    self.add(n, f"calls {c} {where} (torch compute: strict allows only allocation, views, metadata "
                                "and the solution's own extension)")
            return
        if isinstance(f, ast.Attribute):
            recv, m = f.value, f.attr
            if isinstance(recv, ast.Name) and recv.id == "self":
                kind = self.self_kind.get(m, "")
                if kind.startswith("layer:"):
                    self.add(n, f"calls torch layer self.{m} ({kind[6:]}) {where} (torch compute)")
                return  # a method of the solution (followed), or an attribute the runtime guard judges
            if isinstance(recv, ast.Call) and isinstance(recv.func, ast.Name) and recv.func.id == "super":
                return  # the parent's method: a local one is followed by name
            if (isinstance(recv, ast.Attribute) and isinstance(recv.value, ast.Name) and recv.value.id == "self"
                    and self.self_kind.get(recv.attr, "").startswith("local:")):
                return  # method of an instance of a local class: followed by name
            if m in ALLOWED_FUNCTIONS:
                return
            if m in PY_METHODS_OK and not self._tensorish(recv, tnames):
                return
            self.add(n, f"calls tensor method .{m}() {where} (torch compute: strict allows only allocation, views, "
                        "metadata and the solution's own extension)")
        elif isinstance(f, ast.Name) and f.id in TENSOR_BUILTINS:
            if any(self._tensorish(a, tnames) for a in n.args):
                self.add(n, f"calls {f.id}() on tensors {where} (torch compute)")

    def _tensorish(self, e, tnames):
        if isinstance(e, ast.Name):
            return e.id in tnames
        if isinstance(e, ast.Starred):
            return self._tensorish(e.value, tnames)
        if isinstance(e, ast.Attribute):
            if isinstance(e.value, ast.Name) and e.value.id == "self":
                return self.self_kind.get(e.attr) == "tensor"
            if e.attr in PARAM_ATTRS and isinstance(e.value, ast.Attribute) and isinstance(e.value.value, ast.Name) \
                    and e.value.value.id == "self":
                return True
            return e.attr in TENSOR_VIEW_ATTRS and self._tensorish(e.value, tnames)
        if isinstance(e, ast.Call):
            chains = self.resolve(e.func)
            if any(c.split(".", 1)[0] in (_EXT, "cuda_extension") for c in chains):
                return True
            if any(c.startswith("torch.") and c.rsplit(".", 1)[1] in TENSOR_RESULTS for c in chains):
                return True
            if isinstance(e.func, ast.Name) and e.func.id in ITERATING_BUILTINS and not chains:
                return any(self._tensorish(a, tnames) for a in e.args)
            if isinstance(e.func, ast.Attribute) and not chains:
                m = e.func.attr
                if m in TENSOR_RESULTS:
                    return True
                return self._tensorish(e.func.value, tnames) and m not in METADATA_RESULTS and m not in PY_METHODS_OK
            return False
        if isinstance(e, ast.Subscript):
            return self._tensorish(e.value, tnames)
        if isinstance(e, ast.BinOp):
            return self._tensorish(e.left, tnames) or self._tensorish(e.right, tnames)
        if isinstance(e, ast.UnaryOp) and not isinstance(e.op, ast.Not):
            return self._tensorish(e.operand, tnames)
        if isinstance(e, ast.IfExp):
            return self._tensorish(e.body, tnames) or self._tensorish(e.orelse, tnames)
        if isinstance(e, (ast.Tuple, ast.List)):
            return any(self._tensorish(x, tnames) for x in e.elts)
        return False


MAX_SOURCE_CHARS = 2_000_000  # a bigger "model" is not a solution; analysing it is a DoS vector


def check_source(files, strict=True):
    """Findings over the solution's Python files ({name: text}); [] means nothing outside the
    allow-lists. strict=False (policy torch-allowed) keeps only the dangerous findings."""
    out = []
    for name in sorted(files):
        text = files[name]
        if len(text) > MAX_SOURCE_CHARS:
            out.append(Finding(SUSPICIOUS_SOURCE, name, 0, f"source of {len(text)} characters: too large to analyse"))
            continue
        try:
            tree = ast.parse(text, filename=name)
        except SyntaxError as e:
            out.append(Finding(SUSPICIOUS_SOURCE, name, e.lineno or 0, f"syntax error: {e.msg}"))
            continue
        except (ValueError, RecursionError, MemoryError) as e:
            out.append(Finding(SUSPICIOUS_SOURCE, name, 0, f"cannot parse: {type(e).__name__}: {e}"))
            continue
        try:
            s = _Source(name, tree, strict)
            s.collect()
            s.check_dangerous()
            if strict:
                s.check_compute()
            out.extend(sorted(s.findings, key=lambda f: (f.line, f.what)))
        except RecursionError:
            out.append(Finding(SUSPICIOUS_SOURCE, name, 0, "source nested too deeply to analyse"))
    return out


# =============================================================================================
# ELF reader (ELF64 little-endian): the loader's view of a shared object
# =============================================================================================

@dataclass
class DynamicInfo:
    undefined: list  # raw (mangled) names of undefined dynamic symbols, sorted, unique
    needed: list  # DT_NEEDED sonames, in order
    rpath: list  # DT_RPATH entries (split on ':')
    runpath: list  # DT_RUNPATH entries
    audit: list  # DT_AUDIT / DT_DEPAUDIT entries


_PT_LOAD, _PT_DYNAMIC = 1, 2
_SHT_DYNSYM = 11
_DT = dict(NULL=0, NEEDED=1, PLTRELSZ=2, HASH=4, STRTAB=5, SYMTAB=6, RELA=7, RELASZ=8, RELAENT=9, STRSZ=10,
           SYMENT=11, RPATH=15, REL=17, RELSZ=18, RELENT=19, PLTREL=20, JMPREL=23, RUNPATH=29,
           GNU_HASH=0x6FFFFEF5, AUDIT=0x6FFFFEFC, DEPAUDIT=0x6FFFFEFB)
MAX_ELF_BYTES = 4 << 30
MAX_SYMBOLS = 5_000_000


class _Elf:
    def __init__(self, data):
        self.d = data
        if len(data) < 64 or data[:4] != b"\x7fELF":
            raise StaticCheckError("not an ELF file")
        if data[4] != 2 or data[5] != 1:
            raise StaticCheckError("only ELF64 little-endian shared objects are supported")
        (self.e_type, _, _, _, self.phoff, self.shoff, _, _, self.phentsize, self.phnum, self.shentsize,
         self.shnum, _) = self.u("<HHIQQQIHHHHHH", 16)
        self.loads, self.dynamic = [], None
        if self.phnum and self.phentsize < 56:
            raise StaticCheckError("malformed ELF: program header entry too small")
        for i in range(self.phnum):
            p_type, _, off, vaddr, _, filesz, _, _ = self.u("<IIQQQQQQ", self.phoff + i * self.phentsize)
            if p_type == _PT_LOAD:
                self.loads.append((vaddr, off, filesz))
            elif p_type == _PT_DYNAMIC:
                self.dynamic = (off, filesz)

    def u(self, fmt, off):
        size = struct.calcsize(fmt)
        if off < 0 or off + size > len(self.d):
            raise StaticCheckError(f"malformed ELF: read of {size} bytes at {off} past the end ({len(self.d)})")
        return struct.unpack_from(fmt, self.d, off)

    def off(self, vaddr):
        for va, off, sz in self.loads:
            if va <= vaddr < va + sz:
                return off + (vaddr - va)
        raise StaticCheckError(f"malformed ELF: address {vaddr:#x} is in no loaded segment")

    def cstr(self, off, end):
        end = min(end, len(self.d))
        if not 0 <= off < end:
            raise StaticCheckError("malformed ELF: string offset out of its table")
        z = self.d.find(b"\0", off, end)
        if z < 0:
            raise StaticCheckError("malformed ELF: unterminated string")
        return self.d[off:z].decode("utf-8", "backslashreplace")

    def symbols(self, symoff, count, stroff, strsz):
        out = set()
        count = min(count, (len(self.d) - symoff) // 24, MAX_SYMBOLS)
        for i in range(1, count):
            st_name, _, _, st_shndx, _, _ = self.u("<IBBHQQ", symoff + 24 * i)
            if st_shndx == 0 and st_name:
                out.add(self.cstr(stroff + st_name, stroff + strsz))
        return out


def dynamic_info(so_path):
    """The loader's view of a shared object: undefined symbols (raw), DT_NEEDED, RPATH/RUNPATH,
    audit libraries. Raises StaticCheckError on anything it cannot read with certainty."""
    try:
        size = os.path.getsize(so_path)
        if size > MAX_ELF_BYTES:
            raise StaticCheckError(f"{so_path}: {size} bytes, larger than any extension should be")
        with open(so_path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise StaticCheckError(f"cannot read {so_path}: {e}") from None
    elf = _Elf(data)
    undefined = set()
    needed, rpath, runpath, audit = [], [], [], []
    if elf.dynamic is None:
        if elf.e_type == 3:
            raise StaticCheckError("malformed ELF: shared object without PT_DYNAMIC")
    else:
        doff, dsz = elf.dynamic
        tags = []
        for i in range(min(dsz, len(data)) // 16):
            tag, val = elf.u("<qQ", doff + 16 * i)
            if tag == _DT["NULL"]:
                break
            tags.append((tag, val))
        one = {}
        for tag, val in tags:
            one.setdefault(tag, val)
        if _DT["STRTAB"] not in one or _DT["SYMTAB"] not in one:
            raise StaticCheckError("malformed ELF: dynamic section without DT_STRTAB/DT_SYMTAB")
        stroff = elf.off(one[_DT["STRTAB"]])
        strsz = one.get(_DT["STRSZ"], len(data) - stroff)
        symoff = elf.off(one[_DT["SYMTAB"]])
        if one.get(_DT["SYMENT"], 24) != 24:
            raise StaticCheckError("malformed ELF: unexpected symbol entry size")
        for tag, val in tags:
            if tag == _DT["NEEDED"]:
                needed.append(elf.cstr(stroff + val, stroff + strsz))
            elif tag in (_DT["RPATH"], _DT["RUNPATH"], _DT["AUDIT"], _DT["DEPAUDIT"]):
                s = elf.cstr(stroff + val, stroff + strsz)
                dest = rpath if tag == _DT["RPATH"] else runpath if tag == _DT["RUNPATH"] else audit
                dest.extend(p for p in s.split(":") if p)
        count = 0
        if _DT["HASH"] in one:
            _, nchain = elf.u("<II", elf.off(one[_DT["HASH"]]))
            count = max(count, nchain)
        if _DT["GNU_HASH"] in one:
            count = max(count, _gnu_hash_count(elf, elf.off(one[_DT["GNU_HASH"]])))
        # every symbol a relocation names, whatever the hash tables say
        for table, size_tag, ent_tag, default_ent in ((_DT["RELA"], _DT["RELASZ"], _DT["RELAENT"], 24),
                                                      (_DT["REL"], _DT["RELSZ"], _DT["RELENT"], 16),
                                                      (_DT["JMPREL"], _DT["PLTRELSZ"], None, None)):
            if table not in one:
                continue
            ent = one.get(ent_tag, default_ent) if ent_tag else (16 if one.get(_DT["PLTREL"]) == _DT["REL"] else 24)
            if ent not in (16, 24):
                raise StaticCheckError("malformed ELF: unexpected relocation entry size")
            roff, rsz = elf.off(one[table]), one.get(size_tag, 0)
            for i in range(min(rsz // ent, MAX_SYMBOLS)):
                _, info = elf.u("<QQ", roff + ent * i)
                count = max(count, (info >> 32) + 1)
        undefined |= elf.symbols(symoff, count, stroff, strsz)
    # the section headers' view too (what nm shows): a union can only add findings
    if elf.shoff and elf.shnum and elf.shentsize >= 64:
        for i in range(min(elf.shnum, 65535)):
            try:
                _, sh_type, _, _, off, size, link, _, _, entsize = elf.u("<IIQQQQIIQQ", elf.shoff + i * elf.shentsize)
                if sh_type != _SHT_DYNSYM or entsize != 24:
                    continue
                _, _, _, _, str_off, str_size, _, _, _, _ = elf.u("<IIQQQQIIQQ", elf.shoff + link * elf.shentsize)
                undefined |= elf.symbols(off, size // 24, str_off, str_size)
            except StaticCheckError:
                continue  # the loader does not read sections; the dynamic view above is authoritative
    return DynamicInfo(sorted(undefined), needed, rpath, runpath, audit)


def _gnu_hash_count(elf, off):
    nbuckets, symoffset, bloom_size, _ = elf.u("<IIII", off)
    if nbuckets > MAX_SYMBOLS or bloom_size > MAX_SYMBOLS:
        raise StaticCheckError("malformed ELF: implausible DT_GNU_HASH")
    buckets_off = off + 16 + 8 * bloom_size
    last = 0
    for i in range(nbuckets):
        (b,) = elf.u("<I", buckets_off + 4 * i)
        last = max(last, b)
    if last < symoffset:
        return symoffset
    chain_off = buckets_off + 4 * nbuckets
    i = last
    while i - last < MAX_SYMBOLS:
        (h,) = elf.u("<I", chain_off + 4 * (i - symoffset))
        if h & 1:
            break
        i += 1
    return i + 1


# ---------------------------------------------------------------------------------------------
# Demangling: c++filt in a child, with a timeout and an output cap (a crafted name cannot hang or
# exhaust the judge).

_MANGLED = re.compile(r"^_Z[A-Za-z0-9_.$]+$")
MAX_MANGLED_CHARS = 16384
DEMANGLE_TIMEOUT_S = 60
DEMANGLE_MAX_OUTPUT = 256 << 20


def demangle(names):
    """Demangled form of each name (non-mangled names are returned as they are)."""
    names = list(names)
    idx = [i for i, n in enumerate(names) if _MANGLED.match(n) and len(n) <= MAX_MANGLED_CHARS]
    if not idx:
        return names
    exe = shutil.which("c++filt")
    if not exe:
        raise StaticCheckError("c++filt not found: install binutils to demangle extension symbols "
                               "(or call imported_symbols(..., demangle=False))")
    payload = ("\n".join(names[i] for i in idx) + "\n").encode()
    proc = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def feed():
        try:
            proc.stdin.write(payload)
        except OSError:
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    chunks, total = [], 0
    timer = threading.Timer(DEMANGLE_TIMEOUT_S, proc.kill)
    timer.start()
    try:
        while True:
            b = proc.stdout.read(1 << 20)
            if not b:
                break
            total += len(b)
            if total > DEMANGLE_MAX_OUTPUT:
                proc.kill()
                raise StaticCheckError("c++filt output exceeds its cap (demangler bomb?)")
            chunks.append(b)
        rc = proc.wait()
    finally:
        timer.cancel()
        proc.stdout.close()
        writer.join(5)
    if rc != 0:
        raise StaticCheckError(f"c++filt failed (exit {rc}; killed after {DEMANGLE_TIMEOUT_S}s?)")
    lines = b"".join(chunks).decode("utf-8", "backslashreplace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(idx):
        raise StaticCheckError("c++filt returned a different number of names than it was given")
    out = list(names)
    for i, line in zip(idx, lines):
        out[i] = line
    return out


def imported_symbols(so_path, demangle_names=True):
    """The undefined dynamic symbols of a built extension, demangled, sorted."""
    raw = dynamic_info(so_path).undefined
    return sorted(set(demangle(raw))) if demangle_names else raw


# =============================================================================================
# Symbol rules (data). Matched with fnmatch against the symbol's qualified name (return type,
# parameters, template arguments and version suffix stripped: `float* at::TensorBase::data_ptr<
# float>() const` is `at::TensorBase::data_ptr`). First match wins; None = allowed.
# =============================================================================================

# at::_ops structs (op name + overload) of the ALLOWED_ATEN packets, as they are in torch 2.11's
# ATen/ops/*_ops.h, plus CompositeImplicit ops that only decompose into allowed ones (item ->
# _local_scalar_dense, view_as/reshape_as/expand_as, unflatten). Exact names: a prefix match would
# admit slice_scatter, select_backward, as_strided_scatter...
ALLOWED_OP_STRUCTS = frozenset({
    "_copy_from", "_copy_from_and_resize", "_copy_from_and_resize_out", "_copy_from_out",
    "_has_compatible_shallow_copy_type", "_local_scalar_dense", "_reshape_alias", "_unsafe_view", "_unsafe_view_out",
    "alias", "as_strided", "chunk", "clone", "clone_out", "contiguous", "copy_", "detach", "diagonal",
    "diagonal_Dimname", "empty_like", "empty_like_out", "empty_memory_format", "empty_names", "empty_names_out",
    "empty_out", "empty_strided", "empty_strided_out", "expand", "fill__Scalar", "fill__Tensor",
    "flatten_DimnameList", "flatten_named_out_dim", "flatten_using_ints", "flatten_using_names", "full", "full_like",
    "full_like_out", "full_names", "full_names_out", "full_out", "is_nonzero", "is_same_size", "lift_fresh",
    "movedim_int", "movedim_intlist", "narrow", "narrow_Tensor", "new_empty", "new_empty_out", "new_empty_strided",
    "new_empty_strided_out", "new_full", "new_full_out", "new_ones", "new_ones_out", "new_zeros", "new_zeros_out",
    "ones", "ones_like", "ones_like_out", "ones_names", "ones_names_out", "ones_out", "permute", "record_stream",
    "reshape", "resize_", "scalar_tensor", "scalar_tensor_out", "select_Dimname", "select_int", "set_",
    "set__source_Storage", "set__source_Storage_storage_offset", "set__source_Tensor",
    "set__source_Tensor_storage_offset", "slice_Tensor", "split_Tensor", "split_sizes", "split_with_sizes",
    "squeeze", "squeeze_dim", "squeeze_dimname", "squeeze_dims", "sym_numel", "sym_size_int", "sym_storage_offset",
    "sym_stride_int", "t", "transpose_Dimname", "transpose_int", "unbind_Dimname", "unbind_int", "unfold",
    "unsqueeze", "view", "view_as_complex", "view_as_real", "view_dtype", "zero_", "zeros", "zeros_like",
    "zeros_like_out", "zeros_names", "zeros_names_out", "zeros_out",
    # composite-implicit, decomposing into the above
    "item", "view_as", "reshape_as", "expand_as", "unflatten_int", "unflatten_Dimname",
})

# at::Tensor / at::TensorBase members that read metadata or raw pointers (compute methods are
# inline wrappers of at::_ops, judged there; a non-inline compute member is not in this list).
TENSOR_METHODS_OK = frozenset({
    "data_ptr", "mutable_data_ptr", "const_data_ptr", "__dispatch_contiguous", "item", "toString", "print",
    "sizes", "strides", "sym_sizes", "sym_strides", "numel", "sym_numel", "dim", "options", "scalar_type", "device",
    "is_contiguous", "storage_offset", "element_size", "defined", "reset", "get_device", "is_cuda", "is_cpu",
    "suggest_memory_format", "itemsize", "nbytes", "has_names", "is_same", "use_count", "storage", "dtype",
    "TensorBase", "Tensor", "~TensorBase", "~Tensor", "_fw_grad", "requires_grad",
})

_D, _P, _C, _F = DYNAMIC_SYMBOL_LOOKUP, PROCESS_CONTROL, CALLBACK_TAMPERING, FORBIDDEN_OP

SYMBOL_RULES = [
    # --- the loader: reaching functions by name at run time, past every import-based check ---
    ("dlopen", _D, "loads a library at run time"),
    ("dlmopen", _D, "loads a library at run time"),
    ("dlsym", _D, "looks a function up by name (at::matmul without importing it)"),
    ("dlvsym", _D, "looks a function up by name"),
    ("dlinfo", _D, "hands out the loader's link map (every loaded object)"),
    ("dladdr1", _D, "RTLD_DL_LINKMAP hands out the loader's link map"),
    ("dl_iterate_phdr", _D, "walks every loaded object (manual symbol resolution)"),
    ("_dl_*", _D, "loader internals"),
    ("__libc_dl*", _D, "loader internals"),
    # dladdr: address -> containing object/symbol name. It cannot produce a new function pointer, and
    # the object base it reveals is computable from any imported function's address anyway.
    ("dladdr", None, "address -> name only"),
    # --- processes, memory protection, network ---
    *((n, _P, "process control / code injection / network") for n in (
        "fork", "vfork", "_Fork", "__fork", "__libc_fork", "clone", "clone3", "__clone*", "execve", "execveat",
        "fexecve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "posix_spawn*", "system", "popen",
        "kill", "killpg", "tgkill", "tkill", "ptrace", "setsid", "prctl", "mprotect", "pkey_mprotect",
        "process_vm_readv", "process_vm_writev", "syscall", "unshare", "setns", "memfd_create", "daemon", "chroot",
        "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "getaddrinfo", "gethostbyname*",
    )),
    # --- Python C API: running or importing code by name (pybind11's own needs do not include
    # these), tracing/profiling hooks ---
    *((p, _C, "installs a Python tracer/profiler") for p in ("PyEval_SetProfile*", "PyEval_SetTrace*",
                                                             "_PyEval_SetProfile*", "_PyEval_SetTrace*")),
    *((p, _D, "runs or imports Python code by name from C++") for p in (
        "PyRun_*", "_PyRun_*", "Py_CompileString*", "Py_Main*", "PyEval_EvalCode*", "PyEval_EvalFrame*",
        "_PyEval_EvalFrame*", "PyImport_*", "_PyImport_*", "PySys_*", "_PySys_*", "PyMarshal_*")),
    # --- profiler / RecordFunction callbacks, dispatch-mode and dispatch-key TLS: the hooks the
    # strict guard and the harness observe through ---
    *((p, _C, "record-function / profiler callbacks") for p in (
        "at::*RecordFunction*", "at::*record_function*", "at::*Callback*", "at::*callback*", "at::enableRecordFunction",
        "at::ThreadLocalDebugInfo*", "c10::ThreadLocalDebugInfo*", "torch::profiler::*", "torch::autograd::profiler::*",
        "cupti*")),
    ("c10::impl::ExcludeDispatchKeyGuard::*", None, "torch:: factories' inline AutoDispatchBelowADInplaceOrView"),
    *((p, _C, "dispatch-mode / dispatch-key TLS: switches the strict guard off") for p in (
        "c10::impl::TorchDispatchModeTLS*", "c10::impl::PythonDispatcherTLS*", "*PythonTorchFunctionTLS*",
        "at::impl::torch_function_mode*", "c10::impl::tls_set_dispatch_key*", "c10::impl::_force_tls_local_dispatch_key*",
        "c10::impl::ForceDispatchKeyGuard*", "c10::impl::IncludeDispatchKeyGuard*", "c10::impl::PyInterpreter*",
        "at::ThreadLocalState*", "at::impl::PythonOpRegistrationTrampoline*")),
    ("at::Context::set*", _C, "changes global numerics (TF32, deterministic...) for the reference too"),
    # --- operators by name: the dispatcher, TorchScript, op registration ---
    *((p, _F, "calls or registers operators by name (the dispatcher)") for p in (
        "c10::Dispatcher*", "c10::OperatorHandle*", "c10::impl::OperatorEntry*", "c10::KernelFunction*",
        "c10::BoxedKernel*", "c10::RegisterOperators*", "torch::jit::*", "torch::Library*", "torch::CppFunction*")),
    # --- at::_ops: allowed structs are inserted here (see _symbol_rules), the rest is compute ---
    ("at::_ops::*", _F, "aten compute entry point"),
    # --- at:: allocation, metadata, context getters ---
    *((f"at::{c}::{m}", None, "tensor metadata") for c in ("TensorBase", "Tensor") for m in TENSOR_METHODS_OK),
    *((p, None, "allocation") for p in ("at::detail::empty_*", "at::empty", "at::empty_like", "at::empty_strided",
                                        "at::zeros", "at::zeros_like", "at::ones", "at::ones_like", "at::full",
                                        "at::full_like", "at::from_blob", "at::TensorMaker::*", "at::getCPUAllocator",
                                        "at::detail::getCUDAHooks", "at::detail::getDefaultCPUGenerator",
                                        "at::CPUGeneratorImpl::*", "at::CUDAGeneratorImpl::*",
                                        "at::cuda::detail::getDefaultCUDAGenerator")),
    *((p, None, "context / parallel-for plumbing") for p in (
        "at::globalContext", "at::Context::*", "at::get_num_threads", "at::get_thread_num", "at::in_parallel_region",
        "at::set_thread_num", "at::init_num_threads", "at::internal::invoke_parallel",
        "at::internal::lazy_init_num_threads", "at::internal::ThreadIdGuard*", "at::check*", "at::assert_no_*",
        "at::has_internal_overlap", "at::get_overlap_status", "at::TensorArg*", "at::TensorGeometryArg*")),
    ("at::cuda::getCurrentCUDASolverDnHandle", _F, "cuSOLVER: only BLAS and cuDNN are allowed libraries"),
    ("at::cuda::getCurrentCUDASparseHandle", _F, "cuSPARSE: only BLAS and cuDNN are allowed libraries"),
    ("at::cuda::blas::*", _F, "torch's own GEMM wrappers: call cuBLAS yourself"),
    *((p, None, "CUDA context getters") for p in ("at::cuda::get*", "at::cuda::warp_size", "at::cuda::is_available",
                                                  "at::cuda::device_count")),
    *((p, None, "cuDNN handle / descriptors") for p in ("at::native::getCudnnHandle", "at::native::getCudnnDataType*",
                                                        "at::native::*Descriptor*")),
    ("at::cpu::is_*", None, "CPU capability query"),
    ("at::*", _F, "torch (ATen) function outside the allocation/metadata allow-list"),
    # --- torch:: (libtorch / libtorch_python) ---
    *((p, None, "tensor plumbing") for p in ("torch::autograd::AutogradMeta*", "torch::autograd::make_variable",
                                             "torch::PyWarningHandler*", "torch::getTHP*", "torch::utils::getTHP*")),
    # load_inline's generated bindings (with_pytorch_error_handling) turn C++ exceptions into Python ones.
    ("torch::translate_exception_to_python*", None, "error plumbing of load_inline's bindings"),
    ("torch::*", _F, "torch function outside the allocation/metadata allow-list"),
    # --- c10 / caffe2: allocation, TensorImpl, Error, Device, Stream... (denied members above) ---
    # c10/cuda's stream and event headers read the state of Python's CUDA trace hooks (seen in
    # every honest CUDA extension on the H200); reading it switches nothing off.
    ("c10::impl::GPUTrace::*", None, "read by c10/cuda's stream and event headers"),
    ("c10::*", None, "core types"),
    ("caffe2::*", None, "TypeMeta"),
    # --- third-party compute outside BLAS (cuBLAS/cuBLASLt/CPU BLAS/LAPACK) and cuDNN ---
    *((p, _F, "third-party compute library: only BLAS and cuDNN are allowed") for p in (
        "dnnl_*", "mkldnn_*", "dnnl::*", "ideep::*", "cufft*", "cusparse*", "cusolver*", "cutensor*", "curand*",
        "npp[a-z]*", "nvjpeg*", "cudss*", "magma_*",
        # The libraries libtorch_cpu exports besides BLAS (red-team, s38: an extension called MKL's
        # FFT, DftiComputeForward, for a torch.fft task and passed strict): MKL's FFT, sparse and
        # vector maths, XNNPACK, fbgemm, QNNPACK, NNPACK.
        "Dfti*", "mkl_dft_*", "mkl_sparse_*", "v[sdcz][A-Z]*", "vm[sdcz][A-Z]*", "xnn_*", "fbgemm::*",
        "pytorch_qnnp_*", "qnnp_*", "nnp_*", "mkl_spblas_*", "mkl_vml_*")),
    # AOTInductor's C shim, which libtorch exports: torch's own kernels through a C ABI, no at::
    # symbol (aoti_torch_cpu_convolution, aoti_torch__scaled_dot_product_flash_attention, ...;
    # adversary review, s38). Its tensor plumbing stays allowed for the stable ABI.
    *((p, None, "AOTI tensor plumbing") for p in (
        "aoti_torch_get_*", "aoti_torch_dtype_*", "aoti_torch_device_type_*", "aoti_torch_layout_*",
        "aoti_torch_empty_strided", "aoti_torch_create_tensor_from_blob*", "aoti_torch_delete_tensor_object",
        "aoti_torch_new_tensor_handle", "aoti_torch_abi_version", "aoti_torch_is_*")),
    ("aoti_torch_*", _F, "torch kernel through AOTInductor's C shim: only BLAS and cuDNN are allowed libraries"),
    # everything else (libc, libm, libstdc++, libgcc, pthread_*, GOMP_*/omp_*, Py*/_Py*, THP*,
    # pybind11::, std::, __cxa_*, cuda*, cublas*, cudnn*, sgemm_/cblas_*/LAPACKE_*...): allowed.
    # pthread_create/GOMP_*: threads are a legit CPU parallelisation; torch compute issued from a
    # thread still needs its symbols imported, and those are judged above.
]


def _symbol_rules():
    out = []
    for pat, kind, why in SYMBOL_RULES:
        if pat == "at::_ops::*":
            out.extend((f"at::_ops::{s}::*", None, "allocation / view / metadata op")
                       for s in sorted(ALLOWED_OP_STRUCTS))
        out.append((pat, kind, why))
    return out


_RULES = _symbol_rules()
_VERSION = re.compile(r"@@?[A-Za-z_][\w.]*$")
_SPECIAL = ("vtable for ", "VTT for ", "construction vtable for ", "typeinfo name for ", "typeinfo for ",
            "guard variable for ", "non-virtual thunk to ", "virtual thunk to ", "covariant return thunk to ",
            "TLS init function for ", "TLS wrapper function for ", "transaction clone for ")
_OP_SYMBOLS = ("<=>", "<<=", ">>=", "->*", "<<", ">>", "<=", ">=", "->", "()", "[]", "==", "!=", "&&", "||", "++",
               "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<", ">", "+", "-", "*", "/", "%", "&", "|",
               "^", "~", "!", "=", ",")


def _strip_operators(s):
    out, i = [], 0
    for m in re.finditer(r"\boperator\b", s):
        if m.start() < i:
            continue
        out.append(s[i:m.start()])
        j = m.end()
        while j < len(s) and s[j] == " ":
            j += 1
        op = next((o for o in _OP_SYMBOLS if s.startswith(o, j)), None)
        if op:
            j += len(op)
        else:  # new/delete[]/conversion operator: up to the parameter list
            k = s.find("(", j)
            j = k if k >= 0 else len(s)
        out.append("operator_op")
        i = j
    out.append(s[i:])
    return "".join(out)


def symbol_path(symbol):
    """(prefix, qualified name) of a demangled symbol: ('', 'at::_ops::matmul::call'),
    ('vtable for', 'torch::autograd::AutogradMeta')."""
    s = _VERSION.sub("", symbol.strip())
    for pre in _SPECIAL:
        if s.startswith(pre):
            return pre.strip(), symbol_path(s[len(pre):])[1]
    s = _strip_operators(s.replace("(anonymous namespace)", "{anon}"))
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):
        if ch in "<({[":
            if ch == "(" and depth == 0:
                cut = i
                break
            depth += 1
        elif ch in ">)}]":
            depth = max(0, depth - 1)
    head = s[:cut]
    tokens, cur, depth = [], "", 0
    for ch in head:
        if ch in "<({[":
            depth += 1
        elif ch in ">)}]":
            depth = max(0, depth - 1)
        if ch == " " and depth == 0:
            if cur:
                tokens.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        tokens.append(cur)
    merged = []
    for t in tokens:
        if merged and t.startswith("<"):
            merged[-1] += t
        else:
            merged.append(t)
    name = merged[-1] if merged else head
    plain, depth = "", 0  # drop template arguments
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            plain += ch
    return "", plain.strip().rstrip("&*")


_MANGLED_TORCH = re.compile(r"^_Z.*?(?:2at|5torch|3c10)")


def classify_symbol(symbol):
    """(kind, reason) for one imported symbol; kind None = allowed."""
    raw = _VERSION.sub("", symbol.strip())
    if raw.startswith("_Z"):  # not demangled (c++filt refused it, or demangling was skipped)
        if _MANGLED_TORCH.match(raw):
            return FORBIDDEN_OP, "torch/c10 symbol that could not be demangled: judged unknown"
        return None, "not demangled"
    prefix, path = symbol_path(raw)
    if prefix in ("typeinfo for", "typeinfo name for"):
        return None, "RTTI (catch / dynamic_cast)"
    for pat, kind, why in _RULES:
        if fnmatch.fnmatchcase(path, pat):
            return kind, why
    return None, "not torch"


def check_symbols(symbols, strict=True, file=""):
    """Findings over the imported (demangled) symbols of a built extension. With strict=False the
    compute rules (forbidden_op) are dropped; loader/process/callback rules remain."""
    out = []
    for sym in sorted(set(symbols)):
        kind, why = classify_symbol(sym)
        if kind is None or (kind == FORBIDDEN_OP and not strict):
            continue
        out.append(Finding(kind, file, 0, f"imports {sym}: {why}"))
    return out


# ---------------------------------------------------------------------------------------------
# Libraries (DT_NEEDED) and search paths

# Basenames (fnmatch) of libraries an extension may depend on: the C/C++ runtime, torch's own,
# the CUDA runtime/driver, cuBLAS(Lt), cuDNN, OpenMP, BLAS/LAPACK, Python. Anything else brings in
# code whose imports nobody judged (a libevil.so next to the extension).
ALLOWED_LIBRARIES = (
    "libc.so.*", "libm.so.*", "libstdc++.so.*", "libgcc_s.so.*", "ld-linux*.so.*", "libpthread.so.*", "librt.so.*",
    "libdl.so.*", "libc10.so", "libc10_cuda.so", "libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so",
    "libtorch_python.so", "libcudart.so*", "libcuda.so*", "libcublas.so*", "libcublasLt.so*", "libcudnn*.so*",
    "libnvToolsExt.so*", "libgomp.so*", "libomp.so*", "libiomp5.so*", "libopenblas*.so*", "libblas.so*",
    "libcblas.so*", "liblapack.so*", "liblapacke.so*", "libmkl_*.so*", "libpython3*.so*",
)
# RPATH/RUNPATH directories that are not the solution's: torch's lib folder, CUDA, the system.
# (torch's JIT builds set none; a solution's own -rpath is how a look-alike libcublas gets in.)
ALLOWED_RUNPATHS = ("*/site-packages/torch/lib", "/usr/local/cuda*", "/usr/lib*", "/lib*")


def check_libraries(info, file=""):
    """Findings over a DynamicInfo's DT_NEEDED, RPATH/RUNPATH and audit entries."""
    out = []
    for lib in info.needed:
        base = lib.rsplit("/", 1)[-1]
        if "/" in lib or not any(fnmatch.fnmatchcase(base, p) for p in ALLOWED_LIBRARIES):
            out.append(Finding(UNEXPECTED_LIBRARY, file, 0, f"needs {lib} (not a torch/CUDA/BLAS/cuDNN/runtime "
                                                            "library: its own imports are unjudged)"))
    for kind, paths in (("RPATH", info.rpath), ("RUNPATH", info.runpath)):
        for p in paths:
            if "$" in p or not any(fnmatch.fnmatchcase(os.path.normpath(p), g) for g in ALLOWED_RUNPATHS):
                out.append(Finding(UNEXPECTED_LIBRARY, file, 0, f"{kind} {p} (libraries would be looked up in a "
                                                                "folder the solution controls)"))
    for a in info.audit:
        out.append(Finding(UNEXPECTED_LIBRARY, file, 0, f"audit library {a} (rtld-audit hooks every binding)"))
    return out


def check_extension(so_path, strict=True):
    """All .so evidence: imported symbols and libraries. A file that cannot be read is itself a
    finding (forbidden_op): the judge must not pass what it could not inspect."""
    try:
        info = dynamic_info(so_path)
        symbols = demangle(info.undefined)
    except StaticCheckError as e:
        return [Finding(FORBIDDEN_OP, so_path, 0, f"extension could not be inspected: {e}")]
    return check_symbols(symbols, strict=strict, file=so_path) + check_libraries(info, file=so_path)
