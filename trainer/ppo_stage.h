// `opforge train ppo`, single-turn: each iteration samples K answers to B task prompts with the
// actor, asks the reward function (the judge) for each, and updates actor and critic with PPO
// (GAE, the dual-clip surrogate, a clipped value loss, optional KL to the frozen starting actor,
// token-mean losses, advantage whitening, gradient clipping, AdamW). With advantage "rloo" or
// "grpo" there is no critic: each answer's advantage is its reward against the other answers to
// the same prompt (ppo.h, group_advantages), not whitened. An answer whose reward is null (the
// environment failed) is dropped, never scored. Resumable from OUT/checkpoint.
#pragma once
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate.h"
#include "model.h"
#include "tokenizer.h"

namespace opforge::trainer {

struct PpoOptions {
  std::filesystem::path actor, critic, out;  // critic empty: the actor's trunk with a zero value head
  int64_t steps = 150, batch = 8, rollouts_per_task = 4, ppo_epochs = 1, mini_batch = 0, max_new_tokens = 1024;
  int64_t micro_batch = 0;  // answers per forward/backward within a mini-batch (0: the mini-batch at once)
  double lr = 3e-6, critic_lr = 6e-6, temperature = 1.0, top_p = 1.0;  // the paper's learning rates
  double clip_low = 0.2, clip_high = 0.2, dual_clip = 3.0, value_clip = 0.2, kl_coef = 0.0;
  double gamma = 1.0, lam = 1.0, max_grad_norm = 1.0, weight_decay = 0.0;
  uint64_t seed = 0;
  std::string device = "cpu";
  // "gae" (the paper's: a critic, token-level GAE, whitened), "rloo" or "grpo" (critic-free,
  // group-relative; single-turn only).
  std::string advantage = "gae";
  Precision precision;
  bool has_critic() const { return advantage == "gae"; }
  nlohmann::json to_json() const;
};

struct Prompt {
  std::string task_id;
  std::vector<int64_t> ids;  // the chat-templated prompt, generation prompt included
};

// Rewards of the answers to `task_ids` (their texts and token ids, same length); nullopt: not
// judged (the environment failed).
using RewardFn = std::function<std::vector<std::optional<double>>(
    const std::vector<std::string>& task_ids, const std::vector<std::string>& texts,
    const std::vector<std::vector<int64_t>>& tokens)>;

// One sampled answer with the reward it earned: a single-turn answer, or one assistant turn of a
// multi-turn episode (its prompt the whole conversation before it, as the policy rendered it; the
// episode's final reward on each of its turns: with gamma = lam = 1 every token's return is that
// reward either way).
struct Sample {
  std::string task_id;
  std::vector<int64_t> prompt;
  Generation answer;
  std::optional<double> reward;  // nullopt: not judged (the environment failed)
};

// A sample in train value's trajectory format (value_stage.h): ids of prompt and answer,
// prompt_len, the answer's log-probabilities, the reward (null: not judged).
nlohmann::json trajectory_record(const Sample& sample);

// The samples of one step: episodes of `tasks` (the step's B prompts) run with `actor`, which the
// function may only read. Adds what it measured to `metrics`. train_ppo's default (empty) samples
// K single-turn answers per prompt and asks the RewardFn; `train ppo --multi-turn` runs opforge
// agent against the actor (multi_turn.h).
using EpisodeFn = std::function<std::vector<Sample>(const CausalLM& actor, int64_t step,
                                                    const std::vector<Prompt>& tasks, nlohmann::json& metrics)>;

struct PpoResult {
  std::vector<double> reward_mean;  // per step of this process
  std::filesystem::path actor_dir, critic_dir;
};

// The options' own consistency (train_ppo checks it too; the CLI first, before a judge starts).
void check_ppo_options(const PpoOptions& options, bool multi_turn);

PpoResult train_ppo(const PpoOptions& options, const std::vector<Prompt>& prompts, const Tokenizer& tok,
                    const RewardFn& reward, const EpisodeFn& episodes = {});

}  // namespace opforge::trainer
