"""transformers building blocks as seeds: activations and the per-layer modules of every family.

Classes are found by reading modeling_*.py with `ast` (importing 500 model files just to list
them would take minutes); only probing imports a family. Each family is instantiated from a tiny
config (data/crawl/transformers.json), so no weights are ever downloaded.
"""
import ast
import os
import re

from opforge import codegen


def _item(name, category, candidates=None, skip=None, detail=""):
    it = {"name": name, "source": "transformers", "category": category}
    if skip:
        it.update(skip=skip, detail=detail)
    else:
        it["candidates"] = candidates
    return it


def _literal(v, sizes):
    return codegen.literal(v, sizes)


def _config_expr(cfg_class, rules, sizes):
    kwargs = ", ".join(f"{k}={_literal(v, sizes)}" for k, v in rules["config"].items())
    return f"config = {cfg_class}({kwargs})"


def enumerate_activations(sizes):
    from transformers.activations import ACT2CLS

    items, seen = [], set()
    for key in sorted(ACT2CLS):
        entry = ACT2CLS[key]
        cls, kwargs = entry if isinstance(entry, tuple) else (entry, {})
        if not cls.__module__.startswith("transformers"):
            continue  # torch.nn classes are torch seeds
        name = f"transformers.activations.{cls.__name__}"
        if name in seen:
            continue
        seen.add(name)
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        code = codegen.render(
            title=f"Seed: transformers {cls.__name__} (ACT2CLS['{key}']).", sizes=sizes,
            imports=[f"from transformers.activations import {cls.__name__}"],
            inputs=[("x", "torch.randn(batch_size, seq_len, hidden_size)")], forward="self.op(x)",
            init_lines=[f"self.op = {cls.__name__}({args})"])
        items.append(_item(name, "activation", [code]))
    return items


def _resolve_import(node, family):
    """Absolute module of a `from .x import Y` inside transformers/models/<family>/."""
    if node.level == 0:
        return node.module
    base = ["transformers", "models", family][: 3 - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _params(fn):
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    out = [(p.arg, d is not None) for p, d in zip(pos, defaults)][1:]  # drop self
    out += [(p.arg, d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return out


def _category(name, rules):
    if any(re.search(p, name) for p in rules["exclude_patterns"]):
        return None
    for pattern, cat in rules["class_patterns"]:
        if re.search(pattern, name):
            return cat
    return None


def _family_classes(path, family, rules):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    config_cls = config_mod = None
    imports = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            mod = _resolve_import(node, family)
            for alias in node.names:
                imports[alias.asname or alias.name] = mod
                if config_cls is None and alias.name.endswith("Config") and "configuration_" in (mod or ""):
                    config_cls, config_mod = alias.name, mod
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            methods = {b.name: b for b in node.body if isinstance(b, ast.FunctionDef)}
            classes[node.name] = methods
    return config_cls, config_mod, classes


def enumerate_families(rules, sizes):
    import transformers

    root = os.path.join(os.path.dirname(transformers.__file__), "models")
    items = []
    for family in sorted(os.listdir(root)):
        fdir = os.path.join(root, family)
        if not os.path.isdir(fdir) or family.startswith("_"):
            continue
        for fname in sorted(os.listdir(fdir)):
            if not (fname.startswith("modeling_") and fname.endswith(".py")) or "_tf_" in fname or "_flax_" in fname:
                continue
            module = f"transformers.models.{family}.{fname[:-3]}"
            try:
                config_cls, config_mod, classes = _family_classes(os.path.join(fdir, fname), family, rules)
            except (SyntaxError, UnicodeDecodeError) as e:
                items.append(_item(module, "unparsable", skip="unparsable", detail=str(e)))
                continue
            rotary = next((c for c in classes if c.endswith("RotaryEmbedding")), None)
            picked = 0
            for cls_name in sorted(classes):
                cat = _category(cls_name, rules)
                if cat is None:
                    continue
                name = f"{module}.{cls_name}"
                if picked >= rules["max_classes_per_family"]:
                    items.append(_item(name, cat, skip="family_quota",
                                       detail=f"more than max_classes_per_family={rules['max_classes_per_family']}"))
                    continue
                try:
                    cands = _class_candidates(module, cls_name, classes[cls_name], config_cls, config_mod, rotary,
                                              classes, rules, sizes, family)
                except LookupError as e:
                    items.append(_item(name, cat, skip="no_rule", detail=str(e)))
                    continue
                picked += 1
                items.append(_item(name, cat, cands))
    return items


def _class_candidates(module, cls_name, methods, config_cls, config_mod, rotary, classes, rules, sizes, family):
    init = methods.get("__init__")
    fwd = methods.get("forward")
    if fwd is None:
        raise LookupError(f"{cls_name} defines no forward here (inherited or absent)")
    init_params = _params(init) if init else []
    args, needs_config = [], False
    for pname, has_default in init_params:
        if pname in ("args", "kwargs"):
            continue
        if pname in rules["init_args"]:
            v = rules["init_args"][pname]
            if v == "config":
                needs_config = True
                args.append(f"{pname}=config")
            elif not has_default:
                args.append(f"{pname}={_literal(v, sizes)}")
        elif not has_default:
            raise LookupError(f"{cls_name}.__init__ needs {pname!r}, which has no rule in data/crawl/transformers.json "
                              "init_args")
    if needs_config and not config_cls:
        raise LookupError(f"{cls_name} takes a config but {module} imports no configuration class")
    fparams = _params(fwd)
    if not fparams:
        raise LookupError(f"{cls_name}.forward takes no input")
    main, has_default = fparams[0]
    if main not in rules["forward_main"]:
        raise LookupError(f"{cls_name}.forward's first argument {main!r} is not a hidden-state tensor")
    call_args = ["x"]
    uses_rotary = False
    for pname, has_default in fparams[1:]:
        if pname in ("args", "kwargs"):
            continue
        if pname == "position_embeddings" and rotary and needs_config:
            call_args.append("position_embeddings=self.rotary(x, " + rules["forward_args"]["position_ids"] + ")")
            uses_rotary = True
        elif not has_default:
            if pname in rules["forward_args"]:
                call_args.append(f"{pname}={rules['forward_args'][pname]}")
            else:
                raise LookupError(f"{cls_name}.forward needs {pname!r}, which has no rule in "
                                  "data/crawl/transformers.json forward_args")
    imports = [f"from {module} import {cls_name}" + (f", {rotary}" if uses_rotary else "")]
    preamble = []
    if needs_config:
        imports.insert(0, f"from {config_mod} import {config_cls}")
        preamble.append(_config_expr(config_cls, rules, sizes))
    init_lines = [f"self.op = {cls_name}({', '.join(args)})"]
    if uses_rotary:
        init_lines.append(f"self.rotary = {rotary}(config)")
    call = f"self.op({', '.join(call_args)})"
    inputs = [("x", "torch.randn(batch_size, seq_len, hidden_size)")]
    title = f"Seed: transformers {cls_name} ({family})."
    common = dict(title=title, sizes=sizes, imports=imports, inputs=inputs, init_lines=init_lines, preamble=preamble)
    # The module may return a tensor or a tuple whose first element is the hidden state (and
    # whose other elements may be None); the probe keeps the first form that yields tensors.
    return [codegen.render(forward=call, **common), codegen.render(forward=call + "[0]", **common)]


def enumerate_transformers(rules, _torch_layouts=None):
    sizes = rules["sizes"]
    return enumerate_activations(sizes) + enumerate_families(rules, sizes)
