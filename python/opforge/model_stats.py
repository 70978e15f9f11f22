"""Real-model statistics: the op vocabulary, pairs, dataflow edges and layouts of real forwards.

`opforge model-stats` sends one `trace_family` request per entry of
data/real_models/families.json (a crash or a hang costs that family only, and is recorded), then
one `merge_stats` with every trace; the result is data/real_models/stats.json, which the realism
figures (opforge.realism) and the graph composer read. Families are built from their default
config (real widths) with few layers, on the meta device: no weights, no memory, no compute.
"""
import collections
import math

import torch
import torch.nn as nn

from opforge import realism as R

LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "encoder_layers", "decoder_layers",
              "num_decoder_layers")
TOP_SHAPES = 12  # shapes kept per op: enough to see its layouts and size range


def image_size(cfg):
    size = getattr(cfg, "image_size", 224)
    if isinstance(size, (list, tuple)):
        size = size[0]
    return size if isinstance(size, int) and size > 0 else 224


def _config(model_type, layers, overrides=None):
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, **(overrides or {}))
    for key in LAYER_KEYS:
        if isinstance(getattr(cfg, key, None), int) and getattr(cfg, key) > layers:
            setattr(cfg, key, layers)
    # Routed experts: the eager loop indexes by data (nonzero), which meta tensors cannot answer;
    # batched_mm computes the same expert GEMMs with gathers.
    cfg._experts_implementation = "batched_mm"
    return cfg


def _eval_inputs(exprs, sizes, cfg=None):
    ns = {"torch": torch, "cfg": cfg, "image_size": image_size, **sizes}
    if isinstance(exprs, dict):
        return {k: eval(v, ns) for k, v in exprs.items()}  # noqa: S307 - our own data file
    return [eval(v, ns) for v in exprs]  # noqa: S307


def _build(entry, spec, sizes, device, overrides=None):
    with torch.device(device):
        if isinstance(entry, dict):  # a torch module
            return eval(entry["init"], {"torch": torch, "nn": nn}), _eval_inputs(entry["inputs"], sizes)  # noqa: S307
        from transformers import AutoModel

        name, modality = entry
        cfg = _config(name, spec["layers"], overrides)
        inputs = spec["inputs"].get(modality, spec["inputs"]["text"])
        return AutoModel.from_config(cfg), _eval_inputs(inputs, sizes, cfg)


def _run(model, feed):
    model.eval()
    tracer = R.RealismTracer()
    with torch.no_grad(), tracer:
        model(**feed) if isinstance(feed, dict) else model(*feed)
    return tracer


def trace_family(spec, entry):
    """Traces one entry of families.json: [model_type, modality] (a transformers family) or
    {"name", "init", "inputs"} (a torch module); returns its ops, pairs, edges and shapes counted.
    On meta first; a forward that reads its data is traced on the CPU from `spec["fallback"]`."""
    try:
        tracer, device = _run(*_build(entry, spec, spec["sizes"], "meta")), "meta"
    except RuntimeError as e:
        if "meta" not in str(e):
            raise
        fb = spec["fallback"]
        torch.manual_seed(0)
        tracer, device = _run(*_build(entry, spec, fb["sizes"], "cpu", fb["config"])), "cpu-tiny"
    named = isinstance(entry, dict)
    return _counted(tracer, entry["name"] if named else entry[0], "torch" if named else entry[1], device)


def _counted(tracer, name, modality, device):
    shapes = collections.defaultdict(collections.Counter)
    if device == "meta":  # the fallback's small widths are not the family's layouts
        for op, s in zip(tracer.ops, tracer.shapes):
            shapes[op][str(s)] += 1
    return {
        "family": name, "modality": modality, "device": device,
        "ops": dict(collections.Counter(tracer.ops)),
        "pairs": dict(collections.Counter(f"{a} -> {b}" for a, b in zip(tracer.ops, tracer.ops[1:]))),
        "edges": dict(collections.Counter(f"{a} -> {b}" for a, b in tracer.edges)),
        "shapes": {op: dict(c) for op, c in shapes.items()},
    }


def merge_stats(traces, provenance):
    """One table from the families' traces: counts summed, each op's shapes reduced to its
    layouts (rank -> count) and its most frequent shapes, the families that use each op."""
    ops, pairs, edges = collections.Counter(), collections.Counter(), collections.Counter()
    shapes = collections.defaultdict(collections.Counter)
    used_by = collections.defaultdict(set)
    edge_families = collections.Counter()
    for tr in traces:
        ops.update(tr["ops"])
        pairs.update(tr["pairs"])
        edges.update(tr["edges"])
        edge_families.update(tr["edges"].keys())
        for op, c in tr["shapes"].items():
            shapes[op].update(c)
            used_by[op].add(tr["family"])
    return {
        "provenance": provenance,
        "ops": _sorted(ops), "pairs": _sorted(pairs), "edges": _sorted(edges),
        # Counts follow loops (an SSM's scan repeats its ops per step); how many families use an
        # op or an edge is the weight that says how common it is across models.
        "families_per_op": {op: len(used_by[op]) for op in sorted(used_by)},
        "families_per_edge": _sorted(edge_families),
        "layouts": {op: _layout(shapes[op]) for op in sorted(shapes)},
    }


def _sorted(counter):
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def _layout(shape_counts):
    ranks = collections.Counter()
    for s, n in shape_counts.items():
        ranks[R.layout_of(eval(s))] += n  # noqa: S307 - str() of a list of ints, written above
    top = sorted(shape_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_SHAPES]
    sizes = [math.prod(eval(s)) for s in shape_counts]  # noqa: S307
    return {"ranks": _sorted(ranks), "shapes": dict(top),
            "log2_numel": [round(math.log2(max(1, min(sizes))), 1), round(math.log2(max(1, max(sizes))), 1)]}
