"""Disguised copies of KernelBench-format files, for measuring what decontamination catches.

    python3 bench/disguise.py SRC_DIR OUT_DIR [--levels light,resize,rewrite]

Each .py under SRC_DIR (e.g. a KernelBench checkout's KernelBench/) becomes one file per level
under OUT_DIR/<level>/<kb level>__<name>.py, each level adding to the previous one:
  light    docstrings and comments dropped, every name the file binds renamed (Model, forward,
           get_inputs and get_init_inputs stay: the format needs them)
  resize   every integer literal > 1 at module level doubled (batch, channels, sizes)
  rewrite  the functional spelling swapped: torch.relu <-> F.relu, torch.sigmoid <-> F.sigmoid,
           torch.tanh <-> F.tanh, torch.softmax <-> F.softmax; `import torch.nn.functional as F`
           added when needed
What a contaminating copy looks like to a corpus: same computation, other text.
"""
import argparse
import ast
import builtins
from pathlib import Path

KEEP = {"Model", "forward", "get_inputs", "get_init_inputs", "self", "super", "__init__", "torch", "nn", "F",
        "math", "np", "einops", "rearrange", "repeat"} | set(dir(builtins))
SWAP = {"relu", "sigmoid", "tanh", "softmax"}


class _Rename(ast.NodeTransformer):
    """Consistent new names for what the file itself binds (variables, arguments, functions,
    classes, self.<attribute>)."""

    def __init__(self, bound):
        self.map = {n: f"q{i}" for i, n in enumerate(sorted(bound - KEEP))}

    def _n(self, name):
        return self.map.get(name, name)

    def visit_Name(self, node):
        node.id = self._n(node.id)
        return node

    def visit_arg(self, node):
        node.arg = self._n(node.arg)
        return node

    def visit_FunctionDef(self, node):
        node.name = self._n(node.name)
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node):
        node.name = self._n(node.name)
        self.generic_visit(node)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self._n(node.attr)
        return node

    def visit_keyword(self, node):
        self.generic_visit(node)  # keyword names of calls into torch stay (in_features=...)
        return node


def _bound(tree):
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
    return out


def _drop_docstrings(tree):
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body and \
                isinstance(n.body[0], ast.Expr) and isinstance(getattr(n.body[0], "value", None), ast.Constant) \
                and isinstance(n.body[0].value.value, str):
            n.body = n.body[1:] or [ast.Pass()]


def _resize(tree):
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            for c in ast.walk(stmt.value):
                if isinstance(c, ast.Constant) and type(c.value) is int and c.value > 1:
                    c.value *= 2


class _Respell(ast.NodeTransformer):
    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr in SWAP and isinstance(node.value, ast.Name):
            if node.value.id == "torch":
                node.value.id = "F"
            elif node.value.id == "F":
                node.value.id = "torch"
        return node


def _ensure_functional(tree):
    has = any(isinstance(n, ast.Import) and any(a.name == "torch.nn.functional" and a.asname == "F" for a in n.names)
              for n in tree.body)
    if not has:
        tree.body.insert(0, ast.Import(names=[ast.alias(name="torch.nn.functional", asname="F")]))


def disguise(code, level):
    tree = ast.parse(code)
    _drop_docstrings(tree)
    tree = _Rename(_bound(tree)).visit(tree)
    if level in ("resize", "rewrite"):
        _resize(tree)
    if level == "rewrite":
        tree = _Respell().visit(tree)
        _ensure_functional(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--levels", default="light,resize,rewrite")
    a = ap.parse_args()
    files = sorted(Path(a.src).rglob("*.py"))
    for level in a.levels.split(","):
        d = Path(a.out) / level
        d.mkdir(parents=True, exist_ok=True)
        for f in files:
            tag = f.parent.name
            (d / f"{tag}__{f.name}").write_text(disguise(f.read_text(), level))
    print(f"{len(files)} files x {len(a.levels.split(','))} levels under {a.out}")


if __name__ == "__main__":
    main()
