"""opforge serve on a GPU: the solutions of bench/eval_gpu.sh's `all` run (honest, CUDA Agent's
released layout, planted hacks, KernelBench's adversarial kernels) sent to a running `opforge serve`
by concurrent clients, then every honest one again (answered from the verdict cache). Prints the
served rewards beside the offline `opforge eval` report's, the latency of each request, and the
throughput in evaluations per minute.

  python3 bench/serve_gpu.py URL FIXTURES [--kb DIR] [--eval-report all/report.json] [--clients 8]

The service must have been started with --tasks holding FIXTURES/tasks (and DIR/tasks): the task
ids are the file stems, as eval matches them. Exit status 1 when a served reward differs from the
offline one, or a request failed.
"""
import argparse
import concurrent.futures as cf
import json
import os
import statistics
import sys
import time
import urllib.error
import urllib.request


def files_of(path):
    """A solution as the request carries it: one file's text, or a folder's files by relative path."""
    if os.path.isfile(path):
        return {"solution_code": open(path).read()}
    out = {}
    for root, _, names in os.walk(path):
        for n in names:
            full = os.path.join(root, n)
            out[os.path.relpath(full, path)] = open(full).read()
    return {"files": out}


def submissions(fx, kb):
    """(name, task id, request) as bench/eval_gpu.sh names the rows of its `all` run."""
    subs = []
    tasks = {os.path.splitext(n)[0] for n in os.listdir(os.path.join(fx, "tasks"))}
    for n in sorted(os.listdir(os.path.join(fx, "solutions"))):
        key = os.path.splitext(n)[0]
        subs.append((key, key, files_of(os.path.join(fx, "solutions", n))))
    for n in sorted(os.listdir(os.path.join(fx, "released"))):
        subs.append((f"released__{n}", n, files_of(os.path.join(fx, "released", n))))
    for h in sorted(os.listdir(os.path.join(fx, "hacks"))):
        d = os.path.join(fx, "hacks", h)
        for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            key = os.path.splitext(n)[0]
            if key in tasks:
                subs.append((f"{h}__{key}", key, files_of(os.path.join(d, n))))
    if kb and os.path.isdir(os.path.join(kb, "hacks")):
        for n in sorted(os.listdir(os.path.join(kb, "hacks"))):
            key = os.path.splitext(n)[0]
            subs.append((key, key, files_of(os.path.join(kb, "hacks", n))))
    return subs


def post(url, body, timeout=900):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, reply = r.status, json.load(r)
    except urllib.error.HTTPError as e:
        status, reply = e.code, json.loads(e.read() or b"{}")
    return status, reply, time.perf_counter() - t0


def offline(report):
    """The offline rows by solution name (the `all` run of bench/eval_gpu.sh)."""
    if not report or not os.path.exists(report):
        return {}
    return {r["solution"]: r for r in json.load(open(report))["results"]}


def judge_all(url, subs, clients):
    """Every submission once, `clients` at a time: name -> (status, reply, seconds)."""
    with cf.ThreadPoolExecutor(clients) as pool:
        futs = {pool.submit(post, url + "/v1/evaluate", {"task_id": t, **req}): name for name, t, req in subs}
        return {futs[f]: f.result() for f in cf.as_completed(futs)}


def table(subs, first, again, eval_rows):
    bad = 0
    print("| solution | serve reward | reason | eval reward | eval reason | latency s | again s | cached |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, _, _ in subs:
        status, r, s = first[name]
        e = eval_rows.get(name, {})
        rep = again.get(name)
        same = not e or r.get("reward") == e.get("reward")
        bad += status != 200 or not same
        print(f"| {name} | {r.get('reward')} | {r.get('reason') or r.get('error') or ('ok' if status == 200 else status)} | {e.get('reward', '-')} | "
              f"{e.get('reason', '-')} | {s:.1f} | {f'{rep[2]:.2f}' if rep else '-'} | "
              f"{rep[1].get('cached') if rep else '-'} |{'' if same else ' DIFFERS'}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("fixtures")
    ap.add_argument("--kb")
    ap.add_argument("--eval-report")
    ap.add_argument("--clients", type=int, default=8)
    a = ap.parse_args()
    subs = submissions(a.fixtures, a.kb)
    t0 = time.perf_counter()
    first = judge_all(a.url, subs, a.clients)
    wall = time.perf_counter() - t0
    honest = [s for s in subs if first[s[0]][1].get("reward") in (1, 2, 3)]
    again = judge_all(a.url, honest, a.clients)
    bad = table(subs, first, again, offline(a.eval_report))
    lat = [s for _, _, s in first.values()]
    print(f"\n{len(subs)} evaluations by {a.clients} clients in {wall:.1f} s: {60 * len(subs) / wall:.1f} per minute; "
          f"latency median {statistics.median(lat):.1f} s, max {max(lat):.1f} s")
    with urllib.request.urlopen(a.url + "/metrics", timeout=30) as r:
        print("metrics:", json.dumps(json.load(r)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
