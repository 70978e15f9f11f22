// A stage's resumable state in OUT/checkpoint/: the weights as a Hugging Face folder, the
// optimizer's state (libtorch's archive) and state.json (the step and what the stage adds).
// Written into checkpoint.tmp and renamed over the old one, so a kill leaves either the previous
// checkpoint or the new one, never half of each.
#pragma once
#include <torch/optim/optimizer.h>

#include <filesystem>
#include <functional>
#include <vector>
#include <optional>

#include "model.h"

namespace opforge::trainer {

struct TrainState {
  int64_t step = 0;
  nlohmann::json extra = nlohmann::json::object();
};

// One trained model of a checkpoint: its weights saved into a folder (checkpoint/<name>, or the
// checkpoint folder itself when name is empty) with its optimizer's state beside them.
struct CheckpointPart {
  std::string name;
  std::function<void(const std::filesystem::path&)> save_weights;
  torch::optim::Optimizer* optimizer;
};

std::filesystem::path checkpoint_dir(const std::filesystem::path& out, const std::string& part = "");
bool has_checkpoint(const std::filesystem::path& out);
// Every part and state.json in one folder, renamed into place at once: a resumed run never sees
// an actor of one step beside a critic of another.
void save_checkpoint(const std::filesystem::path& out, const std::vector<CheckpointPart>& parts, const TrainState& state);
// What the stage added to state.json, read before anything is loaded (a stage may refuse to resume
// a checkpoint of other options).
nlohmann::json checkpoint_extra(const std::filesystem::path& out);
// The optimizers' state and state.json (logged as `stage` resuming); the weights are loaded from
// checkpoint_dir(out, name).
TrainState load_checkpoint(const std::filesystem::path& out, const std::vector<CheckpointPart>& parts,
                           const char* stage);

// metrics.jsonl of a stage: one JSON object a step. A resumed run first drops the lines past the
// checkpoint's step (a killed run may have logged steps it never saved).
class MetricsLog {
 public:
  MetricsLog(const std::filesystem::path& file, int64_t keep_through_step);
  void write(const nlohmann::json& row);
  // One panel per metric in `keys` against the step (python/opforge/train_plots.py).
  void plot(const std::filesystem::path& png, const std::string& title, const std::vector<std::string>& keys) const;

 private:
  std::filesystem::path file_;
};

}  // namespace opforge::trainer
