"""The solving prompt: data/prompts/solve_task.md (+ .system.md) filled with a task's code.

One template for every consumer that asks a model to solve a task (the verl export today; the RL
adapters and the agent read the same files), so a trainer and the judge describe one policy.
Placeholders are {{name}} with optional spaces, filled once and never expanded again, as
composer/prompt.cpp does for the composer's templates; a missing value is an error.
"""
import os
import re

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def fill(template, values):
    def sub(m):
        if m.group(1) not in values:
            raise KeyError(f"the prompt template has {{{{{m.group(1)}}}}} but no value is given for it")
        return values[m.group(1)]

    return _PLACEHOLDER.sub(sub, template)


def solve_messages(task_code, data_dir, name="solve_task"):
    """Chat messages (system, user) asking for a ModelNew of `task_code`."""
    with open(os.path.join(data_dir, "prompts", f"{name}.md")) as f:
        user = fill(f.read(), {"task_code": task_code.strip()})
    messages = []
    system_path = os.path.join(data_dir, "prompts", f"{name}.system.md")
    if os.path.exists(system_path):
        with open(system_path) as f:
            messages.append({"role": "system", "content": f.read().strip()})
    messages.append({"role": "user", "content": user})
    return messages


def solve_messages_json(arg):
    """{task_code, data_dir} -> the solve_messages as JSON text (the trainer's single-turn prompt)."""
    import json

    req = json.loads(arg)
    return json.dumps(solve_messages(req["task_code"], req["data_dir"]))
