// `opforge train eval`: a model's greedy answer to each task's solving prompt, judged, summed up.
// The prompts and the judge are train ppo's (judge_reward.h: task_prompts, judge_reward), so an
// evaluation scores exactly what PPO's reward scores: pass@1 before and after training, on the
// test split of the shards the training used.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ppo_stage.h"

namespace opforge::trainer {

struct ModelEvalOptions {
  std::filesystem::path model, tasks, out;  // out empty: no per-task rows
  std::string split;                        // empty: every task
  int64_t limit = 0, max_new_tokens = 1024, batch = 8;  // limit 0: every task
  std::string device = "cpu";
  nlohmann::json to_json() const;
};

// The solving prompts of o.tasks (task_prompts): those of o.split when it is given (shards only:
// an error naming what SRC is otherwise), the first o.limit when it is > 0, in the order of SRC.
std::vector<Prompt> eval_prompts(const ModelEvalOptions& o, const Tokenizer& tok);

// Greedy answers to `prompts`, judged by `reward`; each task's row ({task_id, reward, finish,
// response_tokens, response}) written to o.out when given. Returns the summary: tasks, judged,
// null (answers the judge could not score), pass_at_1 (share of judged answers with reward >= 1),
// mean_reward (both null when nothing was judged), reward_hist (-1, 1, 2, 3 always present).
nlohmann::json eval_model(const ModelEvalOptions& o, const std::vector<Prompt>& prompts, const Tokenizer& tok,
                          const RewardFn& reward);

}  // namespace opforge::trainer
