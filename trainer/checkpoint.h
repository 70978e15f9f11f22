// A stage's resumable state in OUT/checkpoint/: the weights as a Hugging Face folder, the
// optimizer's state (libtorch's archive) and state.json (the step and what the stage adds).
// Written into checkpoint.tmp and renamed over the old one, so a kill leaves either the previous
// checkpoint or the new one, never half of each.
#pragma once
#include <torch/optim/optimizer.h>

#include <filesystem>
#include <optional>

#include "model.h"

namespace opforge::trainer {

struct TrainState {
  int64_t step = 0;
  nlohmann::json extra = nlohmann::json::object();
};

std::filesystem::path checkpoint_dir(const std::filesystem::path& out);
bool has_checkpoint(const std::filesystem::path& out);
void save_checkpoint(const std::filesystem::path& out, const CausalLM& model, torch::optim::Optimizer& opt,
                     const TrainState& state);
// The optimizer's state and state.json; the weights are loaded by CausalLM::load(checkpoint_dir).
TrainState load_checkpoint(const std::filesystem::path& out, torch::optim::Optimizer& opt);

// metrics.jsonl of a stage: one JSON object a step. A resumed run first drops the lines past the
// checkpoint's step (a killed run may have logged steps it never saved).
class MetricsLog {
 public:
  MetricsLog(const std::filesystem::path& file, int64_t keep_through_step);
  void write(const nlohmann::json& row);

 private:
  std::filesystem::path file_;
};

}  // namespace opforge::trainer
