// `opforge train recipe`: CUDA Agent's four stages in order (trainer/README.md, "The recipe"):
//   1. single-turn PPO warm-up of the model (train ppo);
//   2. rejection-sampling fine-tuning: agent episodes of the warmed-up actor, served here, kept by
//      opforge agent sft (reward >= min_reward, well-behaved, judged correct again), then train sft
//      on them (skipped, and said, when none is kept: the actor stays the warmed-up one);
//   3. value pre-training of the critic on every turn of those episodes (train value);
//   4. multi-turn agentic PPO from the RFT actor and the pre-trained critic (train ppo --multi-turn).
// Sizes come from a preset (data/recipes/paper.json: the paper's; smoke.json: CPU-sized),
// whose sections are options of each stage's command. One judge serves every stage. Each stage is a
// child `opforge train ...` in OUT/<n>_<stage>/ (its own log, resumable as it is); a finished stage
// leaves `stage.json` and is skipped by a rerun, so a killed recipe resumes where it stopped.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace opforge::trainer {

struct RecipeOptions {
  std::filesystem::path model, tasks, out, preset;  // preset empty: data/recipes/paper.json
  std::string device = "cpu", judge_url;
  std::vector<std::string> judge_args;
};

// Runs (or resumes) the four stages; returns the final actor's folder.
std::filesystem::path run_recipe(const RecipeOptions& options);

}  // namespace opforge::trainer
