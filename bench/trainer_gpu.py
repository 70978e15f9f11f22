"""opforge's trainer against transformers on one GPU (issue #14's H200 figure): generation tokens/s and
the time of one SFT training step (forward + backward + AdamW) for a random Qwen2 model shaped like
Qwen2.5-0.5B, in float32, bf16 autocast and bf16 autocast with gradient checkpointing,
opforge-trainer and transformers (eager PyTorch) side by side in the same call, with the peak
memory of each.

    python3 bench/trainer_gpu.py OPFORGE_TRAINER WORK_DIR [--device cuda|cpu] [--small] [--seq L]
        [--batch B] [--new-tokens N] [--steps S] [--repeats R] [--gen-budget S]
        [--settings fp32,bf16,bf16-ckpt] [--out results.json]

Run from the repo root by the python opforge was configured with (it imports python/opforge/
tokenizer.py, the tokenization opforge runs, and tests/python/chat_fixture.py). Nothing is
downloaded: WORK_DIR/model is a randomly initialised Qwen2 (seeded; hidden 896, 24 layers, 14 heads
over 2 kv heads, intermediate 4864, vocab 151936, tied embeddings, rope theta 1e6), saved in
bfloat16 by save_pretrained with a byte-level BPE tokenizer trained here (chat_fixture's, a few
thousand tokens: the config's vocab_size stays 151936, as Qwen2.5's exceeds its tokenizer's).
--small is a 2-layer, 64-wide model with the same vocabulary and every code path of the full one,
for a CPU smoke test.

Generation, batch 1, greedy, from the same prompt ids: opforge runs one `generate
--max-new-tokens 1` process and R `--max-new-tokens N` processes, and tokens/s = (tokens(N) -
tokens(1)) / (t(N) - t(1)) of the generation seconds each process reports in its --json (after
load and tokenizer, so process starts do not enter it), median of the repeats; its debug log's
phases (model load, tokenizer start, generation, decode) say what a process's start is made of.
transformers' model.generate (the same folder, sdpa, min_new_tokens=N) by the same difference after
a warm-up. --gen-budget S (default 60 on cuda) bounds each side's repeats: once one would not fit,
opforge's next runs with the tokens that fit (at least 32) or is skipped, transformers' is skipped;
the first repeat always runs. opforge generates in
bfloat16 on CUDA (float32 on the CPU): transformers is loaded in the same dtype. The eos token's
embedding row is zeroed so that greedy decoding of the random model never stops early (tied
embeddings: its logit is exactly 0, below the maximum of 151935 random ones); finish is checked.

Training: `train sft` on B synthetic chat records ({messages: [user, assistant]}) that render to
exactly L tokens (cut by --max-len L; the loss on the assistant's tokens), so every step sees the
same batch; step 1 is the warm-up, the median of the rest is reported. transformers runs what
opforge runs (trainer/sft.cpp, model.cpp, model_forward.cpp): float32 master weights, SDPA, the
same token ids and loss mask (labels -100 elsewhere, token-mean loss, logits upcast to float32
for it on both sides), use_cache=False, AdamW(lr 1e-5, betas 0.9/0.95, weight decay 0.01; torch's
default foreach implementation on CUDA, libtorch's per-tensor loop in opforge), gradient clipping
at 1.0. Each of --settings is one `train sft` process and one transformers model of its own:
  fp32       no autocast, no checkpointing (transformers at float32 matmul precision "highest");
  bf16       opforge --bf16 (at::autocast to bfloat16 around forward, loss and backward);
             transformers torch.autocast(device, torch.bfloat16) around forward + loss,
             backward outside it (as torch recommends; inside gives the same losses on the CPU);
  bf16-ckpt  the same plus opforge --grad-checkpoint (each decoder layer recomputed in backward,
             reentrant, the forward's autocast state replayed); transformers
             gradient_checkpointing_enable(use_reentrant=True) on every decoder layer, model.train().
The first-step losses of the two must agree (same weights, same batch): relative 1e-3 in float32,
2e-2 under bf16 autocast (matmuls rounded to bf16 in different orders: kernels, fusions). Peak
memory: transformers' torch.cuda.max_memory_allocated, opforge's peak_mem_gib from metrics.jsonl
when it writes one; for both, the GPU's memory.used above its level before the phase, sampled by
nvidia-smi (CUDA context and the allocator's cache included). On the CPU: peak RSS (opforge: each
process's own; transformers: the bench process's, its high-water mark reset before each setting
through /proc/self/clear_refs where the kernel allows).

Output: markdown tables on stdout (training: a row group per setting), everything as JSON in --out
(default WORK_DIR/results.json; training under "train", one entry per setting), progress on
stderr, each opforge process's stderr in WORK_DIR/logs/. The exit status is 1 when a setting's
first-step losses disagree beyond its tolerance. Defaults (L 1024, B 4, N 512, S 6, R 3, all three
settings, --gen-budget 60) are sized to finish inside ~240 s on one H200 (estimated, not yet
measured: ~15 s making the model, ~20 s for the 1-token opforge process and up to ~60 s of N-token
ones, 3 x ~25 s for sft processes, each with its final checkpoint of ~8 GB (float32 weights, AdamW
state, model), up to ~60 s for transformers' generation and 3 x ~10 s for its training steps; a
first run of opforge generate at the old ~65 ms a token took ~70 s alone); each opforge process
is also bounded by a timeout.
"""
import argparse
import contextlib
import gc
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "python"))

FULL = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
VOCAB = 151936
LR, WD, BETAS, CLIP = 1e-5, 0.01, (0.9, 0.95), 1.0
# The training settings: opforge-trainer's flags, transformers' counterpart, the first-step loss tolerance.
SETTINGS = {
    "fp32": {"bf16": False, "ckpt": False, "flags": [], "tol": 1e-3},
    "bf16": {"bf16": True, "ckpt": False, "flags": ["--bf16"], "tol": 2e-2},
    "bf16-ckpt": {"bf16": True, "ckpt": True, "flags": ["--bf16", "--grad-checkpoint"], "tol": 2e-2},
    # The batch as forward/backward passes of one sequence each, gradients added up before AdamW:
    # what --micro-batch saves in activation memory, and what it costs in step time.
    "bf16-micro1": {"bf16": True, "ckpt": False, "micro": 1, "flags": ["--bf16"], "tol": 2e-2},
}
PROMPT = "def forward(self, x): the kernel writes its output once per element"
T0 = time.time()


def log(msg):
    print(f"[trainer_gpu +{time.time() - T0:.1f}s] {msg}", file=sys.stderr, flush=True)


# --- the model folder --------------------------------------------------------------------------

def words(rng, n):
    """Pseudo-code text: identifiers from a fixed syllable set, punctuation, numbers."""
    syl = ["ker", "nel", "ten", "sor", "add", "mul", "red", "uce", "blo", "ck", "thr", "ead", "warp", "idx", "ptr",
           "out", "in", "ga", "te", "sum", "max", "exp", "log", "gem", "m", "conv", "pool", "norm", "scale", "bias"]
    punct = ["(", ")", ",", ".", ":", "=", "+", "*", "[", "]", "->", ";"]
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.15:
            out.append(rng.choice(punct))
        elif r < 0.22:
            out.append(str(rng.randrange(0, 4096)))
        else:
            out.append("".join(rng.choice(syl) for _ in range(rng.randint(1, 3))) + ("_" if rng.random() < 0.1 else ""))
    return " ".join(out)


def make_model(d, shape, seed):
    """A seeded random Qwen2 of `shape`, bf16 safetensors, with a BPE tokenizer and chat template.
    Reused when WORK_DIR/model was made with the same spec."""
    spec = {"shape": shape, "vocab": VOCAB, "seed": seed, "version": 1}
    stamp = os.path.join(d, "bench_spec.json")
    if os.path.exists(stamp) and json.load(open(stamp)) == spec:
        log(f"model: reusing {d}")
        return
    import torch
    import transformers
    from chat_fixture import MARKERS, bpe_tokenizer

    transformers.utils.logging.disable_progress_bar()

    shutil.rmtree(d, ignore_errors=True)
    rng = random.Random(seed)
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)  # the BPE trainer's progress goes to fd 1: keep stdout the table's
    try:
        tok = bpe_tokenizer([words(rng, 200) for _ in range(400)], 4000, MARKERS)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, tie_word_embeddings=True, max_position_embeddings=32768,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6}, rms_norm_eps=1e-6,
                                   use_sliding_window=False, initializer_range=0.02, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id, bos_token_id=None, **shape)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight[tok.eos_token_id].zero_()  # greedy never emits eos (module doc)
    model.to(torch.bfloat16).save_pretrained(d)
    tok.save_pretrained(d)
    n = sum(p.numel() for p in model.parameters())
    json.dump(spec, open(stamp, "w"))
    log(f"model: {n / 1e6:.1f}M parameters, tokenizer {len(tok)} tokens, config vocab {VOCAB}, saved in {d}")


def make_records(d, n, length, seed):
    """n chat records rendering to >= length tokens, and their rows cut to `length` as opforge's
    sft tokenizes them (python/opforge/tokenizer.py's chat_tokens, the code opforge runs)."""
    from opforge.tokenizer import chat_tokens

    rng = random.Random(seed + 1)
    recs = []
    for _ in range(n):
        user, extra = words(rng, max(8, length // 10)), max(16, length // 2)
        while True:
            rec = {"messages": [{"role": "user", "content": user},
                                {"role": "assistant", "content": words(rng, extra)}]}
            full = json.loads(chat_tokens(json.dumps({"model": d, "records": [rec], "max_len": 0})))["rows"][0]
            if len(full["ids"]) >= length + 8:
                break
            extra = int(extra * 1.5)
        recs.append(rec)
    rows = json.loads(chat_tokens(json.dumps({"model": d, "records": recs, "max_len": length})))["rows"]
    for r in rows:
        assert "error" not in r and len(r["ids"]) == length and sum(r["mask"]) > 0, r.get("error")
    return recs, rows


# --- measuring ---------------------------------------------------------------------------------

class GpuMem:
    """Peak of the GPU's memory.used (MiB) while running, sampled by nvidia-smi, above `base`."""

    def __init__(self, enabled):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.base = self.read() if self.enabled else None
        self.peak, self._stop, self._t = None, threading.Event(), None

    def read(self):
        try:
            out = subprocess.run(["nvidia-smi", "-i", self.gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
            return float(out.strip().splitlines()[0])
        except Exception:  # noqa: BLE001 - a missing reading is a missing figure, not a failed bench
            return None

    def __enter__(self):
        if self.enabled:
            self.peak = self.base
            self._t = threading.Thread(target=self._loop, daemon=True)
            self._t.start()
        return self

    def _loop(self):
        while not self._stop.is_set():
            v = self.read()
            if v is not None and self.base is not None:
                self.peak = max(self.peak, v)
            self._stop.wait(0.2)

    def __exit__(self, *_):
        if self._t:
            self._stop.set()
            self._t.join()

    def gib_above(self, base=None):
        base = self.base if base is None else base
        return None if self.peak is None or base is None else round((self.peak - base) / 1024, 3)


def run_opforge(cmd, log_file, timeout, device):
    """Runs an opforge-trainer command; (stdout, wall seconds, peak GiB: nvidia-smi on CUDA, this
    process's own peak RSS on the CPU, from wait4)."""
    killed = threading.Event()

    def kill():
        killed.set()
        p.kill()

    with open(log_file, "w") as err, GpuMem(device == "cuda") as mem:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            out = p.stdout.read()
            _, status, usage = os.wait4(p.pid, 0)  # reaps it (Popen's wait would not give its rusage)
        finally:
            timer.cancel()
            p.stdout.close()
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
    if killed.is_set():
        raise SystemExit(f"timed out after {timeout} s: {' '.join(cmd)} (log: {log_file})")
    if p.returncode != 0:
        tail = open(log_file).read()[-3000:]
        raise SystemExit(f"rc {p.returncode}: {' '.join(cmd)}\n{tail}")
    peak = mem.gib_above() if device == "cuda" else round(usage.ru_maxrss / 2**20, 3)
    return out, wall, peak


def reset_rss_peak():
    """Resets this process's peak RSS (VmHWM) where the kernel allows it (Linux >= 4.0); False if not."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_peak_gib():
    """This process's peak RSS: VmHWM (which reset_rss_peak resets), else getrusage's ru_maxrss."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 2**20, 3)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)


def med(xs):
    return statistics.median(xs) if xs else None


def sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# --- opforge -----------------------------------------------------------------------------------

def phases(log_file):
    """The phase times an opforge generate process logs at --log-level debug (main.cpp), or None."""
    for line in open(log_file, errors="replace"):
        if "generate phases: " in line:
            return line.split("generate phases: ", 1)[1].strip()
    return None


def opforge_generate_once(a, d, logs, n, tag, timeout):
    cmd = [a.trainer, "--log-level", "debug", "generate", "--model", d, "--prompt", PROMPT, "--max-new-tokens", str(n),
           "--greedy", "--device", a.device, "--json"]
    log_file = os.path.join(logs, f"opforge_generate_{tag}.log")
    out, wall, peak = run_opforge(cmd, log_file, timeout, a.device)
    j = json.loads(out.strip().splitlines()[-1])
    res = {"wall": wall, "gen_seconds": j["seconds"], "tokens": len(j["ids"]), "finish": j["finish"], "peak_gib": peak,
           "ids": j["ids"], "prompt_ids": j["prompt_ids"], "phases": phases(log_file)}
    log(f"opforge generate {tag}: {res['tokens']} tokens ({res['finish']}), process {wall:.1f} s, generation "
        f"{res['gen_seconds']:.2f} s; {res['phases']}")
    return res


def opforge_generate(a, d, logs):
    """One 1-token process, then up to R N-token processes inside --gen-budget seconds: tokens/s =
    (tokens(N) - tokens(1)) / (seconds(N) - seconds(1)) of the generation time each process reports
    (its --json `seconds`: after load and tokenizer), so neither process start enters it. A repeat
    that would not fit the budget is skipped, or run with fewer tokens when at least 32 fit."""
    t0 = time.time()
    one = opforge_generate_once(a, d, logs, 1, "n1", 300)
    runs, n = [], a.new_tokens
    for r in range(a.repeats):
        res = opforge_generate_once(a, d, logs, n, f"n{n}_r{r}", 300)
        dt = res["gen_seconds"] - one["gen_seconds"]
        res["tokens_per_s"] = (res["tokens"] - one["tokens"]) / dt if dt > 0 else None
        runs.append(res)
        log(f"opforge generate {r + 1}/{a.repeats}: {fmt(res['tokens_per_s'], 1)} tokens/s")
        left = a.gen_budget - (time.time() - t0) if a.gen_budget else float("inf")
        per_token = dt / max(res["tokens"] - one["tokens"], 1)
        if r + 1 < a.repeats and res["wall"] > left:
            n = min(a.new_tokens, int((left - one["wall"]) / per_token)) if per_token > 0 else 0
            if n < 32:
                log(f"opforge generate: {a.repeats - r - 1} repeat(s) skipped (--gen-budget {a.gen_budget} s)")
                break
            log(f"opforge generate: the next repeat makes {n} tokens to fit --gen-budget {a.gen_budget} s")
    last, pairs = runs[0], [r["tokens_per_s"] for r in runs]
    short = [r["finish"] for r in runs if r["finish"] != "length"]
    return {"tokens_per_s": med([x for x in pairs if x is not None]), "tokens_per_s_runs": pairs,
            "new_tokens": last["tokens"], "new_tokens_runs": [r["tokens"] for r in runs],
            "finish": last["finish"], "early_stops": len(short),
            "process_seconds_n": med([r["wall"] for r in runs]), "process_seconds_1": one["wall"],
            "gen_seconds_n": med([r["gen_seconds"] for r in runs]), "gen_seconds_1": one["gen_seconds"],
            "phases_1": one["phases"], "phases_n": last["phases"],
            "peak_gib": max((r["peak_gib"] or 0) for r in runs) or None,
            "dtype": "bfloat16" if a.device == "cuda" else "float32"}, last["prompt_ids"], last["ids"]


def sft_precision(log_file):
    """The precision opforge's sft says it ran with ({bf16, grad_checkpoint} of its `sft options` line)."""
    for line in open(log_file, errors="replace"):
        if "sft options: " in line:
            try:
                return json.loads(line.split("sft options: ", 1)[1]).get("precision")
            except ValueError:
                return None
    return None


def opforge_train(a, d, work, logs, name):
    S = SETTINGS[name]
    data, out = os.path.join(work, "sft.jsonl"), os.path.join(work, "sft_out")
    shutil.rmtree(out, ignore_errors=True)  # a checkpoint there would be resumed
    cmd = [a.trainer, "train", "sft", "--model", d, "--data", data, "--out", out, "--steps", str(a.steps), "--batch",
           str(a.batch), "--micro-batch", str(S.get("micro", 0)), "--max-len", str(a.seq), "--lr", str(LR), "--weight-decay", str(WD),
           "--max-grad-norm", str(CLIP), "--save-every", str(a.steps), "--device", a.device] + S["flags"]
    log_file = os.path.join(logs, f"opforge_sft_{name}.log")
    _, wall, peak = run_opforge(cmd, log_file, 600, a.device)
    precision = sft_precision(log_file)
    want = {"bf16": S["bf16"], "grad_checkpoint": S["ckpt"]}
    if precision is not None and precision != want:
        raise SystemExit(f"opforge sft {name}: ran with precision {precision}, asked for {want} (log: {log_file})")
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if x.strip()]
    rest = rows[1:] or rows
    secs = med([r["seconds"] for r in rest])
    mem_keys = sorted({k for r in rows for k in r if "mem" in k})
    res = {"step_seconds": secs, "step_seconds_runs": [r["seconds"] for r in rows],
           "tokens_per_s": a.batch * a.seq / secs, "loss_tokens_per_s": med([r["tokens_per_s"] for r in rest]),
           "loss_tokens": rows[0]["tokens"], "losses": [r["loss"] for r in rows], "process_seconds": wall,
           "peak_gib_smi" if a.device == "cuda" else "peak_rss_gib": peak, "flags": S["flags"],
           "precision": precision, "dtype": "float32 weights" + (", bf16 autocast" if S["bf16"] else ""),
           "attention": "at::scaled_dot_product_attention (boolean mask)",
           "checkpointing": "each decoder layer (reentrant)" if S["ckpt"] else "off",
           "micro_batch": S.get("micro") or "whole batch"}
    for k in mem_keys:
        res["metrics_" + k] = max(r[k] for r in rows if k in r)
    res["peak_gib"] = res.get("metrics_peak_mem_gib")
    log(f"opforge sft {name}: {len(rows)} steps, median step {secs:.3f} s (the first {rows[0]['seconds']:.3f} s); "
        f"process {wall:.1f} s; losses {[round(x, 4) for x in res['losses']]}")
    shutil.rmtree(out, ignore_errors=True)  # ~4x the model in float32 (weights, Adam state, the saved model)
    return res


# --- transformers ------------------------------------------------------------------------------

def hf_generate(a, d, prompt_ids):
    import torch
    from transformers import AutoModelForCausalLM

    dev, dtype = a.device, torch.bfloat16 if a.device == "cuda" else torch.float32
    m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="sdpa").to(dev).eval()
    ids = torch.tensor([prompt_ids], device=dev)
    pad = m.generation_config.pad_token_id

    def gen(n):
        sync(dev)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=pad)
        sync(dev)
        return time.perf_counter() - t0, out[0, ids.shape[1]:].tolist()

    gen(min(8, a.new_tokens))  # warm-up
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    pairs, full, t0 = [], [], time.time()
    with GpuMem(dev == "cuda") as mem:
        for r in range(a.repeats):
            tn, toks = gen(a.new_tokens)
            t1, _ = gen(1)
            pairs.append((len(toks) - 1) / (tn - t1) if tn > t1 else None)
            full.append(len(toks) / tn)
            log(f"transformers generate {r + 1}/{a.repeats}: {len(toks)} tokens in {tn:.2f} s, 1 in {t1:.3f} s: "
                f"{fmt(pairs[-1], 1)} tokens/s")
            if a.gen_budget and r + 1 < a.repeats and time.time() - t0 + tn + t1 > a.gen_budget:
                log(f"transformers generate: {a.repeats - r - 1} repeat(s) skipped (--gen-budget {a.gen_budget} s)")
                break
    res = {"tokens_per_s": med([x for x in pairs if x is not None]), "tokens_per_s_runs": pairs,
           "tokens_per_s_with_prefill": med(full),
           "new_tokens": len(toks), "dtype": str(dtype).replace("torch.", ""),
           "attention": m.config._attn_implementation,
           "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if dev == "cuda" else None,
           "peak_gib_smi": mem.gib_above(a.gpu_base)}
    del m
    return res, toks


def accumulate(m, ids, attn, labels, micro, autocast):
    """Forward and backward over micro-batches of `micro` rows, each loss weighted by its share of
    the batch's loss tokens, so the gradients add up to the whole batch's token-mean loss (what
    opforge's --micro-batch does). Returns that loss."""
    total = int((labels[:, 1:] != -100).sum())
    loss = 0.0
    for i in range(0, len(ids), micro):
        lab = labels[i:i + micro]
        n = int((lab[:, 1:] != -100).sum())
        if n == 0:
            continue
        with autocast():
            part = m(input_ids=ids[i:i + micro], attention_mask=attn[i:i + micro], labels=lab, use_cache=False).loss
        (part * (n / total)).backward()
        loss += part.item() * n / total
    return loss


def hf_train(a, d, rows, name):
    import torch
    from transformers import AutoModelForCausalLM

    S, dev = SETTINGS[name], a.device
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    rss_reset = dev == "cpu" and reset_rss_peak()
    # What opforge's sft runs: float32 master weights; bf16 autocast and layer checkpointing as the setting says.
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa").to(dev)
    m.config.use_cache = False  # checkpointing requires it; opforge's training forward keeps no cache either
    if S["ckpt"]:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    m.train()
    assert m.training and m.is_gradient_checkpointing == S["ckpt"]
    autocast = (lambda: torch.autocast(device_type=dev, dtype=torch.bfloat16)) if S["bf16"] else contextlib.nullcontext
    ids = torch.tensor([r["ids"] for r in rows], device=dev)
    labels = torch.where(torch.tensor([r["mask"] for r in rows], device=dev).bool(), ids, -100)
    attn = torch.ones_like(ids)
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, weight_decay=WD)
    times, losses = [], []
    with GpuMem(dev == "cuda") as mem:
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(a.steps):
            sync(dev)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = accumulate(m, ids, attn, labels, S.get("micro") or len(ids), autocast)
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            opt.step()
            losses.append(loss)
            sync(dev)
            times.append(time.perf_counter() - t0)
    secs = med(times[1:] or times)
    res = {"step_seconds": secs, "step_seconds_runs": times, "tokens_per_s": a.batch * a.seq / secs,
           "loss_tokens_per_s": int((labels[:, 1:] != -100).sum()) / secs, "losses": losses,
           "dtype": "float32 weights" + (", torch.autocast bf16" if S["bf16"] else ""),
           "attention": m.config._attn_implementation,
           "checkpointing": "each decoder layer (use_reentrant=True)" if S["ckpt"] else "off",
           "micro_batch": S.get("micro") or "whole batch",
           "optimizer": "torch.optim.AdamW (default foreach)" if dev == "cuda" else "torch.optim.AdamW",
           "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if dev == "cuda":
        res["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        res["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        res["peak_gib_smi"] = mem.gib_above(a.gpu_base)
    else:
        res["peak_rss_gib"] = rss_peak_gib()
        res["peak_rss_reset"] = rss_reset  # False: the bench process's peak since its start
    log(f"transformers train {name}: median step {secs:.3f} s (first {times[0]:.3f} s); "
        f"losses {[round(x, 4) for x in losses]}")
    del m, opt, params
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    return res


# --- report ------------------------------------------------------------------------------------

def fmt(v, nd=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def ratio(x, y):
    return f"{x / y:.2f}x" if x and y else "-"


def report(a, R):
    og, hg = R["opforge_generate"], R["hf_generate"]
    lines = [f"## opforge-trainer vs transformers: random Qwen2 {R['model']['params_m']:.0f}M "
             f"({'small' if a.small else 'Qwen2.5-0.5B shape'}), {a.device} "
             f"({R['device_name']}), torch {R['torch']}, transformers {R['transformers']}", "",
             f"Generation, batch 1, greedy, prompt {len(R['prompt_ids'])} tokens, {a.new_tokens} new tokens "
             f"(tokens/s = (tokens(N) - tokens(1)) / (t(N) - t(1)), median of the repeats that fit "
             f"--gen-budget {a.gen_budget or '-'} s; opforge: generation seconds each process reports):", "",
             "| | opforge | transformers | opforge / transformers |", "|---|---|---|---|",
             f"| tokens/s | {fmt(og['tokens_per_s'], 1)} | {fmt(hg['tokens_per_s'], 1)} | "
             f"{ratio(og['tokens_per_s'], hg['tokens_per_s'])} |",
             f"| new tokens (finish) | {og['new_tokens']} ({og['finish']}) | {hg['new_tokens']} (min_new_tokens) | |",
             f"| dtype | {og['dtype']} | {hg['dtype']} | |",
             f"| attention | at::scaled_dot_product_attention, KV cache | {hg['attention']}, DynamicCache | |",
             f"| tokens/s of each run | {', '.join(fmt(x, 1) for x in og['tokens_per_s_runs'])} | "
             f"{', '.join(fmt(x, 1) for x in hg['tokens_per_s_runs'])} | |",
             f"| peak GiB, nvidia-smi | {fmt(og['peak_gib'])} | {fmt(hg['peak_gib_smi'])} "
             f"(max allocated {fmt(hg['peak_gib'])}) | {ratio(og['peak_gib'], hg['peak_gib_smi'])} |"
             if a.device == "cuda" else f"| peak RSS GiB | {fmt(og['peak_gib'])} | - | |",
             f"| process s, N / 1 token | {fmt(og['process_seconds_n'], 2)} / {fmt(og['process_seconds_1'], 2)} | | |",
             f"| generation s, N / 1 token | {fmt(og['gen_seconds_n'], 2)} / {fmt(og['gen_seconds_1'], 2)} | | |",
             f"| 1-token process phases | {og['phases_1'] or '-'} | | |",
             "", f"Greedy ids equal for the first {R['leading_equal']} of {a.new_tokens} tokens "
             f"({'bf16: near-ties may differ' if a.device == 'cuda' else 'float32'})."]
    lines += ["", f"Training step (forward + backward + AdamW + clip), batch {a.batch} x {a.seq} tokens, "
              f"median of steps 2..{a.steps}, float32 master weights on both sides:", "",
              "| setting | | opforge | transformers | opforge / transformers |", "|---|---|---|---|---|"]
    for name, T in R["train"].items():
        ot, ht = T["opforge"], T["transformers"]
        g = [("step s", fmt(ot["step_seconds"]), fmt(ht["step_seconds"]),
              ratio(ot["step_seconds"], ht["step_seconds"])),
             ("tokens/s (B x L)", fmt(ot["tokens_per_s"], 0), fmt(ht["tokens_per_s"], 0),
              ratio(ot["tokens_per_s"], ht["tokens_per_s"])),
             ("loss tokens/s", fmt(ot["loss_tokens_per_s"], 0), fmt(ht["loss_tokens_per_s"], 0), "")]
        if a.device == "cuda":
            g += [("peak GiB, allocator", fmt(ot["peak_gib"]), f"{fmt(ht['peak_gib'])} (max allocated)",
                   ratio(ot["peak_gib"], ht["peak_gib"])),
                  ("peak GiB, nvidia-smi", fmt(ot["peak_gib_smi"]), fmt(ht.get("peak_gib_smi")),
                   ratio(ot["peak_gib_smi"], ht.get("peak_gib_smi")))]
        else:
            since = "" if ht.get("peak_rss_reset") else ", since its start"
            g.append(("peak RSS GiB", fmt(ot["peak_rss_gib"]), f"{fmt(ht['peak_rss_gib'])} (bench process{since})",
                      ratio(ot["peak_rss_gib"], ht["peak_rss_gib"])))
        g += [("loss step 1 / last", f"{fmt(ot['losses'][0], 5)} / {fmt(ot['losses'][-1], 5)}",
               f"{fmt(ht['losses'][0], 5)} / {fmt(ht['losses'][-1], 5)}",
               f"step 1 rel. diff {T['first_loss_rel_diff']:.1e} (tol {T['tolerance']:.0e}"
               f"{')' if T['loss_agrees'] else ', EXCEEDED)'}"),
              ("checkpointing", ot["checkpointing"], ht["checkpointing"], ""),
              ("rows per forward/backward", ot["micro_batch"], ht["micro_batch"], ""),
              (f"sft process s (load, {a.steps} steps, checkpoint)", fmt(ot["process_seconds"], 1), "", "")]
        for n, (what, o, h, r) in enumerate(g):
            lines.append(f"| {'**' + name + '**' if n == 0 else ''} | {what} | {o} | {h} | {r} |")
    first = next(iter(R["train"].values()))["transformers"]
    lines += ["", "Settings: fp32 = no autocast (transformers at float32 matmul precision "
              f"{first['float32_matmul_precision']}); bf16 = opforge --bf16 (at::autocast), transformers "
              "torch.autocast(bfloat16) around forward + loss; bf16-ckpt = bf16 plus opforge --grad-checkpoint, "
              "transformers gradient_checkpointing_enable(use_reentrant=True); bf16-micro1 = bf16 with opforge "
              "--micro-batch 1, transformers one forward/backward per sequence, each loss weighted by its share "
              "of the batch's loss tokens, then one AdamW step. Both: attention SDPA (opforge "
              "at::scaled_dot_product_attention with a padding mask, transformers sdpa), use_cache off, "
              f"AdamW (libtorch's; transformers {first['optimizer']}), clip {CLIP}, batch x seq {a.batch} x {a.seq}.",
              "", f"Total {R['total_seconds']:.0f} s."]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trainer", help="the opforge-trainer binary")
    ap.add_argument("work", help="work folder (the model, data, logs; reused model when its spec matches)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--small", action="store_true", help="a 2-layer 64-wide model (same vocabulary), for the CPU")
    ap.add_argument("--seq", type=int, help="training sequence length (default 1024; --small 64)")
    ap.add_argument("--batch", type=int, help="training batch (default 4; --small 2)")
    ap.add_argument("--new-tokens", type=int, help="generated tokens (default 512; --small 16)")
    ap.add_argument("--steps", type=int, help="training steps, the first a warm-up (default 6; --small 3)")
    ap.add_argument("--repeats", type=int, default=3, help="generation timings (median)")
    ap.add_argument("--gen-budget", type=float,
                    help="seconds each side's generation timing may take: later repeats are skipped or shortened "
                         "to fit (default 60 on cuda, 0 = none on the CPU)")
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help=f"training settings, comma-separated, of {', '.join(SETTINGS)} (default all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="results JSON (default WORK/results.json)")
    a = ap.parse_args()
    for k, full, small in (("seq", 1024, 64), ("batch", 4, 2), ("new_tokens", 512, 16), ("steps", 6, 3)):
        if getattr(a, k) is None:
            setattr(a, k, small if a.small else full)
    if a.gen_budget is None:
        a.gen_budget = 60.0 if a.device == "cuda" else 0.0
    assert a.new_tokens > 1 and a.steps >= 2 and a.repeats >= 1
    a.settings = [x.strip() for x in a.settings.split(",") if x.strip()]
    bad = [x for x in a.settings if x not in SETTINGS]
    if bad or not a.settings or len(set(a.settings)) != len(a.settings):
        ap.error(f"--settings: {','.join(bad) or 'empty or repeated'}: pick from {', '.join(SETTINGS)}")
    a.trainer = os.path.abspath(a.trainer)
    work = os.path.abspath(a.work)
    d, logs = os.path.join(work, "model"), os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    a.gpu_base = GpuMem(a.device == "cuda").base  # before this process touches the GPU

    random.seed(a.seed)
    make_model(d, SMALL if a.small else FULL, a.seed)
    recs, rows = make_records(d, a.batch, a.seq, a.seed)
    with open(os.path.join(work, "sft.jsonl"), "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    log(f"data: {a.batch} records of {a.seq} tokens, {sum(sum(r['mask'][1:]) for r in rows)} loss tokens")

    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(a.seed)
    R = {"args": {k: v for k, v in vars(a).items() if k != "gpu_base"}, "torch": torch.__version__,
         "transformers": transformers.__version__,
         "device_name": torch.cuda.get_device_name(0) if a.device == "cuda" else f"{os.cpu_count()} cores"}
    cfg = json.load(open(os.path.join(d, "config.json")))
    R["model"] = {k: cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                          "num_key_value_heads", "intermediate_size", "vocab_size",
                                          "tie_word_embeddings", "rope_parameters", "max_position_embeddings")}
    h, L, I, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    R["model"]["params_m"] = (V * h + L * (h * h * 2 + 2 * h * kv + h + 2 * kv + 3 * h * I + 2 * h) + h) / 1e6

    log("opforge generate")
    R["opforge_generate"], R["prompt_ids"], o_ids = opforge_generate(a, d, logs)
    # The opforge processes first, while this process holds no CUDA context (nvidia-smi's base).
    R["train"] = {}
    for name in a.settings:
        log(f"opforge train sft, {name}")
        R["train"][name] = {"opforge_flags": SETTINGS[name]["flags"], "opforge": opforge_train(a, d, work, logs, name)}
    log("transformers generate")
    R["hf_generate"], h_ids = hf_generate(a, d, R["prompt_ids"])
    R["leading_equal"] = next((i for i, (x, y) in enumerate(zip(o_ids, h_ids)) if x != y), min(len(o_ids), len(h_ids)))
    for name in a.settings:
        log(f"transformers train, {name}")
        T = R["train"][name]
        T["transformers"] = hf_train(a, d, rows, name)
        lo, lh = T["opforge"]["losses"][0], T["transformers"]["losses"][0]
        T["first_loss_rel_diff"] = abs(lo - lh) / abs(lh)
        T["tolerance"] = SETTINGS[name]["tol"]
        T["loss_agrees"] = T["first_loss_rel_diff"] <= T["tolerance"]
    R["total_seconds"] = time.time() - T0
    out = a.out or os.path.join(work, "results.json")
    with open(out, "w") as f:
        json.dump(R, f, indent=1)
    print(report(a, R))
    print()
    for name, T in R["train"].items():
        lo, lh = T["opforge"]["losses"][0], T["transformers"]["losses"][0]
        print(f"First-step loss, {name}: opforge {lo:.6f}, transformers {lh:.6f} (relative difference "
              f"{T['first_loss_rel_diff']:.1e}, tolerance {T['tolerance']:.0e}).")
    print(f"JSON: {out}")
    if R["opforge_generate"]["early_stops"]:
        print(f"WARNING: {R['opforge_generate']['early_stops']} opforge generations stopped before "
              f"{a.new_tokens} tokens (finish {R['opforge_generate']['finish']}); tokens/s uses the counts")
    off = [n for n, T in R["train"].items() if not T["loss_agrees"]]
    if off:
        print(f"WARNING: the first-step losses differ beyond the tolerance in {', '.join(off)}: the two sides do "
              "not train the same thing there")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
