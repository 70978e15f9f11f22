"""Enumerate operators of torch and transformers and write a candidate seed task for each.

Runs inside a worker (request "enumerate"). Returns one item per operator:
  {"name", "source", "category", "candidates": [code, ...]}   to be probed, first that runs wins
  {"name", "source", "category", "skip": REASON, "detail": TEXT}   not probed, with why
Rules (argument values, input layouts, per-op calls) are data: data/crawl/*.json.
"""
import inspect
import json
import os
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from opforge import codegen


def load_rules(data_dir, name):
    with open(os.path.join(data_dir, "crawl", name)) as f:
        return json.load(f)


class Layouts:
    def __init__(self, rules):
        self.sizes = rules["sizes"]
        self.inputs = rules["inputs"]
        self.layouts = rules["layouts"]

    def exprs(self, layout=None, inputs=None):
        if inputs is not None:
            exprs = list(inputs)
        else:
            if layout not in self.layouts:
                raise KeyError(f"unknown layout {layout!r} (data/crawl/torch.json 'layouts')")
            exprs = [self.inputs[k] for k in self.layouts[layout]]
        return list(zip(codegen.INPUT_NAMES, exprs))


def _item(name, source, category, candidates=None, skip=None, detail=""):
    """candidates: codes, or (code, spec) pairs; specs travel beside the codes."""
    it = {"name": name, "source": source, "category": category}
    if skip:
        it.update(skip=skip, detail=detail)
    else:
        it["candidates"] = [c[0] if isinstance(c, tuple) else c for c in candidates]
        it["specs"] = [c[1] if isinstance(c, tuple) else None for c in candidates]
    return it


# --- torch.nn modules ------------------------------------------------------------------------

def _nn_category(cls):
    return cls.__module__.rsplit(".", 1)[-1]


def _guess_layouts(name, nn_rules):
    for pattern, layout in nn_rules["guess"]:
        if re.search(pattern, name):
            return [layout]
    return list(nn_rules["fallback_layouts"])


def enumerate_nn(rules, lay):
    nn_rules = rules["nn"]
    items = []
    for name in sorted(dir(nn)):
        obj = getattr(nn, name)
        if not (inspect.isclass(obj) and issubclass(obj, nn.Module)):
            continue
        qual = f"torch.nn.{name}"
        cat = _nn_category(obj)
        if name in nn_rules["skip"]:
            reason = nn_rules["skip"][name]
            items.append(_item(qual, "torch", cat, skip=reason.split(":")[0], detail=reason))
            continue
        if name.startswith(nn_rules["lazy_prefix"]):
            items.append(_item(qual, "torch", cat, skip="lazy", detail="lazy module: shapes are inferred on first call; "
                                                                       f"covered by its eager twin nn.{name[4:]}"))
            continue
        if inspect.isabstract(obj):
            items.append(_item(qual, "torch", cat, skip="abstract", detail="abstract class"))
            continue
        rule = nn_rules["classes"].get(name, {})
        try:
            code = _nn_candidates(name, obj, rule, nn_rules, lay)
        except LookupError as e:
            items.append(_item(qual, "torch", cat, skip="no_rule", detail=str(e)))
            continue
        items.append(_item(qual, "torch", cat, candidates=code))
    return items


def _nn_candidates(name, cls, rule, nn_rules, lay):
    sizes = lay.sizes
    arg_rules = {**nn_rules["args"], **rule.get("args", {})}
    if "init" in rule:
        # Explicit constructor arguments (e.g. containers of a layer).
        params, values = [], []
        ctor = f"nn.{name}({', '.join(rule['init'])})"
    else:
        try:
            sig = inspect.signature(cls.__init__)
        except (TypeError, ValueError) as e:
            raise LookupError(f"no signature for nn.{name}.__init__: {e}") from None
        params, values, kwargs = [], [], []
        for p in list(sig.parameters.values())[1:]:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            required = p.default is inspect.Parameter.empty
            if p.name in rule.get("args", {}) or (required and p.name in arg_rules):
                v = codegen.literal(arg_rules[p.name], sizes)
                if required:
                    params.append(p.name)
                    values.append(v)
                else:
                    kwargs.append(f"{p.name}={v}")
            elif required:
                raise LookupError(f"nn.{name} needs argument {p.name!r}, which has no rule in data/crawl/torch.json "
                                  "nn.args")
        ctor = f"nn.{name}({', '.join(params + kwargs)})"
    init_lines = [f"self.op = {ctor}"]
    for attr, expr in rule.get("extra_init", {}).items():
        init_lines.append(f"self.{attr} = {expr}")
    if "inputs" in rule:
        layouts = [None]
    elif "layout" in rule:
        layouts = [rule["layout"]]
    else:
        layouts = _guess_layouts(name, nn_rules)
    out = []
    for layout in layouts:
        inputs = lay.exprs(layout, rule.get("inputs"))
        fwd = rule.get("forward", f"self.op({', '.join(n for n, _ in inputs)})")
        code = codegen.render(title=f"Seed: torch.nn.{name}.", sizes=sizes, inputs=inputs, forward=fwd,
                              init_params=params, init_lines=init_lines, init_values=values)
        out.append((code, _spec(f"torch.nn.{name}", "module", inputs, fwd, init_lines, params, values)))
    return out


# --- functions: torch.nn.functional and torch.* -------------------------------------------------

def _spec(name, kind, inputs, forward, init_lines, params=(), values=()):
    """How a composer reuses this seed as one line of a fused forward (see compose.py)."""
    return {"name": name, "kind": kind, "inputs": [list(i) for i in inputs], "forward": forward,
            "init_lines": list(init_lines), "init_params": list(params), "init_values": list(values)}


def _fn_code(qual, call, inputs, lay, rule, title):
    init_lines = []
    for attr, expr in rule.get("params", {}).items():
        init_lines.append(f"self.{attr} = nn.Parameter({expr})")
    for attr, expr in rule.get("buffers", {}).items():
        init_lines.append(f"self.register_buffer({attr!r}, {expr})")
    fwd = call.replace("{fn}", qual)
    code = codegen.render(title=title, sizes=lay.sizes, inputs=inputs, forward=fwd, init_lines=init_lines)
    return code, _spec(qual, "function", inputs, fwd, init_lines)


def _default_call(inputs):
    return "{fn}(" + ", ".join(n for n, _ in inputs) + ")"


def _short_ns(namespace):
    return {"torch.nn.functional": "F"}.get(namespace, namespace)


def enumerate_functional(rules, lay):
    fr = rules["functional"]
    items = []
    for name in sorted(dir(F)):
        obj = getattr(F, name)
        if name.startswith("_") or inspect.isclass(obj) or inspect.ismodule(obj) or not callable(obj):
            continue
        qual = f"torch.nn.functional.{name}"
        cat = _fn_category(name)
        if name in fr["skip"]:
            items.append(_item(qual, "torch", cat, skip="not_applicable", detail=fr["skip"][name]))
            continue
        if name.endswith("_") and not name.endswith("__"):
            items.append(_item(qual, "torch", cat, skip="inplace_variant", detail=f"in-place twin of F.{name[:-1]}"))
            continue
        rule = fr["functions"].get(name)
        if rule is None:
            try:
                sig = inspect.signature(obj)
                required = [p for p in sig.parameters.values()
                            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            except (TypeError, ValueError):
                required = [None]  # a builtin: try it as unary
            if len(required) > 1:
                items.append(_item(qual, "torch", cat, skip="no_rule",
                                   detail=f"F.{name} needs {len(required)} arguments; add a rule to data/crawl/torch.json "
                                          "functional.functions"))
                continue
            layouts = fr["fallback_layouts"]
            rule = {}
        else:
            layouts = [rule["layout"]] if "layout" in rule else [None]
        cands = []
        for layout in layouts:
            inputs = lay.exprs(layout, rule.get("inputs"))
            call = rule.get("call", _default_call(inputs))
            cands.append(_fn_code(f"F.{name}", call, inputs, lay, rule, f"Seed: torch.nn.functional.{name}."))
        items.append(_item(qual, "torch", cat, candidates=cands))
    return items


def _fn_category(name):
    for key, cat in (("loss", "loss"), ("pool", "pooling"), ("conv", "conv"), ("norm", "normalization"),
                     ("dropout", "dropout"), ("attention", "attention")):
        if key in name:
            return cat
    return "activation"


def _resolve(namespace, name):
    obj = torch
    for part in namespace.split(".")[1:]:
        obj = getattr(obj, part)
    return getattr(obj, name, None)


def enumerate_torch(rules, lay):
    items, listed = [], set()
    for group in rules["torch"]["groups"]:
        ns = group["namespace"]
        for op in group["ops"]:
            rule = {"name": op} if isinstance(op, str) else dict(op)
            name = rule["name"]
            qual = f"{ns}.{name}"
            listed.add(qual)
            cat = group["category"]
            if _resolve(ns, name) is None:
                items.append(_item(qual, "torch", cat, skip="not_in_this_torch",
                                   detail=f"{qual} does not exist in torch {torch.__version__}"))
                continue
            merged = {k: v for k, v in group.items() if k not in ("ops", "namespace", "category")}
            merged.update({k: v for k, v in rule.items() if k != "name"})
            inputs = lay.exprs(merged.get("layout"), merged.get("inputs"))
            call = merged.get("call", _default_call(inputs))
            items.append(_item(qual, "torch", cat, candidates=[_fn_code(qual, call, inputs, lay, merged, f"Seed: {qual}.")]))
    # Public torch.* callables not in any group: recorded, so what the rules miss is visible.
    for name in sorted(dir(torch)):
        qual = f"torch.{name}"
        obj = getattr(torch, name, None)
        if (qual in listed or name.startswith("_") or not name.islower() or inspect.isclass(obj)
                or inspect.ismodule(obj) or not callable(obj)):
            continue
        reason = "inplace_variant" if name.endswith("_") else "unclassified"
        items.append(_item(qual, "torch", "unclassified", skip=reason,
                           detail="not a compute op in data/crawl/torch.json torch.groups (creation, I/O, "
                                  "utility, or not yet classified)"))
    return items


# --- user seed files --------------------------------------------------------------------------

def enumerate_ops(data_dir, sources=("torch", "transformers"), files=(), match=None, limit=0):
    """Items of the registered `sources` (opforge.sources) and of the --add `files` (source local)."""
    from opforge import sources as S

    rules = load_rules(data_dir, "torch.json")
    items = S.enumerate_sources(list(sources), S.Context(data_dir, rules, Layouts(rules)))
    items += S.folder_items(files, "local")
    if match:
        rx = re.compile(match)
        items = [it for it in items if rx.search(it["name"])]
    seen, unique = set(), []
    for it in items:
        if it["name"] not in seen:
            seen.add(it["name"])
            unique.append(it)
    if limit:
        unique = unique[:limit]
    return unique
