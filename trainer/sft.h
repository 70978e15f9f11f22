// `opforge train sft`: supervised fine-tuning on chat records with the loss on assistant tokens
// only (token-mean over the batch), AdamW, gradient clipping, micro-batches; resumable from its
// last checkpoint with the same result as an uninterrupted run (the data order is a function of
// the seed and the epoch). The RFT stage of the paper's recipe is this on `opforge agent sft`'s
// output.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "model.h"

namespace opforge::trainer {

struct SftOptions {
  std::filesystem::path model, data, val, out;
  int64_t epochs = 1, steps = 0;  // steps > 0 overrides epochs
  int64_t batch = 8, micro_batch = 0;  // micro_batch 0: the whole batch at once
  int64_t max_len = 4096, save_every = 50;
  double lr = 1e-5, weight_decay = 0.01, max_grad_norm = 1.0;
  uint64_t seed = 0;
  std::string device = "cpu";
  Precision precision;
  nlohmann::json to_json() const;
};

struct SftResult {
  int64_t steps = 0;
  double last_loss = 0, val_loss = -1;  // val_loss < 0: no --val
  std::filesystem::path model_dir;
};

SftResult train_sft(const SftOptions& options);

}  // namespace opforge::trainer
