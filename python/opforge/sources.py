"""Seed sources: where `opforge crawl` gets operators from. One registered piece per source.

A source is a function `enumerate(ctx) -> [item]` whose items have crawl.py's form
({"name", "category", "candidates": [code, ...]} to probe, or {"name", "category", "skip",
"detail"}); the registry sets each item's "source" to the source's name. Built in: `torch` and
`transformers`. A new one is registered in exactly one place, either
- a file `NAME.json` in `data/sources/` or in a folder of $OPFORGE_SOURCES (colon-separated, for
  sources kept outside the checkout): {"folder": PATH} for a folder of KernelBench-format files
  (relative to the file), or {"entry": "module:function", "path": [folders put on sys.path]} for
  code; or
- a Python entry point of an installed package, group "opforge.sources", name NAME, value
  "module:function".
`opforge crawl --sources torch,NAME` crawls it; its seeds compose as single-module tasks under the
mix bucket NAME (`opforge compose --mix 2:80,NAME:20`). docs/sources.md has a worked example.
"""
import importlib
import json
import os
import re
import sys

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
RESERVED = {"none", "local", "imported"}  # --sources none; --add files; opforge import


class Context:
    """What a source's enumerate function may use: the data folder and the torch rules."""

    def __init__(self, data_dir, rules, layouts):
        self.data_dir, self.rules, self.layouts = data_dir, rules, layouts


def _builtin():
    from opforge import crawl
    from opforge.crawl_transformers import enumerate_transformers

    def torch_source(ctx):
        return crawl.enumerate_nn(ctx.rules, ctx.layouts) + crawl.enumerate_functional(ctx.rules, ctx.layouts) + \
            crawl.enumerate_torch(ctx.rules, ctx.layouts)

    def transformers_source(ctx):
        return enumerate_transformers(crawl.load_rules(ctx.data_dir, "transformers.json"), ctx.layouts)

    return {"torch": torch_source, "transformers": transformers_source}


def _load(entry, extra_path=()):
    for p in extra_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    mod_name, _, fn_name = entry.partition(":")
    if not fn_name:
        raise ValueError(f"source entry {entry!r} must be 'module:function'")
    return getattr(importlib.import_module(mod_name), fn_name)


def _from_file(path):
    with open(path) as f:
        spec = json.load(f)
    base = os.path.dirname(os.path.abspath(path))
    if "folder" in spec:
        folder = os.path.join(base, spec["folder"])
        if not os.path.isdir(folder):
            raise ValueError(f"{path}: folder {folder} does not exist")
        return lambda ctx: folder_items([folder])
    if "entry" in spec:
        paths = [os.path.join(base, p) for p in spec.get("path", [])]
        return lambda ctx: _load(spec["entry"], paths)(ctx)
    raise ValueError(f"{path}: a source file needs \"folder\" or \"entry\" (docs/sources.md)")


def registry(data_dir):
    """name -> enumerate function: built-ins, then data/sources/*.json and $OPFORGE_SOURCES, then
    entry points. Nothing is imported or read until a source is enumerated."""
    reg = _builtin()
    folders = [os.path.join(data_dir, "sources")] + [f for f in os.environ.get("OPFORGE_SOURCES", "").split(":") if f]
    for folder in folders:
        for fname in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if fname.endswith(".json"):
                path = os.path.join(folder, fname)
                _register(reg, fname[:-5], lambda p=path: _from_file(p), path)
    from importlib import metadata

    for ep in sorted(metadata.entry_points(group="opforge.sources"), key=lambda e: e.name):
        _register(reg, ep.name, lambda ep=ep: ep.load(), f"entry point {ep.value}")
    return reg


def _register(reg, name, make, where):
    if not NAME.match(name) or name in RESERVED:
        raise ValueError(f"source name {name!r} ({where}) must match [a-z][a-z0-9_]* and not be one of "
                         f"{sorted(RESERVED)}")
    if name in reg:
        raise ValueError(f"source {name!r} ({where}) is registered twice")
    reg[name] = lambda ctx, make=make: make()(ctx)


def folder_items(paths, source=None):
    """One item per KernelBench-format file under `paths` (recursive), named source.stem."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, n) for n in names if n.endswith(".py")]
        else:
            files.append(p)
    items = []
    for f in sorted(files):
        with open(f, encoding="utf-8", errors="replace") as fh:
            code = fh.read()
        stem = os.path.splitext(os.path.basename(f))[0]
        item = {"name": stem, "category": "module", "candidates": [code], "path": os.path.abspath(f)}
        if source:
            item.update(name=f"{source}.{stem}", source=source)
        items.append(item)
    return items


def enumerate_sources(names, ctx):
    """Items of the named sources, each item's "source" and name prefix set to its source."""
    reg = registry(ctx.data_dir)
    unknown = [n for n in names if n not in reg]
    if unknown:
        raise ValueError(f"unknown source {unknown[0]!r} in --sources: registered are {', '.join(sorted(reg))}; add "
                         "one as data/sources/NAME.json or an 'opforge.sources' entry point (docs/sources.md)")
    items = []
    for name in names:
        for it in reg[name](ctx):
            it = dict(it, source=name)
            if name not in ("torch", "transformers") and not it["name"].startswith(name + "."):
                it["name"] = f"{name}.{it['name']}"
            items.append(it)
    return items
