"""The judge (requests "eval_compile", "eval_solution", "eval_baselines"): the trusted side of
`opforge eval`. This process never runs solution code.

It keeps the reference model, draws every input set itself, computes the expected outputs,
compares, and times; each solution runs in a fresh child process (python/opforge/candidate.py),
started for that one solution inside the sandbox the evaluator chose (`launch`, from
evaluator/launch.cpp) and killed afterwards with everything it started. The child gets
its files and prebuilt extensions over a socket, reads its inputs from shared memory the judge
rewrites before every call, and hands back outputs only as bytes in shared memory
(python/opforge/shm.py). docs/architecture.md ("The judge") has the threat model.

1. eval_compile: the static checks of the source (python/opforge/static_check.py), then a
   sandboxed child imports the solution with recording build hooks (which load/load_inline calls
   it makes), and a sandboxed compiler child builds each recorded call (or the CUDA Agent folder)
   into <cache>/extensions/<key>; the built .so's imported symbols are checked too.
2. eval_solution: a child loads the solution with those builds, gets the reference's weights,
   and runs on `correct_trials` fresh input sets (strict evidence from inside it: the guard and
   the profiler over all threads); then timing with the judge's clock (opforge.timing.time_calls),
   every timed call on a fresh input set the judge draws itself, a random sample of timed calls
   read back after the inputs were overwritten, so output computed late is wrong.
3. eval_baselines: the task's own Model (eager, then torch.compile) in children of the same kind,
   timed with the same protocol, so the per-call overhead of the crossing is in both figures.
"""
import fcntl
import gc
import hashlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch

from opforge import devshm
from opforge import extensions as X
from opforge import shm
from opforge import task as T
from opforge import timing
from opforge import tolerance as tol

STARTUP_S = 300
SAMPLE_RATE = 0.2  # share of timed calls whose output is read back and checked
PRECISION_KEEP = 4  # timed read-backs, drawn at random, also held to the float64 result (_Truth) after timing
MAX_FILES_BYTES = 256 << 20


class Verdict(Exception):
    def __init__(self, reason, detail):
        super().__init__(detail)
        self.reason = reason


# The reasons a solution's child may answer with (candidate.py's). The child runs the solution's
# code, which can rewrite the child's handlers: any other reason, a judge_* one above all (the
# judge's own failures are retried and never scored), is the child speaking for the judge.
CHILD_REASONS = frozenset({"protocol_error", "no_model_new", "load_error", "compile_error", "init_error",
                           "output_mismatch", "out_of_memory", "runtime_error"})


def child_verdict(reply, default, detail):
    """The Verdict for a child's failed answer, its reason checked against CHILD_REASONS."""
    reason = reply.get("reason") or default
    if isinstance(reason, str) and reason in CHILD_REASONS:
        return Verdict(reason, detail)
    return Verdict("protocol_error", f"the solution's process answered reason {str(reason)[:80]!r}, which is not "
                                     f"one a child gives: {detail}")


# ---------------------------------------------------------------------------------------------
# A child process


def _argv(launch, fd, work=None):
    inner = [launch["exe"], "worker", "--candidate", "--protocol-fd", str(fd)]
    if launch.get("mode") != "bwrap":
        return inner
    spec = dict(launch["spec"])
    spec["keep_fds"] = [fd]
    if work:
        spec["work"] = work
    return list(launch["sandbox_exec"]) + ["--spec", json.dumps(spec), "--"] + inner


class Child:
    """One single-use solution process. Every wait on it is bounded; its whole tree dies in close()."""

    def __init__(self, launch, log, work=None, timeout_s=600, wait=True):
        self.launch, self.timeout_s, self.seq = launch, timeout_s, 0
        self.posted = []  # requests sent without waiting (post), answered before the next ask
        self.collected = {}  # what their replies said beyond ok, by op (a spare's profiler warm-up: its seconds)
        self.chan, theirs = shm.Channel.pair()
        fd = theirs.fileno()
        env = dict(os.environ)
        self.tmp = None
        if launch.get("mode") != "bwrap":
            # No sandbox: the environment is still the allow-list, and /work a fresh folder.
            env = dict(launch["spec"].get("env", {}))
            if work is None:
                self.tmp = work = tempfile.mkdtemp(prefix="opforge-child-")
            env["OPFORGE_WORK"] = work
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(_argv(launch, fd, work), pass_fds=[fd], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, env=env, start_new_session=True)
        theirs.close()
        self.cold_start_s = None
        if wait:
            self.ready()

    def ready(self):
        """Waits for the child's hello (torch imported); returns self."""
        if self.cold_start_s is None:
            hello = self._recv(STARTUP_S, "starting")
            # The child's own figure: for a pre-started child the judge's clock would also count the
            # time it waited to be taken.
            self.cold_start_s = hello.get("startup_s") or (time.perf_counter() - self.t0)
            self.pid = hello.get("pid")
        return self

    def _recv(self, timeout, what, spin_s=0.0):
        try:
            msg, fds = self.chan.recv(timeout, spin_s)
        except shm.WireError as e:
            raise self._dead(e, what) from None
        for fd in fds:
            os.close(fd)
        return msg

    def _dead(self, err, what):
        if err.reason == "timeout":
            return Verdict("timeout", f"the solution's process gave no answer within {self.timeout_s:.0f} s while "
                                      f"{what}; killed")
        if err.reason == "protocol_error":
            return Verdict("protocol_error", f"while {what}: {err}")
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        if code == 137 or code == -signal.SIGKILL:
            return Verdict("out_of_memory", f"the solution's process was killed (status {code}) while {what}: "
                                            "its memory limit, most likely")
        return Verdict("candidate_crash", f"the solution's process ended (status {code}) while {what}")

    def post(self, op, what, **fields):
        """Sends a request whose answer is collected (and checked) before the next ask."""
        self.seq += 1
        try:
            self.chan.send({"op": op, "seq": self.seq, **fields})
        except shm.WireError as e:
            raise self._dead(e, what) from None
        self.posted.append((self.seq, what, op))

    def _collect(self):
        while self.posted:
            seq, what, op = self.posted.pop(0)
            reply = self._recv(self.timeout_s, what)
            if reply.get("seq") != seq or not reply.get("ok"):
                raise child_verdict(reply, "protocol_error", f"while {what}: {str(reply)[:500]}")
            self.collected[op] = {k: v for k, v in reply.items() if k not in ("ok", "seq")}

    def ask(self, op, what, fds=(), timeout=None, spin_s=0.0, **fields):
        """Sends one request and returns the reply; a failure of the child is a Verdict. spin_s:
        wait for the answer without sleeping for up to that long (timed calls on the GPU)."""
        self._collect()
        if self.chan.pending():
            raise Verdict("protocol_error", f"before {what}: the solution's process sent a message nobody asked for")
        self.seq += 1
        try:
            self.chan.send({"op": op, "seq": self.seq, **fields}, fds)
        except shm.WireError as e:
            raise self._dead(e, what) from None
        reply = self._recv(timeout or self.timeout_s, what, spin_s)
        if reply.get("seq") != self.seq:
            raise Verdict("protocol_error", f"while {what}: an answer to a request nobody made")
        return reply

    def must(self, op, what, fds=(), spin_s=0.0, **fields):
        reply = self.ask(op, what, fds, spin_s=spin_s, **fields)
        if not reply.get("ok"):
            tb = reply.get("traceback")
            raise child_verdict(reply, "runtime_error",
                                str(reply.get("detail", ""))[:3000] + (f"\n{str(tb)[-1500:]}" if tb else ""))
        return reply

    def close(self):
        try:
            self.chan.send({"op": "exit"})
        except shm.WireError:
            pass
        self.chan.close()
        _end_tree(self.proc)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


# Pre-started children per launch profile, kept by this judge worker for its next solutions: a
# child imports torch while the judge works on the current one, so a solution's dispatch costs its
# files and its extension's load, not an interpreter's start. Spares are started once a solution's
# timing is over (top_up_spares), so the one a solution takes was started two evaluations earlier: a
# solution that fails fast (a -1 in a second) still leaves the next one a spare that has imported
# (4.3 s dispatch on the H200 with one spare started at take, docs/gpu.md). Each costs about a
# CUDA context (~0.5 GiB of the GPU) and an imported torch (~1 GiB of host memory) per judge
# worker. Never reused: taken once, then killed.
SPARES = 3
_SPARE = {}


def _key(launch):
    return json.dumps(launch, sort_keys=True)


def _live_spares(key):
    """The key's spares still running (a dead one is closed and dropped), oldest first."""
    live = []
    for c in _SPARE.get(key, []):
        if c.proc.poll() is None:
            live.append(c)
        else:
            c.close()
    _SPARE[key] = live
    return live


def take_child(launch, log, timeout_s):
    """A fresh child for one solution: the oldest live spare, else a new one. The spares are topped
    up by `top_up_spares` once the solution's timing is over, never during it: a spare importing
    torch beside the timed calls slowed the host side of the first of three repeat processes by a
    third (crossing floor 0.313 against 0.24 ms on the H200, docs/gpu.md)."""
    live = _live_spares(_key(launch))
    child = live.pop(0) if live else Child(launch, log, timeout_s=timeout_s, wait=False)
    child.timeout_s = timeout_s
    return child


def top_up_spares(launch, log, timeout_s):
    """Starts children until the launch profile has SPARES of them (on a GPU only: on the CPU a
    start would share the cores with the next solution's timing). Returns the live spares."""
    live = _live_spares(_key(launch))
    while len(live) < SPARES:
        live.append(Child(launch, log, timeout_s=timeout_s, wait=False))
    return live


def _end_tree(proc):
    """sandbox-exec turns SIGTERM into the end of the sandbox's whole PID namespace; without a
    sandbox the child's session is its tree."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what an unsandboxed child left in its session
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------------------------
# Files over the wire


def _solution_files(root):
    """(relative path, absolute path) of every regular file of the solution; links refused."""
    out, total = [], 0
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            if os.path.islink(p):
                raise Verdict("load_error", f"{os.path.relpath(p, root)} is a symbolic link: solutions are plain files")
            total += os.path.getsize(p)
            out.append((os.path.relpath(p, root), p))
    if total > MAX_FILES_BYTES:
        raise Verdict("load_error", f"the solution's files hold {total >> 20} MiB (limit {MAX_FILES_BYTES >> 20})")
    return out


def _blob(entries):
    """One memfd holding the files, and the manifest the child unpacks into /work."""
    datas = []
    for rel, path in entries:
        with open(path, "rb") as f:
            datas.append((rel, f.read()))
    arena = shm.HostArena.create(sum(len(d) for _, d in datas))
    manifest, off = [], 0
    for rel, data in datas:
        arena.map[off:off + len(data)] = data
        manifest.append({"path": rel, "offset": off, "size": len(data)})
        off += len(data)
    return arena, {"files": manifest, "files_bytes": arena.nbytes}


def _ship(child, op, what, entries, **fields):
    arena, files = _blob(entries)
    try:
        return child.must(op, what, fds=[arena.fd], **files, **fields)
    finally:
        arena.close()


def _artifact_entries(artifacts):
    """The prebuilt extensions, shipped next to the solution's files under .opforge_ext/."""
    entries, refs = [], []
    for a in artifacts:
        rel = os.path.join(".opforge_ext", a["key"])
        so = os.path.join(a["dir"], a["name"] + ".so")
        entries.append((os.path.join(rel, a["name"] + ".so"), so))
        refs.append({"key": "folder" if a.get("kind") == "folder" else a["key"], "name": a["name"], "dir": rel})
    return entries, refs


# ---------------------------------------------------------------------------------------------
# Phase 1: static checks, discovery, sandboxed builds


def _static_source(entries, policy):
    from opforge import static_check as S

    texts = {}
    for rel, path in entries:
        if rel.endswith(".py"):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts[rel] = f.read()
    return [_finding(f) for f in S.check_source(texts, strict=policy == "strict")]


def _static_symbols(so_path, policy):
    from opforge import static_check as S

    return [_finding(f) for f in S.check_extension(so_path, strict=policy == "strict")]


def _finding(f):
    return {"kind": f.kind, "file": f.file, "line": f.line, "what": f.what}


def _build(launch, log, key, cache_dir, timeout_s, what, entries=(), **request):
    """One extension into <cache>/extensions/<key>, built by a compiler child that sees only what
    it builds; published by a rename, so a killed build never leaves a half-written entry."""
    final = os.path.join(cache_dir, "extensions", key)
    # One build per key at a time: solutions that share a source (a rollout's copies) wait for
    # the first build instead of each building it (64 files of 8 sources built 64 times).
    with open(os.path.join(cache_dir, "extensions", f".lock-{key}"), "a") as lock:
        _lock_within(lock, timeout_s, what)
        if os.path.exists(os.path.join(final, "manifest.json")):
            with open(os.path.join(final, "manifest.json")) as f:
                return json.load(f), True
        return _build_now(launch, log, key, final, cache_dir, timeout_s, what, entries, request), False


def _lock_within(lock, timeout_s, what):
    """The build lock, waited for at most one build's limit: a source whose build hangs holds it
    that long, and its copies waiting behind it get the same verdict rather than a build each (or
    the judge worker's own time limit, an environment failure)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise Verdict("timeout", f"{what}: a build of the same sources ran past {timeout_s:.0f} s") from None
            time.sleep(0.1)


def _build_now(launch, log, key, final, cache_dir, timeout_s, what, entries, request):
    tmp = tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=os.path.join(cache_dir, "extensions"))
    child = Child(launch, log, work=tmp, timeout_s=timeout_s)
    try:
        reply = _ship(child, "compile", what, list(entries), **request)
    finally:
        child.close()
    art = {"key": key, "name": reply["name"], "dir": final, "kind": request.get("kind", "inline"),
           "seconds": reply["seconds"]}
    with open(os.path.join(tmp, "out", "manifest.json"), "w") as f:
        json.dump(art, f)
    try:
        os.rename(os.path.join(tmp, "out"), final)
    except OSError:
        pass  # another process's build of the same key won (another judge on this cache)
    shutil.rmtree(tmp, ignore_errors=True)
    return art


def _read_calls(solution_dir, entries, layout, entry):
    """A one-file solution whose build calls are plain literals needs no discovery child (a child
    start is seconds of CPU); anything else is discovered by importing it in the sandbox."""
    if layout != "file" or [rel for rel, _ in entries if rel.endswith(".py")] != [entry]:
        return None
    with open(os.path.join(solution_dir, entry), encoding="utf-8", errors="replace") as f:
        return X.static_records(f.read(), solution_dir)


def parse_error(path):
    """The load_error a one-file solution's child would give for source that does not parse, found
    without starting one (a discovery child is seconds of CPU, and the batch's build waits for it:
    4.5-12 s in the thirty-third session's learning run, where copy errors are common). The child's
    own read and message (candidate._exec_module: UTF-8 under LANG=C.UTF-8, "<file> line N: msg"),
    and ast.parse, the parser stage of its compile. None when the source parses or fails otherwise
    (not UTF-8, too deep, too big): the child decides those as before."""
    import ast

    from opforge import static_check as S

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(S.MAX_SOURCE_CHARS + 1)
        if len(text) > S.MAX_SOURCE_CHARS:
            return None
        ast.parse(text, filename=path)
    except SyntaxError as e:
        return f"{os.path.basename(path)} line {e.lineno}: {e.msg}"
    except Exception:  # noqa: BLE001 - not a parse error: the child's import gives the verdict
        return None
    return None


def _builds(solution_dir, entries, layout, entry, launch, log, cache_dir, timeout_s):
    """The builds the solution needs: the folder's kernels, and every load/load_inline call its
    Python makes, as a sandboxed import with recording hooks reports them."""
    arts = []
    if layout == "folder":
        from opforge import solution_build

        spec = solution_build.folder_build_spec(solution_dir)
        arts.append(_build(launch, log, "folder_" + spec["digest"][:16], cache_dir, timeout_s,
                           "building the kernels/ folder", entries, folder=".", kind="folder"))
    calls = _read_calls(solution_dir, entries, layout, entry)
    if calls is None and layout == "file":
        unparsed = parse_error(os.path.join(solution_dir, entry))
        if unparsed:
            raise Verdict("load_error", unparsed)
    if calls is None:
        child = Child(launch, log, timeout_s=timeout_s)
        try:
            calls = _ship(child, "discover", "importing the solution to find its builds", entries, entry=entry,
                          layout=layout)["calls"]
        finally:
            child.close()
    for rec in calls:
        arts.append(_build(launch, log, X.key(rec), cache_dir, timeout_s, f"building extension {rec['name']}",
                           record=rec))
    return arts


def eval_compile(solution_dir, entry, layout, cache_dir, launch, policy="strict", timeout_s=600, log_path=None):
    """Phase 1. Returns {ok, reason, detail, seconds, artifacts, findings, builds_cached}."""
    t0 = time.perf_counter()
    os.makedirs(os.path.join(cache_dir, "extensions"), exist_ok=True)
    out = {"ok": False, "reason": None, "detail": "", "artifacts": [], "findings": [], "builds_cached": 0}
    with open(log_path or os.devnull, "ab") as log:
        try:
            entries = _solution_files(solution_dir)
            out["findings"] = _static_source(entries, policy)
            for art, cached in _builds(solution_dir, entries, layout, entry, launch, log, cache_dir, timeout_s):
                out["artifacts"].append(art)
                out["builds_cached"] += cached
                out["findings"] += _static_symbols(os.path.join(art["dir"], art["name"] + ".so"), policy)
            out["ok"] = True
        except Verdict as v:
            out["reason"], out["detail"] = v.reason, str(v)
        except Exception as e:  # noqa: BLE001 - a layout error of the folder is the solution's
            out["reason"], out["detail"] = "compile_error", f"{type(e).__name__}: {str(e)[:3000]}"
    out["seconds"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------------------
# Phase 2: one solution, checked and timed


class Session:
    """A child with a model bound to the judge's arenas: inputs written by the judge before every
    call, outputs read back by the judge."""

    def __init__(self, child, ref_mod, ref, device, first, expected0, seed):
        self.child, self.device = child, device
        self.last_pending = None
        self.first = first  # the judge's first input set (tensors on device): the arenas' layout
        self._init(ref_mod, ref, seed)
        self.in_specs, self.slot_bytes = shm.layout([t for t in first if isinstance(t, torch.Tensor)])
        self.out_specs, out_bytes = shm.layout(expected0)
        self.outs = shm.create_arena(out_bytes, device)
        self.out_views = [self.outs.tensor(s) for s in self.out_specs]
        self.encoded = shm.encode(list(first), [])
        self.ins, self.slot_views = None, []
        self.bind(1)

    def bind(self, slots):
        """An input arena of `slots` input sets side by side (slot 0 for checked calls, one slot
        per call of a timed batch), bound in the child in place of the previous one."""
        ins = shm.create_arena(self.slot_bytes * slots, self.device)
        specs = [[{**s, "offset": s["offset"] + k * self.slot_bytes} for s in self.in_specs] for k in range(slots)]
        views = [[ins.tensor(s) for s in ss] for ss in specs]
        try:
            self.child.must("bind", "binding inputs", fds=[ins.fd, self.outs.fd], arena_kind=shm.arena_kind(ins),
                            in_bytes=ins.nbytes, out_bytes=self.outs.nbytes, inputs=self.encoded, slot_specs=specs,
                            out_specs=self.out_specs)
        except BaseException:
            del views
            ins.close()
            raise
        old, self.ins, self.slot_views = self.ins, ins, views
        if old is not None:
            old.close()

    @property
    def slots(self):
        return len(self.slot_views)

    @property
    def call_bytes(self):
        """What one call of a batch holds: its input slot and the output the child keeps."""
        return self.slot_bytes + sum(t.numel() * t.element_size() for t in self.out_views)

    def _init(self, ref_mod, ref, seed):
        seed = init_seed(seed)  # what crosses: the input sets' seed cannot be recovered from it
        T.seed_everything(seed)
        init = ref_mod.get_init_inputs()
        state = ref.state_dict()
        names = list(state)
        arena, encoded, specs = shm.pack([init, [state[n] for n in names]], self.device)
        enc_init, enc_state = encoded["list"]
        state_refs = [{"name": n, "tensor": v["tensor"]} for n, v in zip(names, enc_state["list"])]
        try:
            self.child.must("init", "constructing ModelNew", fds=shm.fd_list(arena),
                            arena_kind=shm.arena_kind(arena) if arena else "host",
                            arena_bytes=arena.nbytes if arena else 0, specs=specs, init=enc_init,
                            state=state_refs, seed=seed)
        finally:
            if arena is not None:
                arena.close()

    def write(self, values, slot=0, sync=True):
        """The judge's inputs into an input slot; on CUDA the copy is finished before the call
        (unless the caller synchronises later itself)."""
        for v, t in zip(self.slot_views[slot], [x for x in values if isinstance(x, torch.Tensor)]):
            v.copy_(t)
        if sync:
            timing.sync(self.device)

    @staticmethod
    def _fill_poison(views):
        for v in views:
            if v.is_floating_point() or v.is_complex():
                v.fill_(float("nan"))
            else:
                v.fill_(-1 if v.dtype != torch.bool else True)

    def poison(self):
        self._fill_poison(self.out_views)
        timing.sync(self.device)

    def poison_inputs(self):
        """Every input slot overwritten: an output computed from them from now on is wrong."""
        for views in self.slot_views:
            self._fill_poison(views)
        timing.sync(self.device)

    def read(self):
        timing.sync(self.device)
        return [v.clone() for v in self.out_views]

    def inputs_intact(self, values):
        timing.sync(self.device)
        return all(torch.equal(v, t) for v, t in zip(self.slot_views[0],
                                                     [x for x in values if isinstance(x, torch.Tensor)]))

    def close(self):
        del self.slot_views, self.out_views
        self.ins.close()
        self.outs.close()


def _expected(ref, values):
    with torch.no_grad():
        out = ref(*[x.clone() if isinstance(x, torch.Tensor) else x for x in values])
    return [t.clone() for t in T.flatten_outputs(out)]


def _close(cand, ref, atol, rtol):
    """(all within tolerance, max abs error): the filter's rule (tolerance.py)."""
    return all(tol.tensor_close(c, r, rtol, atol) for c, r in zip(cand, ref)), tol.max_error(cand, ref)


def _forbidden(evidence, strict):
    """Under strict, the torch ops the guard or the profiler saw that are not allocation, views or
    metadata (full names: an op of another namespace named like an allowed one is not allowed)."""
    if not strict:
        return []
    from opforge.policy import ALLOWED_ATEN

    bad = list(evidence.get("guard") or [])
    for name in evidence.get("ops") or []:
        ns, _, op = str(name).partition("::")
        if ns == "profiler":
            continue  # record_function scopes, not compute
        if ns != "aten" or op.split(".")[0] not in ALLOWED_ATEN:
            bad.append(name)
    return sorted(set(bad))


def _evidence(reply):
    """The child's report on itself, checked for shape: a malformed one is the child's fault."""
    ev = reply.get("evidence")
    if ev is None:
        return {}
    ok = (isinstance(ev, dict) and all(isinstance(x, list) and all(isinstance(n, str) for n in x)
                                       for x in (ev.get("ops", []), ev.get("guard", [])))
          and all(ev.get(k) is None or (isinstance(ev[k], (int, float)) and not isinstance(ev[k], bool))
                  for k in ("pending_ms", "extension_calls")))
    if not ok:
        raise Verdict("protocol_error", f"the solution's process sent malformed evidence: {str(ev)[:200]}")
    return ev


def _shape_list(ts):
    return [{"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")} for t in ts]


class _Truth:
    """The reference in float64 (tolerance.precision_ratio): an answer right by the 1e-2 rule must
    also be about as near the true outputs as float32 eager is, on the first checked set, on the
    last timed call read back and on PRECISION_KEEP of the others read back, drawn at random and
    checked once timing is over (a child knows a checked call from a timed one, not which timed
    call is read back, nor which of those is held to float64; the last batch alone was predictable
    from the trial count). The float64 copy of the model is made at the first use and kept. A
    reference that cannot run in float64 (an op without it) is no verdict on the answer: the check
    is skipped and says why.
    Running out of device memory is not skipped (a child could hold the memory to be let off): it
    is the verdict of memory that a judge sharing the device gives again alone (evaluator/README.md)."""

    def __init__(self, ref):
        self.ref, self.m64, self.ratios, self.skipped = ref, None, [], None

    def check(self, got, expected, values, label):
        if self.skipped is not None:
            return
        try:
            if self.m64 is None:
                self.m64 = tol.widened_copy(self.ref)
            truth = tol.float64_outputs(self.m64, values, T.flatten_outputs, widened=True)
        except torch.cuda.OutOfMemoryError:
            raise  # the child may hold the device's memory on purpose: eval_solution's verdict of memory
        except Exception as e:  # noqa: BLE001 - see the docstring
            self.skipped = f"the reference does not run in float64: {type(e).__name__}: {str(e)[:200]}"
            self.m64 = None
            return
        if [t.shape for t in truth] != [t.shape for t in expected]:
            self.skipped, self.m64 = "the reference in float64 returns other outputs", None
            return
        worst, at = tol.precision_check(got, expected, truth, tol.input_numel(values))
        if worst is None:
            return
        self.ratios.append(worst)
        if worst > tol.PRECISION_RATIO:
            raise Verdict("imprecise", f"{label}: output {at} is {worst:.3g} times as far from the float64 result as "
                                       f"float32 eager is (at most {tol.PRECISION_RATIO}): computed in a lower "
                                       "precision, or approximated, where the task is float32")

    def report(self):
        return {"max_ratio": max(self.ratios) if self.ratios else None, "limit": tol.PRECISION_RATIO,
                "checked": len(self.ratios), "skipped": self.skipped}


def _check_set(sess, ref, values, label, strict, atol, rtol, expected=None, truth=None):
    """One input set through the child, judged here (and against the float64 truth when given a
    _Truth). Returns (max error, expected outputs)."""
    expected = _expected(ref, values) if expected is None else expected
    sess.write(values)
    sess.poison()
    reply = sess.child.ask("run", f"running ModelNew on {label}", mode="check", fetch=True)
    evidence = _evidence(reply)
    sess.last_pending = evidence.get("pending_ms")
    bad = _forbidden(evidence, strict)
    if bad:
        raise Verdict("forbidden_op", f"{label}: {', '.join(bad[:6])} ran during ModelNew.forward; under --policy "
                                      "strict it may only allocate, take views and call its own extension")
    if not reply.get("ok"):
        raise child_verdict(reply, "runtime_error", f"{label}: {str(reply.get('detail'))[:3000]}")
    if "error" in reply:
        # The child's CUDA allocator failing is a verdict of memory, which a judge sharing the
        # device gives again alone before it stands (evaluator/README.md).
        oom = str(reply["error"]).startswith("OutOfMemoryError")
        raise Verdict("out_of_memory" if oom else "runtime_error", f"ModelNew.forward on {label}: {reply['error']}")
    if reply.get("structure") != _shape_list(expected):
        raise Verdict("output_mismatch", f"{label}: ModelNew returned {reply.get('structure')}, the reference "
                                         f"{_shape_list(expected)}")
    got = sess.read()
    if not sess.inputs_intact(values):
        raise Verdict("aliases_input", f"{label}: ModelNew wrote into its inputs")
    ok, err = _close(got, expected, atol, rtol)
    if not ok:
        raise Verdict("incorrect", f"{label}: max abs error {err:.4g} beyond atol={atol:g} (x the output's mean "
                                    f"magnitude where above 1), rtol={rtol:g}")
    if truth is not None:
        truth.check(got, expected, values, label)
    if strict and evidence.get("extension_calls") == 0:
        raise Verdict("no_kernel", f"{label}: ModelNew.forward called no function of its extension (strict "
                                   "policy: the output must come from the solution's kernels)")
    return err, expected


PENDING_MS = 0.15  # a device sync after an idle stream costs tens of microseconds; more is work elsewhere


def _checked_sets(sess, draw, seed, n):
    """The n checked input sets in turn: the session's first, then each later one drawn when its
    check comes (seeds seed+2.., as _reference's first is seed+1). One at a time, so a worker holds
    two sets and not n: a corpus task's set is ~1 GB, and judge workers share a GPU."""
    yield sess.first
    for k in range(1, n):
        yield draw(seed + 1 + k)


class _Constancy:
    """Which of a task's outputs have been the same (by the agreement rule) on every input set so
    far: each output on its own, so a varying second output does not hide a first that is ~0 on
    the task's own inputs. Only the reference's outputs go in: what it finds is the task's."""

    def __init__(self, rtol, atol):
        self.rtol, self.atol, self.first, self.flags = rtol, atol, None, []

    def see(self, outs):
        if self.first is None:
            self.first, self.flags = outs, [True] * len(outs)
        else:
            self.flags = [c and tol.tensor_close(o, f, self.rtol, self.atol)
                          for c, o, f in zip(self.flags, outs, self.first)]

    def stress_usable(self, outs):
        """Whether the reference's outputs on stressed inputs can judge anything: an output finite
        on the task's own inputs and NaN or inf on x*4+1 (log1p(-p) of a probability) fails every
        answer, its own included (red-team, s35). The filter rejects such tasks; a user's task
        is then checked on its own sets alone."""
        return all(bool(torch.isfinite(o).all()) or not bool(torch.isfinite(f).all())
                   for o, f in zip(outs, self.first) if o.is_floating_point() or o.is_complex())

    def after_stress(self, outs):
        """(degenerate, stress_timed) from the outputs on stressed inputs: degenerate when every
        output is still the same; stress_timed when one that looked constant moved."""
        still = [tol.tensor_close(o, f, self.rtol, self.atol) for c, o, f in zip(self.flags, outs, self.first) if c]
        return all(self.flags) and all(still), not all(still)


def _check_all(sess, ref, draw, seed, n, strict, atol, rtol, flags, truth=None):
    """Every checked input set, then stressed inputs when any of the task's outputs looks
    constant (_Constancy). Returns (max error, stress_timed): stress_timed when the stressed set
    made a constant-looking output move, so the timed calls take stressed inputs too (an answer
    right on the checks alone and ~0 after them would pass every timed read-back)."""
    max_err, seen, busy = 0.0, _Constancy(rtol, atol), []
    for k, values in enumerate(_checked_sets(sess, draw, seed, n)):
        err, exp = _check_set(sess, ref, values, f"input set {k + 1}", strict, atol, rtol,
                              truth=truth if k == 0 else None)
        max_err = max(max_err, err)
        seen.see(exp)
        busy += [ms for ms in [sess.last_pending] if ms is not None and ms > PENDING_MS]
        values = exp = None  # freed before the next set is drawn
    if len(busy) >= 2 and len(busy) * 2 >= n:
        raise Verdict("unsynchronized_stream", f"the device stayed busy {max(busy):.3f} ms after ModelNew's stream "
                                               f"finished in {len(busy)} of {n} calls: work left on another stream")
    stressed = tol.stress(sess.first)
    exp = _stressed_expected(seen, ref, stressed, n)
    if exp is None:
        if n > 1 and all(seen.flags):  # still constant, and x*4+1 cannot judge it
            flags.append("degenerate_task")
        return max_err, False
    err, exp = _check_set(sess, ref, stressed, "stressed inputs (x*4+1), since the task's outputs look constant",
                          strict, atol, rtol, expected=exp)
    degenerate, stress_timed = seen.after_stress(exp)
    if degenerate:
        flags.append("degenerate_task")
    return max(max_err, err), stress_timed


def _reference_stress_timed(ref, first, expected0, draw, seed, n, rtol, atol):
    """Whether a candidate of this task is timed on stressed inputs (_check_all), from the
    reference alone on the same sets: its baselines are then timed on them too, so a task whose
    time depends on its data (a sort, a sparse pattern) is compared on the same inputs."""
    seen = _Constancy(rtol, atol)
    seen.see(expected0)
    for k in range(1, n):
        seen.see(_expected(ref, draw(seed + 1 + k)))  # the seeds of _checked_sets
    exp = _stressed_expected(seen, ref, tol.stress(first), n)
    return exp is not None and seen.after_stress(exp)[1]


def _stressed_expected(seen, ref, stressed, n):
    """The reference's outputs on the stressed inputs where the checks take them (an output looked
    constant on every one of n > 1 sets, and x*4+1 leaves it usable), else None: one decision for
    the candidate's checks (_check_all) and its baselines (_reference_stress_timed)."""
    if n <= 1 or not any(seen.flags):
        return None
    exp = _expected(ref, stressed)
    return exp if seen.stress_usable(exp) else None


def _stressed(draw):
    """The timed calls' inputs of a task whose outputs look constant on its own (_check_all)."""
    return lambda seed: tol.stress(draw(seed))


# ---------------------------------------------------------------------------------------------
# Timing


SPIN_S = 0.05  # how long the judge polls for a timed call's answer before sleeping (GPU only)
CHILD_SPIN_S = 0.25  # how long the child polls for the next timed request (the judge is drawing inputs)
MAX_CHILD_SPIN_S = 4.0  # the longest the judge asks for (candidate.MAX_SPIN_S holds the child to 5 s)


def _spin(device):
    return SPIN_S if str(device).startswith("cuda") else 0.0


def _child_spin(device):
    """The then_spin of a timing-phase request: on the GPU the child keeps polling for the next."""
    return CHILD_SPIN_S if _spin(device) else None


FLOOR_CALLS = 9  # harness-only round trips, the smallest of which is a child's crossing floor
# The most a floor may take off a batch (measured: 0.21-0.31 ms on the H200). Another process's
# GPU work left running while the floor is measured (a colluding solution's kernel that outlives
# its checks) inflates the floor of the next solution; bounded, it buys at most this per batch.
FLOOR_MAX_MS = 1.0


def crossing_floor_ms(child, device, lock):
    """The fixed cost of one timed batch that is not the solution's: the judge's clock around a
    harness-only call (candidate.op_floor) after the same preparation as a timed batch (judge-side
    GPU work, a sync), so the socket's round trip and the GPU's switch to the child's context are
    in it. Asked before the solution is loaded, it is a figure the solution cannot shape; every
    timed batch (baselines' too) has it subtracted, so the per-call time is the device work's.
    The smallest of the round trips: a floor inflated by a disturbed trial would make a time too
    short. GPU only: on the CPU a batch is a few milliseconds of host work beside the crossing on the
    same cores, and on a loaded 2-core host the round trip varies as much as it costs (0.0)."""
    dev = str(device)
    if not dev.startswith("cuda"):
        return 0.0
    times = []
    with timing.exclusive(lock):
        for _ in range(FLOOR_CALLS):
            timing.flush_l2(dev)
            timing.sync(dev)
            t0 = time.perf_counter()
            child.must("floor", "measuring the crossing's floor", spin_s=_spin(dev), then_spin=_child_spin(dev))
            times.append((time.perf_counter() - t0) * 1e3)
    return min(min(times), FLOOR_MAX_MS)


def _drawer(ref_mod, device, first):
    """Fresh input sets for timed calls, drawn by the judge from get_inputs() with seeds of its
    own (never derived from the checked sets, so no output the child saw can be reassembled into
    a timed one); non-tensor values are the first set's, as the child bound them."""
    want = [(tuple(x.shape), x.dtype) for x in first if isinstance(x, torch.Tensor)]

    def draw(seed):
        try:
            values = _draw(ref_mod, device, seed)
        except T.TaskError as e:
            raise Verdict("task_error", f"the reference task failed to draw inputs: {e}") from None
        if [(tuple(x.shape), x.dtype) for x in values if isinstance(x, torch.Tensor)] != want:
            raise Verdict("task_error", "get_inputs() returns tensors of other shapes from one call to the next")
        return [x if isinstance(x, torch.Tensor) else y for x, y in zip(values, first)]

    return draw


BATCH_MS = {"cuda": 50.0, "cpu": 2.0}  # the device time a timed batch aims at (its fixed cost shrinks per call)
MAX_BATCH = 64
MIN_BATCHES = {"cuda": 20, "cpu": 10}  # timed batches at least, whatever --trials says: the median needs a few
SLOT_BUDGET_CPU = 1 << 30  # host bytes the input slots and the child's outputs of one batch may take


def _slot_budget(device):
    """Bytes one batch may hold (input slots plus the outputs the child keeps): 40% of the
    device's free memory, since the child's own workspace and the judge's draws share it. (Half
    was tried on the H200: 28 calls instead of 23 did not bring the judge closer to the kernels'
    time, docs/gpu.md "Tenth session".)"""
    if str(device).startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0] * 2 // 5
    return SLOT_BUDGET_CPU


# How far above the crossing floor a batch's fixed cost may be put (fixed_cost_ms). Measured on
# the H200 beyond the floor: 0.7 ms (batch 23) to 1.1 ms (batch 28), the child's first launch of a
# batch, the final sync and the crossing after large input draws. A solution that shapes its small
# batches to raise the estimate buys at most this, less what its batches really cost, per batch.
FIXED_MARGIN_MS = 1.0


def small_batch(k, device):
    """The second batch size of the timed trials (GPU only, as the floor; 0: none): a quarter of
    the batch, close enough to the calls' origin that the line's intercept is not a long reach, far
    enough from one call that it is still a batch."""
    return k // 4 if _kind(device) == "cuda" and k >= 4 else 0


def _kind(device):
    return "cuda" if str(device).startswith("cuda") else "cpu"


def batch_size(call_ms, footprint, device):
    """Calls per timed batch: enough that the batch lasts about BATCH_MS, as memory allows (every
    call has an input slot of its own and its output is kept until the batch is read back)."""
    target = BATCH_MS[_kind(device)]
    k = min(MAX_BATCH, math.ceil(target / max(call_ms, 1e-3)))
    return max(1, min(k, _slot_budget(device) // max(1, footprint)))


class _Timer:
    """The judge's side of time_calls, in batches: before each batch a fresh input set (_drawer)
    is written into every slot and the L2 flushed; the child runs one call per slot back to back
    and synchronises once, and the judge's clock is around the whole batch, so the fixed cost of
    a crossing is shared by the batch's calls. For a random sample of calls the output is read
    back after every input slot was overwritten and the output arena poisoned, so an output the
    child computes only when asked (or from inputs it kept) is wrong. Nothing is asked of the
    child between the writes and the clock's start: it cannot compute a call untimed
    (docs/architecture.md, "The judge")."""

    def __init__(self, sess, ref, draw, atol, rtol, strict=False, floor_ms=0.0, truth=None):
        self.sess, self.ref, self.draw, self.atol, self.rtol, self.truth = sess, ref, draw, atol, rtol, truth
        self.floor_ms = floor_ms or 0.0  # crossing_floor_ms of this child, subtracted from every batch
        self.strict, self.runs, self.child_ms, self.crossing_ms = strict, 0, [], []
        # Fresh entropy, not the run's seed: which calls are read back and what their inputs are
        # must not be computable by the child from anything it was told.
        self.rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        self.current, self.fetch_ms, self.sampled, self.wrong = [], [], 0, None
        self.prep_s = 0.0  # how long the last before() took
        self.kept, self.seen = [], 0  # (output on the host, its inputs' seed): read-backs for _Truth

    def _watched(self):
        """Under strict, timed calls are held to the policy as checked ones are: what the observer
        saw over the whole timing phase."""
        ev = _evidence(self.sess.child.must("watch", "reading the observer of timed calls", action="stop"))
        bad = _forbidden(ev, True)
        if bad:
            raise Verdict("forbidden_op", f"during timed calls: {', '.join(bad[:6])} ran; under --policy strict "
                                          "ModelNew may only allocate, take views and call its own extension")
        calls = ev.get("extension_calls")
        if calls is not None and calls < self.runs:
            raise Verdict("no_kernel", f"{self.runs} timed calls made only {calls} calls of the solution's extension: "
                                       "the timed output did not come from its kernels")

    def before(self, _i, n=None):
        # Only the seeds are kept (a sampled call's inputs are drawn again to judge it): the
        # judge holds no second copy of a batch's inputs, so the batch may be longer.
        dev = self.sess.device
        t0 = time.perf_counter()
        self.current = [self.rng.getrandbits(62) for _ in range(n or self.sess.slots)]
        for k, seed in enumerate(self.current):
            self.sess.write(self.draw(seed), slot=k, sync=False)
        timing.flush_l2(dev)
        timing.sync(dev)
        self.prep_s = time.perf_counter() - t0

    def call(self, n=None):
        n, dev = n or self.sess.slots, self.sess.device
        self.runs += n
        sent = time.perf_counter()
        # The child polls on after answering for as long as the judge's next preparation should take
        # (twice the last one's): a child that fell asleep while 23 GiB of inputs were drawn paid a
        # wake-up inside the next batch (0.37 ms against 0.12 ms on the H200, docs/gpu.md).
        then = _child_spin(dev)
        if then is not None:
            then = min(MAX_CHILD_SPIN_S, max(then, 2 * self.prep_s))
        reply = self.sess.child.ask("run", "a timed batch of ModelNew", mode="time", batch=n, spin_s=_spin(dev),
                                    then_spin=then)
        back = time.perf_counter()
        if not reply.get("ok") or "error" in reply:
            raise child_verdict(reply, "runtime_error",
                                f"while timing ModelNew: {reply.get('error') or reply.get('detail')}")
        self._advice(reply, sent, back)

    def _advice(self, reply, sent, back):
        """The child's own figures (evidence only, never the time): its time per call, and how
        long the request took to reach its clock and the answer to come back."""
        nums = [reply.get(k) for k in ("child_ms", "t0", "t1")]
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in nums):
            self.child_ms.append(float(nums[0]))
            self.crossing_ms.append(((nums[1] - sent) * 1e3, (back - nums[2]) * 1e3))

    def after(self, i, _n=None, force=False):
        picks = [k for k in range(len(self.current)) if i >= 0 and self.rng.random() < SAMPLE_RATE]
        if force and not picks:
            picks = [self.rng.randrange(len(self.current))]
        if not picks:
            return
        self.sess.poison_inputs()
        for k in picks:
            self.sess.poison()
            t0 = time.perf_counter()
            self.sess.child.must("fetch", "reading back a timed call's output", slot=k,
                                 then_spin=_child_spin(self.sess.device))
            self.fetch_ms.append((time.perf_counter() - t0) * 1e3)
            got, values = self.sess.read(), self.draw(self.current[k])
            exp = _expected(self.ref, values)
            ok, err = _close(got, exp, self.atol, self.rtol)
            self.sampled += 1
            if not ok and self.wrong is None:
                self.wrong = err
            if ok and self.truth is not None:
                if force:  # the last call, read back after timing
                    self.truth.check(got, exp, values, "a timed call's output, read back")
                else:
                    self._keep(got, self.current[k])

    def _keep(self, got, seed):
        """A uniform draw of PRECISION_KEEP of the timed read-backs (reservoir sampling, fresh
        entropy), kept on the host and held to float64 once timing is over: run here, the float64
        forwards would hold the GPU's timing lock and spend the timing budget."""
        self.seen += 1
        j = len(self.kept) if len(self.kept) < PRECISION_KEEP else self.rng.randrange(self.seen)
        if j < PRECISION_KEEP:
            self.kept[j:j + 1] = [([g.to("cpu") for g in got], seed)]

    def _check_kept(self):
        for got, seed in self.kept:
            values = self.draw(seed)
            self.truth.check([g.to(self.sess.device) for g in got], _expected(self.ref, values), values,
                             "a timed call's output, read back")
        self.kept = []

    def _calibrate(self, lock):
        """Single calls (also the warm-up) give the call's time, and so the batch size; the
        inputs are then rebound with a slot per call of a batch."""
        times = []
        with timing.exclusive(lock):
            for _ in range(3):
                self.before(-1)
                t0 = time.perf_counter()
                self.call()
                times.append((time.perf_counter() - t0) * 1e3)
        k = batch_size(min(times), self.sess.call_bytes, self.sess.device)
        if k > 1:
            self.sess.bind(k)
        return k

    def run(self, trials, budget_s, lock):
        k = self._calibrate(lock)
        # The observer starts after the rebind (making shared-memory views is torch work of the
        # harness's own); the calibration calls decide only the batch size.
        self.runs = 0
        if self.strict:
            self.sess.child.must("watch", "starting the observer of timed calls", action="start")
        batches = max(MIN_BATCHES[_kind(self.sess.device)], math.ceil(trials / k))
        small = small_batch(k, self.sess.device)
        stats = timing.time_calls(self.call, self.sess.device, warmup=1, trials=batches, budget_s=budget_s,
                                  lock_path=lock, before=self.before, after=self.after, per_call=k,
                                  overhead_ms=self.floor_ms, small=small, margin_ms=FIXED_MARGIN_MS if small else 0.0,
                                  keep_samples=True)
        self.before(-1)  # and always one more, read back
        self.call()
        self.after(0, force=True)
        if self.wrong is not None:
            raise Verdict("incorrect", f"a timed call's output, read back after its inputs were overwritten, is off by "
                                       f"{self.wrong:.4g}: the output was not finished when the call returned, or "
                                       "the timed calls computed otherwise than the checked ones")
        if self.truth is not None:
            self._check_kept()
        if self.strict:
            self._watched()
        stats.update({"sampled_calls": self.sampled, "fetch_median_ms": _median(self.fetch_ms),
                      "clock": "judge wall clock", "child_median_ms": _median(self.child_ms), "batch": k,
                      "floor_ms": self.floor_ms, "small_batch": small,
                      "request_ms": _median([a for a, _ in self.crossing_ms]),
                      "answer_ms": _median([b for _, b in self.crossing_ms])})
        return stats


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


PROFILE_BATCHES = 3  # batches of the profiling pass at least (its timeline is a mean over them)


def _profile(sess, timer, result, strict, lock, calls=5):
    """A separate pass under the child's CUDA profiler, the batches prepared exactly as timed ones:
    the share of GPU time in the solution's own kernels, in the allowed libraries and in torch's
    (evidence); under strict, a torch compute kernel is a fallback."""
    batches = max(PROFILE_BATCHES, math.ceil(calls / sess.slots))
    with timing.exclusive(lock):
        sess.child.must("profile", "starting the profiler", action="start")
        for _ in range(batches):
            timer.before(-1)
            timer.call()
        reply = sess.child.ask("profile", "profiling ModelNew", action="stop", calls=batches * sess.slots)
    if not reply.get("ok"):
        result["flags"].append("no_profile")
        return
    # judge_over_kernels is the report's (make_row): the ratio of the figure the reward is made from
    result["profile"] = prof = {k: reply.get(k) for k in ("kernel_ms_per_call", "by_kind_ms", "torch_kernels",
                                                          "batch_ms")}
    if strict and prof.get("torch_kernels"):
        raise Verdict("forbidden_op", f"torch compute kernels ran in ModelNew.forward: {prof['torch_kernels'][:3]}")


# ---------------------------------------------------------------------------------------------
# Requests


def device_name(device):
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def init_seed(seed):
    """The seed both models are built with (sent to the child for ModelNew): one-way from the
    run's seed, so the child cannot recompute the judge's input sets from it."""
    digest = hashlib.sha256(f"opforge-init-seed:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _draw(ref_mod, device, seed):
    """An input set made on the device itself (a GiB of CPU randn per set would dominate a GPU
    evaluation); the seed is the judge's and never crosses to the child."""
    return T.make_inputs(ref_mod, device, seed=seed, on_device=True)


def _reference(task_code, device, seed):
    """(reference module, model, the first input set, its expected outputs, the drawer of every
    later set: _drawer, which holds them to the first set's shapes; _checked_sets draws the
    checked ones as they come)."""
    try:
        ref_mod = T.load_module(task_code, name="opforge_reference")
        ref = T.build(ref_mod, device, seed=init_seed(seed)).eval()
        first = _draw(ref_mod, device, seed + 1)
    except T.TaskError as e:
        raise Verdict("task_error", f"the reference task failed: {e.reason}: {e}") from None
    draw = _drawer(ref_mod, device, first)
    try:
        return ref_mod, ref, first, _expected(ref, first), draw
    except T.TaskError as e:
        raise Verdict("task_error", f"the reference's output: {e}") from None


def _release():
    # Only where something compiled (the baselines compile in their own children): importing
    # torch._dynamo just to reset it was a worker's first clean-up, 1.8-2.5 s on the CPU machine
    # against 0.03-0.06 s without.
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _base_result(device, policy, launch):
    return {"compiled": False, "correct": False, "reason": None, "detail": "", "max_error": None, "flags": [],
            "candidate": None, "device_name": device_name(device), "torch": torch.__version__, "policy": policy,
            "sandbox": launch.get("profile", "off"), "dispatch_s": None, "cold_start_s": None}


def eval_solution(task_code, solution_dir, entry, layout, artifacts, launch, device="cpu", policy="strict",
                  atol=1e-2, rtol=1e-2, correct_trials=5, trials=100, budget_s=10.0, seed=0, timing_lock=None,
                  timeout_s=600, log_path=None, timed=True):
    if not timed and policy == "strict":
        # Strict's profile pass (torch compute kernels the import guard misses) runs with the timing.
        raise ValueError("eval_solution: timed=False needs policy='torch-allowed' (strict's profile runs with the timing)")
    device = T.resolve_device(device)
    tol.exact_fp32()  # the reference's outputs in float32 proper, as the filter kept the task
    timing_lock = timing_lock or os.environ.get("OPFORGE_TIMING_LOCK")
    result = _base_result(device, policy, launch)
    # The judge worker's own parts beside the child's (dispatch, checks): the reference and its
    # first set, and the clean-up after (collector, allocator, the next spares started).
    result["phase_s"] = {}
    child = sess = truth = None
    with open(log_path or os.devnull, "ab") as log:
        try:
            t0 = time.perf_counter()
            ref_mod, ref, first, expected0, draw = _reference(task_code, device, seed)
            truth = _Truth(ref)
            result["phase_s"]["reference"] = time.perf_counter() - t0
            child, t1 = _start(launch, log, timeout_s, device, result)
            timing.SUSPECTS[:] = [child.proc.pid]  # its tree holding a lock the timer waits for is a verdict
            # Untimed (opforge eval --untimed): checks only, so no timing floor, no timing, no profile.
            floor = crossing_floor_ms(child, device, timing_lock) if timed else None  # before the solution loads
            entries, refs = _artifact_entries(artifacts)
            _ship(child, "load", "importing the solution", _solution_files(solution_dir) + entries, entry=entry,
                  layout=layout, artifacts=refs, device=device, policy=policy)
            result["compiled"] = True
            result["dispatch_parts"]["loaded_s"] = time.perf_counter() - t1
            sess = Session(child, ref_mod, ref, device, first, expected0, seed)
            first = expected0 = None  # the session holds the set; the checks compute their own outputs
            result["dispatch_s"] = time.perf_counter() - t1
            with timing.shared(timing.check_lock(timing_lock, device)):
                result["max_error"], stress = _check_all(sess, ref, draw, seed, correct_trials, policy == "strict",
                                                         atol, rtol, result["flags"], truth)
            result["phase_s"]["checks"] = time.perf_counter() - t1 - result["dispatch_s"]
            if timed:
                timer = _Timer(sess, ref, _stressed(draw) if stress else draw, atol, rtol, strict=policy == "strict",
                               floor_ms=floor, truth=truth)
                _time_and_profile(sess, timer, result, trials, budget_s, policy == "strict", timing_lock)
                if stress:
                    result["candidate"]["inputs"] = "stressed (x*4+1): the task's outputs look constant on its own"
            result["correct"] = True
        except Verdict as v:
            result["reason"], result["detail"] = v.reason, str(v)
        except timing.LockHeld as e:
            if not e.by_suspect:
                raise  # a neighbour's: the environment's failure, judged again
            result["reason"], result["detail"] = "timing_lock_held", str(e)
        except (torch.cuda.OutOfMemoryError, devshm.CudaDriverError) as e:
            # Once the solution's child is loaded it may hold the device's memory on purpose: the
            # judge's own allocation failing then (torch's, or the driver's for a shared arena) is
            # the solution's verdict, not the environment's (which `opforge serve` answers
            # retryable, an escape from -1: fixture memory_hog).
            if isinstance(e, devshm.CudaDriverError) and e.code != devshm.CUDA_ERROR_OUT_OF_MEMORY:
                raise
            loaded = result["compiled"]
            result["reason"] = "out_of_memory" if loaded else "judge_out_of_memory"
            result["detail"] = ("the judge's own allocation failed while the solution's child held the device: "
                                if loaded else "") + str(e)[:2000]
        finally:
            t_end = time.perf_counter()
            timing.SUSPECTS.clear()
            if truth is not None:
                result["precision"] = truth.report()
            if sess is not None:
                sess.close()
            if child is not None:
                child.close()
            # Nothing of this task stays in the allocator's cache of an idle worker: a neighbour
            # judged alone after running out of memory gets the device's memory (judge_alone).
            ref_mod = ref = first = expected0 = draw = sess = timer = truth = None  # noqa: F841
            if device.startswith("cuda"):
                gc.collect()  # a task module's classes and functions refer to it: freed by the collector
            _release()
            if device.startswith("cuda"):
                top_up_spares(launch, log, timeout_s)
                _warm_spare(launch, timed)
            result["phase_s"]["cleanup"] = time.perf_counter() - t_end
    return result


def _time_and_profile(sess, timer, result, trials, budget_s, strict, lock):
    """The timed phase after the checks: the candidate's time (its read-backs checked as it goes)
    and, on CUDA, the profile pass (under strict a torch compute kernel there is forbidden_op)."""
    t2 = time.perf_counter()
    result["candidate"] = timer.run(trials, budget_s, lock)
    result["phase_s"]["timing"] = time.perf_counter() - t2
    if sess.device.startswith("cuda"):
        _profile(sess, timer, result, strict, lock)
        result["phase_s"]["profile"] = time.perf_counter() - t2 - result["phase_s"]["timing"]


def _start(launch, log, timeout_s, device, result):
    """The solution's child: taken (the spare on CUDA) and its CUDA context made. Returns (child,
    the clock start of the dispatch figures)."""
    t1 = time.perf_counter()
    child = take_child(launch, log, timeout_s).ready()
    if device.startswith("cuda"):
        child.must("warm", "making the CUDA context")
    result["cold_start_s"] = child.cold_start_s
    result["dispatch_parts"] = {"child_ready_s": time.perf_counter() - t1}
    # A spare's profiler warm-up under strict (seconds of Kineto's start, or why it failed): what
    # the solution's first check did not pay, and what ran beside the timing before it.
    # Only these two keys, so nothing a spare's reply carries can stand in for the judge's figures.
    warm = child.collected.get("warm", {})
    result["dispatch_parts"].update({k: warm[k] for k in ("profiler_warm_s", "profiler_warm_error") if k in warm})
    return child, t1


def eval_prestart(device, launch, timeout_s=600, log_path=None, timed=True):
    """A judge worker's first spares, started before any solution reaches it (on a GPU only, like
    every spare), with their CUDA contexts made: without them the first solution of a run waits
    for a child's whole cold start. Waits until they have imported torch, so that a run's next
    prestart request goes to another idle worker. Returns {started, cold_start_s}."""
    if not T.resolve_device(device).startswith("cuda"):
        return {"started": 0, "cold_start_s": None}
    with open(log_path or os.devnull, "ab") as log:  # each child keeps its own copy of the descriptor
        live = top_up_spares(launch, log, timeout_s)
    for child in list(live):
        try:
            child.ready()
        except Verdict:
            live.remove(child)
            child.close()
            raise
    _warm_spare(launch, timed)
    return {"started": len(live), "cold_start_s": max(c.cold_start_s for c in live)}


def _warm_spare(launch, timed):
    """Once a solution's timing is over, the spares may make their CUDA contexts and, when the judge
    times (strict always does), start the profiler up: a process's first profiler session costs 4-6 s
    on an H100 and the next 0.01 s (bench/profiler_startup.py, docs/gpu.md). Strict's first check
    runs under it, and a timed solution's profile pass under either policy: a spare that has not paid
    it makes its solution pay (torch-allowed's timed profile passes took 6.1-6.9 s on an H100, the
    thirty-third session, against strict's 0.09-0.17 s). Untimed judges run no profiler."""
    for spare in _SPARE.get(_key(launch), []):
        if not spare.posted and spare.proc.poll() is None:
            try:
                spare.post("warm", "making the CUDA context", profiler=bool(timed))
            except Verdict:
                pass  # a broken spare is found and replaced when it is taken


def _with_inductor_cache(launch, cache_dir):
    """Baseline children run the task's own (trusted) code: they share one inductor cache of the
    judge's, so a task code compiled once is not compiled again. Never given to a solution's child."""
    if not cache_dir:
        return launch
    d = os.path.join(cache_dir, "inductor")
    os.makedirs(d, exist_ok=True)
    spec = json.loads(json.dumps(launch["spec"]))
    spec.setdefault("rw", []).append(d)
    spec.setdefault("env", {})["TORCHINDUCTOR_CACHE_DIR"] = d
    return {**launch, "spec": spec}


def _baseline(task_code, ref_mod, ref, first, expected0, draw, compile_, launch, log, device, trials, budget_s, seed,
              lock, timeout_s, stress):
    child = Child(launch, log, timeout_s=timeout_s)
    sess = None
    try:
        if device.startswith("cuda"):
            child.must("warm", "making the CUDA context")
        floor = crossing_floor_ms(child, device, lock)  # as for a candidate: before the task's code is loaded
        child.must("reference", "loading the reference", task_code=task_code, compile=compile_, device=device)
        sess = Session(child, ref_mod, ref, device, first, expected0, seed)
        with timing.shared(timing.check_lock(lock, device)):
            # Warms up (and for torch.compile compiles) beside other checks, not in a timed region.
            _check_set(sess, ref, first, "the first input set", False, 1e-2, 1e-2)
        timed = _Timer(sess, ref, _stressed(draw) if stress else draw, 1e-2, 1e-2, floor_ms=floor).run(trials, budget_s,
                                                                                                       lock)
        if stress:
            timed["inputs"] = "stressed (x*4+1), as the task's candidates: its outputs look constant on its own"
        return timed
    finally:
        if sess is not None:
            sess.close()
        child.close()


def eval_baselines(task_code, launch, device="cpu", trials=100, budget_s=10.0, seed=0, timing_lock=None,
                   timeout_s=600, log_path=None, correct_trials=5, cache_dir=None):
    """The reference's eager and torch.compile times, each in a child of its own timed exactly
    like a candidate (same crossing, same clock, same sampled read-backs)."""
    device = T.resolve_device(device)
    tol.exact_fp32()
    launch = _with_inductor_cache(launch, cache_dir)
    lock = timing_lock or os.environ.get("OPFORGE_TIMING_LOCK")
    out = {"eager": None, "compile": None, "detail": "", "device_name": device_name(device), "torch": torch.__version__}
    with open(log_path or os.devnull, "ab") as log:
        try:
            args = _reference(task_code, device, seed)  # a baseline checks the first set only
            stress = _reference_stress_timed(*args[1:], seed, correct_trials, 1e-2, 1e-2)
            out["eager"] = _baseline(task_code, *args, False, launch, log, device, trials, budget_s, seed, lock,
                                     timeout_s, stress)
            try:
                out["compile"] = _baseline(task_code, *args, True, launch, log, device, trials, budget_s, seed, lock,
                                           timeout_s, stress)
            except Verdict as v:
                out["detail"] = f"torch.compile of the reference failed: {v.reason}: {str(v)[:500]}"
        except Verdict as v:
            out["detail"] = f"the eager baseline failed: {v.reason}: {str(v)[:500]}"
        finally:
            _release()
    return out
