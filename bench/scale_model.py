#!/usr/bin/env python3
"""Issue #16's scale model: from the per-stage rates measured on the H200 machine (docs/gpu.md),
the predicted wall time and GPU-hours of a 6K, 60K and 600K corpus (tasks kept after dedup) on
1, 8, 64 and 512 GPUs, and which part binds each configuration. Every input says whether it was
measured (and where) or modelled; nothing here is run.

  python3 bench/scale_model.py [--filter-rate 157.5] [--kept-share 0.295] [--out bench/results/scale]

Prints a markdown table (stdout) and writes OUT.md and OUT.png (wall time against GPUs).

The layout it models is issue #16's: the crawl once, then per shard (one GPU each, on nodes of
8 GPUs) compose and filter on node-local disk, then one merge, dedup and export on one node.
"""
import argparse
import math
import os

# (value, unit, "measured: where" or "modelled: why")
INPUTS = {
    "filter_per_gpu_min": (157.5, "judged/min per H200, 16 workers", "measured: 18th session, ops6k 1,000, candidates 100-600"),
    "accept_share": (0.959, "accepted / drawn", "measured: 18th session, 985 of 1,027 drawn"),
    "kept_share": (0.295, "kept after dedup / drawn", "measured: 18th session, 303 of 1,027 (484 exact duplicates)"),
    "compose_per_node_s": (42.0, "candidates/s, 8 workers, 16 cores", "measured: 17th session, 1,000 in 23.9 s"),
    "crawl_s": (20.0, "s, once (copied to every shard)", "measured: 17th session, from the committed crawl"),
    "cpu_s_per_task": (3.5, "CPU-seconds per judged task outside the GPU lock", "modelled: compile 1.43 s + build, "
                       "checks' and inputs' host work ~2 s (17th session phases, lock waits taken out by estimate)"),
    "cores_per_gpu": (16.0, "cores per GPU on the node", "measured: the H200 machine (16 cores, 1 GPU)"),
    "dedup_features_per_s": (240.0, "tasks/s, 16 cores", "measured: 17th session, dedup of 988 in 4.1 s"),
    "dedup_search_100k_s": (16.3, "s for 100k tasks x 10k references, 16 cores", "measured: docs/gpu.md, dedupscale"),
    "dedup_bytes_per_task": (4096.0 * 2, "bytes of vectors per task (1,024 floats, index copy)", "modelled: dims 1024"),
    "export_per_s": (21.0, "records/s with realism and plots, one process", "measured: 17th session, 305 in 14.4 s"),
    "db_bytes_per_task": (10_000.0, "bytes per candidate in a workspace", "measured: 13.7 MB for 1,000 candidates "
                          "with 3,742 seeds (17th session)"),
    "merge_bytes_per_s": (50e6, "bytes/s merged into one SQLite file", "modelled: SQLite bulk insert on one NVMe"),
    "node_memory_bytes": (512e9, "bytes of RAM on the merge node", "modelled: a typical 8-GPU node"),
}
SIZES = (6_000, 60_000, 600_000)
CAVEATS = """## What this does not show

- The kept share (29.5%) was measured on 1,027 candidates. Most candidates are 2-op chains (Ops-6K's
  mix), of which real models have few distinct structures: exact dedup drops more as the corpus
  grows, so at 60K and 600K the share falls unless the mix moves to longer chains. The candidates
  column is a floor.
- The filter's rate is one H200's with 16 workers and 16 cores (157.5 judged a minute, one exclusive
  GPU section per task). Since then the filter skips twins of accepted tasks without running them,
  which makes drawn candidates cheaper than this rate says; not measured on a GPU yet.
- Merge, dedup and export are modelled on one node; export's realism tracing, one process today,
  binds past ~64 GPUs and is the first thing to parallelise. Dedup's vectors fit a node's memory
  at every size here.
- Nothing of Slurm's or Ray's scheduling, staging or start-up cost is in it.
"""
GPUS = (1, 8, 64, 512)


def v(name, over):
    return over.get(name, INPUTS[name][0])


def stages(kept, gpus, over):
    """Seconds per stage for `kept` tasks on `gpus` GPUs (one shard per GPU, 8 GPUs a node)."""
    drawn = kept / v("kept_share", over)
    nodes = max(1, math.ceil(gpus / 8))
    filt_gpu = drawn / (v("filter_per_gpu_min", over) * gpus) * 60
    # The filter's host work per task must fit the node's cores: past that the CPU binds it.
    filt_cpu = drawn * v("cpu_s_per_task", over) / (v("cores_per_gpu", over) * gpus)
    accepted = drawn * v("accept_share", over)
    search = v("dedup_search_100k_s", over) * (accepted / 1e5) * max(1.0, math.log10(max(accepted, 10)) / 5)
    return {
        "crawl": v("crawl_s", over),
        "compose": drawn / (v("compose_per_node_s", over) * nodes),
        "filter": max(filt_gpu, filt_cpu),
        "filter_bound": "GPU timing lock" if filt_gpu >= filt_cpu else "compile / host CPU",
        "merge": drawn * v("db_bytes_per_task", over) / v("merge_bytes_per_s", over) if gpus > 1 else 0.0,
        "dedup": accepted / v("dedup_features_per_s", over) + search,
        "dedup_memory_gb": accepted * v("dedup_bytes_per_task", over) / 1e9,
        "export": kept / v("export_per_s", over),
        "drawn": drawn,
    }


def row(kept, gpus, over):
    s = stages(kept, gpus, over)
    total = sum(s[k] for k in ("crawl", "compose", "filter", "merge", "dedup", "export"))
    serial = {"merge": s["merge"], "dedup": s["dedup"], "export": s["export"]}
    parts = {"filter (" + s["filter_bound"] + ")": s["filter"], **serial, "compose": s["compose"]}
    bound = max(parts, key=parts.get)
    if s["dedup_memory_gb"] > v("node_memory_bytes", over) / 1e9:
        bound = "dedup memory"
    return {"kept": kept, "gpus": gpus, "drawn": s["drawn"], "wall_h": total / 3600,
            "gpu_h": s["filter"] * gpus / 3600, "bound": bound, "share_filter": s["filter"] / total,
            "dedup_gb": s["dedup_memory_gb"]}


def table(rows):
    out = ["| kept | GPUs | candidates | wall (h) | GPU-hours (filter) | filter's share of wall | dedup vectors (GB) | bound by |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['kept']:,} | {r['gpus']} | {r['drawn']:,.0f} | {r['wall_h']:.2f} | {r['gpu_h']:.1f} | "
                   f"{100 * r['share_filter']:.0f}% | {r['dedup_gb']:.1f} | {r['bound']} |")
    return "\n".join(out)


def inputs_table(over):
    out = ["| input | value | unit | source |", "| --- | --- | --- | --- |"]
    for k, (val, unit, src) in INPUTS.items():
        out.append(f"| {k} | {over.get(k, val):g} | {unit} | {src}{' (overridden)' if k in over else ''} |")
    return "\n".join(out)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for kept in SIZES:
        rs = [r for r in rows if r["kept"] == kept]
        ax.plot([r["gpus"] for r in rs], [r["wall_h"] for r in rs], marker="o", label=f"{kept:,} kept")
    ax.set(xscale="log", yscale="log", xlabel="GPUs (H200, 8 per node)", ylabel="wall time (hours)",
           title="opforge corpus regeneration: modelled from measured rates")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--filter-rate", type=float, help="judged/min per GPU instead of the measured 157.5")
    ap.add_argument("--kept-share", type=float, help="kept/drawn instead of the measured 0.295")
    ap.add_argument("--out", help="OUT.md and OUT.png (default: print only)")
    a = ap.parse_args()
    over = {}
    if a.filter_rate:
        over["filter_per_gpu_min"] = a.filter_rate
    if a.kept_share:
        over["kept_share"] = a.kept_share
    rows = [row(k, g, over) for k in SIZES for g in GPUS]
    text = "## Predicted\n\n" + table(rows) + "\n\n## Inputs\n\n" + inputs_table(over) + "\n\n" + CAVEATS
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out + ".md", "w") as f:
            f.write("# Scale model (bench/scale_model.py)\n\n" + text)
        plot(rows, a.out + ".png")


if __name__ == "__main__":
    main()
