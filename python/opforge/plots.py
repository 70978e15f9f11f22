"""PNG plots of `opforge export`'s stats (request "plots"), drawn with matplotlib's Agg backend.

Takes the stats dict export writes as stats/*.json and the folder to write into; returns the
files written. The PNG metadata carries no software version or date, so a rerun over the same
stats usually gives the same bytes (not promised: export's checksums leave the PNGs out).
"""
import os

_META = {"Software": None}


def _bar(plt, labels, values, title, xlabel, path, horizontal=False, log=False):
    fig, ax = plt.subplots(figsize=(8, max(3, 0.25 * len(labels) + 1) if horizontal else 4))
    if log:
        # Counts span thousands of seeds down to a handful of tasks: a log axis and the numbers
        # on the bars keep the small stages visible.
        ax.set_yscale("log")
        bars = ax.bar(range(len(labels)), [max(v, 0.8) for v in values])
        for b, v in zip(bars, values):
            ax.annotate(str(v), (b.get_x() + b.get_width() / 2, max(v, 0.8)), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("count (log)")
    elif horizontal:
        ax.barh(range(len(labels)), values)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("tasks")
    else:
        ax.bar(range(len(labels)), values)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("tasks")
        ax.set_xlabel(xlabel)
    ax.set_title(title)
    _save(plt, fig, path)


def _save(plt, fig, path):
    fig.tight_layout()
    fig.savefig(path, metadata=_META)
    plt.close(fig)


def _hist_labels(h):
    out = []
    for b in h["bins"]:
        to = b["to"]
        out.append(f"{b['from']:g}-{to:g}" if to is not None else f">={b['from']:g}")
    return out


def plots(stats, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []

    def path(name):
        p = os.path.join(out_dir, name)
        written.append(p)
        return p

    f = stats["funnel"]
    labels, values = [], []
    for k, v in sorted(f.get("seeds", {}).items()):
        labels.append(f"seeds {k}")
        values.append(v)
    labels += ["candidates", "filter accepted", "filter rejected", "dedup kept", "dedup dropped", "exported"]
    values += [f["candidates"]["total"], f["filter"]["accepted"], f["filter"]["rejected"], f["dedup"]["kept"],
               f["dedup"]["dropped"], f["exported"]["records"]]
    _bar(plt, labels, values, "funnel", "", path("funnel.png"), log=True)

    top = stats["op_frequency"][:40]
    _bar(plt, [x["op"] for x in top], [x["tasks"] for x in top], "op frequency (top 40)", "", path("op_frequency.png"),
         horizontal=True)
    opt = stats["ops_per_task"]
    _bar(plt, [str(x["num_ops"]) for x in opt], [x["tasks"] for x in opt], "ops per task", "traced ops",
         path("ops_per_task.png"))
    h = stats["eager_ms"]
    _bar(plt, _hist_labels(h), [b["tasks"] for b in h["bins"]], "eager time", "ms", path("eager_ms.png"))
    h = stats["similarity"]["ref_similarity"]
    _bar(plt, _hist_labels(h), [b["tasks"] for b in h["bins"]], "cosine to nearest KernelBench reference", "cosine",
         path("similarity.png"))
    if "realism" in stats:
        _realism(plt, stats["realism"], path("realism.png"))
    return {"files": written}


def _realism(plt, r, path):
    """The three realism figures of the corpus beside each reference's, as grouped bars."""
    sets = [("this dataset", r["corpus"])] + [(os.path.basename(k.rstrip("/")) or k, v) for k, v in r["references"].items()]
    keys = [("heavy_share", "heavy op"), ("vocab_share", "real ops"), ("pair_share", "real pairs")]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.set_title("how much the tasks look like real models")
    ax.set_ylim(0, 100)
    ax.set_ylabel("percent")
    width = 0.8 / len(sets)
    for i, (name, f) in enumerate(sets):
        xs = [k + i * width for k in range(len(keys))]
        ax.bar(xs, [f.get(key) or 0 for key, _ in keys], width, label=f"{name} ({f['tasks']})")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))])
    ax.set_xticklabels([label for _, label in keys])
    ax.legend(fontsize=7)
    _save(plt, fig, path)
