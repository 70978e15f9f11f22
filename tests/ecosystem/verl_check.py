"""verl's own code (verl 0.9.1) on opforge's data and reward. Run by scripts/test_ecosystem.sh;
exits 1 with what differed, prints one JSON line.

- RL: verl's dataset factory (`create_rl_dataset`, so `RLHFDataset`, as its PPO trainer builds it
  from `data.train_files`/`data.val_files` of its own `ppo_trainer` config) loads the train.parquet
  and test.parquet of `opforge export --format verl`, every prompt through the chat template
  (`filter_overlong_prompts`). The task's row is rolled out twice (`rollout.n` = 2) by verl's
  `SingleTurnAgentLoop`, the LLM server's answers given (the honest solution, the hack, each in a
  fenced block), and post-processed by verl's `AgentLoopWorker`, whose streaming reward hands
  each trajectory's DataProto (built by verl's `_compute_score`) to a `RewardLoopWorker` ray actor of
  verl's `RewardLoopManager`; its `NaiveRewardManager` calls `compute_score` of
  python/opforge_rl/verl.py (the `custom_reward_function`) against the running `opforge serve`.
  The trainer's reward tensor (`extract_reward`) must give the honest one >= 1, the hack -1.
- SFT: `opforge.sft_parquet` writes an `opforge agent sft` record (system, user, assistant turns
  calling the agent's tools, tool answers) and verl's `MultiTurnSFTDataset` reads it with its SFT
  config (`data.tools_key` = `verl_tools`): the tools must reach the chat template as the agent
  offered them (less the nulls a parquet struct adds), every call in the loss mask, no user or
  tool text in it, and verl's check that turn-by-turn tokens equal the whole conversation's.

The tokenizer is a byte-level BPE trained here, offline, on the rows' own text, with a
tool-aware chat template; only generation is left out (no model), the responses are given.

  python3 tests/ecosystem/verl_check.py EXPORT_DIR URL TASK_ID HONEST.py HACK.py WORK_DIR
"""
import asyncio
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REWARD_FILE = os.path.join(ROOT, "python", "opforge_rl", "verl.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from chat_fixture import MARKERS, bpe_tokenizer  # noqa: E402
# agent/tools.cpp tool_definitions(), as `opforge agent sft` writes them into each record.
STR = {"type": "string"}


def tool(name, what, props, required):
    return {"type": "function", "function": {"name": name, "description": what, "parameters": {
        "type": "object", "properties": props, "required": required}}}


TOOLS = [tool("bash", "Run a bash command in your working folder (a sandbox: the folder is writable, no network). "
                      "Output is truncated; the command has a time limit.", {"command": STR}, ["command"]),
         tool("read_file", "Read a file of your working folder (path relative to it).", {"path": STR}, ["path"]),
         tool("write_file", "Write a file of your working folder (created or replaced; protected files refused).",
              {"path": STR, "content": STR}, ["path", "content"]),
         tool("submit", "End the episode: the judge evaluates the folder as it is now.", {}, [])]


def response(code):
    return f"Here it is:\n```python\n{code}```\n"


def save_tokenizer(texts, out_dir):
    """A byte-level BPE trained on `texts` with the chat template, saved where verl loads it."""
    bpe_tokenizer(texts, 1024, MARKERS).save_pretrained(out_dir)


def verl_config(name, overrides):
    """verl's own trainer config (its YAML, as `python -m verl.trainer.main_ppo` composes it)."""
    import verl.trainer
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.trainer.__file__), "config"),
                               version_base=None):
        return compose(name, overrides=overrides)


def rl_config(export_dir, tok_dir, work):
    return verl_config("ppo_trainer", [
        f"data.train_files=[{export_dir}/train.parquet]", f"data.val_files=[{export_dir}/test.parquet]",
        "data.max_prompt_length=8192", "data.max_response_length=4096", "data.filter_overlong_prompts=True",
        f"+data.cache_dir={work}/verl_cache", f"actor_rollout_ref.model.path={tok_dir}",
        "actor_rollout_ref.rollout.n=2",
        f"reward.custom_reward_function.path={REWARD_FILE}", "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1"])


def rl_rows(config, tok):
    """Every row of both splits as verl's RL dataset gives them."""
    from verl.trainer.ppo.utils import create_rl_dataset

    train = create_rl_dataset(config.data.train_files, config.data, tok, None, is_train=True)
    val = create_rl_dataset(config.data.val_files, config.data, tok, None, is_train=False)
    return [train[i] for i in range(len(train))], [val[i] for i in range(len(val))]


class ScriptedServer:
    """The LLM server's part in a rollout: it answers the prompt with the given response (and EOS)."""

    def __init__(self, tok, text):
        self.ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]

    async def generate(self, **_):
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(token_ids=self.ids, stop_reason="completed")


def loop_worker(config, tok, handles):
    """verl's AgentLoopWorker without its __init__ (that one connects to the LLM servers): the
    post-processing and streaming reward its rollouts run."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    w = object.__new__(AgentLoopWorker)
    w.config, w.tokenizer, w.processor, w.mm_processor_kwargs = config, tok, None, {}
    w.reward_loop_worker_handles, w.distillation_enabled = handles, False
    w.rollout_config = config.actor_rollout_ref.rollout  # the padding lengths (a dataclass wants an engine)
    return w


async def roll_out(config, worker, tok, batch, responses):
    """`batch` (rows of the RL dataset, repeated rollout.n times) through verl's single-turn agent
    loop, the i-th trajectory answered with responses[i], post-processed into the trainer's batch."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.utils.dataset.rl_dataset import RLHFDataset

    outs = []
    for i, text in enumerate(responses):
        kwargs = {k: v[i] for k, v in batch.non_tensor_batch.items()}
        loop = SingleTurnAgentLoop(trainer_config=DictConfigWrap(config), server_manager=ScriptedServer(tok, text),
                                   tokenizer=tok, processor=None, dataset_cls=RLHFDataset,
                                   data_config=DictConfigWrap(config.data))
        out = await loop.run(sampling_params={}, **kwargs)
        outs.append(await worker._agent_loop_postprocess(out, validate=False, **kwargs))
    return worker._postprocess(outs, input_non_tensor_batch=batch.non_tensor_batch)


def rewards(config, tok, batch, url, responses, work):
    """The reward tensor and its extra info the trainer gets for the rollouts, and the manager's
    class: RewardLoopManager's ray actors score them as the trajectories finish."""
    import ray
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop import RewardLoopManager
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    from verl.trainer.ppo.reward import extract_reward

    env = get_ppo_ray_runtime_env()
    env.setdefault("env_vars", {}).update({"OPFORGE_SERVE_URL": url, "PYTHONPATH": os.environ["PYTHONPATH"]})
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=env, log_to_driver=False,
             _temp_dir=os.path.join(work, "ray"))  # its sessions go with the work folder
    try:
        manager = RewardLoopManager(OmegaConf.create(OmegaConf.to_container(config, resolve=True)))
        worker = loop_worker(config, tok, manager.reward_loop_worker_handles)
        out = asyncio.run(roll_out(config, worker, tok, batch, responses))
    finally:
        ray.shutdown()
    return (*extract_reward(out), manager.reward_manager_cls.__name__)


def rl_check(export_dir, url, task_id, honest, hack, work, counts):
    from verl import DataProto
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import collate_fn

    tok_dir = os.path.join(work, "tokenizer")
    config = rl_config(export_dir, tok_dir, work)
    tok = hf_tokenizer(tok_dir)
    train, val = rl_rows(config, tok)
    row = [r for r in train + val if r["reward_model"]["ground_truth"] == task_id]
    failures = [] if [len(train), len(val)] == counts else [f"verl read {len(train)} + {len(val)} rows of {counts}"]
    failures += [] if len(row) == 1 else [f"{len(row)} rows with ground_truth {task_id}"]
    if failures:
        return {"train": len(train), "test": len(val)}, failures
    batch = DataProto.from_single_dict(collate_fn(row)).repeat(config.actor_rollout_ref.rollout.n, interleave=True)
    reward, extra, manager = rewards(config, tok, batch, url, [response(honest), response(hack)], work)
    scores = reward.sum(-1).tolist()
    seen = {"train": len(train), "test": len(val), "reward_manager": manager, "scores": scores,
            "correct": [float(c) for c in extra["correct"]], "reasons": [str(r) for r in extra["reason"]]}
    if not (scores[0] >= 1 and scores[1] == -1 and seen["correct"] == [1.0, 0.0]):
        failures.append(f"rewards through verl: {seen}")
    return seen, failures


def sft_record(code):
    """A record as `opforge agent sft` writes it (agent/sft.cpp sft_record): the episode cut after
    its last assistant turn (the call to submit), the agent's tools."""
    def call(i, name, args):
        return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    msgs = [{"role": "system", "content": "You write fast kernels for PyTorch models."},
            {"role": "user", "content": "Task linear_relu: write model_new.py in your folder."},
            {"role": "assistant", "content": "", "tool_calls": [call(0, "write_file", {"path": "model_new.py",
                                                                                         "content": code})]},
            {"role": "tool", "tool_call_id": "call_0", "content": f"wrote model_new.py ({len(code)} bytes)"},
            {"role": "assistant", "content": "Checking it.",
             "tool_calls": [call(1, "bash", {"command": "python3 -c 'import model_new'"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "exit code 0, no output"},
            {"role": "assistant", "content": "Submitting.", "tool_calls": [call(2, "submit", {})]}]
    return {"messages": msgs, "tools": TOOLS, "task_id": "linear_relu", "task": "linear_relu", "reward": 1,
            "rejudged_reward": 1, "turns": 3, "solution_hash": "0" * 16}


def sft_parquet(rec, work):
    """The record through opforge.sft_parquet, in the project's environment as `opforge agent sft` runs it."""
    src, dst = os.path.join(work, "rft.jsonl"), os.path.join(work, "rft.parquet")
    with open(src, "w") as f:
        f.write(json.dumps(rec) + "\n")
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    subprocess.run([sys.executable, "-m", "opforge.sft_parquet", src, dst], env=env, check=True)
    return dst


def without_nulls(x):
    if isinstance(x, dict):
        return {k: without_nulls(v) for k, v in x.items() if v is not None}
    return [without_nulls(v) for v in x] if isinstance(x, list) else x


def sft_check(code, work):
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    rec = sft_record(code)
    path = sft_parquet(rec, work)
    data = verl_config("sft_trainer_engine", [f"data.train_files={path}", "data.tools_key=verl_tools",
                                              "data.max_length=16384"]).data
    tok = hf_tokenizer(os.path.join(work, "tokenizer"))
    ds = MultiTurnSFTDataset(data.train_files, tok, data)  # as verl's create_sft_dataset builds it
    item = ds[0]  # raises when turn-by-turn tokens differ from the whole conversation's
    ids, loss = item["input_ids"], item["loss_mask"]
    trained, context = tok.decode(ids[loss == 1]), tok.decode(ids[loss == 0])
    calls = [c["function"] for m in rec["messages"] for c in m.get("tool_calls") or []]
    failures = []
    if without_nulls(ds.tools[0]) != TOOLS:
        failures.append(f"the tools verl renders are not the agent's: {ds.tools[0]}")
    if not all(f"{c['name']} {c['arguments']}" in trained for c in calls):
        failures.append("a tool call is not in the loss mask")
    if any(m["content"] in trained for m in rec["messages"] if m["role"] != "assistant"):
        failures.append("user, system or tool text is in the loss mask")
    if not all(m["content"] in context for m in rec["messages"] if m["role"] != "assistant"):
        failures.append("user, system or tool text is missing from the context")
    seen = {"rows": len(ds), "tokens": int(ids.numel()), "trained": int(loss.sum()), "calls": len(calls),
            "null_properties": json.dumps(ds.tools[0]).count(": null")}
    return seen, failures


def main(export_dir, url, task_id, honest_path, hack_path, work):
    import pyarrow.parquet as pq

    honest, hack = open(honest_path).read(), open(hack_path).read()
    splits = [pq.read_table(os.path.join(export_dir, f"{s}.parquet")).to_pylist() for s in ("train", "test")]
    prompts = [m["content"] for rows in splits for r in rows for m in r["prompt"]]
    save_tokenizer(prompts + [response(honest), response(hack), json.dumps(TOOLS)], os.path.join(work, "tokenizer"))
    sft, sft_failures = sft_check(honest, work)
    rl, rl_failures = rl_check(export_dir, url, task_id, honest, hack, work, [len(rows) for rows in splits])
    print(json.dumps({"verl_rl": rl, "verl_sft": sft, "failures": rl_failures + sft_failures}))
    return 1 if rl_failures + sft_failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:7]))
