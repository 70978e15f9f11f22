"""TRL's reward function for `GRPOTrainer(reward_funcs=[make_reward_func()])`.

TRL calls it with `prompts`, `completions` and every other column of the dataset as keyword
arguments: the task id comes from the column named `column` (`task_id` by default). A completion
is the text or, for conversational datasets, the list of messages whose last assistant content
is the response. Returns the judge's rewards (-1/1/2/3) as floats.

When the environment fails past the client's `retry_s`, that sample's reward is None: TRL
ignores a None reward for that sample (it becomes NaN and is left out of the mean) rather than
train on a reward the solution did not earn.
"""
from opforge_rl.client import Client, row_reward


def completion_text(completion):
    if isinstance(completion, str):
        return completion
    texts = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
    return texts[-1] if texts else ""


def make_reward_func(client=None, column="task_id"):
    client = client or Client()

    def opforge_reward(prompts, completions, **kwargs):
        ids = kwargs.get(column)
        if ids is None:
            raise KeyError(f"opforge_reward needs the dataset column {column!r} (the task id of each prompt); "
                           f"the columns given were {sorted(kwargs)}")
        rows = client.evaluate([{"task_id": t, "response": completion_text(c)} for t, c in zip(ids, completions)])
        return [row_reward(r) for r in rows]

    return opforge_reward
