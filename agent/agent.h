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

// The summary of episode records: pass rate, reward histogram, turns, tokens, endings, reasons.
nlohmann::json summarize_episodes(const std::vector<nlohmann::json>& records);
std::string summary_markdown(const nlohmann::json& summary);

}  // namespace opforge::agent
