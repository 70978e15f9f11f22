// PPO math of the bundled RL trainer (see ppo.h for the contract).
#include "ppo.h"

#include <ATen/core/grad_mode.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>

namespace opforge::trainer {

namespace {

// Errors name the function and the argument, so a shape bug in the trainer points at its source.
void check_float(const char* fn, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), fn, ": `", name, "` is undefined");
  TORCH_CHECK(t.is_floating_point(), fn, ": `", name, "` must be floating point, got ", t.scalar_type());
}

void check_same_shape(const char* fn, const char* name, const at::Tensor& t, const char* ref_name,
                      const at::Tensor& ref) {
  TORCH_CHECK(t.defined(), fn, ": `", name, "` is undefined");
  TORCH_CHECK(t.sizes() == ref.sizes(), fn, ": `", name, "` has shape ", t.sizes(), " but `", ref_name,
              "` has shape ", ref.sizes());
}

// Mask as booleans: nonzero = valid, whatever the mask's dtype.
at::Tensor valid_of(const at::Tensor& mask) { return mask.ne(0); }

// Token-mean over valid tokens, with padding selected away (not multiplied) so NaN cannot leak.
at::Tensor mean_over(const at::Tensor& x, const at::Tensor& valid) {
  auto picked = at::where(valid, x, at::zeros({}, x.options()));
  auto count = valid.sum().clamp_min(1).to(x.scalar_type());
  return picked.sum() / count;
}

double mean_stat(const at::Tensor& x, const at::Tensor& valid) {
  return mean_over(x.detach().to(at::kDouble), valid).item<double>();
}

}  // namespace

Advantages gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask, double gamma,
               double lam) {
  check_float("gae", "rewards", rewards);
  check_float("gae", "values", values);
  TORCH_CHECK(rewards.dim() == 2, "gae: `rewards` must be [B, T], got shape ", rewards.sizes());
  check_same_shape("gae", "values", values, "rewards", rewards);
  check_same_shape("gae", "mask", mask, "rewards", rewards);
  at::NoGradGuard no_grad;
  const auto valid = valid_of(mask);
  const auto zero = at::zeros({}, values.options());
  // Padding values and rewards are selected away up front, so whatever sits there is ignored.
  const auto v = at::where(valid, values.detach(), zero);
  const auto r = at::where(valid, rewards.detach().to(values.scalar_type()), zero);
  const auto m = valid.to(values.scalar_type());
  auto adv = at::zeros_like(v);
  const int64_t T = v.size(1);
  auto next_value = at::zeros({v.size(0)}, v.options());
  auto next_adv = at::zeros_like(next_value);
  auto next_mask = at::zeros_like(next_value);
  for (int64_t t = T - 1; t >= 0; --t) {
    const auto v_t = v.select(1, t);
    const auto delta = r.select(1, t) + gamma * next_mask * next_value - v_t;
    const auto a_t = delta + (gamma * lam) * next_mask * next_adv;
    adv.select(1, t).copy_(a_t);
    next_value = v_t;
    next_adv = a_t;
    next_mask = m.select(1, t);
  }
  adv = at::where(valid, adv, zero);
  return {adv, at::where(valid, adv + v, zero)};
}

at::Tensor masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  check_float("masked_mean", "x", x);
  check_same_shape("masked_mean", "mask", mask, "x", x);
  return mean_over(x, valid_of(mask));
}

at::Tensor masked_whiten(const at::Tensor& x, const at::Tensor& mask, bool shift_mean) {
  check_float("masked_whiten", "x", x);
  check_same_shape("masked_whiten", "mask", mask, "x", x);
  const auto valid = valid_of(mask);
  const int64_t n = valid.sum().item<int64_t>();
  TORCH_CHECK(n >= 2, "masked_whiten: `mask` has ", n, " valid tokens; the unbiased variance needs at least 2");
  const auto mean = mean_over(x, valid);
  const auto centered = x - mean;
  // Bessel correction n / (n - 1), as verl's masked_var(unbiased=True).
  const auto var = mean_over(centered * centered, valid) * (static_cast<double>(n) / static_cast<double>(n - 1));
  auto whitened = centered * at::rsqrt(var + 1e-8);
  if (!shift_mean) whitened = whitened + mean;
  return at::where(valid, whitened, at::zeros({}, whitened.options()));
}

std::vector<double> group_advantages(const std::vector<double>& rewards, const std::vector<std::string>& groups,
                                     const std::string& kind) {
  TORCH_CHECK(kind == "rloo" || kind == "grpo", "group_advantages: unknown kind \"", kind, "\" (rloo or grpo)");
  TORCH_CHECK(rewards.size() == groups.size(), "group_advantages: ", rewards.size(), " rewards for ", groups.size(),
              " group ids");
  std::map<std::string, std::vector<std::size_t>> members;
  for (std::size_t i = 0; i < rewards.size(); ++i) members[groups[i]].push_back(i);
  std::vector<double> out(rewards.size(), 0.0);
  for (const auto& [group, idx] : members) {
    const double n = static_cast<double>(idx.size());
    if (idx.size() < 2) continue;
    double sum = 0, sq = 0;
    for (auto i : idx) sum += rewards[i];
    const double mean = sum / n;
    for (auto i : idx) sq += (rewards[i] - mean) * (rewards[i] - mean);  // two passes: no cancellation
    const double std = std::sqrt(sq / (n - 1));
    for (auto i : idx)
      out[i] = kind == "rloo" ? rewards[i] - (sum - rewards[i]) / (n - 1) : (rewards[i] - mean) / (std + 1e-6);
  }
  return out;
}

PolicyLoss policy_loss(const at::Tensor& logprobs, const at::Tensor& old_logprobs, const at::Tensor& advantages,
                       const at::Tensor& mask, double clip_low, double clip_high, double dual_clip_c) {
  const char* fn = "policy_loss";
  check_float(fn, "logprobs", logprobs);
  check_float(fn, "old_logprobs", old_logprobs);
  check_float(fn, "advantages", advantages);
  check_same_shape(fn, "old_logprobs", old_logprobs, "logprobs", logprobs);
  check_same_shape(fn, "advantages", advantages, "logprobs", logprobs);
  check_same_shape(fn, "mask", mask, "logprobs", logprobs);
  TORCH_CHECK(clip_low >= 0 && clip_low < 1, fn, ": `clip_low` must be in [0, 1), got ", clip_low);
  TORCH_CHECK(clip_high >= 0, fn, ": `clip_high` must be >= 0, got ", clip_high);
  TORCH_CHECK(dual_clip_c > 1, fn, ": `dual_clip_c` must be > 1, got ", dual_clip_c);
  const auto valid = valid_of(mask);
  const auto old = old_logprobs.detach();
  const auto adv = advantages.detach();
  // Clamped like verl: a log-ratio beyond +-20 is already fully clipped, exp() would only overflow.
  const auto log_ratio = (logprobs - old).clamp(-20.0, 20.0);
  const auto ratio = at::exp(log_ratio);
  const auto pg1 = -adv * ratio;
  const auto pg2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high);
  const auto clipped = at::maximum(pg1, pg2);
  const auto pg3 = -adv * dual_clip_c;  // the dual clip's lower bound on the objective
  const auto negative = adv < 0;
  const auto per_token = at::where(negative, at::minimum(clipped, pg3), clipped);

  PolicyLoss out;
  out.loss = mean_over(per_token, valid);
  out.clip_fraction = mean_stat(pg2.gt(pg1).to(at::kDouble), valid);
  out.dual_clip_fraction = mean_stat((negative & clipped.gt(pg3)).to(at::kDouble), valid);
  out.approx_kl = mean_stat(old - logprobs, valid);
  return out;
}

ValueLoss value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                     const at::Tensor& mask, double clip_range) {
  const char* fn = "value_loss";
  check_float(fn, "values", values);
  check_float(fn, "old_values", old_values);
  check_float(fn, "returns", returns);
  check_same_shape(fn, "old_values", old_values, "values", values);
  check_same_shape(fn, "returns", returns, "values", values);
  check_same_shape(fn, "mask", mask, "values", values);
  const auto valid = valid_of(mask);
  const auto ret = returns.detach();
  const auto err = values - ret;
  const auto vf1 = err * err;
  ValueLoss out;
  if (clip_range <= 0) {
    out.loss = 0.5 * mean_over(vf1, valid);
    return out;
  }
  const auto old = old_values.detach();
  const auto v_clipped = old + (values - old).clamp(-clip_range, clip_range);
  const auto err_clipped = v_clipped - ret;
  const auto vf2 = err_clipped * err_clipped;
  out.loss = 0.5 * mean_over(at::maximum(vf1, vf2), valid);
  out.clip_fraction = mean_stat(vf2.gt(vf1).to(at::kDouble), valid);
  return out;
}

at::Tensor kl_penalty(const at::Tensor& logprobs, const at::Tensor& ref_logprobs, const std::string& kind) {
  check_float("kl_penalty", "logprobs", logprobs);
  check_float("kl_penalty", "ref_logprobs", ref_logprobs);
  check_same_shape("kl_penalty", "ref_logprobs", ref_logprobs, "logprobs", logprobs);
  const auto diff = logprobs - ref_logprobs;
  if (kind == "k1") return diff;
  if (kind == "k2") return 0.5 * diff * diff;
  if (kind == "k3" || kind == "low_var_kl") {
    const auto d = ref_logprobs - logprobs;
    return (at::exp(d) - d - 1.0).clamp(-10.0, 10.0);
  }
  TORCH_CHECK(false, "kl_penalty: unknown `kind` \"", kind, "\"; allowed: k1, k2, k3, low_var_kl");
}

at::Tensor entropy_from_logits(const at::Tensor& logits) {
  check_float("entropy_from_logits", "logits", logits);
  TORCH_CHECK(logits.dim() >= 1 && logits.size(-1) >= 1,
              "entropy_from_logits: `logits` must be [..., V] with V >= 1, got shape ", logits.sizes());
  const auto wide = logits.to(at::promote_types(logits.scalar_type(), at::kFloat));
  // Entropy is shift-invariant; subtracting the row max keeps lse and sum(p * l) small, so their
  // difference does not cancel away the digits (1000.69 - 1000 in float32 keeps ~4 of them).
  const auto l = wide - std::get<0>(wide.detach().max(-1, /*keepdim=*/true));
  const auto p = at::softmax(l, -1);
  // A -inf logit has p = 0; replacing it by 0 keeps p * l (and its gradient) at 0 instead of NaN.
  const auto finite_l = at::where(at::isneginf(l), at::zeros({}, l.options()), l);
  return at::logsumexp(l, {-1}) - (p * finite_l).sum(-1);
}

double explained_variance(const at::Tensor& values, const at::Tensor& returns, const at::Tensor& mask) {
  check_float("explained_variance", "values", values);
  check_float("explained_variance", "returns", returns);
  check_same_shape("explained_variance", "returns", returns, "values", values);
  check_same_shape("explained_variance", "mask", mask, "values", values);
  at::NoGradGuard no_grad;
  const auto valid = valid_of(mask);
  if (valid.sum().item<int64_t>() == 0) return 0.0;
  const auto y = returns.detach().to(at::kDouble);
  const auto residual = y - values.detach().to(at::kDouble);
  // Population variances: the n / (n - 1) factor would cancel in the ratio anyway.
  auto var = [&](const at::Tensor& x) {
    const auto c = x - mean_over(x, valid);
    return mean_over(c * c, valid).item<double>();
  };
  const double var_y = var(y);
  // Returns that are one value up to float32 rounding (every answer -1, say) explain nothing: the
  // ratio would be rounding noise over rounding noise (-1.7e6 was logged).
  const double scale = mean_over(y * y, valid).item<double>();
  if (!(var_y > 1e-10 * std::max(scale, 1.0))) return 0.0;
  return 1.0 - var(residual) / var_y;
}

}  // namespace opforge::trainer
