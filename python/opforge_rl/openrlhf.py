"""OpenRLHF's reward function: `reward_func(queries, prompts, labels)`.

OpenRLHF can also point `--remote_rm_url` at the service's own `/openrlhf` endpoint; this is the
same contract for a reward file run in the trainer's process. Each query is the prompt followed
by the response: the part after its prompt is sent. `labels` are task ids. The answer is
`{"rewards", "scores", "extra_logs"}`, rewards the judge's (-1/1/2/3), scores (reward + 1) / 4 in
[0, 1], as torch tensors when torch is there (OpenRLHF's trainers are), lists otherwise.

When the environment fails past the client's `retry_s`, reward_func raises EnvironmentFailure
(as the service's /openrlhf answers 503): a reward list cannot say "not judged".
"""
from opforge_rl.client import Client, EnvironmentFailure, row_reward

_client = None


def response_part(query, prompt):
    return query[len(prompt):] if prompt and query.startswith(prompt) else query


def reward_func(queries, prompts, labels, client=None, **_):
    global _client
    client = client or _client or Client()
    _client = _client or client
    rows = client.evaluate([{"task_id": lab, "response": response_part(q, p)}
                            for q, p, lab in zip(queries, prompts, labels)])
    rewards = [row_reward(r) for r in rows]
    if any(r is None for r in rewards):
        bad = next(r for r in rows if row_reward(r) is None)
        raise EnvironmentFailure(f"opforge could not judge task {bad.get('task_id')!r}: {bad.get('reason')}")
    scores = [(r + 1) / 4 for r in rewards]
    logs = {"correct": [float(bool(r.get("correct"))) for r in rows]}
    try:
        import torch
        return {"rewards": torch.tensor(rewards), "scores": torch.tensor(scores),
                "extra_logs": {k: torch.tensor(v) for k, v in logs.items()}}
    except ImportError:
        return {"rewards": rewards, "scores": scores, "extra_logs": logs}
