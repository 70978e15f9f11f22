// `opforge train value`: value pre-training. The critic (value.h: the trunk and a scalar head)
// regresses on the returns of trajectories whose final reward is known (train ppo's
// trajectories.jsonl, or chat records with a reward), so that PPO starts with a critic that
// already tells a promising answer from a hopeless one instead of a zero head whose advantages
// are the raw rewards. AdamW, gradient clipping, float32 master weights; resumable from
// OUT/checkpoint with the bytes of an uninterrupted run (the data order is a function of the
// seed and the epoch); writes OUT/critic, which `train ppo --critic` loads.
//
// The trajectory format (JSONL, one record a line; trainer/README.md has it too):
//   {"task_id": "...", "step": 3,               optional, for people
//    "ids": [prompt and response token ids],
//    "prompt_len": P  |  "loss_mask": [0/1 per id, 1 on the tokens the policy generated],
//    "logprobs": [one per response token],       the rollout's; not read by this stage
//    "reward": R | null}                          the final reward; null: not judged, skipped
// or a chat record {"messages": [...], "tools"?: ..., "reward": R}, tokenised once by the
// model's chat template (Tokenizer::chat_rows, SFT's path), its assistant turns the response.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data.h"
#include "model.h"

namespace opforge::trainer {

struct ValueOptions {
  std::filesystem::path model, critic_init, trajectories, out;  // critic_init empty: model
  int64_t epochs = 1, steps = 0;  // steps > 0 overrides epochs
  int64_t batch = 8, micro_batch = 0, max_len = 8192, save_every = 50;  // micro_batch 0: the whole batch at once
  double lr = 6e-6, weight_decay = 0.0, max_grad_norm = 1.0;  // train ppo's critic optimizer
  double gamma = 1.0, lam = 1.0;  // train ppo's defaults
  uint64_t seed = 0;
  std::string device = "cpu";
  Precision precision;
  nlohmann::json to_json() const;
};

// Trajectories as rows of ids with the mask of response tokens (TokenRows' loss_mask), and each
// row's final reward.
struct Trajectories {
  TokenRows rows;  // rows.skipped: malformed records, too long, or no response token
  std::vector<double> rewards;
  int64_t null_reward = 0;  // records skipped because the judge gave no reward
};

// Every record of `src` (a JSONL file, or every .jsonl file of a folder but metrics.jsonl, in
// name order). `model` is the folder whose tokenizer renders chat records; it is loaded only when
// there is one. Rows longer than max_len are skipped (cutting one would cut its reward's token).
// Throws when nothing usable is left.
Trajectories read_trajectories(const std::filesystem::path& src, const std::filesystem::path& model, int64_t max_len);

struct ValueResult {
  std::vector<double> value_loss;  // per step of this process
  std::filesystem::path critic_dir;
};

ValueResult train_value(const ValueOptions& options);

}  // namespace opforge::trainer
