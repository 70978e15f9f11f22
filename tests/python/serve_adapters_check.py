"""The RL adapters (python/opforge_rl) against a running `opforge serve`: driven by
tests/test_serve.cpp once the service has judged HONEST and HACK for TASK, so the adapters'
requests are answered from its verdict cache. Exits 1 with what differed.

  python3 tests/python/serve_adapters_check.py URL TASK HONEST.py HACK.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "python"))

from opforge_rl import BadRequest, Client, EnvironmentFailure  # noqa: E402
from opforge_rl import openrlhf, trl, verl  # noqa: E402


def fenced(code):
    return f"I fused the ops into one kernel.\n```python\n{code}```\nThat is all."


def main(url, task, honest_path, hack_path):
    honest, hack = open(honest_path).read(), open(hack_path).read()
    client = Client(url, retry_s=5, backoff_s=0.5)
    failures = []

    def expect(what, ok, got):
        if not ok:
            failures.append(f"{what}: got {got!r}")

    trl_reward = trl.make_reward_func(client)
    conv = [[{"role": "assistant", "content": fenced(honest)}], [{"role": "assistant", "content": fenced(hack)}]]
    got = trl_reward(prompts=["p", "p"], completions=conv, task_id=[task, task])
    expect("trl rewards (honest, hack)", got[0] >= 1 and got[1] == -1, got)
    expect("trl: an unknown task is None, not a reward", trl_reward(["p"], ["x"], task_id=["no_such_task"]) == [None],
           "not None")
    try:
        trl_reward(["p"], ["x"])
        failures.append("trl without a task_id column did not raise")
    except KeyError:
        pass

    score = verl.compute_score("torch#1", fenced(honest), task, {"split": "train"}, client=client)
    expect("verl compute_score honest", score["score"] >= 1 and score["correct"] == 1.0 and score["speedup_eager"] > 0,
           score)
    batch = verl.compute_score_batch(["torch#1"] * 2, [fenced(hack), "no code at all"], [task, task], client=client)
    expect("verl batch: hack -1 with its reason", batch[0]["score"] == -1 and batch[0]["reason"] != "correct", batch[0])
    expect("verl batch: a response without code is -1", batch[1]["score"] == -1, batch[1])
    try:
        verl.compute_score("torch#1", "x", "no_such_task", client=client)
        failures.append("verl on an unknown task did not raise EnvironmentFailure")
    except EnvironmentFailure:
        pass

    prompt = "Write ModelNew.\n"
    o = openrlhf.reward_func([prompt + fenced(honest), prompt + fenced(hack)], [prompt, prompt], [task, task],
                             client=client)
    rewards = [float(x) for x in o["rewards"]]
    expect("openrlhf rewards", rewards[0] >= 1 and rewards[1] == -1, rewards)
    expect("openrlhf scores", [float(x) for x in o["scores"]] == [(r + 1) / 4 for r in rewards], o["scores"])

    try:
        client.evaluate([{"task_id": task, "response": 3}])
        failures.append("a response that is not text was not refused")
    except BadRequest as e:
        expect("a bad request names its field", "response" in str(e), str(e))
    print(json.dumps({"failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
