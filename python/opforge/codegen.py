"""Rendering KernelBench-format task code from parts. Shared by the crawler (and composers)."""
import re

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INPUT_NAMES = ["x", "y", "z", "w", "v", "u"]


def used_sizes(texts, sizes):
    """Size constants referenced by any of `texts`, in the order of `sizes`."""
    found = set()
    for t in texts:
        found.update(_IDENT.findall(t))
    # Sizes may be defined in terms of each other; not used here, but keep order stable.
    return [k for k in sizes if k in found]


def literal(value, sizes):
    """A Python expression for a rule value: a size name, 'expr:…' raw code, or a literal."""
    if isinstance(value, str):
        if value in sizes:
            return value
        if value.startswith("expr:"):
            return value[5:]
        return repr(value)
    if isinstance(value, list):
        return "(" + ", ".join(literal(v, sizes) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def render(*, title, sizes, inputs, forward, init_params=(), init_lines=(), init_values=(), imports=(),
           preamble=()):
    """Returns task source.

    inputs: list of (name, expression); forward: the expression returned by forward;
    init_params/init_values: Model.__init__ parameters and what get_init_inputs returns;
    init_lines: statements of __init__ after super().__init__(); preamble: module-level lines
    after the size constants (e.g. a config object).
    """
    names = [n for n, _ in inputs]
    # forward: one returned expression, or a list of statements (the last returns).
    fwd_lines = [f"return {forward}"] if isinstance(forward, str) else list(forward)
    texts = [e for _, e in inputs] + fwd_lines + list(init_lines) + list(init_values) + list(preamble)
    size_lines = [f"{k} = {sizes[k]}" for k in used_sizes(texts, sizes)]
    out = [HEADER + "".join(f"{i}\n" for i in imports)]
    if size_lines:
        out.append("\n".join(size_lines) + "\n")
    if preamble:
        out.append("\n".join(preamble) + "\n")
    params = "".join(f", {p}" for p in init_params)
    body = ["        super().__init__()"] + [f"        {line}" for line in init_lines]
    out.append(
        "\nclass Model(nn.Module):\n"
        f'    """{title}"""\n\n'
        f"    def __init__(self{params}):\n" + "\n".join(body) + "\n\n"
        f"    def forward(self, {', '.join(names)}):\n" + "".join(f"        {line}\n" for line in fwd_lines)
    )
    out.append(
        "\n\ndef get_inputs():\n"
        f"    return [{', '.join(e for _, e in inputs)}]\n"
        "\n\ndef get_init_inputs():\n"
        f"    return [{', '.join(init_values)}]\n"
    )
    return "\n".join(out)
