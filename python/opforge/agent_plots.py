"""The PNG of an `opforge agent` summary: rewards and how episodes ended (matplotlib, Agg).
    python -m opforge.agent_plots SUMMARY.json OUT.png"""
import json
import sys


def agent_plots(summary, out_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = ["-1", "1", "2", "3"]
    values = [summary["reward_histogram"].get(k, 0) for k in labels]
    ax1.bar(labels, values, color=["#c44", "#888", "#4a4", "#26c"])
    ax1.set_xlabel("final reward")
    ax1.set_ylabel("episodes")
    ax1.set_title(f"{summary['episodes']} episodes, pass rate {100 * summary['pass_rate']:.0f}%")
    ends = summary.get("endings") or {}
    ax2.barh(list(ends), list(ends.values()), color="#678")
    ax2.set_xlabel("episodes")
    ax2.set_title(f"how episodes ended (mean {summary['mean_turns']:.1f} turns)")
    fig.tight_layout()
    fig.savefig(out_path, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        agent_plots(json.load(f), sys.argv[2])
