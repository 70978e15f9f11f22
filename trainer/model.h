// A causal language model of the Llama / Qwen2 family in libtorch: RMSNorm, rotary position
// embeddings, grouped-query attention through at::scaled_dot_product_attention, a SwiGLU MLP, tied
// or untied embeddings, Qwen2's q/k/v bias. Loaded from and saved to a Hugging Face model folder
// (config.json, *.safetensors, the tokenizer's files copied along), so transformers reads what
// opforge writes. Weights are kept by their Hugging Face names, which makes loading and saving a
// rename-free copy.
//
// Thread safety: one model is used from one thread. Errors: an unsupported architecture or a
// missing field or file throws opforge::Error naming it.
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace opforge::trainer {

struct LmConfig {
  std::string model_type;  // "qwen2" or "llama"
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  double rms_eps = 1e-6, rope_theta = 10000.0;
  bool tie_embeddings = false, qkv_bias = false, o_bias = false, mlp_bias = false;
  std::vector<int64_t> eos_ids;  // config.json's, then generation_config.json's
  nlohmann::json raw;            // config.json as read, written back on save

  // From a config.json; `where` names the file in errors.
  static LmConfig from_json(const nlohmann::json& j, const std::string& where);
};

// Keys and values of every layer for the positions seen so far: [batch, kv_heads, capacity, head_dim],
// filled up to `length`.
struct KvCache {
  std::vector<at::Tensor> k, v;
  int64_t length = 0;
};

// "cpu" or "cuda" (the first visible GPU) as --device names them; an error for anything else or a
// CUDA device this libtorch cannot see.
at::Device device_named(const std::string& name);

class CausalLM {
 public:
  // bf16 on CUDA, fp32 on the CPU unless `dtype` says otherwise.
  static CausalLM load(const std::filesystem::path& dir, const at::Device& device,
                       std::optional<at::ScalarType> dtype = std::nullopt);
  // config.json, model.safetensors and the tokenizer / generation files of the folder it was loaded from.
  void save(const std::filesystem::path& dir) const;

  // Logits [B, T, vocab] (in the model's dtype) for `ids` [B, T]. `mask` [B, past + T] holds 1 for
  // real tokens and 0 for padding; positions count real tokens only, so left-padded prompts and
  // right-padded training rows get the positions they would have alone. An undefined `mask` says
  // that every token is real: positions are column numbers and attention is causal with no mask
  // tensor at all (what transformers runs for unpadded input; on CUDA it lets SDPA take flash
  // attention, which accepts no mask). With a cache, keys and values are appended to it (it must
  // have room: make_cache).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask, KvCache* cache = nullptr) const;
  // The last layer's normed hidden states [B, T, hidden]: what the logits and a critic's value head read.
  at::Tensor hidden(const at::Tensor& ids, const at::Tensor& mask, KvCache* cache = nullptr) const;
  // Logits of hidden states (the output projection alone): generation projects only the last
  // position, as transformers' generate does (logits_to_keep=1), not the whole prompt.
  at::Tensor logits(const at::Tensor& hidden) const { return at::linear(hidden, head_); }
  KvCache make_cache(int64_t batch, int64_t capacity) const;

  std::vector<at::Tensor> parameters() const;  // every trainable tensor (tied weights once)
  void set_requires_grad(bool on);
  // Gradient checkpointing: with grad mode on and no cache, each decoder layer keeps only its
  // input and runs again during backward (activations of one layer held, not of all).
  void set_checkpointing(bool on) { checkpointing_ = on; }
  const LmConfig& config() const { return cfg_; }
  const std::filesystem::path& source() const { return src_; }
  at::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }

 private:
  friend struct LayerCheckpoint;
  at::Tensor layer(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& attn_mask, KvCache* cache) const;
  at::Tensor attention(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& attn_mask, KvCache* cache) const;
  // The tensors of one decoder layer, looked up once at load: a forward pass would otherwise
  // format and find ~16 names a layer. Handles sharing the map's tensors (in-place updates and
  // requires_grad reach both); an undefined bias is an absent one.
  struct LayerWeights {
    at::Tensor in_norm, post_norm, q, q_b, k, k_b, v, v_b, o, o_b, gate, gate_b, up, up_b, down, down_b;
  };
  void bind_weights();
  std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& pos) const;
  const at::Tensor& w(const std::string& name) const;
  at::Tensor maybe(const std::string& name) const;
  LmConfig cfg_;
  std::map<std::string, at::Tensor> w_;
  std::vector<LayerWeights> layers_;
  at::Tensor embed_, norm_, head_;
  at::Tensor inv_freq_;  // rotary inverse frequencies [head_dim / 2], float32 on the device
  std::filesystem::path src_;
  at::Device device_{at::kCPU};
  at::ScalarType dtype_ = at::kFloat;
  bool checkpointing_ = false;
};

// How a stage trains (--bf16, --grad-checkpoint): the memory and speed levers of one GPU.
struct Precision {
  bool bf16 = false;           // autocast matmuls and attention to bfloat16 (float32 master weights stay)
  bool checkpointing = false;  // recompute each layer in backward (CausalLM::set_checkpointing)
  nlohmann::json to_json() const { return {{"bf16", bf16}, {"grad_checkpoint", checkpointing}}; }
};

// Autocast to `dtype` (bfloat16 unless a recompute replays another) on `device` for its scope when
// `on` (matmuls and attention in bf16 over float32 master weights; norms and losses stay float32,
// as autocast's op lists decide). Off: nothing. Cast weights are cached until the outermost scope
// closes, so no optimizer step may come between two forward passes of one scope.
class Autocast {
 public:
  Autocast(const at::Device& device, bool on, at::ScalarType dtype = at::kBFloat16);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  at::DeviceType type_;
  bool on_, was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace opforge::trainer
