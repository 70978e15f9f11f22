// Batched sampling from a CausalLM with a KV cache: greedy or temperature / top-p, a token limit
// and stop tokens, recording the exact token ids and each one's log-probability under logits /
// temperature (raw logits when greedy; top-p only decides what is drawn) — what the trainer's
// forward pass recomputes and PPO's importance ratio is taken against, so the trainer never
// re-tokenises its own rollouts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace opforge::trainer {

struct SampleOptions {
  int64_t max_new_tokens = 256;
  bool greedy = false;
  double temperature = 1.0;
  double top_p = 1.0;
  std::vector<int64_t> stop_ids;  // the model's eos ids are added by generate()
  int64_t pad_id = 0;             // fed for padding; never attended to
  uint64_t seed = 0;
};

struct Generation {
  std::vector<int64_t> tokens;  // the completion, the stop token included when one ended it
  std::vector<float> logprobs;  // one per token
  std::string finish;           // "stop" or "length"
};

// One completion per prompt (token ids). Deterministic for a given seed, batch and device.
std::vector<Generation> generate(const CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const SampleOptions& options);

}  // namespace opforge::trainer
