"""The driver of `opforge ray`, which writes ROOT/launch/shard.sh and merge.sh and then runs this
module in the venv's interpreter (Ray's API is Python):

    python -m opforge.ray_launch --address auto --root ROOT --shards N --pending 0,2 \
        --gpus-per-shard G --cpus-per-shard C

Each pending shard is one Ray task asking for G GPUs and C CPUs: it runs `bash shard.sh I` on the
node Ray placed it on (Ray sets CUDA_VISIBLE_DEVICES to the task's GPUs; the script works on
node-local disk and stages to ROOT/shards/I, which every node must see), its output appended to
ROOT/logs/shard-I.out. When every shard has finished, one more task runs merge.sh (merge, dedup,
export). Ray schedules and retries (a task whose node dies runs again; the script skips a shard
already staged); nothing here decides placement. Prints the export folder on stdout, logs on
stderr; exit status 1 when a shard or the merge failed.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

# A task without GPUs gets CUDA_VISIBLE_DEVICES="" from run_script itself, so Ray's coming change
# of that default (its FutureWarning on every such task) changes nothing here.
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
import ray  # noqa: E402


def log(msg):
    print(f"[opforge ray {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_script(script, args, log_path, gpus=0):
    """`bash script args` on this node, stderr appended to log_path; returns (status, host, stdout)."""
    host = socket.gethostname()
    env = dict(os.environ)
    if not gpus:  # a CPU shard must not find a GPU of its node (the filter's --device auto would)
        env["CUDA_VISIBLE_DEVICES"] = ""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a") as out:
        out.write(f"== {time.strftime('%Y-%m-%dT%H:%M:%S')} on {host}: bash {script} {' '.join(args)}\n")
        out.flush()
        p = subprocess.run(["bash", script, *args], stdout=subprocess.PIPE, stderr=out, text=True, env=env)
    return p.returncode, host, p.stdout


def reachable(address, timeout_s=10):
    """Whether HOST:PORT accepts a connection: ray.init retries an address with no cluster for minutes."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s).close()
        return True
    except (OSError, ValueError):
        return False


def connect(address):
    if address != "auto" and not address.startswith("ray://") and not reachable(address):
        raise SystemExit(f"opforge ray: nothing listens at --address {address}: start a cluster there (`ray start "
                         "--head --port PORT`) or pass the address `ray start` printed (HOST:PORT)")
    try:
        ray.init(address=address, log_to_driver=False, logging_level="warning")
    except ConnectionError as e:
        raise SystemExit(f"opforge ray: no Ray cluster at --address {address} ({e}): start one (`ray start --head` "
                         "on the head node, `ray start --address HEAD:PORT` on the others) or pass --address HOST:PORT")


def check_fits(gpus, cpus):
    """A task that asks for more than any node has waits in Ray until a node that fits joins (an
    autoscaler may add one), silently: say so now."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if not any(r.get("GPU", 0) >= gpus and r.get("CPU", 0) >= cpus for r in nodes):
        have = ", ".join(f"{r.get('CPU', 0):g} CPUs/{r.get('GPU', 0):g} GPUs" for r in nodes) or "no live node"
        log(f"warning: no live node of the cluster has {cpus:g} CPUs and {gpus:g} GPUs for one shard "
            f"(--cpus-per-shard, --gpus-per-shard; its nodes: {have}): the shards wait until one joins")


def runtime_env():
    """opforge's own settings (OPFORGE_PYTHON, OPFORGE_HOME, ...) go with the tasks to other nodes."""
    env = {k: v for k, v in os.environ.items() if k.startswith("OPFORGE_")}
    return {"env_vars": env} if env else None


def outcome(ref):
    """A finished task's (status, host, stdout); a task that died itself (its worker, its node)
    with its retries spent is a failure too."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayError as e:
        return f"lost ({type(e).__name__})", "?", ""


def run_shards(args, pending):
    """Runs the pending shards as Ray tasks; returns the indices that failed."""
    launch, logs = os.path.join(args.root, "launch"), os.path.join(args.root, "logs")
    task = ray.remote(run_script)
    refs = {}
    for i in pending:
        ref = task.options(num_gpus=args.gpus_per_shard, num_cpus=args.cpus_per_shard, max_retries=2,
                           name=f"opforge-shard-{i}", runtime_env=runtime_env()).remote(
            os.path.join(launch, "shard.sh"), [str(i)], os.path.join(logs, f"shard-{i}.out"), args.gpus_per_shard)
        refs[ref] = i
    failed = []
    while refs:
        done, _ = ray.wait(list(refs), num_returns=1)
        i = refs.pop(done[0])
        rc, host, _ = outcome(done[0])
        if rc != 0:
            failed.append(i)
        log(f"shard {i} on {host}: {'finished' if rc == 0 else f'failed, status {rc}'} ({len(refs)} running)")
    return sorted(failed)


def expand(part):
    """`3` or `0-3` of the launcher's index list."""
    lo, _, hi = part.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--address", default="auto")
    ap.add_argument("--root", required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--pending", default="", help="the shards without a completion marker, e.g. 0-3,5")
    ap.add_argument("--gpus-per-shard", type=float, default=0)
    ap.add_argument("--cpus-per-shard", type=float, default=1)
    args = ap.parse_args()
    pending = [i for part in args.pending.split(",") if part for i in expand(part)]
    connect(args.address)
    check_fits(args.gpus_per_shard, args.cpus_per_shard)
    log(f"{len(pending)} of {args.shards} shards to run on {args.address}")
    failed = run_shards(args, pending)
    if failed:
        log(f"shards {failed} failed: their logs are {os.path.join(args.root, 'logs', 'shard-I.out')}; run "
            "`opforge ray` again with the same options and only unfinished shards run")
        return 1
    log("merging, dedup, export")
    merge = ray.remote(run_script).options(num_cpus=1, max_retries=1, name="opforge-merge",
                                           runtime_env=runtime_env())
    rc, host, out = outcome(merge.remote(os.path.join(args.root, "launch", "merge.sh"), [],
                                         os.path.join(args.root, "logs", "merge.out")))
    if rc != 0:
        log(f"the merge failed on {host} (status {rc}): see {os.path.join(args.root, 'logs', 'merge.out')}")
        return 1
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
