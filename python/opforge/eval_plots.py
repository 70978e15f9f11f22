"""The PNG of an `opforge eval` report (request "eval_plots"): the reward histogram and the
speed-up of every correct solution over eager and torch.compile, matplotlib's Agg backend."""
import os

_META = {"Software": None}


def eval_plots(report, out_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    hist = report["summary"]["reward_histogram"]
    labels = ["-1", "1", "2", "3"]
    values = [hist.get(k, 0) for k in labels]
    bars = ax1.bar(labels, values, color=["#c44", "#888", "#4a4", "#26c"])
    for b, v in zip(bars, values):
        ax1.annotate(str(v), (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    ax1.set_xlabel("reward")
    ax1.set_ylabel("solutions")
    ax1.set_title(f"reward ({report['summary']['evaluated']} solutions)")

    rows = [r for r in report["results"] if r.get("correct") and r.get("speedup_eager")]
    rows.sort(key=lambda r: r["speedup_eager"])
    xs = range(len(rows))
    ax2.set_yscale("log")
    ax2.scatter(xs, [r["speedup_eager"] for r in rows], label="vs eager", s=14)
    comp = [(i, r["speedup_compile"]) for i, r in enumerate(rows) if r.get("speedup_compile")]
    if comp:
        ax2.scatter([i for i, _ in comp], [v for _, v in comp], label="vs torch.compile", s=14, marker="x")
    margin = report["options"]["speedup_margin"]
    ax2.axhline(1.0 + margin, color="#999", lw=0.8, ls="--", label=f"1 + margin ({margin:g})")
    ax2.set_xlabel("correct solutions (sorted)")
    ax2.set_ylabel("speed-up (log)")
    ax2.set_title("speed-up of correct solutions")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, metadata=_META)
    plt.close(fig)
    return [out_path]
