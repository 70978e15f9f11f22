// One episode of the ReAct loop (agent.h): the conversation, its tool calls, its ending and the
// judge's final row. Internal to the agent stage.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "agent.h"
#include "judge_client.h"
#include "tools.h"

namespace opforge::agent {

using evaluator::JudgeClient;

struct EpisodeTask {
  std::string task_id, name, folder;  // folder: under the run's work/
  std::string code;                   // the task's model.py
  std::filesystem::path work;         // the run's work/ (manifest, .protected/)
};

// The LLM endpoint or the judge failed the episode: not the solution's doing (errors.jsonl).
struct EpisodeAborted : std::runtime_error {
  std::string reason;
  EpisodeAborted(std::string r, const std::string& detail) : std::runtime_error(detail), reason(std::move(r)) {}
};

// The episode's record (agent/README.md, "Records"). Throws EpisodeAborted, or opforge::Error for
// what dooms the run (the LLM client's rejected key, unreachable endpoint).
nlohmann::json run_episode(const AgentOptions& o, const EpisodeTask& t, llm::LlmClient& llm, const JudgeClient& judge,
                           const ToolContext& tools, const std::string& system_prompt);

// The judge's row on the folder as it is: -1 `bad_submission` when its files could not all be
// read within the limits, -1 `protected_files_changed` when a protected file differs from
// export's copy (neither judged), else serve's row (retried while retryable). `sol` is the
// folder's solution_files, read once by the caller (the record keeps them too).
nlohmann::json final_row(const EpisodeTask& t, const JudgeClient& judge, const SolutionFiles& sol);

}  // namespace opforge::agent
