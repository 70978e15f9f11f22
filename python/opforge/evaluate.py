"""Evaluate one candidate solution against its task (requests "eval_compile", "eval_solution" and
"eval_baselines").

The KernelBench protocol, hardened. eval_compile imports the solution once so its extension is
built into the harness's cache (a separate, parallel phase with its own time limit);
eval_solution imports it again (the build is cached), checks it and times it:

1. The reference Model and ModelNew are built after seeding the RNG identically, then ModelNew
   gets every entry of the reference's state_dict whose name and shape it has (strict=False:
   a solution may hold fewer or other parameters); both in eval() under no_grad.
2. `correct_trials` fresh input sets (seeds drawn per run by the supervisor), cloned per model.
   Per set: the reference runs, its outputs are copied and the originals freed and poisoned
   (NaN) so a candidate that returns stale memory fails; the candidate runs (under the strict
   guard unless policy is torch-allowed); then, in order: refused ops (forbidden_op), replaced
   harness functions (tampering), on CUDA output that changes after a device-wide sync
   (unsynchronized_stream), output structure (output_mismatch), storage shared with its inputs
   (aliases_input) or with an earlier call's output, or the same values as the previous call
   while the reference's changed (cached_output), values within atol/rtol (incorrect), and under
   strict at least one call of its own extension (no_kernel).
3. When the reference's outputs are the same for every input set within tolerance (a
   degenerate-looking task: a constant would pass), both run once more on stressed inputs
   (floats x*4+1): a mismatch is incorrect; a reference still constant flags degenerate_task.
4. Timing of the candidate under its guard with opforge.timing.time_fn, then one more fresh input
   set is checked, so a solution that changes behaviour once it is being timed is caught. The
   eager and torch.compile baselines are timed the same way in eval_baselines, once per task code
   (the supervisor caches them).

Every outcome is a value with a reason (docs/reasons.md); the reward is computed by the
supervisor from these figures.
"""
import glob
import math
import os
import sys
import time
import types

import torch

from opforge import task as T
from opforge import timing
from opforge.eval_guard import (_sha, BuildFailed, ExtensionCalls, ForbiddenOp, NoGuard, StrictGuard, TamperSnapshot,
                                hooked_loaders)

# A device-wide sync after the current stream is done costs tens of microseconds on an idle GPU;
# more than this means kernels were still running elsewhere.
PENDING_MS = 0.15


class Fail(Exception):
    def __init__(self, reason, detail):
        super().__init__(detail)
        self.reason = reason


def device_name(device):
    if str(device).startswith("cuda"):
        return torch.cuda.get_device_name(device)
    # Same spelling as evaluator.cpp reads it, so the supervisor's cache key matches ours.
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


# ---------------------------------------------------------------------------------------------
# Importing a solution


def _build_folder(solution_dir, ext_dir, calls, orig_load):
    """CUDA Agent layout: kernels/* into ONE extension, importable as `cuda_extension`."""
    kdir = os.path.join(solution_dir, "kernels")
    sources = sorted(p for ext in ("*.cu", "*.cpp", "*.cc") for p in glob.glob(os.path.join(kdir, ext)))
    if not sources:
        raise BuildFailed(f"no kernels/*.cu, *.cpp or *.cc in {solution_dir}")
    headers = sorted(p for ext in ("*.h", "*.cuh", "*.hpp") for p in glob.glob(os.path.join(kdir, ext)))
    files = sources + headers
    digest = _sha([os.path.basename(p).encode() + b"\0" + open(p, "rb").read() for p in files])
    name = f"cuda_extension_{digest[:12]}"
    # Sources are copied to a path named by their hash: torch's build keys include the include
    # path, so the same kernels from another report folder reuse this build.
    build_dir = os.path.join(ext_dir, name)
    src_dir = os.path.join(build_dir, "src")
    os.makedirs(src_dir, exist_ok=True)
    for p in files:
        dst = os.path.join(src_dir, os.path.basename(p))
        data = open(p, "rb").read()
        if not os.path.exists(dst) or open(dst, "rb").read() != data:
            with open(dst, "wb") as f:
                f.write(data)
    with_cuda = any(p.endswith(".cu") for p in sources)
    try:
        mod = orig_load(name=name, sources=[os.path.join(src_dir, os.path.basename(p)) for p in sources],
                        extra_include_paths=[src_dir], extra_cflags=["-O3"],
                        extra_cuda_cflags=["-O3"] if with_cuda else None, build_directory=build_dir,
                        with_cuda=with_cuda, verbose=False)
    except (RuntimeError, OSError, ImportError) as e:
        raise BuildFailed(str(e)) from None
    return calls.wrap(mod)


def import_solution(solution_dir, entry, layout, cache_dir, calls):
    """Executes the solution's file as a fresh module (never registered in sys.modules) from its
    own folder. Raises BuildFailed for compiler errors, Fail(load_error) for anything else."""
    import torch.utils.cpp_extension as ce

    ext_dir = os.path.join(cache_dir, "extensions")
    os.makedirs(ext_dir, exist_ok=True)
    new_load, new_inline, orig_load, orig_inline = hooked_loaders(calls, ext_dir)

    saved_cwd, saved_path = os.getcwd(), list(sys.path)
    saved_env = os.environ.get("TORCH_EXTENSIONS_DIR")
    os.environ["TORCH_EXTENSIONS_DIR"] = ext_dir
    ce.load, ce.load_inline = new_load, new_inline
    try:
        os.chdir(solution_dir)
        sys.path.insert(0, solution_dir)
        if layout == "folder":
            sys.modules["cuda_extension"] = _build_folder(solution_dir, ext_dir, calls, orig_load)
        path = os.path.join(solution_dir, entry)
        mod = types.ModuleType("opforge_solution")
        mod.__file__ = path
        try:
            with open(path) as f:
                code = compile(f.read(), path, "exec")
        except SyntaxError as e:
            raise Fail("load_error", f"{entry} line {e.lineno}: {e.msg}") from None
        try:
            exec(code, mod.__dict__)
        except BuildFailed:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the solution's fault, as a value
            raise Fail("load_error", f"{type(e).__name__}: {str(e)[:1500]}") from None
        if not isinstance(getattr(mod, "ModelNew", None), type):
            raise Fail("no_model_new", f"{entry} defines no class ModelNew")
        return mod
    finally:
        ce.load, ce.load_inline = orig_load, orig_inline
        sys.modules.pop("cuda_extension", None)
        sys.path[:] = saved_path
        os.chdir(saved_cwd)
        if saved_env is None:
            os.environ.pop("TORCH_EXTENSIONS_DIR", None)
        else:
            os.environ["TORCH_EXTENSIONS_DIR"] = saved_env


def _tail(text, n=3000):
    return text if len(text) <= n else "…" + text[-n:]


def eval_compile(solution_dir, entry, layout, cache_dir):
    """Phase 1: build (and import) the solution once. Returns {ok, reason, detail, seconds}."""
    snap = TamperSnapshot()
    t0 = time.perf_counter()
    try:
        import_solution(solution_dir, entry, layout, cache_dir, ExtensionCalls())
        return {"ok": True, "reason": None, "detail": "", "seconds": time.perf_counter() - t0}
    except BuildFailed as e:
        return {"ok": False, "reason": "compile_error", "detail": _tail(str(e)), "seconds": time.perf_counter() - t0}
    except Fail as e:
        return {"ok": False, "reason": e.reason, "detail": str(e), "seconds": time.perf_counter() - t0}
    finally:
        snap.restore()


# ---------------------------------------------------------------------------------------------
# Checks


def _clone(xs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _structure(v):
    """Output structure for comparison: lists and tuples alike, shapes and dtypes of leaves."""
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), str(v.dtype))
    if isinstance(v, (list, tuple)):
        return ("seq", tuple(_structure(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple((k, _structure(v[k])) for k in sorted(v)))
    return ("other", type(v).__name__)


def _leaves(v):
    try:
        return T.flatten_outputs(v)
    except T.TaskError as e:
        raise Fail("output_mismatch", str(e)) from None


def _span(t):
    s = t.untyped_storage()
    return (t.device, s.data_ptr(), s.data_ptr() + s.nbytes())


def _overlaps(a, b):
    (da, a0, a1), (db, b0, b1) = _span(a), _span(b)
    return da == db and a1 > a0 and b1 > b0 and a0 < b1 and b0 < a1


def _poison(specs, device):
    """Fill blocks the size of the reference's freed outputs with NaN (or all-ones bits): the
    allocator hands those blocks out again first, so stale results cannot survive."""
    blocks = []
    for shape, dtype in specs:
        t = torch.empty(shape, dtype=dtype, device=device)
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.fill_(True)
        else:
            t.fill_(-1)
        blocks.append(t)
    del blocks


def _close(cand, ref, atol, rtol):
    """(all within tolerance, max abs error)."""
    ok, err = True, 0.0
    for c, r in zip(cand, ref):
        if c.numel() == 0:
            continue
        if not torch.allclose(c, r, atol=atol, rtol=rtol):
            ok = False
        d = (c.double() - r.double()).abs().max().item() if not c.is_complex() else (c - r).abs().max().item()
        err = max(err, d if not math.isnan(d) else float("inf"))
    return ok, err


def _stress(xs):
    return [x * 4 + 1 if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]


class _Ctx:
    def __init__(self, ref_mod, ref, new, guard, calls, snap, device, policy, atol, rtol):
        self.ref_mod, self.ref, self.new, self.guard, self.calls, self.snap = ref_mod, ref, new, guard, calls, snap
        self.device, self.strict, self.atol, self.rtol = device, policy == "strict", atol, rtol
        self.max_error = 0.0
        self.prev = []  # candidate outputs of earlier calls, kept alive for the storage check

    def forward(self, xs):
        with torch.no_grad(), self.guard:
            return self.new(*xs)

    def check_clean(self, when):
        if self.guard.violations:
            raise Fail("forbidden_op", f"{when}: {', '.join(sorted(set(self.guard.violations))[:5])}")
        changed = self.snap.changed()
        if changed:
            raise Fail("tampering", f"{when}: replaced {', '.join(changed[:8])}")

    def one(self, inputs, label, stressed=False):
        """Runs both models on one input set and applies every check. Returns the reference's
        output leaves (copies)."""
        with torch.no_grad():
            try:
                r = self.ref(*_clone(inputs))
            except Exception as e:  # noqa: BLE001
                raise Fail("task_error", f"the reference failed on {label}: {type(e).__name__}: {e}") from None
        ref_struct = _structure(r)
        ref_leaves = T.flatten_outputs(r)
        expected = [t.clone() for t in ref_leaves]
        specs = [(tuple(t.shape), t.dtype) for t in ref_leaves]
        del r, ref_leaves
        _poison(specs, self.device)
        xs = _clone(inputs)
        calls_before = self.calls.count
        try:
            out = self.forward(xs)
        except torch.cuda.OutOfMemoryError as e:
            raise Fail("out_of_memory", f"CUDA out of memory in ModelNew.forward: {str(e)[:300]}") from None
        except (Exception, SystemExit) as e:  # noqa: BLE001
            self.check_clean(f"ModelNew.forward on {label}")
            raise Fail("runtime_error", f"ModelNew.forward on {label}: {type(e).__name__}: {str(e)[:1500]}") from None
        self.check_clean(f"ModelNew.forward on {label}")
        if _structure(out) != ref_struct:
            raise Fail("output_mismatch", f"{label}: ModelNew returned {T.describe(out)}, the reference "
                                          f"{_describe_struct(ref_struct)}")
        leaves = _leaves(out)
        if self.device.startswith("cuda"):
            # Work left on a side stream. Read the output on the current stream right away; then
            # the device must be idle once that stream is done (a second call decides, so one
            # host hiccup is not taken for a hack); then the output must not have changed.
            early = [t.clone() for t in leaves]
            alone = os.environ.get("OPFORGE_WORKERS_ON_GPU", "1") == "1"
            if alone and timing.pending_after_stream_ms() > PENDING_MS:
                self.forward(_clone(inputs))
                pending = timing.pending_after_stream_ms()
                if pending > PENDING_MS:
                    raise Fail("unsynchronized_stream", f"{label}: the device stayed busy {pending:.3f} ms after "
                                                        "ModelNew's stream finished: work left on another stream")
            torch.cuda.synchronize()
            if not all(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan()) and
                                             torch.equal(a.nan_to_num(), b.nan_to_num()))
                       for a, b in zip(early, leaves)):
                raise Fail("unsynchronized_stream", f"{label}: ModelNew's output changed after torch.cuda.synchronize(): "
                                              "work left on another stream")
        for t in leaves:
            for x in xs:
                if isinstance(x, torch.Tensor) and _overlaps(t, x):
                    raise Fail("aliases_input", f"{label}: an output shares memory with an input "
                                                "(returned the input or a view of it)")
            for earlier in self.prev:
                for e in earlier:
                    if _overlaps(t, e):
                        raise Fail("cached_output", f"{label}: an output shares memory with the output of an "
                                                    "earlier call (cached across calls)")
        ok, err = _close(leaves, expected, self.atol, self.rtol)
        self.max_error = max(self.max_error, err)
        if not ok:
            if not stressed and self.prev and all(torch.equal(a, b) for a, b in zip(leaves, self.prev[-1])):
                raise Fail("cached_output", f"{label}: ModelNew returned the previous call's values for new "
                                            f"inputs (max error {err:.3g})")
            raise Fail("incorrect", f"{label}: max abs error {err:.4g} beyond atol={self.atol:g}, rtol={self.rtol:g}")
        if self.strict and self.calls.count == calls_before:
            raise Fail("no_kernel", f"{label}: ModelNew.forward called no function of its extension "
                                    "(strict policy: the output must come from the solution's kernels)")
        self.prev.append(leaves)
        return expected


def _describe_struct(s):
    kind = s[0]
    if kind == "tensor":
        return {"shape": list(s[1]), "dtype": s[2].replace("torch.", "")}
    if kind == "seq":
        return [_describe_struct(x) for x in s[1]]
    return kind


# ---------------------------------------------------------------------------------------------
# The request


def eval_solution(task_code, solution_dir, entry, layout, cache_dir, device="cpu", policy="strict", atol=1e-2,
                  rtol=1e-2, correct_trials=5, trials=100, budget_s=10.0, seed=0, timing_lock=None):
    device = T.resolve_device(device)
    timing_lock = timing_lock or os.environ.get("OPFORGE_TIMING_LOCK")
    result = {"compiled": False, "correct": False, "reason": None, "detail": "", "max_error": None, "flags": [],
              "candidate": None, "eager": None, "compile": None, "device_name": device_name(device),
              "torch": torch.__version__, "policy": policy, "sandbox": os.environ.get("OPFORGE_SANDBOX_STATE", "off"),
              "extension_calls": 0}
    # Identities of the timer, sync, comparison and guard, before any solution code runs.
    snap = TamperSnapshot()
    try:
        _evaluate(result, snap, task_code, solution_dir, entry, layout, cache_dir, device, policy, atol, rtol,
                  correct_trials, trials, budget_s, seed, timing_lock)
    except Fail as f:
        result["reason"], result["detail"] = f.reason, str(f)
        result["correct"] = False
    except torch.cuda.OutOfMemoryError as e:
        result["reason"], result["detail"], result["correct"] = "out_of_memory", str(e)[:2000], False
    finally:
        snap.restore()
        _release()
    return result


def _release():
    """What one request leaves behind: compiled graphs and cached device memory."""
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _timing_inputs(ref_mod, device, seed):
    """The one input set the candidate and the baselines are timed on (eval_baselines builds it
    again in its own request: same seed, same tensors)."""
    return T.make_inputs(ref_mod, device, seed=seed + 1000)


def _evaluate(result, snap, task_code, solution_dir, entry, layout, cache_dir, device, policy, atol, rtol,
              correct_trials, trials, budget_s, seed, timing_lock):
    try:
        ref_mod = T.load_module(task_code, name="opforge_reference")
        ref = T.build(ref_mod, device, seed=seed)
    except T.TaskError as e:
        raise Fail("task_error", f"the reference task failed: {e.reason}: {e}") from None
    calls = ExtensionCalls()
    try:
        sol = import_solution(solution_dir, entry, layout, cache_dir, calls)
    except BuildFailed as e:
        raise Fail("compile_error", _tail(str(e))) from None
    result["compiled"] = True
    changed = snap.changed()
    if changed:
        raise Fail("tampering", f"importing the solution replaced {', '.join(changed[:8])}")
    T.seed_everything(seed)
    try:
        init = ref_mod.get_init_inputs()
        new = sol.ModelNew(*init).to(device)
    except (Exception, SystemExit) as e:  # noqa: BLE001
        raise Fail("init_error", f"ModelNew(*get_init_inputs()): {type(e).__name__}: {str(e)[:1500]}") from None
    own = new.state_dict()
    shared = {k: v for k, v in ref.state_dict().items() if k in own and own[k].shape == v.shape}
    new.load_state_dict(shared, strict=False)
    ref.eval()
    new.eval()
    changed = snap.changed()
    if changed:
        raise Fail("tampering", f"constructing ModelNew replaced {', '.join(changed[:8])}")

    guard = StrictGuard() if policy == "strict" else NoGuard()
    ctx = _Ctx(ref_mod, ref, new, guard, calls, snap, device, policy, atol, rtol)
    # Checks share the GPU with other workers' checks, never with a neighbour's timed region.
    check_lock = timing.check_lock(timing_lock, device)
    refs = []
    with timing.shared(check_lock):
        for k in range(correct_trials):
            inputs = T.make_inputs(ref_mod, device, seed=seed + 1 + k)
            refs.append(ctx.one(inputs, f"input set {k + 1}"))
        if len(refs) > 1 and all(_close(r, refs[0], atol, rtol)[0] for r in refs[1:]):
            # Every input set gave the same output within tolerance: a constant would have passed.
            inputs = _stress(T.make_inputs(ref_mod, device, seed=seed + 1))
            stressed = ctx.one(inputs, "stressed inputs (x*4+1), since the task's outputs look constant",
                               stressed=True)
            if _close(stressed, refs[0], atol, rtol)[0]:
                result["flags"].append("degenerate_task")
    result["max_error"] = ctx.max_error
    result["extension_calls"] = calls.count

    # Timing: the candidate under the same guard it was checked with, so it cannot tell checking
    # from timing apart; the same input set for candidate and baselines.
    inputs = _timing_inputs(ref_mod, device, seed)
    del ctx.prev[:]
    last = []

    def timed():
        # Keeps the latest output: the check after timing compares against it.
        last[:] = [ctx.forward(inputs)]

    try:
        result["candidate"] = timing.time_fn(timed, device, trials=trials, budget_s=budget_s, lock_path=timing_lock)
    except ForbiddenOp:
        pass
    except Exception as e:  # noqa: BLE001
        ctx.check_clean("while timing ModelNew")
        raise Fail("runtime_error", f"while timing ModelNew: {type(e).__name__}: {str(e)[:1500]}") from None
    ctx.check_clean("while timing ModelNew")
    if last:
        try:
            ctx.prev.append(_leaves(last[0]))
        except Fail:
            pass
    del last[:]
    # One more fresh input set after timing: behaviour that changes with the call count shows.
    with timing.shared(check_lock):
        ctx.one(T.make_inputs(ref_mod, device, seed=seed + 2000), "a fresh input set after timing")
    result["correct"] = True


def eval_baselines(task_code, device="cpu", trials=100, budget_s=10.0, seed=0, timing_lock=None):
    """The reference's eager and torch.compile times (request "eval_baselines"), on the input set
    eval_solution times the candidate on. The evaluator asks once per task code, after the
    solutions, and only for codes with a correct solution and no cached baselines: in a request of
    their own, so no solution's failure (or crash) can take a correct neighbour's speed-up away."""
    device = T.resolve_device(device)
    timing_lock = timing_lock or os.environ.get("OPFORGE_TIMING_LOCK")
    try:
        ref_mod = T.load_module(task_code, name="opforge_reference")
        ref = T.build(ref_mod, device, seed=seed)
        ref.eval()
        eager, comp, note = baselines(ref, _timing_inputs(ref_mod, device, seed), device, trials, budget_s,
                                      timing_lock)
    finally:
        _release()
    return {"eager": eager, "compile": comp, "detail": note, "device_name": device_name(device),
            "torch": torch.__version__}


def baselines(ref, inputs, device, trials, budget_s, timing_lock):
    """Eager and torch.compile of the reference, timed exactly like the candidate. A compile
    failure leaves compile None (the reward then cannot reach 3) with a note."""
    def run(m):
        with torch.no_grad():
            return m(*inputs)

    eager = timing.time_fn(lambda: run(ref), device, trials=trials, budget_s=budget_s, lock_path=timing_lock)
    note = ""
    try:
        compiled = torch.compile(ref)
        with timing.shared(timing.check_lock(timing_lock, device)):
            run(compiled)  # compiles: GPU work beside other checks, not in a timed region
        comp = timing.time_fn(lambda: run(compiled), device, trials=trials, budget_s=budget_s, lock_path=timing_lock)
    except Exception as e:  # noqa: BLE001
        comp = None
        note = f"torch.compile of the reference failed: {type(e).__name__}: {str(e)[:500]}"
    return eager, comp, note
