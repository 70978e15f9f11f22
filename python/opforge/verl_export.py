"""`opforge export --format verl`: the kept tasks as the parquet rows verl's RL dataset reads.

One file per split (train.parquet, test.parquet). Columns, as verl's RLHFDataset and reward
manager expect them: `data_source` (Ops-6K's `torch#K`), `prompt` (chat messages: the solving
prompt of opforge.prompts), `ability` = "cuda", `reward_model` = {"style": "rule",
"ground_truth": task id}, `extra_info` (task id, split, index, code, ops, and the filter's
metrics as JSON text: their keys differ between tasks, and a parquet struct cannot).
"""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from opforge.prompts import solve_messages

SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.struct([("task_id", pa.string()), ("split", pa.string()), ("index", pa.int64()),
                              ("code", pa.string()), ("ops", pa.list_(pa.string())), ("metrics", pa.string())])),
])


def row(rec, index, data_dir):
    return {"data_source": rec["data_source"], "prompt": solve_messages(rec["code"], data_dir), "ability": "cuda",
            "reward_model": {"style": "rule", "ground_truth": rec["id"]},
            "extra_info": {"task_id": rec["id"], "split": rec["split"], "index": index, "code": rec["code"],
                           "ops": [str(o) for o in rec["ops"]], "metrics": json.dumps(rec["metrics"], sort_keys=True)}}


def write_verl(records, out_dir, data_dir):
    """Handler `write_verl`: writes <split>.parquet per split that has records; returns
    [{"file", "split", "records"}]."""
    files = []
    for split in ("train", "test"):
        rows = [row(r, i, data_dir) for i, r in enumerate(x for x in records if x["split"] == split)]
        if not rows and not (split == "train" and not records):
            continue
        name = f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), os.path.join(out_dir, name))
        files.append({"file": name, "split": split, "records": len(rows)})
    return files
