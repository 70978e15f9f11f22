"""`opforge agent sft`'s parquet: its JSONL records in the columns TRL's SFTTrainer and verl's
MultiTurnSFTDataset read (`messages`, `tools`).

`messages` are OpenAI chat messages with one schema for every role: `role`, `content`,
`tool_calls` (id, type, function {name, arguments}: the arguments as the JSON text the model
wrote, as the OpenAI API carries them; chat templates print a string as it is) and `tool_call_id`.
`tools` is the tools' JSON schema as JSON text: the tools' parameters differ, and a parquet struct
would give every tool the others' parameters as nulls (TRL reads JSON text; see agent/README.md
for verl). The rest: `task_id`, `task`, `reward` (as first measured), `rejudged_reward`, `turns`,
`solution_hash`.

    python -m opforge.sft_parquet IN.jsonl OUT.parquet
"""
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq

CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                  ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(CALL)),
                     ("tool_call_id", pa.string())])
SCHEMA = pa.schema([("messages", pa.list_(MESSAGE)), ("tools", pa.string()), ("task_id", pa.string()),
                    ("task", pa.string()), ("reward", pa.int64()), ("rejudged_reward", pa.int64()),
                    ("turns", pa.int64()), ("solution_hash", pa.string())])


def call(c):
    fn = c.get("function") or {}
    args = fn.get("arguments")
    return {"id": c.get("id"), "type": c.get("type", "function"),
            "function": {"name": fn.get("name"), "arguments": args if isinstance(args, str) else json.dumps(args)}}


def message(m):
    calls = m.get("tool_calls")
    return {"role": m["role"], "content": m.get("content") or "",
            "tool_calls": [call(c) for c in calls] if calls else None, "tool_call_id": m.get("tool_call_id")}


def row(rec):
    return {"messages": [message(m) for m in rec["messages"]], "tools": json.dumps(rec["tools"]),
            **{k: rec.get(k) for k in ("task_id", "task", "reward", "rejudged_reward", "turns", "solution_hash")}}


def main(src, dst):
    with open(src) as f:
        rows = [row(json.loads(line)) for line in f if line.strip()]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), dst)
    print(f"sft_parquet: {len(rows)} record(s) in {dst}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
