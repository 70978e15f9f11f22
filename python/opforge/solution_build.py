"""The one place that turns a solution folder into a build spec, and builds it.

Two folder layouts are accepted (evaluator/README.md, "Layout of tasks and solutions"):

- "kernels": every source sits in kernels/, and one of them (by convention kernels/*_binding.cpp)
  defines PYBIND11_MODULE(TORCH_EXTENSION_NAME, m).
- "released" (the agent_workdir CUDA Agent published): binding.cpp and binding_registry.h sit at
  the folder root, binding.cpp defines the module and applies what kernels/*_binding.cpp
  registered through the header; those files `#include "../binding_registry.h"`.

The spec is plain data (relative paths, a digest) so the judge can compute it in a process that
must stay light: torch is imported only inside build_folder.
"""
import hashlib
import os
import re
import shutil

SOURCE_EXTS = (".cu", ".cpp", ".cc")
HEADER_EXTS = (".h", ".hh", ".hpp", ".cuh", ".inl")
INCLUDE_DIRS = (".", "kernels")
ROOT_MARKERS = ("binding.cpp", "binding_registry.h")
# Module names a solution may give PYBIND11_MODULE. TORCH_EXTENSION_NAME is torch's macro; the
# released binding.cpp spells the literal cuda_extension, which build_folder maps onto the real
# (hashed) name with a -D, since Python looks for PyInit_<the name the harness imports>.
MODULE_TOKENS = ("TORCH_EXTENSION_NAME", "cuda_extension")
# Part of the digest: bump when the flags or the file selection change, so old builds are not
# reused for what would now compile differently.
SPEC_VERSION = "opforge-folder-build-1"

_MODULE_RE = re.compile(r"\bPYBIND11_MODULE\s*\(\s*(\w+)\s*,")
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)

class LayoutError(Exception):
    """The folder cannot be built as one extension; the message names the file at fault."""


def _inside(root, rel):
    """Real path of root/rel; refuses anything that resolves outside root (symlinks included),
    since the build would otherwise read (and the digest hash) files the solution does not own."""
    real = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([root, real]) != root:
        raise LayoutError(f"{rel} resolves outside the solution folder ({real}): refused")
    return real


def _files(root, sub, exts, recursive=False):
    """Relative paths under root/sub ending in exts; sub itself must not leave root."""
    top = _inside(root, sub)
    if not os.path.isdir(top):
        return []
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for f in filenames:
            if f.endswith(exts):
                found.append(os.path.normpath(os.path.join(sub, os.path.relpath(os.path.join(dirpath, f), top))))
        if not recursive:
            break
    for rel in found:
        if not os.path.isfile(_inside(root, rel)):
            raise LayoutError(f"{rel} is not a regular file")
    return found


def _read(root, rel):
    with open(_inside(root, rel), "rb") as f:
        return f.read()


def _digest(root, files):
    h = hashlib.sha256(SPEC_VERSION.encode() + b"\0")
    for rel in files:
        data = _read(root, rel)
        # Length-prefixed so no two different trees hash the same byte stream.
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _module_definition(root, sources):
    """(file, token) of the one PYBIND11_MODULE; comments are ignored so a note about the macro
    does not count as a second module."""
    defs = []
    for rel in sources:
        text = _COMMENT_RE.sub("", _read(root, rel).decode("utf-8", "replace"))
        defs += [(rel, tok) for tok in _MODULE_RE.findall(text)]
    if not defs:
        raise LayoutError("no source defines PYBIND11_MODULE(TORCH_EXTENSION_NAME, m): put it in one "
                          "kernels/*_binding.cpp, or in binding.cpp at the folder root")
    if len(defs) > 1:
        raise LayoutError("PYBIND11_MODULE is defined more than once (one extension, one module): "
                          + ", ".join(rel for rel, _ in defs))
    rel, tok = defs[0]
    if tok not in MODULE_TOKENS:
        raise LayoutError(f"{rel} defines PYBIND11_MODULE({tok}, ...): name it TORCH_EXTENSION_NAME, "
                          "the harness names the extension")
    return rel, tok


def _check_objects(sources):
    """torch names each object file after its source's base name (.cu gets .cuda.o), in one build
    folder: two sources mapping to one object would make ninja fail with an obscure message."""
    seen = {}
    for rel in sources:
        stem, ext = os.path.splitext(os.path.basename(rel))
        obj = stem + (".cuda.o" if ext == ".cu" else ".o")
        if obj in seen:
            raise LayoutError(f"{seen[obj]} and {rel} would compile to the same object {obj}: rename one")
        seen[obj] = rel


def folder_build_spec(solution_dir):
    """What to compile for solution_dir, as relative paths. Raises LayoutError."""
    root = os.path.realpath(solution_dir)
    if not os.path.isdir(root):
        raise LayoutError(f"{solution_dir} is not a folder")
    released = any(os.path.lexists(os.path.join(root, m)) for m in ROOT_MARKERS)
    # Released layout: root sources too, as the released compile script globs them (binding.cpp).
    sources = sorted((_files(root, ".", SOURCE_EXTS) if released else []) + _files(root, "kernels", SOURCE_EXTS))
    if not sources:
        raise LayoutError(f"no kernels/*.cu, *.cpp or *.cc (nor binding.cpp) in {solution_dir}")
    # Headers may sit in folders below kernels/ (kernels/common/x.cuh); they only travel.
    headers = sorted(_files(root, ".", HEADER_EXTS) + _files(root, "kernels", HEADER_EXTS, recursive=True))
    _check_objects(sources)
    binding, token = _module_definition(root, sources)
    digest = _digest(root, sorted(sources + headers))
    return {
        "layout": "released" if released else "kernels",
        "sources": sources,
        "headers": headers,
        "include_dirs": list(INCLUDE_DIRS),
        "with_cuda": any(s.endswith(".cu") for s in sources),
        "digest": digest,
        "name": f"cuda_extension_{digest[:12]}",
        "binding": binding,
        "module_token": token,
    }


def materialize(spec, solution_dir, dest_dir):
    """Copies the spec's files under dest_dir with their relative paths (so "../binding_registry.h"
    from kernels/ resolves). Returns (absolute sources, absolute include dirs). Raises LayoutError
    when the folder changed since the spec was made: the build is named by the digest."""
    root = os.path.realpath(solution_dir)
    files = sorted(spec["sources"] + spec["headers"])
    if _digest(root, files) != spec["digest"]:
        raise LayoutError(f"{solution_dir} changed after its build spec was made")
    for rel in files:
        _copy_if_changed(_inside(root, rel), os.path.join(dest_dir, rel))
    dest = os.path.abspath(dest_dir)
    return ([os.path.join(dest, s) for s in spec["sources"]],
            [os.path.normpath(os.path.join(dest, d)) for d in spec["include_dirs"]])


def _copy_if_changed(src, dst):
    """Leaves an identical file alone (ninja rebuilds on mtime) and replaces atomically (two
    workers may materialize the same digest at once)."""
    with open(src, "rb") as f:
        data = f.read()
    if os.path.isfile(dst):
        with open(dst, "rb") as f:
            if f.read() == data:
                return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    shutil.copymode(src, tmp)
    os.replace(tmp, dst)


def build_folder(solution_dir, build_root, load=None):
    """Builds solution_dir with build_root as torch's build directory (sources copied to
    build_root/src, the module at build_root/<name>.so): give each build a folder of its own, since
    torch keeps one build.ninja per folder. Returns {"so_path", "name", "module"}, name =
    cuda_extension_<digest[:12]>. Raises LayoutError, or what load raises for a compiler error."""
    spec = folder_build_spec(solution_dir)
    name = spec["name"]
    build_dir = os.path.abspath(build_root)
    sources, includes = materialize(spec, solution_dir, os.path.join(build_dir, "src"))
    if load is None:
        from torch.utils.cpp_extension import load
    # The literal module name of the released binding.cpp becomes the hashed one.
    defines = [] if spec["module_token"] == "TORCH_EXTENSION_NAME" else [f"-D{spec['module_token']}={name}"]
    with_cuda = spec["with_cuda"]
    module = load(name=name, sources=sources, extra_include_paths=includes, extra_cflags=["-O3", *defines],
                  extra_cuda_cflags=["-O3", *defines] if with_cuda else None, with_cuda=with_cuda,
                  build_directory=build_dir, verbose=False)
    so_path = getattr(module, "__file__", None) or os.path.join(build_dir, name + ".so")
    return {"so_path": so_path, "name": name, "module": module}
