// opforge agent: the ReAct loop of CUDA Agent over exported working folders (agent/README.md).
// Each episode is one task's folder and one conversation with an OpenAI-compatible endpoint that
// calls tools (bash, read_file, write_file, submit); the final reward is the strict judge's
// (`opforge serve`) on the folder as the episode left it.
//
// Errors: an episode's own failures (bad tool calls, hung commands, a protected file written) are
// told to the model and the episode goes on; an episode that the LLM endpoint or the judge failed
// is written to errors.jsonl with its reason and run again by the next run (never a -1). Only
// what dooms every episode throws opforge::Error: a rejected key, an unreachable endpoint, a judge
// that does not start. Thread safety: run_agent is one call per process.
#pragma once
#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "opforge/core/llm_client.h"

namespace opforge::agent {

struct AgentOptions {
  std::filesystem::path tasks;  // as opforge eval's --tasks
  std::filesystem::path out;    // episodes.jsonl, errors.jsonl, summary.{json,md,png}, work/, judge/
  std::filesystem::path data_dir;
  llm::LlmOptions llm;          // url, model, key, retries; concurrency is per episode (one request)
  int max_turns = 200;
  int concurrency = 4;              // episodes in flight
  long max_context_tokens = 131072;
  std::string device = "auto";      // of the judge the agent starts
  std::string judge_url;            // an opforge serve to use; empty: start one (judge_args passed on)
  std::string judge_token_env;      // the variable holding judge_url's bearer token
  std::vector<std::string> judge_args;
  double bash_timeout_s = 300;
  std::size_t tool_output_chars = 16000;
  bool no_sandbox = false;          // bash unsandboxed (a machine without bubblewrap)
};

// Runs every task's episode that episodes.jsonl does not hold yet; returns the summary.
nlohmann::json run_agent(const AgentOptions& o);

// The records of RUN/episodes.jsonl (or errors.jsonl): a line cut short by a kill is dropped.
std::vector<nlohmann::json> read_records(const std::filesystem::path& file);

// opforge agent sft: the rejection-sampling fine-tuning set of CUDA Agent from a run's records.
struct SftOptions {
  std::filesystem::path trajectories;  // an opforge agent --out
  std::filesystem::path out;           // the JSONL file; the parquet beside it unless `parquet` is set
  std::filesystem::path parquet;
  int min_reward = 1;                  // as first measured, in the record
  long max_failed_calls = -1;          // tool calls the loop refused (bad tool, arguments, path, limit); -1: any
  std::string device = "auto";         // of the judge that judges each kept solution again
  std::vector<std::string> judge_args;
};
// Keeps the episodes of the run's own tasks whose reward was >= min_reward with no flag, and
// whose final files a fresh judge finds correct again, with no flag and reward >= min_reward; writes them as chat records (agent/README.md, "The SFT
// set"). Returns the tally: episodes, kept, dropped by reason. Throws opforge::Error when RUN is
// not a run folder, or when the judge fails (the environment's failure: nothing is written).
nlohmann::json build_sft(const SftOptions& o);

// The summary of episode records: pass rate, reward histogram, turns, tokens, endings, reasons.
nlohmann::json summarize_episodes(const std::vector<nlohmann::json>& records);
std::string summary_markdown(const nlohmann::json& summary);

}  // namespace opforge::agent
