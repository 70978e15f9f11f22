"""Offline composer backends: one registered piece per backend.

A backend is a function `(seeds, sizes, seed, block, start, mix, target_ms, seeds_key, **extra)
-> [record]` that makes the candidates of one block of indices; `opforge.compose.compose_block`
does the bucket draw, duplicate retries and determinism for it, given a `make(rng, bucket, vary)`.
Built in: `template` and `graph`. Another is registered by an entry point of an installed package
in group "opforge.composers" (name = backend, value = "module:function") and used with
`opforge compose --backend NAME`. docs/sources.md has a worked example.
"""
import importlib


def registry():
    reg = {"template": "opforge.compose:compose_template", "graph": "opforge.compose_graph:compose_graph"}
    from importlib import metadata

    for ep in metadata.entry_points(group="opforge.composers"):
        if ep.name in reg or ep.name == "llm":
            raise ValueError(f"composer backend {ep.name!r} (entry point {ep.value}) is already a backend")
        reg[ep.name] = ep.value
    return reg


def compose_offline(backend, **args):
    """Handler `compose_offline`: one block of candidates from the registered `backend`."""
    reg = registry()
    if backend not in reg:
        raise ValueError(f"unknown --backend {backend!r}: registered are {', '.join(sorted(reg))} and llm; add one "
                         "as an 'opforge.composers' entry point (docs/sources.md)")
    mod_name, fn_name = reg[backend].split(":")
    return getattr(importlib.import_module(mod_name), fn_name)(**args)
