// opforge agent: the ReAct loop over working folders (agent/agent.h).
#include <iostream>

#include "agent.h"
#include "commands.h"
#include "opforge/core/paths.h"

namespace opforge::cli {

namespace {

CLI::App* add_agent_sft(CLI::App& agent, Runner& run) {
  auto* cmd = agent.add_subcommand(
      "sft",
      "The rejection-sampling fine-tuning set of CUDA Agent from a run's records: episodes whose reward was at least "
      "--min-reward with no flag, whose final files a fresh strict judge finds correct again with no flag, as chat "
      "records (OpenAI messages with tool_calls and tool answers, and the tools) in JSONL and parquet. Prints the "
      "tally as JSON.");
  auto o = std::make_shared<agent::SftOptions>();
  cmd->add_option("--trajectories", o->trajectories, "An opforge agent --out (episodes.jsonl, work/)")->required();
  cmd->add_option("-o,--out", o->out, "The JSONL file (written anew)")->required();
  cmd->add_option("--parquet", o->parquet, "The parquet file (default: --out with .parquet)");
  cmd->add_option("--min-reward", o->min_reward, "Least reward, as first measured")->capture_default_str()
      ->check(CLI::Range(-1, 3));
  cmd->add_option("--max-failed-calls", o->max_failed_calls,
                  "Most tool calls the loop refused (unknown tool, bad arguments, refused path, past the limit); -1: "
                  "any")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "The judge's device: auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--judge-arg", o->judge_args, "An option for the opforge serve started here (repeat)");
  cmd->callback([&run, o] {
    run = [o] {
      auto tally = agent::build_sft(*o);
      std::cout << tally.dump(2) << "\n";
      return 0;
    };
  });
  return cmd;
}

}  // namespace

void add_agent(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "agent",
      "CUDA Agent's ReAct loop: one episode per task, in its exported working folder, against any OpenAI-compatible "
      "chat endpoint with tool calling (bash in a sandbox with no network, read_file, write_file, submit). The final "
      "reward is the strict judge's (opforge serve, started here unless --judge-url) on the folder as the episode "
      "left it. Writes OUT/episodes.jsonl (one record per episode: messages, tool calls, tokens, the judge's row), "
      "OUT/summary.{json,md,png}; a killed run resumes without re-running finished episodes. Prints summary.md.");
  auto o = std::make_shared<agent::AgentOptions>();
  o->llm.key_env = "OPENAI_API_KEY";
  cmd->add_option("--tasks", o->tasks, "Shards, a workspace or a folder of .py tasks (as eval)");
  cmd->add_option("-o,--out", o->out, "Run folder (created; an earlier run's folder resumes)");
  cmd->add_option("--llm-url", o->llm.url, "OpenAI-compatible endpoint, e.g. http://localhost:8000/v1");
  cmd->add_option("--llm-model", o->llm.model, "Model name sent to the endpoint");
  cmd->add_option("--llm-key-env", o->llm.key_env, "Environment variable holding the API key (never logged)")
      ->capture_default_str();
  cmd->add_option("--llm-timeout-s", o->llm.timeout_s, "Per-request time limit")->capture_default_str();
  cmd->add_option("--llm-retries", o->llm.max_retries, "Retries of a request on 429, 5xx and network errors")
      ->capture_default_str();
  cmd->add_option("--temperature", o->llm.temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--max-tokens", o->llm.max_tokens, "Completion tokens per turn")->capture_default_str();
  cmd->add_option("--max-turns", o->max_turns, "Model turns per episode")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--concurrency", o->concurrency, "Episodes in flight")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--max-context-tokens", o->max_context_tokens, "An episode ends once its context is larger")
      ->capture_default_str();
  cmd->add_option("--bash-timeout-s", o->bash_timeout_s, "Time limit of one bash call (the judge's answers excluded)")
      ->capture_default_str();
  cmd->add_option("--tool-output-chars", o->tool_output_chars, "Characters of a tool's output the model sees")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "The judge's device: auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--judge-url", o->judge_url, "An opforge serve to use instead of starting one");
  cmd->add_option("--judge-token-env", o->judge_token_env, "Environment variable holding --judge-url's bearer token");
  cmd->add_option("--judge-arg", o->judge_args, "An option for the opforge serve started here (repeat; e.g. "
                                                "--judge-arg=--trials --judge-arg=20)");
  cmd->add_flag("--no-sandbox", o->no_sandbox, "Run bash without bubblewrap (only where it cannot run)");
  auto* sft = add_agent_sft(*cmd, run);
  cmd->callback([&run, o, cmd, sft] {
    if (*sft) return;  // `agent sft` set the job
    for (auto* name : {"--tasks", "--out", "--llm-url", "--llm-model"})
      if (cmd->get_option(name)->count() == 0)
        throw CLI::RequiredError(std::string(name) + " (opforge agent --help; opforge agent sft --help for the SFT set)");
    run = [o] {
      o->data_dir = data_dir();
      auto s = agent::run_agent(*o);
      std::cout << agent::summary_markdown(s);
      return 0;
    };
  });
}

}  // namespace opforge::cli
