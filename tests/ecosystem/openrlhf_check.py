"""OpenRLHF's own reward client (openrlhf 0.11.2, `SingleTurnAgentExecutor`, the code its PPO
rollouts use for `--remote_rm_url`) against a running `opforge serve`: once over HTTP to
/openrlhf, once through the reward file python/opforge_rl/openrlhf.py. Run by
scripts/test_ecosystem.sh; exits 1 with what differed.

  python3 tests/ecosystem/openrlhf_check.py URL TASK HONEST.py HACK.py
"""
import asyncio
import json
import os
import sys

import opforge_rl.openrlhf as reward_file
from openrlhf.utils.agent import SingleTurnAgentExecutor

PROMPT = "Write ModelNew for the task.\n"


def query(code):
    return PROMPT + f"Here it is:\n```python\n{code}```\n"


async def rewards(executor, via_http, queries, labels):
    fetch = executor._fetch_rewards_via_http if via_http else executor._fetch_rewards_via_func
    out = []
    for q, lab in zip(queries, labels):  # as its rollouts call it: one query at a time
        info = (await fetch([q], [PROMPT], [lab]))[0]
        out.append((float(info["rewards"][0]), float(info["scores"][0])))
    return out


def main(url, task, honest_path, hack_path):
    os.environ["OPFORGE_SERVE_URL"] = url  # the reward file's client reads it, as in a trainer's environment
    queries = [query(open(honest_path).read()), query(open(hack_path).read())]
    failures, seen = [], {}
    for name, executor, http in [("http /openrlhf", SingleTurnAgentExecutor(url.rstrip("/") + "/openrlhf"), True),
                                 ("reward file", SingleTurnAgentExecutor(os.path.abspath(reward_file.__file__)), False)]:
        got = asyncio.run(rewards(executor, http, queries, [task, task]))
        seen[name] = got
        (honest_r, honest_s), (hack_r, hack_s) = got
        if not (honest_r >= 1 and hack_r == -1 and honest_s == (honest_r + 1) / 4 and hack_s == 0.0):
            failures.append(f"{name}: {got}")
    print(json.dumps({"openrlhf": seen, "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
