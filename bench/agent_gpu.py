"""One scripted `opforge agent` episode end to end on a GPU: a loopback OpenAI-compatible server
(stdlib http.server; the LLM is the one outside service we cannot reach there) plays the model's
turns on tasks/gemm_epilogue: read model.py, write the released-layout solution's files, run
utils/compile.sh, verification.py and profiling.py through the judge, submit. The judge is the
opforge serve the agent starts on the GPU. Then `opforge agent sft` on the run: the episode's
files judged again by a judge of its own, the record written as the SFT set.
    python3 bench/agent_gpu.py OPFORGE OUT_DIR [AGENT_OPTION...]   (from the repo root; exit 1 when reward < 1)
AGENT_DEVICE=cpu runs the same episode's pipeline on a machine without a GPU (the reward is then -1)."""
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FX = "tests/fixtures/eval_gpu"
SOL = os.path.join(FX, "released", "gemm_epilogue")
SOL_FILES = ["model_new.py", "kernels/gemm_epilogue.cu", "kernels/gemm_epilogue.h", "kernels/gemm_epilogue_binding.cpp"]


def call(i, name, **arguments):
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def turn(n):
    if n == 0:
        return [call(0, "read_file", path="model.py"), call(1, "bash", command="nvidia-smi -L 2>&1 | head -2; echo uid=$(id -u)")]
    if n == 1:
        return [call(10 + k, "write_file", path=p, content=open(os.path.join(SOL, p)).read()) for k, p in enumerate(SOL_FILES)]
    scripts = {2: "bash utils/compile.sh", 3: "python3 utils/verification.py", 4: "python3 utils/profiling.py"}
    if n in scripts:
        return [call(20 + n, "bash", command=scripts[n])]
    return [call(99, "submit")]


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = sum(m["role"] == "assistant" for m in body["messages"])
        msg = {"role": "assistant", "content": "", "tool_calls": turn(n)}
        out = json.dumps({"id": "x", "object": "chat.completion", "usage": {"prompt_tokens": 2000 + 500 * n,
                                                                             "completion_tokens": 200},
                          "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *_):
        pass


def main(opforge, out):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    os.makedirs(out, exist_ok=True)
    tasks = os.path.join(out, "tasks")
    os.makedirs(tasks, exist_ok=True)
    with open(os.path.join(FX, "tasks", "gemm_epilogue.py")) as f, open(os.path.join(tasks, "gemm_epilogue.py"), "w") as g:
        g.write(f.read())
    t0 = time.time()
    rc = subprocess.call([opforge, "agent", "--tasks", tasks, "--out", os.path.join(out, "run"), "--llm-url",
                          f"http://127.0.0.1:{srv.server_port}/v1", "--llm-model", "scripted", "--device", os.environ.get("AGENT_DEVICE", "cuda")]
                         + sys.argv[3:])
    print(f"== opforge agent: rc {rc}, {time.time() - t0:.1f} s")
    with open(os.path.join(out, "run", "episodes.jsonl")) as f:
        ep = json.loads(f.readline())
    for m in ep["messages"]:
        if m["role"] == "tool" and not m["content"].startswith("wrote "):
            print(f"-- tool {m['tool_call_id']}:\n{m['content'][-1500:]}")
    for c in ep["tool_calls"]:
        print(f"   {c['turn']} {c['name']:<10} ok={c['ok']} {c['seconds']:.1f} s {json.dumps(c['detail'])[:160]}")
    fin = ep["final"]
    print(f"episode: ended {ep['ended']}, {ep['turns']} turns, {ep['seconds']:.1f} s; final reward {ep['reward']} "
          f"({fin.get('reason')}), candidate {fin.get('candidate_ms')} ms, eager {fin.get('eager_ms')}, "
          f"compile {fin.get('compile_ms')}, sandbox {fin.get('sandbox')}, judge {fin.get('judge')}")
    return sft(opforge, out) if rc == 0 and (ep["reward"] or -1) >= 1 else 1


def sft(opforge, out):
    """The episode's record through `opforge agent sft`: its files judged again on the GPU."""
    t0 = time.time()
    res = subprocess.run([opforge, "agent", "sft", "--trajectories", os.path.join(out, "run"), "--out",
                          os.path.join(out, "run", "sft", "rft.jsonl"), "--device", os.environ.get("AGENT_DEVICE", "cuda")],
                         stdout=subprocess.PIPE, text=True)
    print(f"== opforge agent sft: rc {res.returncode}, {time.time() - t0:.1f} s\n{res.stdout}")
    if res.returncode != 0:
        return 1
    with open(os.path.join(out, "run", "sft", "rft.jsonl")) as f:
        recs = [json.loads(x) for x in f]
    for r in recs:
        print(f"sft record: {r['task']}, {len(r['messages'])} messages, reward {r['reward']}, "
              f"judged again {r['rejudged_reward']}")
    return 0 if len(recs) == 1 and recs[0]["rejudged_reward"] >= 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
