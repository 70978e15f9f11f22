#include "model.h"

#include <fstream>

#include "opforge/core/error.h"
#include "safetensors.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

int64_t need_int(const json& j, const char* key, const std::string& where) {
  OPFORGE_CHECK(j.contains(key) && j[key].is_number_integer(), "{}: field {} is missing or not an integer", where, key);
  return j[key].get<int64_t>();
}

void add_ids(const json& v, std::vector<int64_t>& out) {
  if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  if (v.is_array())
    for (auto& x : v)
      if (x.is_number_integer()) out.push_back(x.get<int64_t>());
}

double rope_theta_of(const json& j, const std::string& where) {
  // transformers 5 writes rope_parameters; older checkpoints rope_theta and rope_scaling.
  const json* p = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? &j["rope_parameters"] : &j;
  std::string type = p->value("rope_type", std::string("default"));
  bool scaled = j.contains("rope_scaling") && !j["rope_scaling"].is_null();
  OPFORGE_CHECK(type == "default" && !scaled, "{}: rope_type {} / rope_scaling is not supported (only the default "
                "rotary embedding)", where, type);
  return p->value("rope_theta", 10000.0);
}

}  // namespace

at::Device device_named(const std::string& d) {
  OPFORGE_CHECK(d == "cpu" || d == "cuda", "--device must be cpu or cuda, not {}", d);
  OPFORGE_CHECK(d == "cpu" || at::hasCUDA(), "--device cuda, but this libtorch sees no CUDA device");
  return d == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
}

LmConfig LmConfig::from_json(const json& j, const std::string& where) {
  LmConfig c;
  c.raw = j;
  c.model_type = j.value("model_type", "");
  OPFORGE_CHECK(c.model_type == "qwen2" || c.model_type == "llama",
                "{}: model_type {} is not supported (opforge's trainer runs qwen2 and llama)", where, c.model_type);
  OPFORGE_CHECK(j.value("hidden_act", "silu") == "silu", "{}: hidden_act must be silu", where);
  OPFORGE_CHECK(!j.value("use_sliding_window", false), "{}: use_sliding_window is not supported", where);
  c.vocab = need_int(j, "vocab_size", where);
  c.hidden = need_int(j, "hidden_size", where);
  c.intermediate = need_int(j, "intermediate_size", where);
  c.layers = need_int(j, "num_hidden_layers", where);
  c.heads = need_int(j, "num_attention_heads", where);
  c.kv_heads = j.contains("num_key_value_heads") ? need_int(j, "num_key_value_heads", where) : c.heads;
  c.head_dim = j.contains("head_dim") && j["head_dim"].is_number_integer() ? j["head_dim"].get<int64_t>()
                                                                            : c.hidden / c.heads;
  OPFORGE_CHECK(c.heads % c.kv_heads == 0, "{}: num_attention_heads must be a multiple of num_key_value_heads", where);
  c.rms_eps = j.value("rms_norm_eps", 1e-6);
  c.rope_theta = rope_theta_of(j, where);
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  c.qkv_bias = c.model_type == "qwen2" || j.value("attention_bias", false);
  c.o_bias = c.model_type == "llama" && j.value("attention_bias", false);
  c.mlp_bias = j.value("mlp_bias", false);
  if (j.contains("eos_token_id")) add_ids(j["eos_token_id"], c.eos_ids);
  return c;
}

CausalLM CausalLM::load(const fs::path& dir, const at::Device& device, std::optional<at::ScalarType> dtype) {
  fs::path cfg_file = dir / "config.json";
  OPFORGE_CHECK(fs::exists(cfg_file), "{} has no config.json: give a Hugging Face model folder", dir.string());
  json j = json::parse(std::ifstream(cfg_file), nullptr, false);
  OPFORGE_CHECK(j.is_object(), "{} is not a JSON object", cfg_file.string());
  CausalLM m;
  m.cfg_ = LmConfig::from_json(j, cfg_file.string());
  if (fs::exists(dir / "generation_config.json")) {
    json g = json::parse(std::ifstream(dir / "generation_config.json"), nullptr, false);
    if (g.is_object() && g.contains("eos_token_id")) add_ids(g["eos_token_id"], m.cfg_.eos_ids);
  }
  m.src_ = dir;
  m.device_ = device;
  m.dtype_ = dtype.value_or(device.is_cuda() ? at::kBFloat16 : at::kFloat);
  for (auto& [name, t] : read_checkpoint(dir)) {
    if (name.find("rotary_emb") != std::string::npos) continue;  // buffers recomputed from the config
    m.w_[name] = t.to(device, m.dtype_);
  }
  if (m.cfg_.tie_embeddings) m.w_.erase("lm_head.weight");
  m.bind_weights();
  return m;
}

// Every weight the forward reads must be there: w() names the first missing one.
void CausalLM::bind_weights() {
  embed_ = w("model.embed_tokens.weight");
  norm_ = w("model.norm.weight");
  head_ = cfg_.tie_embeddings ? embed_ : w("lm_head.weight");
  layers_.clear();
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i), a = p + "self_attn.", f = p + "mlp.";
    layers_.push_back({w(p + "input_layernorm.weight"), w(p + "post_attention_layernorm.weight"),
                       w(a + "q_proj.weight"), maybe(a + "q_proj.bias"), w(a + "k_proj.weight"), maybe(a + "k_proj.bias"),
                       w(a + "v_proj.weight"), maybe(a + "v_proj.bias"), w(a + "o_proj.weight"), maybe(a + "o_proj.bias"),
                       w(f + "gate_proj.weight"), maybe(f + "gate_proj.bias"), w(f + "up_proj.weight"),
                       maybe(f + "up_proj.bias"), w(f + "down_proj.weight"), maybe(f + "down_proj.bias")});
  }
  // The rotary inverse frequencies, once (transformers keeps them as a buffer too), by the
  // formula the forward used to evaluate every call: the same float32 values.
  const int64_t d = cfg_.head_dim;
  at::Tensor even = at::arange(0, d, 2, at::TensorOptions().device(device_).dtype(at::kLong)).to(at::kFloat);
  inv_freq_ = 1.0 / at::pow(cfg_.rope_theta, even / static_cast<double>(d));
}

const at::Tensor& CausalLM::w(const std::string& name) const {
  auto it = w_.find(name);
  OPFORGE_CHECK(it != w_.end(), "{}: the checkpoint has no tensor {}", src_.string(), name);
  return it->second;
}

at::Tensor CausalLM::maybe(const std::string& name) const {
  auto it = w_.find(name);
  return it == w_.end() ? at::Tensor() : it->second;
}

KvCache CausalLM::make_cache(int64_t batch, int64_t capacity) const {
  KvCache c;
  auto opts = at::TensorOptions().device(device_).dtype(dtype_);
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    c.k.push_back(at::zeros({batch, cfg_.kv_heads, capacity, cfg_.head_dim}, opts));
    c.v.push_back(at::zeros({batch, cfg_.kv_heads, capacity, cfg_.head_dim}, opts));
  }
  return c;
}

std::vector<at::Tensor> CausalLM::parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [_, t] : w_) out.push_back(t);
  return out;
}

void CausalLM::set_requires_grad(bool on) {
  for (auto& [_, t] : w_) t.requires_grad_(on);
}

}  // namespace opforge::trainer
