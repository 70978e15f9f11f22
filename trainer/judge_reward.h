// What `opforge train ppo` and `train eval` ask the judge: the tasks' single-turn prompts (the
// solving prompt of data/prompts/, the one verl's export and the adapters use, through the model's
// chat template) and a RewardFn that sends each answer to `opforge serve`.
#pragma once
#include <filesystem>

#include "evaluator.h"
#include "judge_client.h"
#include "ppo_stage.h"

namespace opforge::trainer {

// One prompt per task of SRC (a shard, a workspace, a folder of KernelBench files: load_tasks).
std::vector<Prompt> task_prompts(const std::filesystem::path& src, const Tokenizer& tok);
// One prompt per task, named by the task's name.
std::vector<Prompt> task_prompts(const std::vector<evaluator::EvalTask>& tasks, const Tokenizer& tok);

// Each answer judged by the service (its last code block is the solution), `concurrency` at a
// time. A row the service marks retryable (the environment failed) is a null reward.
RewardFn judge_reward(const evaluator::JudgeClient& judge, int concurrency);

}  // namespace opforge::trainer
