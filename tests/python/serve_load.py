"""A bounded load on a running `opforge serve` (started by tests/test_serve.cpp with a short
--timeout-s and a small --queue): 200 requests from 16 concurrent clients. Four distinct
evaluations (an honest solution, a hack, two hangs) go first, so the small queue fills; then 60 bad
requests, 20 unknown tasks, 100 repeats of the honest and the hack, 16 health checks. Every request
answered 429 is sent again after its Retry-After (shortened) until it is judged. Exits 1 with what
went wrong; prints the figures as JSON.

  python3 tests/python/serve_load.py URL TASK HONEST.py HACK.py HANG.py TIMEOUT_S
"""
import concurrent.futures as cf
import json
import sys
import time
import urllib.error
import urllib.request


def call(url, path, body=None, raw=None):
    """(status, reply, headers, seconds); never raises for an HTTP status."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.load(r), dict(r.headers), time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers), time.perf_counter() - t0


def bad_requests(task, code):
    """60 requests the service must refuse with 400 and the field it names."""
    shapes = [
        (b"not json", ""), (json.dumps([1, 2]).encode(), ""),
        (json.dumps({"solution_code": code}).encode(), "task_id"),
        (json.dumps({"task_id": 7, "solution_code": code}).encode(), "task_id"),
        (json.dumps({"task_id": task}).encode(), "solution_code"),
        (json.dumps({"task_id": task, "solution_code": code, "response": code}).encode(), "solution_code"),
        (json.dumps({"task_id": task, "solution_code": 5}).encode(), "solution_code"),
        (json.dumps({"task_id": task, "response": ["x"]}).encode(), "response"),
        (json.dumps({"task_id": task, "solution_code": code, "trials": 2}).encode(), "trials"),
        (json.dumps({"task_id": task, "files": {"../model_new.py": code}}).encode(), "files"),
        (json.dumps({"task_id": task, "files": {"kernels.cu": "x"}}).encode(), "files"),
        (json.dumps({"task_id": task, "solution_code": code, "task_code": code}).encode(), "task_code"),
    ]
    return [shapes[i % len(shapes)] for i in range(60)]


def plan(task, honest, hack, hangs):
    first = [("evaluate", {"task_id": task, "solution_code": c}) for c in [honest, hack] + hangs]
    rest = [("bad", b) for b in bad_requests(task, honest)]
    rest += [("unknown", {"task_id": f"no_such_task_{i}", "solution_code": honest}) for i in range(20)]
    rest += [("evaluate", {"task_id": task, "solution_code": honest if i % 2 else hack}) for i in range(100)]
    rest += [("health", None)] * 16
    return first, rest


def send(url, kind, body):
    if kind == "health":
        with urllib.request.urlopen(url + "/healthz", timeout=60) as r:
            return r.status, json.load(r), {}, 0.0
    if kind == "bad":
        return call(url, "/v1/evaluate", raw=body[0])
    return call(url, "/v1/evaluate", body)


RESETS = []  # connections reset before an answer (sent again, as any HTTP client would: nothing was judged)


def until_judged(url, kind, body):
    """A request sent again after each 429 (its Retry-After, shortened to 1 s) until answered."""
    tries, t0 = 0, time.perf_counter()
    while True:
        try:
            status, reply, headers, _ = send(url, kind, body)
        except (ConnectionError, urllib.error.URLError) as e:
            RESETS.append(str(e))
            if len(RESETS) > 20:
                raise
            time.sleep(1.0)
            continue
        tries += 1
        if status != 429:
            return status, reply, tries, time.perf_counter() - t0
        if not headers.get("Retry-After"):
            return status, {"error": "429 without Retry-After"}, tries, time.perf_counter() - t0
        time.sleep(1.0)


def check(results, plan_all, hangs, timeout_s):
    errs = []
    rejected = sum(t > 1 for _, _, t, _ in results)
    rewards = {}
    for (kind, body), (status, reply, _, secs) in zip(plan_all, results):
        if kind == "bad":
            if status != 400 or reply.get("field") != body[1]:
                errs.append(f"bad request {body[0][:60]!r}: {status} field {reply.get('field')!r}, wanted 400 {body[1]!r}")
        elif kind == "unknown":
            if status != 404 or reply.get("reward") is not None or reply.get("retryable") is not True:
                errs.append(f"unknown task: {status} {reply}")
        elif kind == "evaluate":
            code = body["solution_code"]
            if status != 200 or reply.get("retryable"):
                errs.append(f"evaluation: {status} {reply.get('reason')} {reply.get('error')}")
            rewards.setdefault(code, set()).add(reply.get("reward"))
            # Counted from the first send: the second hang can wait behind the batch of the first (its
            # limit plus start-up) and the task's baseline timing, then take its own limit. Under
            # CI's load (2 cores, ctest -j2) that was 67.6 s for a 6 s limit: 29 s, 23 s, 15.5 s.
            if code in hangs and (reply.get("reason") != "timeout" or secs > 2 * (timeout_s + 60)):
                errs.append(f"hang: {reply.get('reason')} after {secs:.1f} s (limit {timeout_s} s)")
        elif status != 200:
            errs.append(f"healthz: {status}")
    return errs, rejected, rewards


def main(url, task, honest_path, hack_path, hang_path, timeout_s):
    honest, hack = open(honest_path).read(), open(hack_path).read()
    hang = open(hang_path).read()
    hangs = [hang, hang + "\n# a second hang, judged on its own\n"]
    first, rest = plan(task, honest, hack, hangs)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(16) as pool:
        head = [pool.submit(until_judged, url, k, b) for k, b in first]
        time.sleep(0.5)  # the four distinct evaluations are in (or refused) before the rest
        results = [f.result() for f in head + [pool.submit(until_judged, url, k, b) for k, b in rest]]
    errs, rejected, rewards = check(results, first + rest, hangs, float(timeout_s))
    if rewards.get(honest) is None or len(rewards[honest]) != 1 or min(rewards[honest]) < 1:
        errs.append(f"the honest solution's rewards: {rewards.get(honest)}")
    if rewards.get(hack) != {-1}:
        errs.append(f"the hack's rewards: {rewards.get(hack)}")
    if rejected == 0:
        errs.append("no request was answered 429: the queue never filled")
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        metrics = json.load(r)
    print(json.dumps({"requests": len(results), "answered": sum(s != 0 for s, _, _, _ in results),
                      "sent_again_after_429": rejected, "connection_resets": len(RESETS), "seconds": round(time.perf_counter() - t0, 1),
                      "errors": errs, "metrics": metrics}))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:7]))
