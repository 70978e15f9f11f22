"""What one call across the judge/solution boundary costs on a GPU, piece by piece.

    python bench/crossing.py [--mib 1024] [--trials 200]

A parent (the judge's role) and a child process (the solution's) share a CUDA arena over a
SOCK_SEQPACKET socket, as `opforge eval` does (python/opforge/shm.py). The child's "call" is one
elementwise kernel over the arena (y = x * 2 + 1) and a device sync. Each row is the parent's
per-call median wall time for one variant of the protocol:
  wait     block: recv sleeps in the kernel; spin: non-blocking recv in a loop (both sides)
  steps    the parent's untimed work before each call, in order (variant's docstring): none, a
           rewrite of the inputs and an L2 flush by kernels or by the copy engine only, and the
           ready ping that makes the child launch a tiny kernel, before or after the rewrite
and, for the anchor, the same kernel timed inside the child (wall clock around kernel+sync, and
CUDA events). Prints a Markdown table; the overhead column is the row minus the in-process wall.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

from opforge import shm  # noqa: E402


def recv(chan, spin):
    if not spin:
        return chan.recv()[0]
    chan.sock.setblocking(False)
    while True:
        try:
            data = chan.sock.recv(shm.MAX_MESSAGE)
            break
        except BlockingIOError:
            continue
    chan.sock.setblocking(True)
    import json
    return json.loads(data)


def local(x, trials):
    flush = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    walls, evs = [], []
    for _ in range(trials):
        flush.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.mul(2).add_(1)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.mul(2).add_(1)
        b.record()
        b.synchronize()
        evs.append(a.elapsed_time(b))
    return {"wall": statistics.median(walls), "events": statistics.median(evs)}


def child_entry():
    fd = int(sys.argv[2])
    chan = shm.Channel.from_fd(fd)
    torch.empty(1, device="cuda")
    chan.send({"hello": True})
    msg, fds = chan.recv()
    arena = shm.open_arena("device", fds[0], int(msg["nbytes"]), "cuda")
    x = arena.tensor({"offset": 0, "shape": [int(msg["nbytes"]) // 4], "dtype": "float32"})
    serve(chan, x)


def serve(chan, x):
    spin, tick = False, None
    y = None
    while True:
        msg = recv(chan, spin)
        op = msg["op"]
        if op == "exit":
            return
        if op == "spin":
            spin = bool(msg["on"])
        elif op == "run":
            y = None
            y = x.mul(2).add_(1)
            torch.cuda.synchronize()
        elif op == "ready":
            tick = torch.ones(1, device="cuda") if tick is None else tick.add_(1)
            torch.cuda.synchronize()
        elif op == "local":
            chan.send(local(x, int(msg["trials"])))
            continue
        chan.send({"ok": True})


def ask(chan, spin, **msg):
    chan.send(msg)
    return recv(chan, spin)


def variant(chan, bufs, spin, steps, trials, idle_ms=0.0):
    """Per-call median of a timed "run" after the untimed `steps` (a string of step letters):
    m: the parent makes the next inputs with a kernel (a mix, on the compute engine), in staging
    c: it copies staging into the shared arena and flushes L2 with kernels (fill)
    d: it does both with cudaMemcpy only (copy engine: inputs, then a 64 MiB copy over the flush buffer)
    r: the child launches a tiny kernel (the ready ping)
    s: the parent leaves the GPU idle for idle_ms (host sleep; does the context switch's cost fade?)"""
    arena_t, src, flush, flush_src = bufs
    ask(chan, False, op="spin", on=spin)
    times = []
    for i in range(trials + 5):
        for step in steps:
            if step == "m":
                src.mul_(1.0)
            elif step == "c":
                arena_t.copy_(src)
                flush.zero_()
            elif step == "d":
                arena_t.copy_(src)
                flush.copy_(flush_src)
            elif step == "r":
                ask(chan, spin, op="ready")
            elif step == "s":
                torch.cuda.synchronize()
                time.sleep(idle_ms / 1e3)
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        ask(chan, spin, op="run")
        if i >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    ask(chan, spin, op="spin", on=False)
    return statistics.median(times)


STEPS = ("", "c", "rc", "cr", "d", "rd", "mrd", "mrc")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[1024, 16])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--idle-ms", type=float, nargs="*", default=[0.5, 2.0, 10.0],
                    help="idle times tried after the rewrite (steps cs, spin only)")
    a = ap.parse_args()
    print("| MiB | wait | untimed steps | judge ms/call | in-child wall ms | in-child events ms | overhead ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mib in a.mib:
        nbytes = mib << 20
        chan, theirs = shm.Channel.pair()
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", str(theirs.fileno())],
                                pass_fds=[theirs.fileno()])
        theirs.close()
        chan.recv(60)
        arena = shm.create_arena(nbytes, "cuda")
        chan.send({"op": "bind", "nbytes": nbytes}, fds=[arena.fd])
        t = arena.tensor({"offset": 0, "shape": [nbytes // 4], "dtype": "float32"})
        src = torch.randn(nbytes // 4, device="cuda")
        t.copy_(src)
        flush = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        bufs = (t, src, flush, torch.ones_like(flush))
        torch.cuda.synchronize()
        loc = ask(chan, False, op="local", trials=a.trials)
        for spin in (False, True):
            for steps in STEPS:
                ms = variant(chan, bufs, spin, steps, a.trials)
                print(f"| {mib} | {'spin' if spin else 'block'} | {steps or '-'} | {ms:.4f} | {loc['wall']:.4f} | "
                      f"{loc['events']:.4f} | {ms - loc['wall']:.4f} |", flush=True)
        for idle in a.idle_ms:
            ms = variant(chan, bufs, True, "cs", a.trials, idle)
            print(f"| {mib} | spin | cs ({idle:g} ms idle) | {ms:.4f} | {loc['wall']:.4f} | "
                  f"{loc['events']:.4f} | {ms - loc['wall']:.4f} |", flush=True)
        chan.send({"op": "exit"})
        proc.wait(30)
        del t
        arena.close()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child_entry()
    else:
        main()
