"""What identifies a solution's extension build, for the judge and the solution's child alike.

A single-file solution builds its extension at import time with
torch.utils.cpp_extension.load_inline (or load). The judge never runs that Python itself: a
sandboxed child *records* each call (record()), the judge keys it (key()) and has it compiled by
a sandboxed compiler child into <cache>/extensions/<key>/, and the evaluation child, importing the
solution again, finds the prebuilt module under the same key. The key covers everything the build
depends on (sources, flags, name, torch version), so equal sources share one build across
solutions and runs and different ones never collide; the compiler child sees only the recorded
arguments, never the solution's Python, so what sits under a key is what those sources build.
"""
import hashlib
import json
import os

# Arguments of load/load_inline that change the build; the rest (verbose, build_directory,
# keep_intermediates) do not, and build_directory is the harness's choice, never the solution's.
BUILD_ARGS = ("name", "cpp_sources", "cuda_sources", "sycl_sources", "functions", "extra_cflags",
              "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags", "extra_include_paths", "with_cuda",
              "with_pytorch_error_handling", "with_sycl", "use_pch", "is_python_module", "is_standalone",
              "sources")
LOAD_POSITIONAL = ("name", "sources")
INLINE_POSITIONAL = ("name", "cpp_sources", "cuda_sources", "functions")


class RecordError(Exception):
    pass


def _text(v):
    if isinstance(v, (list, tuple)):
        return [str(x) for x in v]
    return v if v is None or isinstance(v, (bool, int, str)) else str(v)


def record(kind, args, kwargs, cwd="."):
    """The build-relevant arguments of one load/load_inline call as plain JSON. For `load` the
    source files are read (their text is part of the record: the compiler child gets no files)."""
    names = LOAD_POSITIONAL if kind == "load" else INLINE_POSITIONAL
    if len(args) > len(names):
        raise RecordError(f"{kind}() got {len(args)} positional arguments; pass the rest by keyword")
    call = dict(zip(names, args))
    call.update(kwargs)
    rec = {"kind": kind}
    for k in BUILD_ARGS:
        if k in call and call[k] is not None:
            rec[k] = _text(call[k])
    if not isinstance(rec.get("name"), str) or not rec["name"].isidentifier():
        raise RecordError(f"{kind}() needs name= a Python identifier (got {rec.get('name')!r})")
    if kind == "load":
        srcs = rec.get("sources")
        srcs = [srcs] if isinstance(srcs, str) else list(srcs or [])
        for p in srcs:
            # Read by the judge itself when the calls come from the source: never outside the solution.
            if os.path.isabs(p) or os.path.normpath(p).startswith(".."):
                raise RecordError(f"load(): source {p} is outside the solution's folder")
        rec["sources"] = [{"path": os.path.basename(p), "text": _read(os.path.join(cwd, p))} for p in srcs]
    return rec


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise RecordError(f"cannot read extension source {path}: {e}") from None


def key(rec):
    import torch

    blob = json.dumps({"rec": rec, "torch": torch.__version__, "abi": 1}, sort_keys=True).encode()
    return rec["name"] + "_" + hashlib.sha256(blob).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Reading the calls off the source, when they are plain enough


_BUILDERS = ("load", "load_inline")


def _literals(tree):
    """Module-level names assigned exactly once to a literal: {name: value}."""
    import ast

    seen, values = {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        seen[n.id] = seen.get(n.id, 0) + 1
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    values[node.targets[0].id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    pass
    return {k: v for k, v in values.items() if seen.get(k) == 1}


def _top_level_calls(tree):
    """load/load_inline calls that are a module-level statement or the value of one; None when a
    builder is referred to anywhere else (aliased, called in a function, looked up by name)."""
    import ast

    calls, ok_funcs = [], set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.Expr)) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _BUILDERS:
            calls.append(value)
            ok_funcs.add(id(value.func))
    for n in ast.walk(tree):
        named = (isinstance(n, ast.Name) and n.id in _BUILDERS) or (isinstance(n, ast.Attribute) and n.attr in _BUILDERS)
        if (named and id(n) not in ok_funcs) or (isinstance(n, ast.Name) and n.id == "cpp_extension"):
            return None
    return calls


def static_records(text, cwd="."):
    """The records of a single-file solution's build calls read off its source, without running
    it (the judge's own process may do this: only literals are evaluated). None unless every call
    is a module-level `load`/`load_inline` imported from torch.utils.cpp_extension whose arguments
    are literals or module-level names bound once to literals; then a sandboxed import finds them.
    The evaluation child keys the calls it really makes the same way, so a solution whose source
    says one thing and does another fails there, with compile_error."""
    import ast

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                and n.module == "torch.utils.cpp_extension" for a in n.names}
    calls, lits = _top_level_calls(tree), _literals(tree)
    if calls is None or any(c.func.id not in imported for c in calls):
        return None
    out = []
    for c in calls:
        try:
            args = [_value(a, lits) for a in c.args]
            kwargs = {k.arg: _value(k.value, lits) for k in c.keywords if k.arg is not None}
            if any(k.arg is None for k in c.keywords):
                return None  # **kwargs
            out.append(record(c.func.id, args, kwargs, cwd))
        except (LookupError, ValueError, TypeError, SyntaxError, RecordError, RecursionError):
            return None
    return out


def _value(node, lits):
    import ast

    if isinstance(node, ast.Name):
        return lits[node.id]
    if isinstance(node, ast.Starred):
        raise ValueError("starred argument")
    return ast.literal_eval(node)
