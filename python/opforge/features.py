"""Features of task code for `opforge dedup` (request "features"); pure ast, no task code runs.

For each code:
- "normal": a normal form for exact dedup. Docstrings, comments and formatting go (ast.unparse);
  names the task binds itself (variables, parameters, `self.<attr>`) become v0, v1, ... in order
  of first appearance; numeric constants become one placeholder. So a copy that only renames or
  resizes has the same text (C++ hashes it with xxh3). Names the task does not bind (torch, nn,
  F, functions and classes, keyword names) are API and stay: renaming them would merge tasks that
  compute different things.
- "tokens": structural tokens with counts, for near-duplicate and KernelBench similarity. AST
  node-type n-grams (n = 1..3) over a pre-order walk, where identifiers and literals are only
  their node types; plus the op sequence as unigrams and bigrams prefixed "op:". The op sequence
  is the traced one when the caller has it (the filter's `ops`), else the calls found in the AST,
  in execution order, spelled the way tracing spells them (nn.Conv2d, torch.relu, F.gelu,
  Tensor.view, torch.add for `+`) so traced tasks and untraced references compare.
- "ops": the op sequence used (traced or from the AST).
Code that does not parse gets its whitespace-collapsed text as normal form and no AST tokens.
"""
import ast

from opforge.normalize import _strip_docstrings

NUM = "_NUM_"

# Binary operators as tracing names them (tracing.py _DUNDER).
_BINOP = {
    ast.Add: "torch.add", ast.Sub: "torch.sub", ast.Mult: "torch.mul", ast.Div: "torch.div",
    ast.FloorDiv: "torch.floor_divide", ast.MatMult: "torch.matmul", ast.Pow: "torch.pow",
    ast.Mod: "torch.remainder",
}
# Node types that say nothing about structure and would only dilute the n-grams.
_SKIP = (ast.expr_context,)


def _preorder(node):
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _preorder(child)


def _bound_names(tree):
    """Names the code binds itself: assigned names, parameters, attributes assigned on self."""
    names, attrs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            attrs.add(node.attr)
    names.discard("self")
    return names, attrs


def _canonicalise(tree):
    names, attrs = _bound_names(tree)
    mapping = {}

    def canon(key):
        if key not in mapping:
            mapping[key] = f"v{len(mapping)}"
        return mapping[key]

    for node in _preorder(tree):
        if isinstance(node, ast.Name) and node.id in names:
            node.id = canon(("n", node.id))
        elif isinstance(node, ast.arg) and node.arg in names:
            node.arg = canon(("n", node.arg))
        elif isinstance(node, ast.Attribute) and node.attr in attrs \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = canon(("a", node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex)) \
                and not isinstance(node.value, bool):
            node.value = NUM
    return tree


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _import_aliases(tree):
    """local name -> full module path, e.g. F -> torch.nn.functional, nn -> torch.nn."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _spell(full):
    """A dotted torch path spelled the way tracing.py spells ops."""
    for prefix, short in (("torch.nn.functional.", "F."), ("torch.nn.", "nn.")):
        if full.startswith(prefix):
            rest = full[len(prefix):]
            return short + rest.split(".")[-1] if short == "nn." else short + rest
    if full.startswith("transformers."):
        return "transformers." + full.split(".")[-1]
    return full


def _resolve(node, aliases):
    d = _dotted(node)
    if d is None:
        return None
    head, _, rest = d.partition(".")
    if head in aliases:
        d = aliases[head] + ("." + rest if rest else "")
    return d


LOCAL_MODULE = "local_module"  # a module the file builds itself (its class or helper's name is the file's own)


def _rooted(full):
    return full.split(".")[0] in ("torch", "transformers")


def op_token(op):
    """An op as a similarity token: one spelling per computation (`F.relu`, `torch.relu`,
    `nn.ReLU`, `Tensor.relu_` -> `relu`; `nn.LayerNorm`, `F.layer_norm` -> `layernorm`), so a
    copy that only changes how it calls an op scores as the op it calls (bench/decontam_recall.sh)."""
    for prefix in ("torch.nn.functional.", "torch.", "F.", "nn.", "Tensor."):
        if op.startswith(prefix):
            op = op[len(prefix):]
            break
    if op.endswith("_") and not op.endswith("__"):
        op = op[:-1]
    return op.replace("_", "").lower()


def _ast_ops(tree):
    """The op sequence of the Model's forward, read from the AST in execution order."""
    aliases = _import_aliases(tree)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if model is None:
        return []
    methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
    # self.<attr> = nn.Something(...) in __init__: calling self.<attr> is calling that module.
    submodules = {}
    if "__init__" in methods:
        for node in ast.walk(methods["__init__"]):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                full = _resolve(node.value.func, aliases)
                for t in node.targets:
                    if full and isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        submodules[t.attr] = _spell(full) if _rooted(full) else LOCAL_MODULE
    ops = []

    def visit(node):
        # Children first: arguments run before the call that takes them.
        for child in ast.iter_child_nodes(node):
            visit(child)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
            ops.append(_BINOP[type(node.op)])
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                if f.attr in submodules:
                    ops.append(submodules[f.attr])
                return
            full = _resolve(f, aliases)
            if full and full.split(".")[0] in ("torch", "transformers"):
                ops.append(_spell(full))
            elif isinstance(f, ast.Attribute) and not (full and full.split(".")[0] in aliases):
                ops.append(f"Tensor.{f.attr}")  # a method of a tensor: x.view(...), x.sum(...)

    if "forward" in methods:
        for stmt in methods["forward"].body:
            visit(stmt)
    return ops


def _ngrams(tree):
    seq = [type(n).__name__ for n in _preorder(tree) if not isinstance(n, _SKIP)]
    counts = {}
    for n in (1, 2, 3):
        for i in range(len(seq) - n + 1):
            key = "|".join(seq[i:i + n])
            counts[key] = counts.get(key, 0) + 1
    return counts


def features_of(code, ops=None):
    try:
        tree = _strip_docstrings(ast.parse(code))
    except SyntaxError:
        return {"normal": " ".join(code.split()), "tokens": {}, "ops": ops or []}
    if ops is None:
        ops = _ast_ops(tree)
    tokens = _ngrams(tree)
    spelled = [op_token(op) for op in ops]
    for i, op in enumerate(spelled):
        key = "op:" + op
        tokens[key] = tokens.get(key, 0) + 1
        if i:
            key = f"op:{spelled[i - 1]}>{op}"
            tokens[key] = tokens.get(key, 0) + 1
    normal = ast.unparse(_canonicalise(tree))
    return {"normal": normal, "tokens": tokens, "ops": ops}


def features(items):
    """items: [{"code": str, "ops": [str] | None}] -> [{"normal", "tokens", "ops"}]."""
    return [features_of(it["code"], it.get("ops")) for it in items]
