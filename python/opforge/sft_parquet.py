"""`opforge agent sft`'s parquet: its JSONL records in the columns TRL's SFTTrainer and verl's
MultiTurnSFTDataset read (`messages`, and `tools` for TRL, `verl_tools` for verl).

`messages` are OpenAI chat messages with one schema for every role: `role`, `content`,
`tool_calls` (id, type, function {name, arguments}: the arguments as the JSON text the model
wrote, as the OpenAI API carries them; chat templates print a string as it is) and `tool_call_id`.
`tools` is the tools' JSON schema as JSON text: the tools' parameters differ, and a parquet struct
gives every tool the others' parameters as nulls; TRL's SFTTrainer reads the text (json.loads).
`verl_tools` is the same list as that struct, for verl: its MultiTurnSFTDataset hands its column
to apply_chat_template as it is, which takes only a list of dicts (JSON text raises "Tools should
either be a JSON schema..."), so point verl's `data.tools_key` at `verl_tools`. Each tool there
carries the other tools' parameter names as null properties (`"path": null` under bash): the
least bad a parquet can do, since it has no type for dicts with differing keys; dropping the null
properties gives the schema back exactly. The rest: `task_id`, `task`, `reward` (as first
measured), `rejudged_reward`, `turns`, `solution_hash`.

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
            **{k: rec.get(k) for k in ("task_id", "task", "reward", "rejudged_reward", "turns", "solution_hash")},
            "verl_tools": rec["tools"]}


def schema(recs):
    """SCHEMA and `verl_tools`, typed by pyarrow from the records' tools: one struct holding every
    tool's keys (in the order first seen, so the same records give the same bytes)."""
    return SCHEMA.append(pa.field("verl_tools", pa.array([r["tools"] for r in recs] or [[]]).type))


def main(src, dst):
    with open(src) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    pq.write_table(pa.Table.from_pylist([row(r) for r in recs], schema=schema(recs)), dst)
    print(f"sft_parquet: {len(recs)} record(s) in {dst}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
