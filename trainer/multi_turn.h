// `train ppo --multi-turn`: a step's episodes are opforge agent runs (agent/README.md) against the
// actor itself, served in this process by the policy server (policy_server.h) while the update
// waits, so each assistant turn comes back with the exact ids and log-probabilities it was sampled
// with (`policy_tokens` of the episode records) and nothing is tokenised again. Each turn becomes
// one PPO sample whose prompt is the conversation before it; the episode's final reward (the
// judge's, on the folder as the episode left it) is the reward of each of its turns. An episode
// that the environment failed (the agent's errors.jsonl) gives no sample. Built with
// OPFORGE_POLICY_SERVER only.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "ppo_stage.h"

namespace opforge::trainer {

struct MultiTurnOptions {
  std::filesystem::path tokenizer_dir;  // the actor's folder: tokenizer and chat template
  std::filesystem::path out;            // OUT/rollouts: step_N/{tasks.jsonl, r0..rK-1/, server.log}
  std::string judge_url;                // the judge every agent run shares (train ppo starts it)
  std::map<std::string, std::string> code;  // task id -> task code, for the step's tasks.jsonl
  int64_t rollouts_per_task = 4, max_turns = 8, max_new_tokens = 1024, agent_concurrency = 4;
  double temperature = 1.0;
  bool bf16 = false;
  std::vector<std::string> agent_args;  // passed on to every opforge agent run
};

EpisodeFn multi_turn_episodes(MultiTurnOptions options);

// The samples of one agent run's records (RUN/episodes.jsonl lines): a sample per turn of
// `policy_tokens`, the episode's reward on each. Throws opforge::Error for a record without
// policy_tokens (not sampled by opforge's policy server) or with malformed ones.
std::vector<Sample> turn_samples(const std::vector<nlohmann::json>& records);

}  // namespace opforge::trainer
