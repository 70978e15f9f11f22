// Subcommand registration. Each subcommand owns its options and --help, and sets `run`, which
// main calls after parsing; it returns the process exit code.
#pragma once
#include <CLI/CLI.hpp>

#include "evaluator.h"

#include <cstddef>
#include <functional>
#include <string>

namespace opforge::cli {

using Runner = std::function<int()>;

void add_crawl(CLI::App& app, Runner& run);
void add_compose(CLI::App& app, Runner& run);
void add_status(CLI::App& app, Runner& run);
void add_merge(CLI::App& app, Runner& run);  // shard workspaces or eval reports into one
void add_filter(CLI::App& app, Runner& run);
void add_import(CLI::App& app, Runner& run);
void add_tasks(CLI::App& app, Runner& run);
void add_dedup(CLI::App& app, Runner& run);
void add_export(CLI::App& app, Runner& run);
void add_worker(CLI::App& app, Runner& run);
void add_eval(CLI::App& app, Runner& run);
void add_serve(CLI::App& app, Runner& run);
void add_env(CLI::App& app, Runner& run);
void add_agent(CLI::App& app, Runner& run);
void add_run(CLI::App& app, Runner& run);
// slurm, ray: compose and filter as shards on a cluster's scheduler, then merge (cmd_launch.cpp).
void add_slurm(CLI::App& app, Runner& run);
void add_ray(CLI::App& app, Runner& run);
void add_sandbox_exec(CLI::App& app, Runner& run);
void add_realism(CLI::App& app, Runner& run);
void add_model_stats(CLI::App& app, Runner& run);
void add_trainer(CLI::App& app, Runner& run);  // generate, train: exec opforge-trainer

// Shared option helpers.
// The judge's limits that eval and serve both take: --trials (3..max_trials), --budget-s,
// --correct-trials, --compile-timeout-s, --timeout-s.
void add_judge_limits(CLI::App* cmd, evaluator::EvalOptions& e, int max_trials);
void add_workspace_option(CLI::App& cmd, std::string& workspace);
int default_workers();
// A resident-memory budget per worker that leaves room for the rest of the machine.
std::size_t default_memory_limit_mb(int workers);

}  // namespace opforge::cli
