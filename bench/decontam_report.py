"""Helper of bench/decontam_recall.sh: treat a workspace's candidates as accepted, and report what
`opforge dedup --reference` made of them.

    python3 bench/decontam_report.py accept WS
    python3 bench/decontam_report.py report WS LABEL [--thresholds 0.8,0.9,0.95]
"""
import argparse
import collections
import json
import re
import sqlite3

BINS = [0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 1.01]


def accept(db):
    # dedup reads only code and ops of accepted rows; with no traced ops it reads them from the AST.
    db.execute("INSERT OR REPLACE INTO filter_results (task_id, verdict, code, metrics) "
               "SELECT id, 'accepted', code, '{}' FROM tasks")
    db.commit()


def _kb_level(prov):
    m = re.search(r"level(\d)__", json.dumps(prov))
    return f"level{m.group(1)}" if m else "composed"


def report(db, label, thresholds):
    rows = db.execute("SELECT t.provenance, d.kept, d.reason, d.ref_similarity FROM dedup_results d "
                      "JOIN tasks t ON t.id = d.task_id").fetchall()
    by_level = collections.defaultdict(list)
    for prov, kept, reason, sim in rows:
        by_level[_kb_level(json.loads(prov))].append((kept, reason, sim or 0.0))
    for lv in sorted(by_level):
        rs = by_level[lv]
        reasons = collections.Counter(r for k, r, _ in rs if not k)
        kb = sum(v for r, v in reasons.items() if r.startswith("kernelbench"))
        print(f"{label} {lv}: {len(rs)} tasks, dropped as KernelBench {kb} ({100 * kb / len(rs):.1f}%): "
              + ", ".join(f"{r} {v}" for r, v in reasons.most_common()))
        sims = [s for _, _, s in rs]
        hist = [sum(lo <= s < hi for s in sims) for lo, hi in zip(BINS, BINS[1:])]
        print("  nearest-reference cosine " + " ".join(f"[{lo:g},{min(hi, 1):g}):{h}" for lo, hi, h in
                                                     zip(BINS, BINS[1:], hist)))
        print("  share at or above " + ", ".join(f"{t:g}: {100 * sum(s >= t for s in sims) / len(sims):.1f}%"
                                                for t in thresholds))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["accept", "report"])
    ap.add_argument("workspace")
    ap.add_argument("label", nargs="?", default="")
    ap.add_argument("--thresholds", default="0.8,0.9,0.95")
    a = ap.parse_args()
    db = sqlite3.connect(f"{a.workspace}/opforge.db")
    if a.what == "accept":
        accept(db)
    else:
        report(db, a.label, [float(t) for t in a.thresholds.split(",")])


if __name__ == "__main__":
    main()
