// Training rows for the trainer's stages: chat records read from JSONL, tokenized with the loss
// mask on assistant tokens, and collated into right-padded batches.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tokenizer.h"

namespace opforge::trainer {

struct TokenRows {
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<uint8_t>> loss_mask;
  int64_t skipped = 0;  // lines that were not chat records, or that the template could not render
  std::vector<std::string> skip_reasons;  // the first few, for the log
};

// Every line of `file` that is a JSON object with `messages` (OpenAI chat: agent sft's records
// and TRL's conversational format), or with `prompt` and `completion`/`response` strings (made a
// user and an assistant message). Throws when the file is missing or yields no row.
TokenRows read_chat_rows(const std::filesystem::path& file, const Tokenizer& tok, int64_t max_len);

// read_chat_rows through a cache in `cache_dir`: a file keyed by the data's bytes, the tokenizer's
// files in `model_dir` and max_len. A chunked or resumed `train sft` tokenises its data once: 6,171
// records took 55 s on a 2-core machine, more than a 250-step chunk's training on the H200.
TokenRows cached_chat_rows(const std::filesystem::path& file, const Tokenizer& tok, int64_t max_len,
                           const std::filesystem::path& model_dir, const std::filesystem::path& cache_dir);

struct Batch {
  at::Tensor ids, attention, loss_mask;  // [B, T] each; long, long, float
  int64_t tokens = 0;                    // loss tokens in the batch
};

// Rows `pick` of `rows`, right-padded with `pad_id` to the longest.
Batch collate(const TokenRows& rows, const std::vector<int64_t>& pick, int64_t pad_id);

// `pick` in consecutive parts of `micro` items (0: one part): the forward/backward passes of one
// optimizer step whose gradients add up to the whole batch's.
std::vector<std::vector<int64_t>> micro_batches(const std::vector<int64_t>& pick, int64_t micro);

// The items of step `step` (1-based) in batches of `batch` over `n` items: epoch e's order is a
// shuffle seeded by (seed, e), so any step's batch is known without replaying the steps before it
// (what resuming needs).
std::vector<int64_t> batch_of_step(int64_t step, int64_t n, int64_t batch, uint64_t seed);

}  // namespace opforge::trainer
