#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.h"
#include "evaluator.h"

namespace opforge::cli {

void add_judge_limits(CLI::App* cmd, evaluator::EvalOptions& e, int max_trials) {
  cmd->add_option("--trials", e.trials, "Timed runs per measurement (median), bounded by --budget-s")
      ->check(CLI::Range(3, max_trials))
      ->capture_default_str();
  cmd->add_option("--budget-s", e.budget_s, "Time budget per measurement (at least 3 trials are taken)")
      ->capture_default_str();
  cmd->add_option("--correct-trials", e.correct_trials, "Fresh random input sets checked for correctness")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--compile-timeout-s", e.compile_timeout_s, "Limit of one solution's build")->capture_default_str();
  cmd->add_option("--timeout-s", e.timeout_s,
                  "Limit of one request to a solution's child (checks, timing, baselines): past it the solution gets "
                  "-1 with reason timeout")
      ->capture_default_str();
  cmd->add_flag("--untimed", e.untimed,
                "Correctness only: no timing and no baselines, reward -1 or 1 (for runs that measure whether answers "
                "are right, not how fast: a learning run). Needs --policy torch-allowed");
}

void add_eval(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Score solutions (ModelNew) against their tasks: build them in parallel, check them on fresh inputs, time them "
      "against eager and torch.compile, and give the CUDA Agent reward (-1 wrong, 1 correct, 2 faster than eager, 3 "
      "faster than eager and compile). Writes report.json, report.md and report.png into --out and prints report.md. "
      "Layouts and checks: evaluator/README.md.");
  struct Opts {
    evaluator::EvalOptions e;
    std::string tasks, solutions, out = "eval_report", cache_dir;
    std::uint64_t seed = 0;
    bool no_sandbox = false, no_plots = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--tasks", o->tasks,
                  "Shards (.jsonl, .jsonl.gz or a folder of them), a workspace (accepted and kept tasks) or a folder "
                  "of KernelBench .py files")
      ->required();
  cmd->add_option("--solutions", o->solutions,
                  "Folder of <task>.py files (ModelNew, e.g. load_inline) and/or <task>/ folders (model_new.py + "
                  "kernels/); <task> is a task's file stem or id")
      ->required();
  cmd->add_option("-o,--out", o->out, "Report folder (created)")->capture_default_str();
  cmd->add_option("--device", o->e.device, "auto, cpu or cuda (auto: cuda when a GPU is visible)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--policy", o->e.policy,
                  "strict: ModelNew.forward may only allocate, take views and call its own extension; torch-allowed: "
                  "no guard (KernelBench-style, for comparisons)")
      ->check(CLI::IsMember({"strict", "torch-allowed"}))
      ->capture_default_str();
  add_judge_limits(cmd, o->e, 100000);
  cmd->add_option("--speedup-margin", o->e.speedup_margin, "Faster means a speed-up above 1 + margin")
      ->capture_default_str();
  cmd->add_option("--atol", o->e.atol, "Absolute tolerance of every output element")->capture_default_str();
  cmd->add_option("--rtol", o->e.rtol, "Relative tolerance of every output element")->capture_default_str();
  cmd->add_option("--compile-workers", o->e.compile_workers, "Parallel builds (default: one per core)");
  cmd->add_option("-j,--workers", o->e.workers, "Evaluation workers (default: one per GPU, 1 on the CPU)");
  cmd->add_option("--memory-limit-mb", o->e.memory_limit_mb, "Resident memory limit per worker (default: 60% of RAM "
                                                             "shared by the workers)");
  cmd->add_option("--cache-dir", o->cache_dir,
                  "Baseline timings (baselines.db) and built extensions (default: ~/.cache/opforge/eval)");
  auto* seed = cmd->add_option("--seed", o->seed, "Seed of the input sets (default: drawn per run, in the report)");
  cmd->add_flag("--no-sandbox", o->no_sandbox,
                "Run each solution's child without bubblewrap (its rows are flagged sandbox_off and earn at most 1)");
  cmd->add_flag("--require-sandbox", o->e.require_sandbox,
                "Fail instead of running solutions unsandboxed when bubblewrap cannot run here");
  cmd->add_option("--child-memory-mb", o->e.child_memory_mb,
                  "Memory limit of one solution's sandbox, through a cgroup where the machine has one (default: the "
                  "per-worker limit)");
  cmd->add_flag("--no-plots", o->no_plots, "Skip report.png (needs matplotlib in the venv)");
  cmd->add_flag("--fresh", o->e.fresh,
                "Judge every solution again; without it a run on an --out that holds journal.jsonl from the same "
                "judge and options reuses the verdicts of unchanged solutions (a killed run resumes)");
  cmd->callback([&run, o, seed] {
    run = [o, seed] {
      o->e.tasks = o->tasks;
      o->e.solutions = o->solutions;
      o->e.out = o->out;
      o->e.cache_dir = o->cache_dir;
      if (seed->count() > 0) o->e.seed = o->seed;
      o->e.sandbox = !o->no_sandbox;
      o->e.plots = !o->no_plots;
      if (o->e.memory_limit_mb == 0)
        o->e.memory_limit_mb = default_memory_limit_mb(std::max(2, o->e.workers > 0 ? o->e.workers : default_workers()));
      if (o->e.child_memory_mb == 0) o->e.child_memory_mb = o->e.memory_limit_mb;
      auto report = evaluator::evaluate(o->e);
      const auto& s = report["summary"];
      std::cout << evaluator::report_markdown(report);
      spdlog::info("eval done in {:.1f}s: {} evaluated, {} correct, mean reward {}; report in {}",
                   report["seconds"].get<double>(), s["evaluated"].get<long>(), s["correct"].get<long>(),
                   s["mean_reward"].is_number() ? fmt::format("{:.3f}", s["mean_reward"].get<double>()) : "-", o->out);
      return 0;
    };
  });
}

}  // namespace opforge::cli
