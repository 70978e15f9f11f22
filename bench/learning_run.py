#!/usr/bin/env python3
"""Issue #14's learning run: a <=5M-parameter Qwen2 trained from scratch by `opforge train sft` on
reference solutions of the corpus's train split, then `opforge train ppo` with the judge's reward
(policy torch-allowed), its greedy pass@1 and mean reward on held-out test tasks (split by op
signature cluster, `opforge export --test-fraction`) measured at the SFT point and every few PPO
steps, for several seeds. See bench/learning_run.md.

  python bench/learning_run.py --corpus EXPORT_DIR --device cuda --out OUT --time-budget-s 1080
  python bench/learning_run.py --small --out /tmp/lr     # CPU smoke test: builds a tiny corpus

Resumable: a call cut at any point (SIGKILL included) is continued by the same command with the
same --out. Every finished unit (corpus, reference check, model, SFT data, each SFT chunk with its
val loss and the plateau decision, each eval point, each PPO chunk) is in OUT/state.json, written
atomically, and skipped by the next call; the trainer's stages resume from their own checkpoints.
The time budget counts every call (OUT/clock.json). `--stop-after-s S` ends a call after a
finished unit once the next one would pass S seconds of that call (SIGTERM ends it as well).

Writes OUT/results.json, OUT/learning_run.png, OUT/summary.md (also printed) with whatever is
done, marked "partial" until every seed is; progress on stderr and in OUT/learning_run.log.
Everything is offline: the model and its tokenizer are made here (transformers from_config, a BPE
trained on the corpus text), nothing is downloaded.
"""
import argparse
import ctypes
import fcntl
import functools
import glob
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPFORGE = os.path.join(ROOT, "build", "opforge")  # --opforge replaces it (the GPU machine's build-gpu)
# Committed H200 workspaces whose 7,000 candidate programs are SFT's copy data (copy_records).
COPY_DBS = [os.path.join(ROOT, "bench", "results", "ops6k_h200.db.gz"),
            os.path.join(ROOT, "corpus", "checkpoints", "ops6k-h200.db.gz")]
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

T0 = time.time()
LOGFILE = None  # OUT/learning_run.log: every call's progress in one place, beside the state it explains


def log(msg):
    line = f"[learning_run {time.time() - T0:7.1f}s] {msg}"
    print(line, file=sys.stderr, flush=True)
    if LOGFILE:
        with open(LOGFILE, "a") as f:
            f.write(time.strftime("%H:%M:%S ") + line + "\n")


class Stop(Exception):
    """This call ends before the run does (--stop-after-s, SIGTERM); the next call goes on."""


def on_sigterm(signum, frame):
    # `timeout` sends TERM: end like --stop-after-s, so the results are written; a second TERM while
    # they are written is ignored.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stop("SIGTERM")


_LIBC = ctypes.CDLL("libc.so.6", use_errno=True)


def die_with_parent():
    # A child that outlived a SIGKILLed driver would go on writing into OUT beside the next call's
    # (PR_SET_PDEATHSIG; `opforge train` execs the trainer, which keeps it).
    _LIBC.prctl(1, signal.SIGTERM)


# The commands running now (seeds run side by side with --parallel-seeds): a call that stops ends
# them, as subprocess.run ends its child when the main thread is interrupted.
CHILDREN, CHILDREN_LOCK = set(), threading.Lock()
STOPPING = threading.Event()


def stop_children():
    STOPPING.set()
    with CHILDREN_LOCK:
        for p in CHILDREN:
            p.terminate()


def sh(args, capture=True, logfile=None, timeout=None):
    """Runs an opforge command; its stderr goes to `logfile` (appended); returns stdout."""
    log("$ " + " ".join(args))
    err = open(logfile, "a") if logfile else None
    try:
        with subprocess.Popen(args, stdout=subprocess.PIPE if capture else None, stderr=err or None, text=True,
                              cwd=ROOT, preexec_fn=die_with_parent) as proc:
            with CHILDREN_LOCK:
                CHILDREN.add(proc)
            try:
                out, _ = proc.communicate(timeout=timeout)
            except BaseException:
                proc.kill()
                raise
            finally:
                with CHILDREN_LOCK:
                    CHILDREN.discard(proc)
        r = subprocess.CompletedProcess(args, proc.returncode, out)
    finally:
        if err:
            err.close()
    if STOPPING.is_set():
        raise Stop("the call is stopping")
    if r.returncode != 0:
        tail = ""
        if logfile and os.path.exists(logfile):
            with open(logfile) as f:
                tail = "".join(f.readlines()[-15:])
        raise RuntimeError(f"{args[1:3]} failed with {r.returncode}\n{tail}")
    return r.stdout or ""


def write_json(path, obj):
    """Atomically: a kill leaves the old file or the new one, never half of one."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def read_json(path, default):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------- state across calls


class Clock:
    """The run's time across calls, in OUT/clock.json. SIGALRM saves it every few seconds (a timer,
    not a thread, so preexec_fn stays safe), so a SIGKILLed call's time counts to within that."""

    EVERY_S = 5

    def __init__(self, out):
        self.path = os.path.join(out, "clock.json")
        c = read_json(self.path, {})
        self.before, self.calls, self.t0 = c.get("spent_s", 0.0), c.get("calls", 0) + 1, None

    def start(self):
        self.t0 = time.time()
        self.save()
        signal.signal(signal.SIGALRM, lambda *_: self.save())
        signal.setitimer(signal.ITIMER_REAL, self.EVERY_S, self.EVERY_S)

    def spent(self):
        return self.before + (time.time() - self.t0 if self.t0 else 0.0)

    def save(self):
        write_json(self.path, {"spent_s": round(self.spent(), 1), "calls": self.calls})


class Run:
    """What every unit needs: options, config, OUT/state.json (finished units), the clock, the judge."""

    def __init__(self, args, cfg):
        self.args, self.cfg, self.out = args, cfg, args.out
        self.path = os.path.join(self.out, "state.json")
        self.state = read_json(self.path, {})
        self.clock = Clock(self.out)
        self.units = 0  # finished by this call: the first always runs, so every call gets somewhere
        self.stopped = None
        self.judge, self.judge_url = None, None
        # Seeds run in threads with --parallel-seeds: the state is changed and written under it.
        self.lock = threading.RLock()

    def save(self):
        with self.lock:
            write_json(self.path, self.state)

    def est(self, kind):
        return self.state.get("estimates", {}).get(kind)

    def finished(self, kind=None, seconds=None):
        """A unit is done: its time is the estimate of the next of its kind; state saved."""
        with self.lock:
            if kind:
                self.state.setdefault("estimates", {})[kind] = round(seconds, 1)
            self.units += 1
            self.save()

    def may_start(self, what, est=None):
        """Raises Stop when this call should end before `what` (--stop-after-s)."""
        if STOPPING.is_set():
            raise Stop(f"the call is stopping before {what}")
        cap = self.args.stop_after_s
        if not cap:
            return
        elapsed = time.time() - T0
        if elapsed >= cap or (est and self.units and elapsed + est > cap):
            raise Stop(f"stop-after-s {cap:.0f}: {elapsed:.0f}s used, {what} would take ~{est or 0:.0f}s")

    def unit(self, key, fn, kind=None):
        """The result of `fn` kept under `key`: computed once across calls."""
        if key in self.state:
            log(f"skip {key}: done in an earlier call")
            return self.state[key]
        self.may_start(key, self.est(kind) if kind else None)
        t = time.time()
        value = fn()
        with self.lock:
            self.state[key] = value
            self.finished(kind, time.time() - t)
        return value


# ---------------------------------------------------------------- corpus


def read_records(corpus):
    recs = []
    for p in sorted(glob.glob(os.path.join(corpus, "*.jsonl"))):
        recs += read_jsonl(p)
    if not recs:
        raise SystemExit(f"{corpus}: no .jsonl shards (an `opforge export` folder, plain JSONL)")
    return recs


def build_corpus(args, out):
    """`opforge run` (default preset, --count) into a workspace, then an export with a test split.
    A tiny corpus has few clusters: the next split seeds are tried until both sides have tasks."""
    ws = os.path.join(out, "workspace")
    corpus = os.path.join(out, "corpus")
    run = [OPFORGE, "run", "-w", ws, "--count", str(args.build_count), "--no-plots"]
    if args.device == "cpu":
        run += ["--device", "cpu"]
    sh(run, logfile=os.path.join(out, "corpus.log"))
    for seed in range(args.split_seed, args.split_seed + 5):
        sh([OPFORGE, "export", "-w", ws, "--out", corpus, "--test-fraction", str(args.test_fraction),
            "--split-seed", str(seed), "--no-plots", "--no-realism"], logfile=os.path.join(out, "corpus.log"))
        splits = [r.get("split") for r in read_records(corpus)]
        log(f"corpus split seed {seed}: {splits.count('train')} train, {splits.count('test')} test")
        if splits.count("train") and splits.count("test"):
            break
    return corpus


# ---------------------------------------------------------------- reference solutions

FENCE = "```"


def reference_solution(code):
    """A ModelNew correct under --policy torch-allowed: the task's own code, ModelNew its Model."""
    return code.rstrip() + "\n\n\nclass ModelNew(Model):\n    pass\n"


def reference_answer(code):
    # solve_task.md: "Answer with the complete Python file in one code block"; the judge takes the
    # answer's last code block.
    return f"{FENCE}python\n{reference_solution(code)}{FENCE}"


def verify_references(recs, out, n, device):
    """Judges n reference solutions with `opforge eval --policy torch-allowed`: all must be >= 1."""
    d = os.path.join(out, "verify")
    sol = os.path.join(d, "solutions")
    os.makedirs(sol, exist_ok=True)
    tasks = os.path.join(d, "tasks.jsonl")
    with open(tasks, "w") as f:
        for r in recs[:n]:
            f.write(json.dumps(r) + "\n")
            with open(os.path.join(sol, f"{r['id']}.py"), "w") as g:
                g.write(reference_solution(r["code"]))
    sh([OPFORGE, "eval", "--tasks", tasks, "--solutions", sol, "--out", os.path.join(d, "report"), "--policy",
        "torch-allowed", "--device", device, "--no-plots", "--trials", "3", "--budget-s", "2"],
       logfile=os.path.join(d, "eval.log"))
    with open(os.path.join(d, "report", "report.json")) as f:
        rep = json.load(f)
    rows = rep.get("rows") or rep.get("results") or []
    rewards = [row.get("reward") for row in rows]
    ok = sum(1 for x in rewards if isinstance(x, (int, float)) and x >= 1)
    # judge_* reasons are the environment's (the judge's own failure), not the solution's.
    env = sum(1 for row in rows if str(row.get("reason") or "").startswith("judge_"))
    log(f"reference solutions: {ok}/{len(rewards)} judged >= 1 under torch-allowed ({env} judge errors)")
    return {"judged": len(rewards), "correct": ok, "judge_errors": env, "rewards": rewards,
            "reasons": [row.get("reason") for row in rows]}


# ---------------------------------------------------------------- model, tokenizer, SFT data


def make_model(out, texts, cfg, seed):
    import torch
    import transformers
    from chat_fixture import MARKERS, bpe_tokenizer

    d = os.path.join(out, "init_model")
    tok = bpe_tokenizer(texts, cfg["vocab"], MARKERS)
    end = tok.convert_tokens_to_ids("<|end|>")
    conf = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
                                    num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                                    num_key_value_heads=cfg["kv_heads"], tie_word_embeddings=True,
                                    max_position_embeddings=cfg["max_pos"], rope_theta=10000.0,
                                    initializer_range=0.02, eos_token_id=[tok.eos_token_id, end],
                                    pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(conf)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(d)
    tok.save_pretrained(d)
    log(f"model: Qwen2 {cfg} -> {n / 1e6:.2f}M parameters, vocab {len(tok)}")
    return {"dir": d, "params": n, "vocab": len(tok)}


def sft_records(recs):
    from opforge.prompts import solve_messages

    data = os.path.join(ROOT, "data")
    return [{"messages": solve_messages(r["code"], data) + [{"role": "assistant", "content": reference_answer(r["code"])}]}
            for r in recs]


def write_sft_data(run, train, model_dir, sft_train, sft_val, extra=()):
    """The SFT files and max_new_tokens (answers' longest, in the model's tokens, plus a quarter).
    Validation is the train tasks' last tenth; `extra` (copy_records) only trains."""
    import transformers

    cfg = run.cfg
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    rows = sft_records(train)
    ntokens = lambda r: len(tok(tok.apply_chat_template(r["messages"], tokenize=False),  # noqa: E731
                                add_special_tokens=False).input_ids)
    ntok = [ntokens(r) for r in rows]
    ans = [len(tok(r["messages"][-1]["content"]).input_ids) for r in rows]
    max_new = int(max(ans) * 1.25) + 16
    log(f"sft records: {len(rows)}, tokens per record max {max(ntok)} mean {sum(ntok) / len(ntok):.0f}; "
        f"answers max {max(ans)} tokens -> max_new_tokens {max_new}")
    if max(ntok) > cfg["max_pos"]:
        log(f"WARNING: records longer than max_position_embeddings {cfg['max_pos']} are cut")
    nval = max(1, len(rows) // 10)
    # Validation: the train split's last tenth by cluster order would be cleaner; records are in id
    # order, so the last tenth is as good as random and never seen in training.
    fit = [r for r in sft_records(extra) if ntokens(r) <= cfg["max_pos"]]
    train_rows = (rows[:-nval] if len(rows) > nval else rows) + fit
    random.Random(0).shuffle(train_rows)
    write_jsonl(sft_train, train_rows)
    write_jsonl(sft_val, rows[-nval:])
    return {"records": len(rows), "copy_records": len(fit), "max_new": max_new, "tokens_max": max(ntok),
            "answer_tokens_max": max(ans)}


def op_signature(ops, table):
    """export's op signature (dedup's op_tokens joined): prefixes cut, lower case, aliases merged,
    layout-only ops (null in the table) left out, unknown ops their own token."""
    toks = []
    for name in ops or []:
        for prefix in table["op_prefixes"]:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        name = name.lower()
        tok = table["op_tokens"].get(name, name)
        if tok is not None:
            toks.append(tok)
    return toks


def db_tasks(db):
    """(code, ops) of every task of a workspace database, .db or .db.gz (sqlite opens no gzip: a
    temporary copy, removed after the read)."""
    import gzip
    import sqlite3

    with tempfile.TemporaryDirectory() as tmp:
        path = db
        if db.endswith(".gz"):
            path = os.path.join(tmp, "copy.db")
            with gzip.open(db) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
        con = sqlite3.connect(path)
        try:
            return con.execute("SELECT code, ops FROM tasks ORDER BY id").fetchall()
        finally:
            con.close()


def copy_records(dbs, test, limit):
    """More programs to copy for SFT: candidate tasks of other workspaces' databases (composed,
    judged or not: SFT only needs code), without any whose op signature, or its sorted tokens, or
    whose code, is a test task's, so no test task's near copy is trained on. 171 train tasks alone
    were memorised, not copied (train loss 0.15, val loss rising from 0.72 after 200 steps on the
    H200): copying from the prompt is what generalises, and it needs many programs."""
    table = json.load(open(os.path.join(ROOT, "data", "kernelbench_ops.json")))
    test_sigs = [op_signature(r.get("ops"), table) for r in test]
    sigs, bags = {" ".join(t) for t in test_sigs}, {" ".join(sorted(t)) for t in test_sigs}
    codes = {r["code"].strip() for r in test}
    out, dropped, seen = [], 0, set()
    for db in dbs:
        for code, ops in db_tasks(db):
            key = code.strip()
            if key in seen:
                continue
            seen.add(key)
            toks = op_signature(json.loads(ops), table)
            if " ".join(toks) in sigs or " ".join(sorted(toks)) in bags or key in codes:
                dropped += 1
                continue
            out.append({"code": code})
    log(f"copy data: {len(out)} programs from {len(dbs)} database(s), {dropped} left out for matching a test task; "
        f"{min(len(out), limit)} used")
    return out[:limit]


def write_jsonl(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def iter_jsonl(path):
    """A JSONL file's rows a line at a time (nothing if it is not there): a PPO seed's trajectories
    are ~1 MB a step."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        yield from (json.loads(line) for line in f if line.strip())


def read_jsonl(path):
    return list(iter_jsonl(path))


# ---------------------------------------------------------------- stages


def run_sft(run, model_dir, train, val):
    """SFT in chunks of cfg['sft_chunk'] steps (it resumes) until val_loss plateaus, the step cap or
    the SFT share of the budget. Each chunk's val loss and the plateau count are in the state."""
    args, cfg, d = run.args, run.cfg, os.path.join(run.out, "sft")
    # The share is SFT's own time, counted from its first chunk: what ran before it (the reference
    # check took 308 s of an H200 call) must not eat it.
    st = run.state.setdefault("sft", {"chunks": [], "best": None, "stale": 0, "done": None,
                                      "start_s": round(run.clock.spent(), 1)})
    for c in st["chunks"]:
        log(f"skip sft chunk to step {c['step']}: done in an earlier call (val_loss {c['val_loss']})")
    while not st["done"]:
        steps = st["chunks"][-1]["step"] if st["chunks"] else 0
        chunk_s = st["chunks"][-1]["s"] if st["chunks"] else None
        if steps >= cfg["sft_max_steps"]:
            st["done"] = "step cap"
        elif chunk_s and run.clock.spent() - st.get("start_s", 0) + chunk_s > args.sft_share * args.time_budget_s:
            st["done"] = "time share spent"
        if st["done"]:
            log(f"sft: {st['done']}")
            run.save()
            break
        steps += cfg["sft_chunk"]
        run.may_start(f"sft chunk to step {steps}", run.est("sft_chunk"))
        t = time.time()
        sh([OPFORGE, "train", "sft", "--model", model_dir, "--data", train, "--val", val, "--out", d, "--steps",
            str(steps), "--batch", str(cfg["sft_batch"]), "--lr", str(args.sft_lr), "--save-every",
            str(cfg["sft_chunk"]), "--max-len", str(cfg["max_pos"]), "--device", args.device, "--seed", "0"]
           + (["--bf16"] if args.bf16 else []), logfile=os.path.join(run.out, "sft.log"))
        chunk_s = time.time() - t
        vals = [m["val_loss"] for m in read_jsonl(os.path.join(d, "metrics.jsonl")) if "val_loss" in m]
        v = vals[-1] if vals else None
        log(f"sft: step {steps} val_loss {v} ({chunk_s:.0f}s a chunk)")
        if plateau_step(args, st, v):
            keep_best(d)
        st["chunks"].append({"step": steps, "val_loss": v, "s": round(chunk_s, 1)})
        run.finished("sft_chunk", chunk_s)
    best = os.path.join(d, "best_model")
    return best if os.path.isdir(best) else os.path.join(d, "model")


def keep_best(d):
    """The chunk's model as SFT's result: PPO starts from the lowest val loss, not the last chunk
    (on 171 tasks val loss rose from 0.72 at step 200 to 0.88 at 400)."""
    tmp = os.path.join(d, "best_model.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(os.path.join(d, "model"), tmp)
    shutil.rmtree(os.path.join(d, "best_model"), ignore_errors=True)
    os.replace(tmp, os.path.join(d, "best_model"))


def plateau_step(args, st, v):
    """A chunk's val loss against the best so far: `patience` chunks without a `rel` gain end SFT.
    True when this chunk is the new best."""
    if v is not None and (st["best"] is None or v < st["best"] * (1 - args.plateau_rel)):
        st["best"], st["stale"] = v, 0
        return True
    st["stale"] += 1
    if st["stale"] >= args.plateau_patience:
        st["done"] = f"val_loss plateaued ({args.plateau_patience} chunks without a {args.plateau_rel:.0%} gain)"
        log(f"sft: {st['done']}")
    return False


def start_judge(run, tasks):
    """One `opforge serve` for this call (warm workers, one baseline cache), its URL."""
    args, out = run.args, run.out
    extra = judge_options(args)
    cmd = [OPFORGE, "serve", "--tasks", tasks, "--port", "0", "--policy", "torch-allowed", "--device",
           args.device, "--max-batch", str(max(16, args.judge_concurrency))] + extra
    log("$ " + " ".join(cmd))
    stdout = open(os.path.join(out, "judge.out"), "w+")
    run.judge = subprocess.Popen(cmd, stdout=stdout, stderr=open(os.path.join(out, "judge.log"), "a"), cwd=ROOT,
                                 preexec_fn=die_with_parent)
    for _ in range(600):
        if run.judge.poll() is not None:
            raise RuntimeError(f"opforge serve exited with {run.judge.returncode}: see {out}/judge.log")
        stdout.seek(0)
        for line in stdout.read().splitlines():
            if line.startswith("listening on "):
                run.judge_url = line.split()[-1]
                log(f"judge at {run.judge_url}")
                return
        time.sleep(0.5)
    raise RuntimeError("opforge serve did not start in 300 s")


def judge_options(args):
    """serve's options past tasks, port, policy and batch. Untimed unless --timed-judge: a correct
    answer here is a copy of its task, so a 2 or 3 would be timing noise, and the baselines of the
    first 29 test tasks took the H200's judge 268 s (evaluator/README.md, --untimed). Each request
    to an answer's child is bounded by 120 s unless --judge-arg sets --timeout-s: a copy of a task
    runs in milliseconds, and serve's 600 s would let one looping answer hold an eval ten minutes."""
    extra = [x for a in args.judge_arg or [] for x in a.split()]
    bound = [] if "--timeout-s" in extra else ["--timeout-s", "120"]
    return ([] if args.timed_judge else ["--untimed"]) + bound + extra


def judge_args(run):
    """--judge-url of this call's judge, started the first time a unit needs one (a call that only
    skips finished units starts none)."""
    args = run.args
    if args.judge_per_command:
        return [f"--judge-arg={x}" for x in ["--policy", "torch-allowed"] + judge_options(args)]
    if not run.judge_url:
        start_judge(run, os.path.join(run.out, "tasks_all.jsonl"))
    # serve judges what is queued in batches: with 4 answers in flight (the trainer's old default)
    # each batch held 1-3, and 100 answers took 350 s on the H200 (~5 s of sandboxed start a batch).
    return ["--judge-url", run.judge_url, "--judge-concurrency", str(args.judge_concurrency)]


def run_eval(run, model, tasks, out_file):
    args, cfg = run.args, run.cfg
    judge = judge_args(run)
    o = sh([OPFORGE, "train", "eval", "--model", model, "--tasks", tasks, "--max-new-tokens", str(cfg["max_new"]),
            "--device", args.device, "--batch", str(cfg["eval_batch"]), "--out", out_file] + judge,
           logfile=out_file + ".log")
    res = json.loads(o.strip().splitlines()[-1])
    res["reasons"] = judge_reasons(out_file + ".log")
    log(f"eval {os.path.relpath(model, args.out)}: pass@1 {res.get('pass_at_1')} mean reward "
        f"{res.get('mean_reward')} ({res.get('judged')}/{res.get('tasks')} judged; by reason {res['reasons']})")
    return res


def judge_reasons(logfile):
    """The judge's verdicts by reason, from the trainer's "verdicts by reason" line (an eval's rows
    carry rewards only): an environment that fails answers shows here, not in pass@1 (on an 80 GB
    H100, 29 of 92 answers ran out of memory beside 11 other judge workers)."""
    found = None
    with open(logfile, errors="replace") as f:
        for line in f:
            if "verdicts by reason: " in line:
                found = line.split("verdicts by reason: ", 1)[1].strip()
    return json.loads(found) if found else None


POINT_KEYS = ("pass_at_1", "mean_reward", "judged", "tasks", "null", "reward_hist", "reasons")


def run_ppo_seed(run, actor0, train_tasks, test_tasks, seed, share_s):
    """PPO from the SFT model in chunks of eval_every steps, an eval of the actor after each. The
    seed's deadline (in run time) is fixed when it starts, so a resumed seed keeps its share."""
    args, cfg, d = run.args, run.cfg, os.path.join(run.out, f"ppo_seed{seed}")
    with run.lock:
        ps = run.state.setdefault("ppo", {}).get(str(seed))
        if ps is None:
            ps = run.state["ppo"][str(seed)] = {"deadline_s": round(run.clock.spent() + share_s, 1), "trained_to": 0,
                                                "chunk_s": None, "eval": [], "done": None, "train_s": None}
            run.save()
    for p in ps["eval"]:
        log(f"skip ppo seed {seed} step {p['step']} (chunk and eval): done in an earlier call")
    every = cfg["eval_every"]
    while not ps["done"]:
        step = ps["trained_to"]
        # An eval point: every eval_every steps and the last. A chunk split by chunk_end goes on to
        # its point first (in this call or the next); the share is checked at points only.
        at_point = step % every == 0 or step >= cfg["ppo_steps"]
        if at_point and (ps["eval"][-1]["step"] if ps["eval"] else 0) < step:
            run.may_start(f"eval seed {seed} step {step}", run.est("eval"))
            t = time.time()
            res = run_eval(run, os.path.join(d, "actor"), test_tasks,
                           os.path.join(run.out, f"eval_seed{seed}_step{step}.jsonl"))
            with run.lock:
                ps["eval"].append({"step": step, **{k: res.get(k) for k in POINT_KEYS}})
                ps["chunk_s"] = round((ps.get("train_s") or 0) + time.time() - t, 1)
                ps["train_s"] = None
                run.finished("eval", time.time() - t)
            write_report(run)
            continue
        if step >= cfg["ppo_steps"]:
            ps["done"] = "all steps"
        elif at_point and ps["chunk_s"] and run.clock.spent() + ps["chunk_s"] > ps["deadline_s"]:
            ps["done"] = f"time share spent at step {step}"
        if ps["done"]:
            log(f"ppo seed {seed}: {ps['done']}")
            run.save()
            break
        run_ppo_chunk(run, actor0, train_tasks, d, seed, ps, min((step // every + 1) * every, cfg["ppo_steps"]))


def chunk_end(run, seed, start, point):
    """The step this call trains a seed to: its next eval point when that fits before --stop-after-s
    at the last measured time a PPO step, else as many steps as fit (the rest in the next call);
    not one: Stop. Before, a seed whose chunk did not fit sat idle to the end of the call while its
    time share ran, and began the chunk anew in the next (thirty-third session: 2 of 3 seeds for
    ~185 s of a 480 s call, and they ended at step 8 where the third reached 16)."""
    per, cap = run.est("ppo_step"), run.args.stop_after_s
    if per and cap and run.units:
        fit = int((cap - (time.time() - T0)) // per) - 1
        point = start + max(1, min(fit, point - start))
    # A trainer's own start (CUDA, the model, the judge's first answers) counts as one step more.
    run.may_start(f"ppo seed {seed} to step {point}", per * (point - start + 1) if per else None)
    return point


def run_ppo_chunk(run, actor0, train_tasks, d, seed, ps, point):
    args, cfg = run.args, run.cfg
    start = ps["trained_to"]
    step = chunk_end(run, seed, start, point)
    t = time.time()
    sh([OPFORGE, "train", "ppo", "--actor", actor0, "--tasks", train_tasks, "--out", d, "--steps", str(step),
        "--batch", str(cfg["ppo_batch"]), "--rollouts-per-task", str(cfg["rollouts"]), "--max-new-tokens",
        str(cfg["max_new"]), "--lr", str(args.ppo_lr), "--critic-lr", str(args.ppo_critic_lr), "--kl-coef",
        str(args.kl_coef), "--seed", str(seed), "--device", args.device, "--ppo-epochs", str(cfg["ppo_epochs"]),
        "--mini-batch", str(cfg["ppo_mini_batch"]), "--advantage", args.ppo_advantage] + (["--bf16"] if args.bf16 else [])
       + judge_args(run), logfile=d + ".log")
    write_jsonl(os.path.join(d, "rollouts.jsonl"), rollout_rewards(os.path.join(d, "trajectories.jsonl")))
    secs = time.time() - t
    with run.lock:
        # train_s sums a split chunk's pieces: with the eval after them, the chunk's time (chunk_s)
        ps["trained_to"], ps["train_s"] = step, round((ps.get("train_s") or 0) + secs, 1)
        run.finished("ppo_step", secs / (step - start))


def rollout_rewards(path):
    """Each PPO step's judged answers as {step, task_id, rewards, tokens}, one row per prompt: which
    prompts had answers of one reward (RLOO learns nothing from them) and which tasks kept failing.
    The trajectories themselves (every token id and log-probability) are too big to bring back."""
    groups = {}
    for r in iter_jsonl(path):
        g = groups.setdefault((r["step"], r["task_id"]), {"step": r["step"], "task_id": r["task_id"],
                                                         "rewards": [], "tokens": []})
        g["rewards"].append(r["reward"])
        g["tokens"].append(len(r["logprobs"]))
    return list(groups.values())


def drop_units_without_checkpoints(run):
    """A call on a fresh machine may start from the compact copy of OUT that an earlier call sent
    back (bench/gpu_session.sh: no trainer checkpoints, whose optimizer states are ~100 MB a PPO
    seed). A unit cut half way whose checkpoint is not here starts again: SFT from step 0, a PPO
    seed from the SFT model (its eval points dropped, its share given anew). Finished units need
    no checkpoint."""
    st, out = run.state, run.out
    sft = st.get("sft")
    if sft and not sft.get("done") and sft.get("chunks") and not os.path.isdir(os.path.join(out, "sft", "checkpoint")):
        log(f"sft: no checkpoint of step {sft['chunks'][-1]['step']} here (a compact copy of OUT): SFT starts again")
        shutil.rmtree(os.path.join(out, "sft"), ignore_errors=True)
        del st["sft"]
    for seed, ps in list(st.get("ppo", {}).items()):
        d = os.path.join(out, f"ppo_seed{seed}")
        if ps.get("done") or not ps.get("trained_to") or os.path.isdir(os.path.join(d, "checkpoint")):
            continue
        log(f"ppo seed {seed}: no checkpoint of step {ps['trained_to']} here (a compact copy of OUT): the seed "
            "starts again from the SFT model")
        shutil.rmtree(d, ignore_errors=True)
        for f in glob.glob(os.path.join(out, f"eval_seed{seed}_step*.jsonl*")):
            os.remove(f)
        del st["ppo"][seed]
    run.save()


def run_stages(run, model_dir, sft_train, sft_val, train_tasks, test_tasks, seeds):
    sft_model = run_sft(run, model_dir, sft_train, sft_val)

    def sft_eval():
        run.unit("sft_eval", lambda: run_eval(run, sft_model, test_tasks, os.path.join(run.out, "eval_sft.jsonl")),
                 kind="eval")
        write_report(run)

    if run.args.parallel_seeds:
        left = run.args.time_budget_s - run.clock.spent()
        return run_together(run, {"sft_eval": sft_eval, **{
            f"seed{seed}": functools.partial(run_ppo_seed, run, sft_model, train_tasks, test_tasks, seed, left)
            for seed in seeds}})
    sft_eval()
    for i, seed in enumerate(seeds):
        left = run.args.time_budget_s - run.clock.spent()
        run_ppo_seed(run, sft_model, train_tasks, test_tasks, seed, left / (len(seeds) - i))


def run_together(run, units):
    """--parallel-seeds: the SFT eval and every seed's chunks and evals, each in a thread of its
    own, all on one GPU and one judge, each seed with the whole remaining budget (PPO starts from
    the SFT model, so nothing waits for the SFT eval). The judge answers each answer as it is
    judged (evaluator/README.md, serve), so one eval's slow answers hold up no other unit: the GPU
    trains and generates while the judge checks. A thread that would pass --stop-after-s stops
    alone (the others finish the units they are in); SIGTERM or an error ends every thread's
    command at once. Each keeps what it finished."""
    judge_args(run)  # one judge, started before the threads
    errors = []

    def one(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)
            if not isinstance(e, Stop):
                stop_children()

    threads = [threading.Thread(target=one, args=(fn,), name=name) for name, fn in units.items()]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            time.sleep(0.5)  # the main thread stays where SIGTERM's Stop can reach it
    except BaseException:
        stop_children()
        for t in threads:
            t.join()
        raise
    others = [e for e in errors if not isinstance(e, Stop)]
    if others or errors:
        raise (others or errors)[0]


# ---------------------------------------------------------------- report


def results(run):
    """results.json from the state: the same keys whether one call or several made it."""
    st, seeds = run.state, []
    for seed in run.seeds:
        ps = st.get("ppo", {}).get(str(seed))
        if ps is None:
            continue
        m = read_jsonl(os.path.join(run.out, f"ppo_seed{seed}", "metrics.jsonl"))
        keep = ("step", "reward_mean", "pass_rate", "kl_ref", "approx_kl", "entropy", "rollout_logp_gap",
                "response_length", "peak_mem_gib", "mixed_groups", "answers", "dropped")
        seeds.append({"seed": seed, "eval": ps["eval"], "stopped": ps["done"],
                      "train_metrics": [{k: x[k] for k in keep if k in x} for x in m]})
    sft = st.get("sft", {})
    m = read_jsonl(os.path.join(run.out, "sft", "metrics.jsonl"))
    done = len(seeds) == len(run.seeds) and all(s["stopped"] for s in seeds)
    return {"partial": not done, "stopped": run.stopped, "spent_s": round(run.clock.spent(), 1),
            "calls": run.clock.calls, "device": run.args.device, "config": run.cfg, "args": vars(run.args),
            "corpus": run.corpus_info, "reference_check": st.get("reference_check"), "model": st.get("model"),
            "sft": {"steps": sft["chunks"][-1]["step"] if sft.get("chunks") else 0, "stopped": sft.get("done"),
                    "chunks": sft.get("chunks", []),
                    "val_curve": [{"step": x.get("step"), "val_loss": x["val_loss"]} for x in m if "val_loss" in x],
                    "train_curve": [{"step": x.get("step"), "loss": x.get("loss")} for x in m]},
            "sft_eval": st.get("sft_eval"), "seeds": seeds, "wall_s": round(run.clock.spent(), 1),
            "paired": [p for p in (paired(run.out, seeds, step) for step in
                                   sorted({p["step"] for s in seeds for p in s["eval"]})) if p],
            "paired_all": paired_all(run.out, seeds)}


def write_report(run):
    """results.json, summary.md and the plot with what is done so far (after each eval point, so a
    SIGKILLed call still leaves them)."""
    with run.lock:
        res = results(run)
        write_json(os.path.join(run.out, "results.json"), res)
        return report(res, run.out)


def stat(seeds, step, key):
    xs = [p[key] for s in seeds for p in s["eval"] if p["step"] == step and p[key] is not None]
    if not xs:
        return None, None, 0
    mu = sum(xs) / len(xs)
    sd = (sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0
    return mu, sd, len(xs)


def train_mean(seeds, lo, hi, key):
    """The mean of a PPO metric over steps lo+1..hi of the seeds evaluated at hi (None if none logged
    it): what the updates between two eval points saw (mixed_groups: the share of prompts RLOO
    learns from)."""
    xs = [m[key] for s in seeds if any(p["step"] == hi for p in s["eval"])  # the seeds of the point's row
          for m in s["train_metrics"] if lo < m["step"] <= hi and m.get(key) is not None
          and m.get("dropped") != m.get("answers", -1)]  # a step the judge scored nothing of logs zeros
    return sum(xs) / len(xs) if xs else None


def eval_rewards(path):
    """{task_id: reward} of an eval's rows (None: the judge gave no verdict); {} if not there."""
    return {r["task_id"]: r.get("reward") for r in iter_jsonl(path)}


def paired(out, seeds, step, resamples=2000):
    """Each seed's step-`step` answers against the SFT model's on the same test tasks: the change
    of pass@1 (mean over seeds), a 95% interval from resampling the tasks (the same draw for every
    seed, so the pairing holds), and how many answers turned right (gains) or wrong (losses). The
    tasks are one sample of many, and the seeds' means vary less than a task draw: this interval,
    not the seeds' sd, says whether a rise is more than which tasks were drawn."""
    points = [(s["seed"], step) for s in seeds if any(p["step"] == step for p in s["eval"])]
    return compare_to_sft(out, points, step, resamples)


def paired_all(out, seeds, resamples=2000):
    """Every PPO eval point of every seed against the SFT model at once: per task the mean change
    over the points, then the same task-resampled interval. The goal's "rises over the PPO steps
    above the SFT start" as one test, chosen before the run it judges (thirty-third session), not
    the best of the per-step intervals."""
    return compare_to_sft(out, [(s["seed"], p["step"]) for s in seeds for p in s["eval"]], "all", resamples)


def compare_to_sft(out, points, step, resamples):
    """The evals at (seed, step) `points` against the SFT model's, paired by task (see paired)."""
    sft = eval_rewards(os.path.join(out, "eval_sft.jsonl"))
    runs = [eval_rewards(os.path.join(out, f"eval_seed{seed}_step{st}.jsonl")) for seed, st in points]
    tasks = sorted(t for t, r in sft.items() if r is not None and all(x.get(t) is not None for x in runs))
    if not runs or not tasks:
        return None
    right = lambda r: 1.0 if r > 0 else 0.0  # noqa: E731 - reward >= 1: correct
    d = [sum(right(x[t]) - right(sft[t]) for x in runs) / len(runs) for t in tasks]
    rng = random.Random(0)  # the same interval from the same rows
    means = sorted(sum(d[rng.randrange(len(d))] for _ in d) / len(d) for _ in range(resamples))
    return {"step": step, "seeds": len({seed for seed, _ in points}), "evals": len(runs), "tasks": len(tasks),
            "delta_pass_at_1": sum(d) / len(d),
            "ci95": [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]],
            "gains": sum(1 for x in runs for t in tasks if x[t] > 0 >= sft[t]),
            "losses": sum(1 for x in runs for t in tasks if sft[t] > 0 >= x[t]),
            "by_task": by_task(sft, runs, tasks)}


def by_task(sft, runs, tasks):
    """Where the turns are, per task: of the SFT model's wrong answers, how many were right in every
    eval, in some, in none; of its right ones, how many went wrong in some. A rise carried by a few
    tasks right everywhere reads differently from one spread thinly over many (s34: 3 tasks with
    one call's arguments fixed in all 14 evals)."""
    n_right = {t: sum(1 for x in runs if x[t] > 0) for t in tasks}
    wrong = [t for t in tasks if not sft[t] > 0]
    return {"sft_wrong": len(wrong), "right_in_all": sum(1 for t in wrong if n_right[t] == len(runs)),
            "right_in_some": sum(1 for t in wrong if 0 < n_right[t] < len(runs)),
            "right_in_none": sum(1 for t in wrong if n_right[t] == 0),
            "sft_right_wrong_in_some": sum(1 for t in tasks if sft[t] > 0 and n_right[t] < len(runs))}


def report(res, out):
    sft = res.get("sft_eval") or {}
    seeds = res["seeds"]
    steps = sorted({p["step"] for s in seeds for p in s["eval"]})
    f = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    lines = []
    if res["partial"]:
        lines += [f"**Partial run** ({res['spent_s']:.0f} s over {res['calls']} call(s); this call ended: "
                  f"{res['stopped'] or 'running, or killed'}): rerun the same command to go on.", ""]
    lines += ["| point | seeds | pass@1 mean ± sd | mean reward mean ± sd | test tasks | pass@1 − SFT, same tasks "
              "(95% interval) | turned right / wrong | PPO since the last point: train reward, mixed prompts |",
              "|---|---|---|---|---|---|---|---|",
              f"| SFT (step 0) | 1 | {f(sft.get('pass_at_1'))} | {f(sft.get('mean_reward'))} | {sft.get('tasks')} | | | |"]
    by_step = {p["step"]: p for p in res.get("paired") or []}
    for prev, st in zip([0] + steps, steps):
        pm, ps, n = stat(seeds, st, "pass_at_1")
        rm, rs, _ = stat(seeds, st, "mean_reward")
        p = by_step.get(st)
        cmp = (f"{p['delta_pass_at_1']:+.3f} ({p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}) | {p['gains']} / "
               f"{p['losses']}") if p else "— | —"
        train = f"{f(train_mean(seeds, prev, st, 'reward_mean'))}, {f(train_mean(seeds, prev, st, 'mixed_groups'))}"
        lines.append(f"| PPO step {st} | {n} | {f(pm)} ± {f(ps)} | {f(rm)} ± {f(rs)} | {sft.get('tasks')} | {cmp} "
                     f"| {train} |")
    lines += ["", pooled_line(res.get("paired_all")), "", sft_line(res)]
    table = "\n".join(lines)
    with open(os.path.join(out, "summary.md.tmp"), "w") as fh:
        fh.write(table + "\n")
    os.replace(os.path.join(out, "summary.md.tmp"), os.path.join(out, "summary.md"))
    try:
        plot(res, out, steps)
    except Exception as e:  # the numbers matter more than the picture
        log(f"plot failed: {e}")
    return table


def pooled_line(p):
    """The pooled comparison (paired_all) as a sentence under the table."""
    if not p:
        return "All PPO points against SFT: no eval point yet."
    return (f"All PPO points against SFT ({p['evals']} evals of {p['seeds']} seed(s), {p['tasks']} tasks): pass@1 "
            f"{p['delta_pass_at_1']:+.3f} (95% interval {p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}), turned right / "
            f"wrong {p['gains']} / {p['losses']}." + turns_sentence(p.get("by_task")))


def turns_sentence(b):
    if not b:
        return ""
    return (f" Of the SFT model's {b['sft_wrong']} wrong answers, {b['right_in_all']} were right in every PPO eval, "
            f"{b['right_in_some']} in some, {b['right_in_none']} in none; {b['sft_right_wrong_in_some']} of its right "
            f"answers went wrong in some.")


def sft_line(res):
    """Where the SFT start came from: the model's size, and whether SFT ended on the plateau rule
    (what the learning run's goal asks of it) or on its time share or step cap."""
    m, sft = res.get("model") or {}, res.get("sft") or {}
    curve = sft.get("val_curve") or []
    best = min((c["val_loss"] for c in curve if c.get("val_loss") is not None), default=None)
    params = f"{m['params'] / 1e6:.2f}M parameters" if m.get("params") else "model not built yet"
    return (f"SFT: {params}, {sft.get('steps', 0)} steps, best val loss "
            f"{'—' if best is None else f'{best:.4f}'}, ended: {sft.get('stopped') or 'not yet'}.")


def plot(res, out, steps):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sft, seeds = res.get("sft_eval") or {}, res["seeds"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, name in ((axes[0], "pass_at_1", "greedy pass@1 (test)"), (axes[1], "mean_reward", "mean reward (test)")):
        for s in seeds:
            xs = [0] + [p["step"] for p in s["eval"]]
            ys = [sft.get(key)] + [p[key] for p in s["eval"]]
            ax.plot(xs, [math.nan if y is None else y for y in ys], "o-", alpha=0.35, label=f"seed {s['seed']}")
        mus = [stat(seeds, st, key) for st in steps]
        xs = [0] + steps
        mu = [math.nan if y is None else y for y in [sft.get(key)] + [m[0] for m in mus]]
        sd = [0.0] + [m[1] or 0.0 for m in mus]
        ax.plot(xs, mu, "k-", lw=2, label="mean")
        ax.fill_between(xs, [a - b for a, b in zip(mu, sd)], [a + b for a, b in zip(mu, sd)], color="k", alpha=0.1)
        ax.axhline(mu[0], color="r", ls="--", lw=1, label="SFT start")
        ax.set_xlabel("PPO step")
        ax.set_title(name)
        ax.legend(fontsize=7)
    c = res["sft"]["val_curve"]
    axes[2].plot([p["step"] for p in c], [p["val_loss"] for p in c], "o-")
    axes[2].set_xlabel("SFT step")
    axes[2].set_title("SFT validation loss")
    params = (res.get("model") or {}).get("params") or 0
    fig.suptitle(f"opforge learning run{' (partial)' if res['partial'] else ''}: {params / 1e6:.2f}M-param Qwen2, "
                 f"{res['corpus']['train']} train / {sft.get('tasks')} test tasks, device {res['device']}")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "learning_run.png.tmp.png"), dpi=110)
    os.replace(os.path.join(out, "learning_run.png.tmp.png"), os.path.join(out, "learning_run.png"))
    plt.close(fig)


# ---------------------------------------------------------------- main

CONFIGS = {
    # ~3.5M parameters (the BPE stops near 2,300 tokens on the ~6,000 programs; tied embeddings).
    # SFT chunks of 500 steps of 32: a `train sft` call's start (CUDA, the model, the cached rows)
    # took 13 s of a 17 s chunk of 100 steps of 16 on the H200, and copying needs many epochs.
    # PPO: 2 passes in mini-batches of 8 answers, 8 optimizer steps per iteration: a seed gets ~4
    # iterations, and one update each (mini-batch = batch, the paper's) barely moves the SFT model;
    # the rollouts and their judging are the cost, the updates are not.
    "full": dict(vocab=4096, hidden=256, ffn=704, layers=4, heads=4, kv_heads=2, max_pos=4096, sft_chunk=500,
                 sft_max_steps=6000, sft_batch=32, ppo_steps=40, eval_every=5, ppo_batch=16, rollouts=4,
                 eval_batch=32, ppo_epochs=2, ppo_mini_batch=8),
    "small": dict(vocab=600, hidden=64, ffn=128, layers=2, heads=4, kv_heads=2, max_pos=4096, sft_chunk=2,
                  sft_max_steps=4, sft_batch=4, ppo_steps=1, eval_every=1, ppo_batch=2, rollouts=2, eval_batch=8,
                  ppo_epochs=1, ppo_mini_batch=0),
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="an `opforge export` folder (plain JSONL shards with a test split)")
    ap.add_argument("--build-count", type=int, default=0,
                    help="no --corpus: build one with `opforge run --count N` + export (default: 12 with --small)")
    ap.add_argument("--test-fraction", type=float, default=0.5, help="export's share of test clusters (built corpus)")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="results and state; the same --out again resumes the run")
    ap.add_argument("--opforge", default=OPFORGE, help="the opforge binary (opforge-trainer beside it)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--small", action="store_true", help="tiny smoke config (CPU, minutes)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--time-budget-s", type=float, default=1080, help="whole run over all calls, corpus build excluded")
    ap.add_argument("--stop-after-s", type=float, default=0,
                    help="end this call after a finished unit once the next would pass S s of it (0: never)")
    ap.add_argument("--sft-share", type=float, default=0.3, help="share of the budget for SFT")
    ap.add_argument("--test-tasks", type=int, default=0, help="test tasks evaluated (0: all; the goal wants >= 100)")
    ap.add_argument("--max-train-tasks", type=int, default=0)
    ap.add_argument("--verify", type=int, default=4, help="reference solutions judged by `opforge eval` first (0: none)")
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--ppo-lr", type=float, default=1e-5)
    ap.add_argument("--ppo-critic-lr", type=float, default=2e-5)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--ppo-advantage", choices=["gae", "rloo", "grpo"], default="gae",
                    help="train ppo's --advantage: gae (critic) or a group-relative, critic-free estimator")
    ap.add_argument("--plateau-rel", type=float, default=0.01, help="a val_loss gain below this share is no gain")
    ap.add_argument("--plateau-patience", type=int, default=3, help="chunks without a gain before SFT stops")
    ap.add_argument("--judge-arg", action="append",
                    help="extra `opforge serve` options for the judge, e.g. '--trials 10 --budget-s 1' (repeatable)")
    ap.add_argument("--timed-judge", action="store_true",
                    help="time answers and baselines (reward -1/1/2/3); default `--untimed`: correctness only, -1/1")
    ap.add_argument("--judge-per-command", action="store_true",
                    help="let every train eval/ppo start its own judge (default: one opforge serve a call)")
    ap.add_argument("--bf16", action="store_true", help="pass --bf16 to sft and ppo (CUDA)")
    ap.add_argument("--parallel-seeds", action="store_true",
                    help="run the SFT eval and the PPO seeds side by side (threads; one GPU, one judge), each "
                         "seed with the whole remaining budget, instead of one after another with a share each")
    ap.add_argument("--copy-db", nargs="*", default=COPY_DBS,
                    help="workspace databases (.db or .db.gz) whose candidate tasks add SFT records (copy_records)")
    ap.add_argument("--copy-records", type=int, default=None,
                    help="how many of them at most (0: none; default 6000, 0 with --small)")
    # An eval's 100 answers in one of serve's batches: in batches of 30 each batch waited for its
    # slowest answer (untimed on the H200: 30-44 s a batch, most answers done in the first 10).
    ap.add_argument("--judge-concurrency", type=int, default=128,
                    help="answers a train eval/ppo keeps in flight at the judge (fills serve's batches)")
    for k in ("hidden", "ffn", "heads", "kv_heads", "layers", "vocab", "ppo_steps", "eval_every", "ppo_batch",
              "rollouts", "sft_chunk", "sft_max_steps", "sft_batch", "ppo_epochs", "ppo_mini_batch"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, help="override the config's " + k)
    return ap.parse_args()


def check_fingerprint(run, train, test):
    """What the finished units depend on must not change between calls: a mismatch is an error, not
    a silently mixed run. Budget, stop-after, judge options and --verify may change."""
    import hashlib

    a = run.args
    ids = lambda rs: hashlib.sha1("\n".join(str(r.get("id")) for r in rs).encode()).hexdigest()  # noqa: E731
    fp = {"config": {k: v for k, v in run.cfg.items() if k != "max_new"}, "seeds": run.seeds, "device": a.device,
          "train_ids": ids(train), "test_ids": ids(test), "sft_lr": a.sft_lr, "ppo_lr": a.ppo_lr,
          "ppo_critic_lr": a.ppo_critic_lr, "kl_coef": a.kl_coef, "advantage": a.ppo_advantage, "plateau": [a.plateau_rel, a.plateau_patience],
          "bf16": a.bf16, "copy": [a.copy_db, a.copy_records]}
    old = run.state.setdefault("fingerprint", fp)
    old.setdefault("advantage", "gae")  # a run started before --ppo-advantage was GAE's
    diff = sorted(k for k in set(fp) | set(old) if fp.get(k) != old.get(k))
    if diff:
        raise SystemExit(f"{run.out} was started with other {', '.join(diff)}: use the same options or a new --out")
    run.save()


def prepare(run):
    """Corpus, task files, reference check, model and SFT data: each once across calls."""
    args, out = run.args, run.out
    corpus = args.corpus or run.unit("corpus", lambda: build_corpus(args, out))
    run.clock.start()  # the budget leaves the corpus build out
    recs = read_records(corpus)
    train = [r for r in recs if r.get("split") == "train"][:args.max_train_tasks or None]
    test = [r for r in recs if r.get("split") == "test"][:args.test_tasks or None]
    shared = {r.get("split_cluster") for r in train} & {r.get("split_cluster") for r in test}
    log(f"corpus {corpus}: {len(train)} train, {len(test)} test tasks; clusters on both sides: {len(shared)}")
    if not train or not test:
        raise SystemExit("need train and test records (export with --test-fraction > 0)")
    if len(test) < 100 and not args.small:
        log(f"WARNING: {len(test)} test tasks, the goal asks for >= 100")
    check_fingerprint(run, train, test)
    run.corpus_info = {"dir": corpus, "train": len(train), "test": len(test), "shared_clusters": len(shared)}
    tasks = {k: os.path.join(out, f"tasks_{k}.jsonl") for k in ("train", "test", "all")}
    for k, rows in (("train", train), ("test", test), ("all", train + test)):
        write_jsonl(tasks[k], rows)
    if args.verify:
        run.unit("reference_check", lambda: verify_references(train, out, args.verify, args.device))
    copies = functools.cache(lambda: copy_records(args.copy_db, test, args.copy_records) if args.copy_records else [])
    # The tokenizer learns the copy programs' words too: trained on the 189 train tasks alone it
    # stopped at 1,295 tokens (every word of theirs whole), and a test task's other names and sizes
    # came apart into pieces the model had rarely seen.
    model = run.unit("model", lambda: make_model(out, model_texts(train + copies()), run.cfg, seed=0))
    sft_train, sft_val = os.path.join(out, "sft_train.jsonl"), os.path.join(out, "sft_val.jsonl")
    data = run.unit("sft_data", lambda: write_sft_data(run, train, model["dir"], sft_train, sft_val, copies()))
    run.cfg["max_new"] = data["max_new"]
    return model["dir"], sft_train, sft_val, tasks["train"], tasks["test"]


def model_texts(train):
    from opforge.prompts import solve_messages

    return [r["code"] for r in train] + [m["content"] for m in solve_messages("x", os.path.join(ROOT, "data"))]


def lock_out(out):
    """One call at a time on an --out: a second would train into the same checkpoints."""
    fh = open(os.path.join(out, ".lock"), "w")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"{out} is in use by another learning_run call")
    return fh


def main():
    global OPFORGE, LOGFILE
    args = parse_args()
    args.out, OPFORGE = os.path.abspath(args.out), os.path.abspath(args.opforge)
    os.makedirs(args.out, exist_ok=True)
    lock = lock_out(args.out)  # noqa: F841 (held until exit)
    LOGFILE = os.path.join(args.out, "learning_run.log")
    if args.copy_records is None:
        args.copy_records = 0 if args.small else 6000
    cfg = dict(CONFIGS["small" if args.small else "full"])
    cfg.update({k: getattr(args, k) for k in cfg if getattr(args, k, None) is not None})
    if args.small and not args.test_tasks:
        args.test_tasks = 4
    if not args.corpus:
        args.build_count = args.build_count or (12 if args.small else 600)
    run = Run(args, cfg)
    run.seeds, run.corpus_info = [int(s) for s in args.seeds.split(",") if s != ""], None
    signal.signal(signal.SIGTERM, on_sigterm)
    log(f"call {run.clock.calls} on {args.out} ({run.clock.before:.0f}s of {args.time_budget_s:.0f}s spent before)")
    try:
        drop_units_without_checkpoints(run)
        paths = prepare(run)
        run_stages(run, *paths, run.seeds)
    except Stop as e:
        run.stopped = str(e)
        log(f"this call ends here ({e}); the same command goes on")
    except BaseException as e:
        run.stopped = f"error: {e!r}"[:300]
        raise
    finally:
        end_call(run)
    return 3 if run.stopped else 0


def end_call(run):
    """Whatever happened: the clock saved, the results written with what is done, the judge stopped
    (last: on SIGTERM it finishes the answers in flight first, 18 s in the CPU smoke run)."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if run.clock.t0:
        run.clock.save()
    if run.corpus_info:
        print(write_report(run), flush=True)
        log(f"{'partial' if results(run)['partial'] else 'done'}: {run.clock.spent():.0f}s of run time over "
            f"{run.clock.calls} call(s): {run.out}/results.json, learning_run.png, summary.md")
    if run.judge:
        run.judge.terminate()
        try:
            run.judge.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.judge.kill()


if __name__ == "__main__":
    sys.exit(main())
