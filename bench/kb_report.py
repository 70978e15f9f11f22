"""Verdicts of a workspace of imported KernelBench problems, per level: the first attempt (under
the workers' shared memory) and the final verdict (after `filter`'s retry alone), and the
problems rejected compile_mismatch with their detail.

    python3 bench/kb_report.py WORKSPACE [--json OUT]
"""
import argparse
import collections
import json
import re
import sqlite3


def _level(prov):
    m = re.search(r"level(\d)", json.dumps(prov))
    return f"level{m.group(1)}" if m else "other"


def _label(verdict, reason):
    return "accepted" if verdict == "accepted" else reason or "rejected"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workspace")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    db = sqlite3.connect(f"{a.workspace}/opforge.db")
    rows = db.execute("SELECT t.provenance, f.verdict, f.reason, f.detail, f.metrics FROM tasks t "
                      "JOIN filter_results f ON f.task_id = t.id").fetchall()
    first, final = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    mismatch = []
    for prov, verdict, reason, detail, metrics in rows:
        lv, m = _level(json.loads(prov)), json.loads(metrics or "{}")
        att = m.get("attempts") or [{"verdict": verdict, "reason": reason}]
        first[lv][_label(att[0]["verdict"], att[0]["reason"])] += 1
        final[lv][_label(verdict, reason)] += 1
        if reason == "compile_mismatch":
            mismatch.append({"level": lv, "path": json.loads(prov).get("path"), "detail": detail})
    for lv in sorted(final):
        n = sum(final[lv].values())
        print(f"{lv}: {n} problems")
        print("  first attempt: " + ", ".join(f"{k} {v}" for k, v in first[lv].most_common()))
        print("  final:         " + ", ".join(f"{k} {v}" for k, v in final[lv].most_common()))
    for r in mismatch:
        print(f"compile_mismatch {r['level']} {r['path']}: {r['detail'][:160]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"first": first, "final": final, "compile_mismatch": mismatch}, f, indent=1)


if __name__ == "__main__":
    main()
