"""Normal form of task code, the input of ids (xxh3) and exact dedup.

Comments, docstrings and formatting disappear through ast.parse/ast.unparse. Code that does not
parse falls back to whitespace-collapsed text, so even a broken file has a stable id.
"""
import ast


def _strip_docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def normalize_code(code: str) -> str:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return " ".join(code.split())
    return ast.unparse(_strip_docstrings(tree))


def normalize_request(codes):
    return [normalize_code(c) for c in codes]
