"""verl's reward hook: `compute_score(data_source, solution_str, ground_truth, extra_info)`.

Rows written by `opforge export --format verl` carry the task id as `reward_model.ground_truth`,
which verl's reward manager passes here. The answer is a dict, so verl logs the breakdown beside
the score: `score` (the judge's reward, -1/1/2/3), `correct` (0/1), `speedup_eager`,
`speedup_compile` (0.0 when not correct) and `reason`.

When the environment fails (the service unreachable or answering retryable past the client's
`retry_s`), compute_score raises EnvironmentFailure: verl's rule reward needs a number, and any
number would be a reward the solution did not earn.
"""
from opforge_rl.client import Client, EnvironmentFailure, row_reward

_client = None


def _default_client():
    global _client
    if _client is None:
        _client = Client()
    return _client


def breakdown(row):
    """The judge's row as verl's reward dict."""
    score = row_reward(row)
    if score is None:
        raise EnvironmentFailure(f"opforge could not judge task {row.get('task_id')!r}: {row.get('reason')}")
    num = lambda k: float(row.get(k) or 0.0) if row.get("correct") else 0.0  # noqa: E731
    return {"score": score, "correct": float(bool(row.get("correct"))), "speedup_eager": num("speedup_eager"),
            "speedup_compile": num("speedup_compile"), "reason": row.get("reason") or "correct"}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, client=None, **_):
    return breakdown(*(client or _default_client()).evaluate([{"task_id": ground_truth, "response": solution_str}]))


def compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos=None, client=None, **_):
    """The same for verl's batch reward manager: one request for the whole batch."""
    items = [{"task_id": g, "response": s} for s, g in zip(solution_strs, ground_truths)]
    return [breakdown(r) for r in (client or _default_client()).evaluate(items)]
