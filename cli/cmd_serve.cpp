// opforge serve: the judge as a reward service (evaluator/service.h).
#include <cstdlib>

#include "commands.h"
#include "evaluator.h"
#include "opforge/core/error.h"
#ifdef OPFORGE_HAVE_SERVE
#include "service.h"
#endif

namespace opforge::cli {

namespace {

void add_limits(CLI::App* cmd, evaluator::ServeOptions& o) {
  add_judge_limits(cmd, o.eval, 1000);  // a request's own "trials" is bounded the same (3-1000)
  cmd->add_option("-j,--workers", o.eval.workers, "Judge workers (default: one per GPU, 1 on the CPU)");
  cmd->add_option("--compile-workers", o.eval.compile_workers, "Build workers (default: half the cores)");
  cmd->add_option("--queue", o.queue_max, "Evaluations queued or running before requests get 429")->capture_default_str();
  cmd->add_option("--max-batch", o.max_batch, "Evaluations built and judged together")->capture_default_str();
  cmd->add_option("--max-solution-bytes", o.max_files_bytes, "Size cap of one submission's files")->capture_default_str();
  cmd->add_option("--child-memory-mb", o.eval.child_memory_mb,
                  "Memory limit of one solution's sandbox, through a cgroup where the machine has one (default: the "
                  "per-worker limit, as eval)");
}

}  // namespace

void add_serve(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "serve",
      "Serve the judge over HTTP to RL trainers: POST /v1/evaluate {task_id, solution_code | files, trials?} answers "
      "the row `opforge eval` would give (reward -1/1/2/3, reason, times, flags); also /v1/evaluate_batch, /openrlhf "
      "(OpenRLHF's remote reward), GET /healthz and /metrics. Every solution runs in its own sandboxed child; an "
      "environment failure answers reward null, retryable true. Prints \"listening on http://HOST:PORT\" when ready. "
      "Endpoints and fields: evaluator/README.md.");
  struct Opts {
    evaluator::ServeOptions s;
    std::string tasks, cache_dir, state_dir, token_env;
    bool allow_unsandboxed = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--tasks", o->tasks, "The tasks it judges: shards, a workspace or a folder of .py files (as eval)")
      ->required();
  cmd->add_option("--host", o->s.host, "Address to listen on (loopback unless you mean otherwise)")->capture_default_str();
  cmd->add_option("--port", o->s.port, "Port (0: any free one, printed)")->capture_default_str();
  cmd->add_option("--token-env", o->token_env, "Environment variable holding the bearer token requests must carry");
  cmd->add_option("--device", o->s.eval.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--policy", o->s.eval.policy, "strict or torch-allowed (as eval)")
      ->check(CLI::IsMember({"strict", "torch-allowed"}))
      ->capture_default_str();
  add_limits(cmd, o->s);
  cmd->add_option("--cache-dir", o->cache_dir, "Baselines and built extensions, shared with opforge eval");
  cmd->add_option("--state-dir", o->state_dir, "Submissions and logs (default: <cache-dir>/serve)");
  cmd->add_flag("--allow-unsandboxed", o->allow_unsandboxed,
                "Serve even where bubblewrap cannot run (rows flagged sandbox_off, reward at most 1)");
  cmd->callback([&run, o] {
    run = [o] {
#ifndef OPFORGE_HAVE_SERVE
      throw Error("this opforge was built without serve (cmake -DOPFORGE_SERVE=ON needs cpp-httplib)");
#else
      o->s.eval.tasks = o->tasks;
      o->s.eval.cache_dir = o->cache_dir;
      o->s.state_dir = o->state_dir;
      o->s.eval.require_sandbox = !o->allow_unsandboxed;
      o->s.eval.plots = false;
      if (!o->token_env.empty()) {
        const char* t = std::getenv(o->token_env.c_str());
        OPFORGE_CHECK(t && *t, "--token-env {}: that environment variable is not set (or empty)", o->token_env);
        o->s.token = t;
      }
      if (o->s.eval.memory_limit_mb == 0) o->s.eval.memory_limit_mb = default_memory_limit_mb(4);
      if (o->s.eval.child_memory_mb == 0) o->s.eval.child_memory_mb = o->s.eval.memory_limit_mb;
      return evaluator::serve(o->s);
#endif
    };
  });
}

}  // namespace opforge::cli
