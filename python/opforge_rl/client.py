"""The one client of `opforge serve` that every adapter shares (standard library only, so it
installs into any trainer's environment).

A model's response goes to the service as `response`: the service takes its last fenced code block
as the solution (evaluator/service.cpp, `last_code_block`), so every adapter and /openrlhf extract
the same way. What comes back is the judge's row: `reward` in {-1, 1, 2, 3}, `reason`, times,
speed-ups, flags. A failure of the environment (a full queue, a judge worker that crashed, a
stopping service) is never a reward: the client waits as `Retry-After` says and asks again for up
to `retry_s`, and a row still failing then keeps `reward: None, retryable: True` for the adapter
to hand on as its trainer expects (each adapter's docstring says how).
"""
import json
import os
import time
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000"
FIRST_CONTACT_S = 30.0  # how long a client that never reached the service keeps trying


class EnvironmentFailure(RuntimeError):
    """The service could not judge (after retrying): not the solution's verdict."""


class BadRequest(ValueError):
    """The service refused a request (400): a bug of the caller, named by the service's `field`."""


class Client:
    """`url` defaults to $OPFORGE_SERVE_URL, then http://127.0.0.1:8000; the bearer token to the
    variable named by `token_env` ($OPFORGE_TOKEN by default), when set."""

    def __init__(self, url=None, token_env="OPFORGE_TOKEN", timeout_s=1800.0, retry_s=600.0, backoff_s=2.0):
        self.url = (url or os.environ.get("OPFORGE_SERVE_URL") or DEFAULT_URL).rstrip("/")
        self.token = os.environ.get(token_env) if token_env else None
        self.timeout_s, self.retry_s, self.backoff_s = timeout_s, retry_s, backoff_s
        self.reached = False  # whether the service ever answered this client

    def _once(self, path, body):
        """(status, reply, seconds to wait before asking again or None)."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return r.status, json.load(r), None
        except urllib.error.HTTPError as e:
            try:
                reply = json.loads(e.read() or b"{}")
            except ValueError:
                reply = {"error": f"HTTP {e.code} with a body that is not JSON"}
            wait = e.headers.get("Retry-After") if e.code in (429, 503) else None
            return e.code, reply, float(wait) if wait else None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            return 0, {"error": f"cannot reach opforge serve at {self.url}: {e}"}, self.backoff_s

    def post(self, path, body):
        """The reply to a POST, asking again while the service says to wait (429, 503, not
        reachable) for up to retry_s (FIRST_CONTACT_S while it was never reached). Raises
        BadRequest on 400/401, EnvironmentFailure after that."""
        start = time.monotonic()
        while True:
            status, reply, wait = self._once(path, body)
            self.reached = self.reached or status != 0
            if status == 200:
                return reply
            # A service never reached is more likely a wrong address than a restart: ask for less long.
            deadline = start + (self.retry_s if self.reached else min(self.retry_s, FIRST_CONTACT_S))
            if status == 0 and not self.reached and time.monotonic() + wait > deadline:
                raise EnvironmentFailure(f"{reply['error']} (set OPFORGE_SERVE_URL to where `opforge serve` listens)")
            if status in (400, 401, 413):
                raise BadRequest(f"opforge serve refused {path} ({status}): field {reply.get('field')!r}: "
                                 f"{reply.get('error')}")
            if wait is None or time.monotonic() + wait > deadline:
                raise EnvironmentFailure(f"opforge serve {path} answered {status}: {reply.get('error')}")
            time.sleep(wait)

    def evaluate(self, items):
        """Rows for [{"task_id", "response" | "solution_code" | "files"}], in order. Entries the
        service answers retryable (a judge worker's failure) are asked for again until retry_s;
        past it they keep reward None and retryable True, as an unknown task does at once."""
        rows = [None] * len(items)
        todo = list(range(len(items)))
        deadline = time.monotonic() + self.retry_s
        while todo:
            got = self.post("/v1/evaluate_batch", {"requests": [items[i] for i in todo]})["results"]
            for i, row in zip(todo, got):
                if row.get("status") == 400:
                    raise BadRequest(f"opforge serve refused request {i}: field {row.get('field')!r}: {row.get('error')}")
                rows[i] = row
            # An unknown task is the environment's too, but asking again will not find it.
            todo = [i for i in todo if rows[i].get("retryable") and rows[i].get("status") != 404]
            if todo and time.monotonic() + self.backoff_s > deadline:
                break
            if todo:
                time.sleep(self.backoff_s)
        return rows


def row_reward(row):
    """The row's reward as a float, or None for an environment failure."""
    r = row.get("reward")
    return None if row.get("retryable") or r is None else float(r)
