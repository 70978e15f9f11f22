"""Asks opforge's judge about this working folder (SKILL.md). The judge runs outside your
sandbox, as `opforge serve`, reached at $OPFORGE_SERVE_URL (under `opforge agent`, through the socket
it hands in as $OPFORGE_JUDGE_FD); it builds and runs your files in a
sandbox of its own, on inputs it draws itself, and answers what you need to act on. Standard
library only."""
import json
import os
import socket
import sys
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Not part of the solution: the task, the instructions, these scripts.
SKIP = {"model.py", "SKILL.md"}


def solution_files():
    files = {}
    for base, dirs, names in os.walk(ROOT):
        rel_base = os.path.relpath(base, ROOT)
        if rel_base == "utils" or rel_base.startswith("utils" + os.sep):
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for n in names:
            rel = os.path.normpath(os.path.join(rel_base, n))
            if rel in SKIP or n.startswith(".") or n.endswith((".pyc", ".so", ".o")):
                continue
            with open(os.path.join(base, n), encoding="utf-8", errors="replace") as f:
                files[rel] = f.read()
    return files


def _ask_relay(fd, body):
    """Under `opforge agent` the sandbox has no network: the judge is one request line and one
    answer line on the socket it handed in (OPFORGE_JUDGE_FD)."""
    with socket.socket(fileno=fd) as s, s.makefile("rwb") as f:
        f.write(body + b"\n")
        f.flush()
        line = f.readline()
    row = json.loads(line or b"{}")
    if "error" in row:
        sys.exit(f"the judge refused the request: {row['error']}")
    return row


def ask():
    """The judge's row for the folder as it is now (a dict), or exits 2 saying why it could not."""
    with open(os.path.join(HERE, "task.json")) as f:
        task_id = json.load(f)["task_id"]
    body = json.dumps({"task_id": task_id, "files": solution_files()}).encode()
    relay = os.environ.get("OPFORGE_JUDGE_FD")
    url = os.environ.get("OPFORGE_SERVE_URL")
    if relay and not url:
        return _check(_ask_relay(int(relay), body))
    if not url:
        sys.exit("OPFORGE_SERVE_URL is not set: the judge's address is handed to the agent by whoever runs it")
    req = urllib.request.Request(url.rstrip("/") + "/v1/evaluate", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            row = json.load(r)
    except urllib.error.HTTPError as e:
        sys.exit(f"the judge refused the request ({e.code}): {e.read().decode(errors='replace')[:2000]}")
    except (urllib.error.URLError, OSError) as e:
        sys.exit(f"the judge at {url} cannot be reached: {e}")
    return _check(row)


def _check(row):
    if row.get("retryable"):
        sys.exit(f"the judge could not judge this time ({row.get('reason')}): ask again; not your solution's fault")
    return row


def print_compile(row):
    print("compiled: yes" if row.get("compiled") else "compiled: no")
    if not row.get("compiled"):
        print(row.get("detail") or row.get("reason"))
    return bool(row.get("compiled"))


def print_verification(row):
    if not print_compile(row):
        return False
    if row.get("correct"):
        print(f"correct: yes (max error {row.get('max_error'):.3g} on every input set)")
        return True
    print(f"correct: no ({row.get('reason')})")
    print(row.get("detail") or "")
    return False


def print_profile(row):
    if not print_verification(row):
        return False
    ms = lambda k: f"{row[k]:.4f} ms" if isinstance(row.get(k), (int, float)) else "-"  # noqa: E731
    x = lambda k: f"{row[k]:.3f}x" if isinstance(row.get(k), (int, float)) else "-"  # noqa: E731
    print(f"ModelNew {ms('candidate_ms')}; eager {ms('eager_ms')} ({x('speedup_eager')} faster); "
          f"torch.compile {ms('compile_ms')} ({x('speedup_compile')} faster)")
    kernels = (row.get("profile") or {}).get("by_kind_ms")
    if kernels:
        print("GPU time per call by kind (ms): " + ", ".join(f"{k} {v:.4f}" for k, v in kernels.items()))
    if row.get("flags"):
        print("flags (they cap the reward at 1): " + ", ".join(row["flags"]))
    print(f"reward {row.get('reward')} (-1 wrong, 1 correct, 2 > 5% faster than eager, 3 also > 5% faster than "
          "torch.compile)")
    return True
