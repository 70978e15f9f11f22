// The critic: a CausalLM's trunk and a scalar head on its last hidden state, one value per token.
// Saved as the trunk's Hugging Face folder plus value_head.safetensors beside it, so the trunk
// still loads in transformers. Its language-model head is kept (unused) so the folder stays a
// complete model.
#pragma once
#include "model.h"

namespace opforge::trainer {

class ValueModel {
 public:
  // From a critic folder (value_head.safetensors present) or any model folder (the head starts at
  // zero: every value 0 until value pre-training moves it). float32.
  static ValueModel load(const std::filesystem::path& dir, const at::Device& device);
  void save(const std::filesystem::path& dir) const;
  at::Tensor values(const at::Tensor& ids, const at::Tensor& mask) const;  // [B, T] float32
  std::vector<at::Tensor> parameters() const;
  void set_requires_grad(bool on);
  void set_checkpointing(bool on) { trunk_.set_checkpointing(on); }
  const CausalLM& trunk() const { return trunk_; }

 private:
  CausalLM trunk_;
  at::Tensor head_, bias_;
};

}  // namespace opforge::trainer
