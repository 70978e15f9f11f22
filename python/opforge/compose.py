"""The `template` composer: fuse 1-5 crawled seed ops into one KernelBench-format task.

Deterministic and offline. Candidate `index` of a run with RNG seed `seed` depends only on
(seed, index, the seeds, the mix): the same inputs give the same candidates, and a resumed run
continues at the next index. Each op is chained onto the previous op's output only after it has
actually run on a tensor of that shape (a small CPU check), so chains are shape-correct by
construction; where no op fits, an explicit flatten adapter is inserted and recorded.
"""
import math
import random
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from opforge import codegen
from opforge.normalize import normalize_code

# Ops that would make a chain random, scalar or trivial are not composed.
EXCLUDED_CATEGORIES = {"dropout", "loss", "unclassified", "rnn", "transformer", "sparse", "attention"}
# Pure layout/view ops compute nothing: a chain of them is no kernel worth writing, so they are
# not sampled (the composer's own flatten adapter is added only where shapes require it).
LAYOUT_ONLY = {
    "torch.reshape", "torch.flatten", "torch.t", "torch.ravel", "torch.permute", "torch.transpose", "torch.movedim",
    "torch.swapaxes", "torch.unflatten", "torch.squeeze", "torch.unsqueeze", "torch.clone", "torch.conj",
    "torch.resolve_neg", "torch.positive", "torch.atleast_3d", "torch.narrow", "torch.select", "torch.broadcast_to",
    "torch.expand_copy", "torch.nn.Flatten", "torch.nn.Unflatten", "torch.nn.Identity", "torch.narrow_copy",
}
MAX_NUMEL = 1 << 22          # an op that blows a small probe tensor past this is not chained
MAX_INPUT_NUMEL = 1 << 25    # size targeting never asks for more input elements than this
GOLDEN = (math.sqrt(5) - 1) / 2
ATTEMPTS = 12
FLATTEN = {"name": "torch.flatten", "kind": "adapter", "forward": "torch.flatten(x, 1)", "init_lines": [],
           "init_params": [], "init_values": [], "inputs": []}


class Composer:
    def __init__(self, seeds, sizes):
        self.sizes = sizes
        self.torch_ops = []
        # Whole-module seeds per source (transformers, local, registered sources): the mix
        # bucket named after the source composes them as single-module tasks.
        self.modules = {}
        for s in seeds:
            if s["source"] != "torch":
                if s["source"] != "transformers" or len(s.get("inputs") or []) == 1:
                    self.modules.setdefault(s["source"], []).append(s)
                continue
            spec = s.get("spec")
            outs = s.get("outputs") or []
            if (not spec or s.get("category") in EXCLUDED_CATEGORIES or s["name"] in LAYOUT_ONLY or len(spec["inputs"]) != 1
                    or not spec["inputs"][0][1].startswith(("torch.randn", "torch.rand(")) or len(outs) != 1
                    or outs[0].get("dtype") != "float32" or math.prod(outs[0]["shape"]) <= 1):
                continue
            self.torch_ops.append(s)
        self.torch_ops.sort(key=lambda s: s["name"])
        for mods in self.modules.values():
            mods.sort(key=lambda s: s["name"])
        self._fit = {}

    # -- shape propagation by execution ----------------------------------------------------------
    def _namespace(self):
        return {"torch": torch, "nn": nn, "F": F, **self.sizes}

    def fit(self, spec, shape):
        """Output shape of `spec` applied to a float tensor of `shape`, or None if it does not run."""
        key = (spec["name"], tuple(shape))
        if key in self._fit:
            return self._fit[key]
        out = None
        try:
            ns = self._namespace()
            mod = nn.Module()
            for p, v in zip(spec["init_params"], spec["init_values"]):
                ns[p] = eval(v, ns)  # noqa: S307 - rule values written by us
            for line in spec["init_lines"]:
                exec(line, {**ns, "self": mod})  # noqa: S102
            torch.manual_seed(0)
            x = torch.randn(*shape)
            with torch.no_grad():
                y = eval(spec["forward"], {**ns, "self": mod, "x": x})  # noqa: S307
            # Ops that multiply the data (outer, kron, cartesian products) would explode once the
            # batch is scaled up for timing: not chained.
            if (isinstance(y, torch.Tensor) and y.dtype == torch.float32 and 1 < y.numel() <= MAX_NUMEL
                    and y.numel() <= 8 * x.numel()):
                out = list(y.shape)
        except Exception:  # noqa: BLE001 - not fitting is the expected answer
            out = None
        self._fit[key] = out
        return out

    def input_shape(self, spec):
        ns = self._namespace()
        torch.manual_seed(0)
        return list(eval(spec["inputs"][0][1], ns).shape)  # noqa: S307

    # -- one candidate ---------------------------------------------------------------------------
    def chain(self, rng, k):
        for _ in range(8):
            first = rng.choice(self.torch_ops)
            shape = self.fit(first["spec"], self.input_shape(first["spec"]))
            if shape is not None:
                break
        else:
            return None, "first_op_does_not_run"
        ops = [first]
        while len([o for o in ops if o is not FLATTEN]) < k:
            picked = None
            for cand in rng.sample(self.torch_ops, min(48, len(self.torch_ops))):
                out = self.fit(cand["spec"], shape)
                if out is not None:
                    picked = (cand, out)
                    break
            if picked is None:
                if len(shape) > 2 and (not ops or ops[-1] is not FLATTEN):
                    ops.append(FLATTEN)
                    shape = [shape[0], math.prod(shape[1:])]
                    continue
                return None, "no_compatible_op"
            ops.append(picked[0])
            shape = picked[1]
        return ops, None

    def render_chain(self, ops, batch_size):
        params, values, init_lines, fwd_lines, attr_names = [], [], [], [], set()
        for i, op in enumerate(ops):
            spec = op if op is FLATTEN else op["spec"]
            base = re.sub(r"\W", "_", spec["name"].rsplit(".", 1)[-1]).lower()
            attr_map = {}
            # Attributes the op defines: assigned ones and registered buffers (not methods).
            joined = " ".join(spec["init_lines"])
            defined = set(re.findall(r"self\.(\w+)\s*=", joined)) | set(re.findall(r"register_buffer\('(\w+)'", joined))
            for attr in sorted(defined):
                new = base if attr == "op" else f"{base}_{attr}"
                n, j = new, 2
                while n in attr_names:
                    n, j = f"{new}_{j}", j + 1
                attr_names.add(n)
                attr_map[attr] = n
            pmap = {}
            for p, v in zip(spec["init_params"], spec["init_values"]):
                if p in params and values[params.index(p)] == v:
                    pmap[p] = p
                    continue
                n, j = p, 2
                while n in params:
                    n, j = f"{p}_{j}", j + 1
                params.append(n)
                values.append(v)
                pmap[p] = n

            def sub(text):
                text = re.sub(r"self\.(\w+)", lambda m: "self." + attr_map.get(m.group(1), m.group(1)), text)
                text = re.sub(r"register_buffer\('(\w+)'", lambda m: f"register_buffer('{attr_map.get(m.group(1), m.group(1))}'", text)
                for p, n in pmap.items():
                    if p != n:
                        text = re.sub(rf"(?<![\w.]){re.escape(p)}\b(?!\s*=[^=])", n, text)
                return text

            init_lines += [sub(line) for line in spec["init_lines"]]
            fwd_lines.append(f"x = {sub(spec['forward'])}")
        fwd_lines.append("return x")
        first = ops[0]["spec"]
        sizes = dict(self.sizes)
        sizes["batch_size"] = batch_size
        names = " -> ".join(o["name"] if o is FLATTEN else o["spec"]["name"] for o in ops)
        return codegen.render(title=f"{names}", sizes=sizes, inputs=[("x", first["inputs"][0][1])],
                              forward=fwd_lines, init_params=params, init_lines=init_lines, init_values=values)

    def target_batch(self, est_ms, input_numel, target_ms, base):
        """Scale the batch so the estimated time lands near target_ms (the filter refines it)."""
        if est_ms <= 0:
            return base
        factor = max(1.0, target_ms / est_ms)
        b = base * 2 ** round(math.log2(factor))
        while b > 1 and input_numel * b / base > MAX_INPUT_NUMEL:
            b //= 2
        return int(max(1, min(b, 4096)))


def _bucket(index, mix, offset):
    u = (offset + index * GOLDEN) % 1.0
    acc = 0.0
    for name, p in mix:
        acc += p
        if u < acc:
            return name
    return mix[-1][0]


_COMPOSERS = {}


def _composer(seeds, sizes, seeds_key):
    """The Composer of these seeds; a worker keeps the last one, so its shape cache survives."""
    comp = _COMPOSERS.get(seeds_key) if seeds_key else None
    if comp is None:
        comp = Composer(seeds, sizes)
        if seeds_key:
            _COMPOSERS.clear()
            _COMPOSERS[seeds_key] = comp
    return comp


def compose_block(make, seed, block, start, mix, end=None, crashed=()):
    """Candidates for indices start..block[1]-1 (or ..end-1) of the fixed block [block[0],
    block[1]), by make(rng, bucket, vary) -> record; shared by the backends. Indices in `crashed`
    killed a worker before (a seed op that segfaults): they are skipped, and the supervisor
    records them, so replaying a block one index at a time gets past them.

    mix: [[bucket, probability], ...], buckets "1".."5" (fused ops) or a source's name (one of
    its whole-module seeds: "transformers", "local", a registered source). Duplicates are retried
    against what the block made before, so a block is generated from its first index even when
    only its tail is asked for: candidate i never depends on how runs were cut into requests."""
    offset = random.Random(f"mix:{seed}").random()
    seen = set()  # per request, so the outcome never depends on which worker ran what before
    out = []
    skip = set(crashed)
    for index in range(block[0], end or block[1]):
        if index in skip:
            continue
        bucket = _bucket(index, mix, offset)
        rec = {"index": index, "bucket": bucket}
        # A candidate equal to one already made here is retried with another draw (and, for the
        # one-op buckets where the pool is small, other sizes), so the mix is met with new tasks.
        for attempt in range(ATTEMPTS):
            rng = random.Random(f"{seed}:{index}" if attempt == 0 else f"{seed}:{index}:{attempt}")
            vary = attempt > 0 and rng.choice([1, 2, 4, 8])
            try:
                res = make(rng, bucket, vary)
            except Exception as e:  # noqa: BLE001 - a failed candidate is data
                res = {"ok": False, "reason": "compose_error", "message": f"{type(e).__name__}: {e}"}
            if res["ok"] and res["normalized"] in seen:
                res = {"ok": False, "reason": "duplicate", "message": f"{ATTEMPTS} draws gave known code"}
                continue
            break
        rec.update(res)
        if res["ok"]:
            seen.add(res["normalized"])
        if index >= start:
            out.append(rec)
    return out


def compose_template(seeds, sizes, seed, block, start, mix, target_ms=10.0, seeds_key=None, end=None, crashed=()):
    """Handler `compose_template`: the template backend's candidates of one block (compose_block)."""
    comp = _composer(seeds, sizes, seeds_key)

    def make(rng, bucket, vary):
        if not bucket.isdigit():
            return module_candidate(comp, rng, bucket, target_ms, vary)
        return _torch_candidate(comp, rng, int(bucket), target_ms, vary)

    return compose_block(make, seed, block, start, mix, end, crashed)


def _torch_candidate(comp, rng, k, target_ms, vary=0):
    if not comp.torch_ops:
        return {"ok": False, "reason": "no_torch_seeds", "message": "no runnable single-input torch seeds: run crawl"}
    ops, why = comp.chain(rng, k)
    if ops is None:
        return {"ok": False, "reason": why, "message": f"could not chain {k} ops"}
    real = [o for o in ops if o is not FLATTEN]
    est = sum(float(o.get("probe_ms") or 0.0) for o in real)
    numel = math.prod(comp.input_shape(real[0]["spec"]))
    base = comp.sizes.get("batch_size", 8)
    batch = comp.target_batch(est, numel, target_ms, base)
    if vary:
        batch = max(1, batch * vary // 2)
    code = comp.render_chain(ops, batch)
    return {"ok": True, "code": code, "normalized": normalize_code(code), "source": "torch", "num_ops": len(real),
            "ops": [o["name"] if o is FLATTEN else o["spec"]["name"] for o in ops],
            "seed_ids": [o["id"] for o in real],
            "free_sizes": ["batch_size"], "estimated_ms": est * batch / base, "batch_size": batch}


def module_candidate(comp, rng, source, target_ms, vary=0):
    """One whole-module seed of `source` as a task, its batch (and sequence) scaled to the target."""
    if not comp.modules.get(source):
        return {"ok": False, "reason": "no_module_seeds", "message": f"no runnable seeds of source {source!r}"}
    s = rng.choice(comp.modules[source])
    seq_mult = rng.choice([1, 2, 4, 8])
    code = s["code"]
    m = re.search(r"^seq_len = (\d+)$", code, re.M)
    if m:
        code = code.replace(m.group(0), f"seq_len = {int(m.group(1)) * seq_mult}", 1)
    m = re.search(r"^batch_size = (\d+)$", code, re.M)
    batch = int(m.group(1)) if m else 1
    est = float(s.get("probe_ms") or 0.0) * seq_mult
    if m:
        batch = comp.target_batch(est, 1, target_ms, batch) * (vary or 1)
        code = code.replace(m.group(0), f"batch_size = {batch}", 1)
    return {"ok": True, "code": code, "normalized": normalize_code(code), "source": source, "num_ops": 1,
            "ops": [s["name"]], "seed_ids": [s["id"]], "free_sizes": ["batch_size", "seq_len"],
            "estimated_ms": est * batch / 2, "batch_size": batch}
