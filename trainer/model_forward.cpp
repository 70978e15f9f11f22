// The forward pass of CausalLM (model.h), written to match transformers' Llama/Qwen2 modules
// operation for operation, so that logits agree to float32 rounding (tests/test_trainer.cpp).
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include "files.h"
#include "model.h"
#include "opforge/core/error.h"
#include "safetensors.h"

namespace opforge::trainer {
namespace fs = std::filesystem;

namespace {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // As transformers: in float32, then back to the input's dtype before the weight.
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
  return weight * h.to(x.scalar_type());
}

at::Tensor rotate_half(const at::Tensor& x) {
  int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return b.defined() ? at::linear(x, w, b) : at::linear(x, w);
}

// Which keys each query may see: earlier-or-same positions that are real tokens. A query always
// sees itself, so a padding query's row is never all masked (SDPA would give NaN, and NaN values
// times a zero weight still poison the real rows). Additive (0 / -inf in `dtype`) when `dtype` is
// given: SDPA turns a boolean mask into exactly that in every layer, so converting once here
// saves each layer the conversion and gives identical results.
at::Tensor attention_mask(const at::Tensor& mask, int64_t past, int64_t T, std::optional<at::ScalarType> dtype) {
  int64_t L = mask.size(1);
  auto opts = at::TensorOptions().device(mask.device()).dtype(at::kLong);
  at::Tensor q = at::arange(past, past + T, opts).unsqueeze(1);  // [T, 1]
  at::Tensor k = at::arange(0, L, opts).unsqueeze(0);            // [1, L]
  at::Tensor allowed = (k <= q).unsqueeze(0) & mask.to(at::kBool).unsqueeze(1);  // [B, T, L]
  allowed = (allowed | (k == q).unsqueeze(0)).unsqueeze(1);                       // [B, 1, T, L]
  if (!dtype) return allowed;
  return at::zeros(allowed.sizes(), allowed.options().dtype(*dtype))
      .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
}

}  // namespace

// One decoder layer run without keeping its activations, and again in backward (the reentrant
// checkpoint: the recomputed graph's backward accumulates into the weights' .grad, which every
// stage reads after loss.backward()). The autocast state of the forward pass is restored for the
// recompute, so both passes compute in the same dtypes. The model has no dropout: no RNG state
// to replay.
struct LayerCheckpoint : torch::autograd::Function<LayerCheckpoint> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& amask, const CausalLM* model, int64_t i) {
    ctx->save_for_backward({x, cos, sin, amask});
    const at::DeviceType t = x.device().type();
    ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
    ctx->saved_data["layer"] = i;
    ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(t);
    ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(at::autocast::get_autocast_dtype(t));
    at::NoGradGuard no_grad;
    return model->layer(i, x, cos, sin, amask, nullptr);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const auto* model = reinterpret_cast<const CausalLM*>(ctx->saved_data["model"].toInt());
    at::Tensor x = saved[0].detach().requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode grad(true);
      Autocast cast(x.device(), ctx->saved_data["autocast"].toBool(),
                    static_cast<at::ScalarType>(ctx->saved_data["autocast_dtype"].toInt()));
      y = model->layer(ctx->saved_data["layer"].toInt(), x, saved[1], saved[2], saved[3], nullptr);
    }
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

Autocast::Autocast(const at::Device& device, bool on, at::ScalarType dtype) : type_(device.type()), on_(on) {
  if (!on_) return;
  was_enabled_ = at::autocast::is_autocast_enabled(type_);
  was_dtype_ = at::autocast::get_autocast_dtype(type_);
  at::autocast::set_autocast_enabled(type_, true);
  at::autocast::set_autocast_dtype(type_, dtype);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!on_) return;
  // The cast weights are cached while any autocast scope is open; the outermost one drops them.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type_, was_enabled_);
  at::autocast::set_autocast_dtype(type_, was_dtype_);
}

at::Tensor CausalLM::forward(const at::Tensor& ids, const at::Tensor& mask, KvCache* cache) const {
  return logits(hidden(ids, mask, cache));
}

// cos and sin [B or 1, 1, T, head_dim] of positions [B or 1, T], in the model's dtype (as transformers).
std::pair<at::Tensor, at::Tensor> CausalLM::rotary(const at::Tensor& pos) const {
  at::Tensor freqs = pos.to(at::kFloat).unsqueeze(-1) * inv_freq_;  // [B, T, d/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);        // [B, 1, T, d]
  return {emb.cos().to(dtype_), emb.sin().to(dtype_)};
}

at::Tensor CausalLM::hidden(const at::Tensor& ids, const at::Tensor& mask_in, KvCache* cache) const {
  const int64_t B = ids.size(0), T = ids.size(1), past = cache ? cache->length : 0;
  TORCH_CHECK(!cache || cache->k.empty() || cache->k[0].size(2) >= past + T, "forward: the KV cache is full");
  // No mask: every token real. A chunk after cached tokens still needs one (SDPA's is_causal
  // aligns the diagonal to the first key, not to the query's position).
  at::Tensor mask = mask_in;
  if (!mask.defined() && T > 1 && past > 0) mask = at::ones({B, past + T}, ids.options().device(device_).dtype(at::kLong));
  TORCH_CHECK(!mask.defined() || (mask.dim() == 2 && mask.size(0) == B && mask.size(1) == past + T),
              "forward: mask must be [batch, past + tokens] = [", B, ", ", past + T, "], got ", mask.sizes());
  at::Tensor pos, amask;
  if (mask.defined()) {
    mask = mask.to(device_);
    // Positions count real tokens only (transformers' generate does the same for left padding).
    pos = (mask.to(at::kLong).cumsum(1) - 1).clamp_min(0).narrow(1, past, T);
    // Under autocast SDPA's inputs change dtype, so its own conversion of a boolean mask is kept.
    const bool additive = !at::autocast::is_autocast_enabled(device_.type());
    amask = attention_mask(mask, past, T, additive ? std::optional<at::ScalarType>(dtype_) : std::nullopt);
  } else {
    pos = at::arange(past, past + T, at::TensorOptions().device(device_).dtype(at::kLong)).unsqueeze(0);
  }
  auto [cos, sin] = rotary(pos);
  at::Tensor x = at::embedding(embed_, ids.to(device_));
  const bool recompute = checkpointing_ && !cache && at::GradMode::is_enabled();
  for (int64_t i = 0; i < cfg_.layers; ++i)
    x = recompute ? LayerCheckpoint::apply(x, cos, sin, amask, this, i) : layer(i, x, cos, sin, amask, cache);
  if (cache) cache->length += T;
  return rms_norm(x, norm_, cfg_.rms_eps);
}

at::Tensor CausalLM::layer(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           const at::Tensor& amask, KvCache* cache) const {
  const LayerWeights& L = layers_[static_cast<std::size_t>(i)];
  at::Tensor h = x + attention(i, rms_norm(x, L.in_norm, cfg_.rms_eps), cos, sin, amask, cache);
  at::Tensor n = rms_norm(h, L.post_norm, cfg_.rms_eps);
  at::Tensor gate = linear(n, L.gate, L.gate_b), up = linear(n, L.up, L.up_b);
  return h + linear(at::silu(gate) * up, L.down, L.down_b);
}

// `amask` undefined: every key before and at the query is real (causal, no mask tensor).
at::Tensor CausalLM::attention(int64_t i, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& amask, KvCache* cache) const {
  const LayerWeights& L = layers_[static_cast<std::size_t>(i)];
  const int64_t B = x.size(0), T = x.size(1), d = cfg_.head_dim;
  auto proj = [&](const at::Tensor& w, const at::Tensor& b, int64_t heads) {
    return linear(x, w, b).view({B, T, heads, d}).transpose(1, 2);
  };
  at::Tensor q = proj(L.q, L.q_b, cfg_.heads), k = proj(L.k, L.k_b, cfg_.kv_heads), v = proj(L.v, L.v_b, cfg_.kv_heads);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  if (cache) {
    const int64_t past = cache->length;
    cache->k[i].narrow(2, past, T).copy_(k);
    cache->v[i].narrow(2, past, T).copy_(v);
    k = cache->k[i].narrow(2, 0, past + T);
    v = cache->v[i].narrow(2, 0, past + T);
  }
  // Grouped-query attention inside SDPA (enable_gqa): each kv head serves heads / kv_heads query
  // heads without copying the keys and values (repeat_interleave copied the whole cache of every
  // layer at every step); the same numbers on the CPU, bit for bit.
  const bool gqa = cfg_.heads != cfg_.kv_heads;
  at::Tensor o = amask.defined()
                     ? at::scaled_dot_product_attention(q, k, v, amask, 0.0, false, std::nullopt, gqa)
                     : at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/T > 1, std::nullopt, gqa);
  return linear(o.transpose(1, 2).reshape({B, T, cfg_.heads * d}), L.o, L.o_b);
}

void CausalLM::save(const fs::path& dir) const {
  fs::create_directories(dir);
  // The tokenizer's and generation's files travel with the weights: transformers and vLLM load
  // the folder as a whole. Only those: a checkpoint's optimizer state stays in the checkpoint.
  static const std::set<std::string> side = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                             "generation_config.json", "chat_template.jinja", "chat_template.json",
                                             "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json"};
  for (const auto& name : side) {
    fs::path from = src_ / name;
    if (fs::exists(from) && fs::absolute(src_) != fs::absolute(dir))
      copy_file_bytes(from, dir / name);
  }
  std::ofstream(dir / "config.json") << cfg_.raw.dump(2) << "\n";
  write_safetensors(dir / "model.safetensors", w_);
}

}  // namespace opforge::trainer
