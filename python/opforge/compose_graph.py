"""The `graph` composer: tasks shaped like the compute of real models (docs/realism.md).

A candidate is a chain of 1-5 ops walked along the dataflow edges real models contain
(data/real_models/stats.json: `families_per_edge`, how many model families have producer ->
consumer). Most multi-op chains are anchored on a compute-heavy op (linear, conv1d/2d, attention)
with the prologue and epilogues real models put around it (bias, norm, activation, residual,
scaling, reduction, pooling, softmax), in the layouts real models use (B·S·D tokens, N·D rows,
N·C·H·W images, N·C·L signals, B·H·S·Dh heads) with widths from the table. Sizes come from a grid
and a cost model of the target device, never from a timed probe: the same seed gives the same
candidates on any machine (the filter may still rescale `batch_size`, and records it).

A small share of chains (`exotic_share`) carries one crawled torch op real models do not use, for
diversity; it is placed only where its input domain holds (an op whose seed draws torch.rand only
after an op whose output is non-negative), and so are the grammar's own ops.
"""
import math
import random
import re

from opforge import codegen
from opforge.compose import _composer, compose_block, module_candidate
from opforge.normalize import normalize_code

HEAVY = ("linear", "conv2d", "conv1d", "scaled_dot_product_attention", "matmul", "bmm", "addmm")
# How often each anchors a chain (linear and conv2d dominate real models' FLOPs), and its input.
ANCHOR_WEIGHTS = (35, 25, 8, 12, 8, 4, 8)
ANCHOR_LAYOUT = {"linear": ("tokens", "rows"), "conv2d": ("image",), "conv1d": ("signal",),
                 "scaled_dot_product_attention": ("heads",), "matmul": ("tokens",), "bmm": ("tokens",),
                 "addmm": ("rows",)}
# An op whose seed draws torch.rand (log, rsqrt, lgamma, ... need x > 0) follows only a tensor
# bounded away from zero: a clamp(min=eps), as real models write before a log or an rsqrt, and
# what keeps that bound (a positive scale, a mean, a pooling). sigmoid, softmax, softplus and exp
# are positive in exact arithmetic only: in float32 they underflow to 0 (a softmax over wide
# scores is mostly zeros), which those ops turn into inf.
POSITIVE = set()
UNARY = ("relu", "gelu", "silu", "sigmoid", "tanh", "hardswish", "hardtanh", "softplus")
# Throughput of the cost model: (GFLOP/s, GB/s, ms per op). Deliberately round: the filter's
# calibration moves a task into the window; this only has to land near it.
DEVICES = {"cpu": (40.0, 8.0, 0.005), "cuda": (40000.0, 3000.0, 0.008)}
SEQ = {"cpu": (64, 128, 256, 512), "cuda": (256, 512, 1024, 2048)}
SPATIAL = {"cpu": (14, 28, 56), "cuda": (28, 56, 112)}
# No tensor of a chain above this many elements. On a GPU it is the filter's own calibration cap
# (filter.MAX_INPUT_ELEMENTS, 1 GiB of float32): with 2^26 the cost model could not reach the
# target for most chains (median estimate 0.56 ms for 10), so 62% of the H200's candidates ran
# their checks and a timing twice, once at a size the filter then scaled up to the same place
# (docs/gpu.md, seventeenth session). On the CPU the smaller cap keeps CI's tasks small.
# The largest batch is a cap of the same kind (2^12 on the CPU, as before).
MAX_NUMEL = {"cpu": 1 << 26, "cuda": 1 << 28}
MAX_BATCH = {"cpu": 1 << 12, "cuda": 1 << 16}


class State:
    """The tensor flowing through the chain: its layout, shape and what is known of its values."""

    def __init__(self, layout, shape, positive=False):
        self.layout, self.shape, self.positive = layout, list(shape), positive

    def numel(self, batch):
        return batch * math.prod(self.shape[1:])


class Chain:
    """Code of one candidate under construction: __init__ lines, forward lines, cost terms."""

    def __init__(self):
        self.init, self.fwd, self.ops, self.cost, self.attrs = [], [], [], [], set()
        self.inputs = []

    def attr(self, base):
        n, i = base, 2
        while n in self.attrs:
            n, i = f"{base}{i}", i + 1
        self.attrs.add(n)
        return n

    def add(self, op, line, flops_per_item, bytes_per_item, init=()):
        self.ops.append(op)
        self.fwd.append(line)
        self.init.extend(init)
        self.cost.append((flops_per_item, bytes_per_item))


class Grammar:
    def __init__(self, stats, device, torch_seeds=(), sizes=(), smoothing=0.5):
        self.edges = {}
        for key, n in stats["families_per_edge"].items():
            a, b = key.split(" -> ")
            self.edges.setdefault(a, {})[b] = n
        self.device = device if device in DEVICES else "cpu"
        self.hidden = _widths(stats, "linear", -1, 64, 8192)
        self.channels = _widths(stats, "conv2d", 1, 16, 1024)
        self.signal_channels = _widths(stats, "conv1d", 1, 16, 1024)
        self.heads = sorted({(s[1], s[3]) for s in _shapes(stats, "scaled_dot_product_attention")
                             if len(s) == 4 and 4 <= s[1] <= 64 and 32 <= s[3] <= 128}) or [(12, 64)]
        self.exotic = [s for s in torch_seeds if _pure(s, sizes)]
        self.smoothing = smoothing

    # -- which ops may come next --------------------------------------------------------------
    def applicable(self, st, prev, heavy_left, ch=None):
        ops = list(UNARY) + ["add", "mul", "div", "sub", "clamp"]
        if st.layout in ("tokens", "rows"):
            ops += ["layer_norm", "softmax"] + (["linear"] if heavy_left else [])
        if st.layout == "tokens":
            ops += ["mean", "sum"] + (["matmul", "bmm"] if heavy_left and len(st.shape) == 3 else [])
        if st.layout == "rows" and heavy_left:
            ops += ["addmm"]
        if st.layout == "scores":
            ops += ["softmax"] + (["matmul"] if heavy_left and ch is not None and _can_attend(ch) else [])
        if st.layout == "image":
            ops += ["batch_norm", "group_norm", "mean", "adaptive_avg_pool2d", "pad"] + (["conv2d"] if heavy_left else [])
            if st.shape[2] >= 8:
                ops += ["max_pool2d", "avg_pool2d"]
        if st.layout == "signal":
            ops += ["batch_norm", "group_norm"] + (["conv1d"] if heavy_left else [])
        if st.layout == "rows":
            ops += ["batch_norm"]
        if ch is not None and _can_concat(ch, st):
            ops += ["cat"]
        return [o for o in ops if o != prev or o in ("add", "linear", "conv2d")]

    def next_op(self, rng, st, prev, heavy_left, ch=None):
        """The next op: real edges weighted by how many model families have them, every other
        applicable op by `smoothing` (so structures real models have not shown stay reachable)."""
        cands = self.applicable(st, prev, heavy_left, ch)
        real = self.edges.get(prev, {})
        weights = [real.get(c, 0) + self.smoothing for c in cands]
        if sum(weights) == 0:
            return rng.choice(cands)
        return rng.choices(cands, weights=weights)[0]


def _can_attend(ch):
    """Scores may be applied to the chain's own input (scores @ x, self-attention with shared
    projections) when that input is one B·S·D tensor."""
    return not ch.inputs and len(ch.residual) == 3


def _can_concat(ch, st):
    """The chain's input can be concatenated to x (DenseNet, U-Net skips) along channels or
    features: same shape elsewhere, once, and after at least one op."""
    r, s = ch.residual, st.shape
    if ch.inputs or ch.uses_identity or not ch.ops or len(r) != len(s) or st.layout not in ("image", "tokens"):
        return False
    return r[2:] == s[2:] if st.layout == "image" else r[:-1] == s[:-1]


def _shapes(stats, op):
    lay = stats.get("layouts", {}).get(op, {})
    return [eval(s) for s in lay.get("shapes", {})]  # noqa: S307 - str() of int lists, our table


def _widths(stats, op, dim, lo, hi):
    ws = sorted({s[dim] for s in _shapes(stats, op) if len(s) > abs(dim) and lo <= s[dim] <= hi})
    return ws or [lo * 4]


EXOTIC_CATEGORIES = {"activation", "elementwise", "special", "reduction", "normalization", "instancenorm"}


def _pure(seed, sizes):
    """A crawled op that is one call on x with nothing to build and no size constant to know:
    reachable as an exotic step. Only elementwise-like categories (a matrix op needs square
    inputs, a spectral one complex-friendly sizes, an index op integer ones)."""
    spec = seed.get("spec") or {}
    fwd = spec.get("forward", "")
    names = set(re.findall(r"(?<![\w.])[A-Za-z_]\w*", fwd)) - {"x", "torch", "F", "nn", "dim", "True", "False", "None"}
    return (seed.get("source") == "torch" and seed.get("category") in EXOTIC_CATEGORIES
            and len(spec.get("inputs") or []) == 1 and not spec.get("init_lines") and not spec.get("init_params")
            and "x" in fwd and not (names & set(sizes)))


# -- rendering one op ---------------------------------------------------------------------------
# Each emitter appends its op to the chain and returns the new state. The variants they draw
# are the ones real models use (bias-free projections, depthwise convolutions, tanh GELU, causal
# attention, squeeze-excite pooling, norms without affine parameters): they change the kernel a
# solution must write, which sizes alone do not (dedup ignores numbers).
def _kw(rng, p, text):
    return f", {text}" if rng.random() < p else ""


def _emit_linear(ch, st, op, rng):
    s, per = st.shape, math.prod(st.shape[1:])
    d = s[-1]
    d2 = rng.choice(sorted({d, 4 * d, max(64, d // 4), 2 * d} & set(range(64, 16385))))
    a = ch.attr("fc")
    rows = per // d
    ch.add(op, f"x = self.{a}(x)", 2 * rows * d * d2, 4 * (per + rows * d2),
           [f"self.{a} = nn.Linear({d}, {d2}{_kw(rng, 0.3, 'bias=False')})"])
    return State(st.layout, s[:-1] + [d2])


def _emit_conv(ch, st, op, rng):
    s, per = st.shape, math.prod(st.shape[1:])
    c = s[1]
    depthwise = rng.random() < 0.25
    k = rng.choice([3, 5, 7] if depthwise else ([1, 3, 3, 3] if op == "conv2d" else [1, 3, 5]))
    stride = 2 if rng.random() < 0.2 and s[2] >= 16 else 1
    c2 = c if depthwise else rng.choice(sorted({c, 2 * c, max(16, c // 2)} & set(range(16, 2049))))
    a = ch.attr("conv")
    cls = "nn.Conv2d" if op == "conv2d" else "nn.Conv1d"
    sp = [(n + 2 * (k // 2) - k) // stride + 1 for n in s[2:]]
    out = c2 * math.prod(sp)
    extra = (f", groups={c}" if depthwise else "") + _kw(rng, 0.3, "bias=False")
    ch.add(op, f"x = self.{a}(x)", 2 * out * (1 if depthwise else c) * k ** len(sp), 4 * (per + out),
           [f"self.{a} = {cls}({c}, {c2}, kernel_size={k}, stride={stride}, padding={k // 2}{extra})"])
    return State(st.layout, [s[0], c2] + sp)


def _emit_unary(ch, st, op, rng):
    per = math.prod(st.shape[1:])
    args = _kw(rng, 0.3, "approximate='tanh'") if op == "gelu" else ""
    ch.add(op, f"x = F.{op}(x{args})", 8 * per, 8 * per)
    return State(st.layout, st.shape, op in POSITIVE)


def _emit_scalar(ch, st, op, rng):
    """div by a constant (attention's sqrt(d), a temperature), clamp (ReLU6-style bounds)."""
    per = math.prod(st.shape[1:])
    if op == "div":
        ch.add(op, f"x = x / {rng.choice([8.0, 11.3137, 2.0, 0.7071])}", per, 8 * per)
        return State(st.layout, st.shape, st.positive)
    bounds = rng.choice(["min=-1.0, max=1.0", "min=0.0, max=6.0", "min=0.0", "max=10.0", "min=1e-05"])
    ch.add(op, f"x = torch.clamp(x, {bounds})", per, 8 * per)
    return State(st.layout, st.shape, bounds == "min=1e-05" or st.positive)


def _emit_pad(ch, st, op, rng):
    s, per = st.shape, math.prod(st.shape[1:])
    mode = rng.choice(["", "", ", mode='reflect'", ", mode='replicate'"])
    ch.add(op, f"x = F.pad(x, (1, 1, 1, 1){mode})", per, 8 * per)
    return State(st.layout, s[:2] + [n + 2 for n in s[2:]], st.positive and mode != "")


def _emit_scores(ch, st, op, rng):
    """matmul/bmm of B·S·D tokens with themselves (scores, B·S·S), or of scores with the chain's
    input (the attention-weighted sum, back to B·S·D)."""
    s, per = st.shape, math.prod(st.shape[1:])
    fn = "torch.bmm" if op == "bmm" else "torch.matmul"
    if st.layout == "scores":
        d = ch.residual[-1]
        ch.add(op, f"x = {fn}(x, identity)", 2 * per * d, 4 * (per + s[1] * d))
        ch.uses_identity = True
        return State("tokens", [s[0], s[1], d])
    ch.add(op, f"x = {fn}(x, x.transpose(1, 2))", 2 * s[1] * s[1] * s[2], 4 * (per + s[1] * s[1]))
    return State("scores", [s[0], s[1], s[1]])


def _emit_cat(ch, st, op, rng):
    s, per = st.shape, math.prod(st.shape[1:])
    dim, axis = (1, 1) if st.layout == "image" else (-1, len(s) - 1)
    out = list(s)
    out[axis] += ch.residual[axis]
    ch.add(op, f"x = torch.cat([x, identity], dim={dim})", 0, 8 * per)
    ch.uses_identity = True
    return State(st.layout, out)  # the input half is randn: not positive


def _emit_addmm(ch, st, op, rng):
    """GPT-2's Conv1D: bias + x @ W as one addmm on N·D rows."""
    s, per = st.shape, math.prod(st.shape[1:])
    d = s[-1]
    d2 = rng.choice(sorted({d, 4 * d, 3 * d} & set(range(64, 16385))))
    w, b = ch.attr("weight"), ch.attr("bias")
    ch.add(op, f"x = torch.addmm(self.{b}, x, self.{w})", 2 * d * d2, 4 * (per + d2),
           [f"self.{w} = nn.Parameter(torch.randn({d}, {d2}) * 0.02)", f"self.{b} = nn.Parameter(torch.zeros({d2}))"])
    return State("rows", [s[0], d2])


def _emit_softmax(ch, st, op, rng):
    per = math.prod(st.shape[1:])
    ch.add(op, "x = torch.softmax(x, dim=-1)", 10 * per, 8 * per)
    return State(st.layout, st.shape)


def _emit_reduce(ch, st, op, rng):
    s, per = st.shape, math.prod(st.shape[1:])
    if st.layout == "image" and rng.random() < 0.3:  # squeeze-excite: pool, keep the 1x1 map
        ch.add(op, f"x = x.{op}(dim=(2, 3), keepdim=True)", 2 * per, 4 * per)
        return State("image", [s[0], s[1], 1, 1], st.positive)
    dims = {3: "1", 4: "(1, 2)"}[len(s)] if st.layout == "tokens" else "(2, 3)"
    ch.add(op, f"x = x.{op}(dim={dims})", 2 * per, 4 * per)
    return State("rows", [s[0], s[-1] if st.layout == "tokens" else s[1]], st.positive)


def _emit_pool(ch, st, op, rng):
    s, per = st.shape, math.prod(st.shape[1:])
    if op == "adaptive_avg_pool2d":
        ch.add(op, "x = F.adaptive_avg_pool2d(x, 1).flatten(1)", 2 * per, 4 * per)
        return State("rows", [s[0], s[1]], st.positive)
    k = rng.choice([2, 3])
    pad = 1 if k == 3 else 0
    sp = [(n + 2 * pad - k) // 2 + 1 for n in s[2:]]
    ch.add(op, f"x = F.{op}(x, kernel_size={k}, stride=2, padding={pad})", k * k * per // 4, 5 * per)
    return State(st.layout, s[:2] + sp, st.positive)


def _emit_binary(ch, st, op, rng):
    s, per = st.shape, math.prod(st.shape[1:])
    if op == "add" and ch.residual == s and ch.ops and not ch.uses_identity and not ch.inputs:
        ch.add(op, "x = x + identity", per, 12 * per)
        ch.uses_identity = True  # one residual per block, as real blocks have
        return State(st.layout, s)
    if op == "mul" and rng.random() < 0.3:  # a fixed scale (attention's 1/sqrt(d), a residual scale)
        ch.add(op, f"x = x * {rng.choice([0.125, 0.5, 0.7071, 2.0])}", per, 8 * per)
        return State(st.layout, s, st.positive)
    a = ch.attr({"add": "bias", "sub": "shift", "mul": "scale"}[op])
    param = [s[1], 1, 1] if st.layout == "image" else ([s[1], 1] if st.layout == "signal" else [s[-1]])
    init = "torch.rand" if op == "mul" else "torch.randn"
    sym = {"add": "+", "sub": "-", "mul": "*"}[op]
    ch.add(op, f"x = x {sym} self.{a}", per, 8 * per,
           [f"self.{a} = nn.Parameter({init}({', '.join(map(str, param))}){' + 0.5' if op == 'mul' else ''})"])
    return State(st.layout, s, st.positive and op == "mul")


def _emit_norm(ch, st, op, rng):
    s, per = st.shape, math.prod(st.shape[1:])
    a = ch.attr({"layer_norm": "norm", "batch_norm": "bn", "group_norm": "gn"}[op])
    if op == "layer_norm":
        init = f"nn.LayerNorm({s[-1]}{_kw(rng, 0.2, 'elementwise_affine=False')})"
    elif op == "group_norm":
        groups = next(g for g in (32, 16, 8, 4, 2, 1) if s[1] % g == 0)
        init = f"nn.GroupNorm({groups}, {s[1]}{_kw(rng, 0.2, 'affine=False')})"
    else:
        # Batch statistics without running buffers: no bookkeeping op, same output every call.
        cls = {"image": "nn.BatchNorm2d", "signal": "nn.BatchNorm1d", "rows": "nn.BatchNorm1d"}[st.layout]
        init = f"{cls}({s[1]}, track_running_stats=False{_kw(rng, 0.2, 'affine=False')})"
    ch.add(op, f"x = self.{a}(x)", 8 * per, 12 * per, [f"self.{a} = {init}"])
    return State(st.layout, s)


EMITTERS = {"linear": _emit_linear, "conv2d": _emit_conv, "conv1d": _emit_conv, "softmax": _emit_softmax,
            "mean": _emit_reduce, "sum": _emit_reduce, "adaptive_avg_pool2d": _emit_pool, "max_pool2d": _emit_pool,
            "avg_pool2d": _emit_pool, "add": _emit_binary, "mul": _emit_binary, "sub": _emit_binary,
            "div": _emit_scalar, "clamp": _emit_scalar, "pad": _emit_pad, "matmul": _emit_scores, "bmm": _emit_scores,
            "addmm": _emit_addmm, "cat": _emit_cat, "layer_norm": _emit_norm,
            "batch_norm": _emit_norm, "group_norm": _emit_norm, **{u: _emit_unary for u in UNARY}}


def _emit(ch, st, op, rng):
    if op not in EMITTERS:
        raise ValueError(f"the graph grammar has no op {op!r}")
    return EMITTERS[op](ch, st, op, rng)


def _emit_exotic(g, ch, st, rng):
    """One crawled op real models do not use, where its domain holds; the state is unchanged
    (only shape-preserving pure ops qualify). None when none fits here."""
    pool = [s for s in g.exotic if st.positive or not s["spec"]["inputs"][0][1].startswith("torch.rand(")]
    rng.shuffle(pool)
    for seed in pool[:24]:
        if _shape_preserving(seed):
            per = math.prod(st.shape[1:])
            ch.add(seed["name"], f"x = {seed['spec']['forward']}", 10 * per, 8 * per)
            ch.seed_ids.append(seed["id"])
            return State(st.layout, st.shape)
    return None


def _shape_preserving(seed):
    ins = [i.get("shape") for i in seed.get("inputs") or []]
    outs = [o.get("shape") for o in seed.get("outputs") or []]
    return len(ins) == 1 and len(outs) == 1 and ins[0] == outs[0] and seed["outputs"][0].get("dtype") == "float32"


# -- one candidate ------------------------------------------------------------------------------
def _start(g, rng, anchor):
    """The input layout of the chain: the anchor's, with widths drawn from the real table."""
    dev = g.device
    layout = rng.choice(ANCHOR_LAYOUT[anchor]) if anchor else rng.choice(("tokens", "tokens", "image", "rows"))
    if layout == "tokens" and anchor == "linear" and rng.random() < 0.25:  # channel-last maps (Swin, ConvNeXt)
        return State(layout, [1, *[rng.choice(SPATIAL[dev])] * 2, rng.choice([w for w in g.hidden if w <= 1536])])
    if layout == "tokens":
        return State(layout, [1, rng.choice(SEQ[dev]), rng.choice(g.hidden)])
    if layout == "rows":
        return State(layout, [1, rng.choice(g.hidden)])
    if layout == "image":
        return State(layout, [1, rng.choice(g.channels[:max(1, len(g.channels) * 2 // 3)]), rng.choice(SPATIAL[dev])])
    if layout == "signal":
        return State(layout, [1, rng.choice(g.signal_channels[:6]), rng.choice((256, 512, 1024, 2048))])
    heads, dh = rng.choice(g.heads)
    return State("heads", [1, heads, rng.choice(SEQ[dev]), dh])


def _square(st):
    if st.layout == "image":
        return State(st.layout, st.shape + [st.shape[-1]])
    return st


def build_chain(g, rng, k, anchored, exotic):
    """(Chain, input State) of k ops: a heavy anchor (when `anchored`) with a prologue of 0-1 op
    before it, the rest walked along real edges; one exotic op when `exotic`."""
    anchor = rng.choices(HEAVY, weights=ANCHOR_WEIGHTS)[0] if anchored else None
    st0 = _square(_start(g, rng, anchor))
    ch = Chain()
    ch.residual, ch.uses_identity, ch.seed_ids = st0.shape, False, []
    st, prev, heavy_left = st0, None, 2 if anchored else 0
    # The anchor's position: after one prologue op in 30% of chains (not attention, whose q/k/v
    # are the chain's inputs), -1 when the chain has no anchor.
    pre = -1 if not anchored else int(k >= 2 and rng.random() < 0.3 and anchor != "scaled_dot_product_attention")
    exotic_at = rng.choice([i for i in range(k) if i != pre]) if exotic and k > 1 else -1
    for i in range(k):
        if i == exotic_at and (nxt := _emit_exotic(g, ch, st, rng)) is not None:
            st, prev = nxt, ch.ops[-1]
            continue
        if i == pre:
            op = anchor
        elif i < pre:
            op = _prologue(g, rng, st, anchor)
        else:
            op = g.next_op(rng, st, prev, heavy_left if i > pre else 0, ch)
        if op == "scaled_dot_product_attention":
            st = _emit_attention(ch, st, rng)
        else:
            st = _emit(ch, st, op, rng)
        heavy_left -= op in HEAVY
        prev = op
    return ch, st0


def _prologue(g, rng, st, anchor):
    """An op real models put before `anchor` that keeps the shape (a norm, an activation, a bias)."""
    cands = [o for o in g.applicable(st, None, 0) if o in UNARY or o in ("layer_norm", "batch_norm", "group_norm", "add")]
    weights = [g.edges.get(c, {}).get(anchor, 0) for c in cands]
    return rng.choices(cands, weights=weights)[0] if sum(weights) else rng.choice(cands)


def _emit_attention(ch, st, rng):
    b, h, s, dh = st.shape
    ch.inputs = ["q", "k", "v"]
    ch.add("scaled_dot_product_attention", f"x = F.scaled_dot_product_attention(q, k, v{_kw(rng, 0.5, 'is_causal=True')})",
           4 * h * s * s * dh, 16 * h * s * dh)
    # Heads back to tokens, as every attention block does before its output projection (a view).
    ch.fwd.append(f"x = x.transpose(1, 2).reshape(x.shape[0], {s}, {h * dh})")
    return State("tokens", [b, s, h * dh])


def estimate_ms(g, ch, batch):
    gflops, gbs, per_op = DEVICES[g.device]
    flops = sum(f for f, _ in ch.cost) * batch
    nbytes = sum(b for _, b in ch.cost) * batch
    return flops / (gflops * 1e6) + nbytes / (gbs * 1e6) + per_op * len(ch.cost)


def pick_batch(g, ch, st0, target_ms):
    """The power of two batch (at least 2: batch statistics need two rows) whose estimate is
    nearest target_ms, within the memory cap; None if even batch 2 is over 4x the target (the
    caller draws other sizes)."""
    if estimate_ms(g, ch, 2) > 4 * target_ms:
        return None
    best = 2
    cap = MAX_NUMEL[g.device]
    for b in (2 ** i for i in range(1, MAX_BATCH[g.device].bit_length())):
        if st0.numel(b) * 3 > cap or max(c[1] for c in ch.cost) * b / 4 > cap:
            break
        if abs(math.log(estimate_ms(g, ch, b) / target_ms)) < abs(math.log(estimate_ms(g, ch, best) / target_ms)):
            best = b
    return best


def render(ch, st0, batch):
    shape = ", ".join(["batch_size"] + [str(d) for d in st0.shape[1:]])
    names = ch.inputs or ["x"]
    inputs = [(n, f"torch.randn({shape})") for n in names]
    fwd = (["identity = x"] if ch.uses_identity else []) + ch.fwd + ["return x"]
    title = "graph: " + " -> ".join(ch.ops)
    return codegen.render(title=title, sizes={"batch_size": batch}, inputs=inputs, forward=fwd, init_lines=ch.init)


def graph_candidate(g, rng, k, target_ms, anchor_share, exotic_share):
    for _ in range(6):
        anchored = k >= 2 and rng.random() < anchor_share or k == 1 and rng.random() < 0.5
        ch, st0 = build_chain(g, rng, k, anchored, k >= 2 and rng.random() < exotic_share)
        batch = pick_batch(g, ch, st0, target_ms)
        if batch is not None:
            break
    else:
        return {"ok": False, "reason": "no_size_fits", "message": f"no drawn size of a {k}-op chain fits {target_ms} ms"}
    code = render(ch, st0, batch)
    return {"ok": True, "code": code, "normalized": normalize_code(code), "source": "torch", "num_ops": len(ch.ops),
            "ops": ch.ops, "seed_ids": ch.seed_ids, "free_sizes": ["batch_size"],
            "estimated_ms": round(estimate_ms(g, ch, batch), 3), "batch_size": batch,
            "anchored": any(o in HEAVY for o in ch.ops)}


_GRAMMARS = {}


def compose_graph(seeds, sizes, seed, block, start, mix, stats_path, target_ms=10.0, seeds_key=None, device="cpu",
                  anchor_share=0.95, exotic_share=0.05, edge_smoothing=0.5, end=None, crashed=()):
    """Handler `compose_graph`: the graph backend's candidates of one block (compose.compose_block).
    A worker keeps the grammar of the last (stats, seeds, device), like the template's Composer."""
    key = (stats_path, seeds_key, device, edge_smoothing)
    g = _GRAMMARS.get(key)
    if g is None:
        import json

        with open(stats_path) as f:
            g = Grammar(json.load(f), device, seeds, sizes, edge_smoothing)
        _GRAMMARS.clear()
        _GRAMMARS[key] = g

    def make(rng, bucket, vary):
        if not bucket.isdigit():
            return module_candidate(_composer(seeds, sizes, seeds_key), rng, bucket, target_ms, vary)
        return graph_candidate(g, rng, int(bucket), target_ms, anchor_share, exotic_share)

    return compose_block(make, seed, block, start, mix, end, crashed)
