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
