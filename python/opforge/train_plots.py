"""The trainer's plots (trainer/ calls `plot` through its embedded interpreter): one panel per
metric of a stage's metrics.jsonl, against the step."""
import json


def plot(arg):
    """{metrics: path of metrics.jsonl, out: png path, title, keys: [metric names]} -> {written}"""
    req = json.loads(arg)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(req["metrics"]) if line.strip()]
    keys = [k for k in req["keys"] if any(k in r for r in rows)]
    if not rows or not keys:
        return json.dumps({"written": False})
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, k in zip(axes[0], keys):
        pts = [(r["step"], r[k]) for r in rows if k in r and r[k] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None)
        ax.set_xlabel("step")
        ax.set_title(k)
        ax.grid(alpha=0.3)
    fig.suptitle(req.get("title", ""))
    fig.tight_layout()
    fig.savefig(req["out"], dpi=110)
    plt.close(fig)
    return json.dumps({"written": True})
