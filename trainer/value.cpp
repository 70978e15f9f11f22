#include "value.h"

#include "opforge/core/error.h"
#include "safetensors.h"

namespace opforge::trainer {
namespace fs = std::filesystem;

ValueModel ValueModel::load(const fs::path& dir, const at::Device& device) {
  ValueModel v;
  v.trunk_ = CausalLM::load(dir, device, at::kFloat);
  auto opts = at::TensorOptions().device(device).dtype(at::kFloat);
  if (fs::exists(dir / "value_head.safetensors")) {
    auto t = read_safetensors(dir / "value_head.safetensors");
    OPFORGE_CHECK(t.count("weight") && t.count("bias"), "{}: value_head.safetensors needs weight and bias",
                  dir.string());
    v.head_ = t["weight"].to(opts);
    v.bias_ = t["bias"].to(opts);
    OPFORGE_CHECK(v.head_.numel() == v.trunk_.config().hidden, "{}: the value head does not match hidden_size",
                  dir.string());
  } else {
    v.head_ = at::zeros({1, v.trunk_.config().hidden}, opts);
    v.bias_ = at::zeros({1}, opts);
  }
  return v;
}

void ValueModel::save(const fs::path& dir) const {
  trunk_.save(dir);
  write_safetensors(dir / "value_head.safetensors", {{"weight", head_}, {"bias", bias_}});
}

at::Tensor ValueModel::values(const at::Tensor& ids, const at::Tensor& mask) const {
  return at::linear(trunk_.hidden(ids, mask).to(at::kFloat), head_, bias_).squeeze(-1);
}

std::vector<at::Tensor> ValueModel::parameters() const {
  std::vector<at::Tensor> p = trunk_.parameters();
  p.push_back(head_);
  p.push_back(bias_);
  return p;
}

void ValueModel::set_requires_grad(bool on) {
  trunk_.set_requires_grad(on);
  head_.requires_grad_(on);
  bias_.requires_grad_(on);
}

}  // namespace opforge::trainer
