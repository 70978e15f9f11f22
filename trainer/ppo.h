// The PPO math of the bundled RL trainer: token-level GAE, the clipped (and dual-clipped) policy
// loss, the clipped value loss, KL penalties, entropy and explained variance, as verl / OpenRLHF
// compute them for language models. A sequence's scalar reward sits on its last valid token.
//
// Contract:
// - Per-token tensors are [B, T] floating point (float/double/half/bf16); every tensor passed
//   together has the same shape. Masks have that shape too, any dtype: nonzero = valid response
//   token, zero = padding. Padding values never reach a result (they are selected away, not
//   multiplied by 0, so NaN/inf in padding cannot leak).
// - Losses are "token-mean" aggregated: the mean over all valid tokens of the batch, so long
//   sequences weigh by their token count. An all-padding mask gives a loss of 0 (not NaN).
// - Inputs are never modified and results are fresh tensors (no views, no aliasing). Gradient
//   flows only through `logprobs` (policy_loss) and `values` (value_loss); old log-probs, old
//   values, advantages and returns are detached inside, because PPO treats them as constants.
// - Statistics meant for logging (clip fractions, approx_kl, explained variance) are returned as
//   doubles; reading them synchronises with the device once per statistic.
// - Errors: bad shapes, bad dtypes or out-of-range hyperparameters throw c10::Error (TORCH_CHECK)
//   with a message naming the function and the offending argument.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace opforge::trainer {

struct Advantages {
  at::Tensor advantages, returns;  // [B, T], zero where mask == 0
};

// Generalised advantage estimation backwards over time, without gradient:
//   delta_t = r_t + gamma * m_{t+1} * V_{t+1} - V_t        (V after the last valid token is 0)
//   A_t     = delta_t + gamma * lam * m_{t+1} * A_{t+1}
//   returns = A + V.
// rewards, values, mask: [B, T]. Padding must only follow valid tokens (a gap also just cuts the
// bootstrap chain, which is the right thing for a finished sequence).
Advantages gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask, double gamma,
               double lam);

// Mean of x over the valid tokens of the whole batch (a 0-dim tensor, differentiable in x).
// 0 when no token is valid, so an empty micro-batch adds nothing instead of poisoning with NaN.
at::Tensor masked_mean(const at::Tensor& x, const at::Tensor& mask);

// (x - mean) / sqrt(var + 1e-8) with mean and unbiased (Bessel-corrected, as verl's masked_var)
// variance over valid tokens; zero where mask == 0. With shift_mean = false the mean is added
// back (only the scale is normalised). Needs at least 2 valid tokens for the unbiased variance.
at::Tensor masked_whiten(const at::Tensor& x, const at::Tensor& mask, bool shift_mean = true);

// Critic-free advantages of sequence rewards, one a sample: samples with the same group id (one
// prompt's answers of one step) are compared with each other, so a group whose answers all earned
// the same reward gives every one of them 0 (nothing to learn from it), and a group of one too.
//   "rloo": A_i = r_i - mean of the other samples' rewards in the group (REINFORCE leave-one-out,
//           Ahmadian et al. 2024; unbiased, in reward units);
//   "grpo": A_i = (r_i - group mean) / (group std + 1e-6), std Bessel-corrected as torch.std
//           (Shao et al. 2024; verl's grpo estimator).
// rewards and groups have the same length; an unknown kind throws, naming it.
std::vector<double> group_advantages(const std::vector<double>& rewards, const std::vector<std::string>& groups,
                                     const std::string& kind);

struct PolicyLoss {
  at::Tensor loss;                  // 0-dim, differentiable in logprobs
  double clip_fraction = 0;         // valid tokens where the ratio clip took effect
  double approx_kl = 0;             // token-mean of old_logprobs - logprobs (k1)
  double dual_clip_fraction = 0;    // valid tokens with A < 0 where the dual clip took effect
};

// PPO clipped surrogate with dual clip (Ye et al. 2020; verl's compute_policy_loss):
//   ratio = exp(logprobs - old_logprobs)   (log-ratio clamped to [-20, 20] against overflow)
//   clipped = max(-A * ratio, -A * clamp(ratio, 1 - clip_low, 1 + clip_high))
//   per-token = A < 0 ? min(clipped, -A * dual_clip_c) : clipped;   loss = masked_mean.
// Requires clip_low in [0, 1), clip_high >= 0, dual_clip_c > 1.
PolicyLoss policy_loss(const at::Tensor& logprobs, const at::Tensor& old_logprobs, const at::Tensor& advantages,
                       const at::Tensor& mask, double clip_low = 0.2, double clip_high = 0.2,
                       double dual_clip_c = 3.0);

struct ValueLoss {
  at::Tensor loss;             // 0-dim, differentiable in values
  double clip_fraction = 0;    // valid tokens where the clipped error was the larger one
};

// Clipped value loss: v_clipped = old + clamp(values - old, -clip_range, clip_range);
// loss = 0.5 * masked_mean(max((values - R)^2, (v_clipped - R)^2)). clip_range <= 0 turns
// clipping off (plain 0.5 * MSE, clip_fraction 0).
ValueLoss value_loss(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                     const at::Tensor& mask, double clip_range = 0.2);

// Per-token KL estimate of the policy from the reference policy, same shape as the inputs:
//   "k1": lp - ref;  "k2": 0.5 * (lp - ref)^2;
//   "k3" / "low_var_kl": exp(ref - lp) - (ref - lp) - 1, clamped to [-10, 10] (Schulman's
//   low-variance unbiased estimator; the clamp bounds the rare huge ratio).
// Differentiable in both inputs; the caller detaches what it wants constant.
at::Tensor kl_penalty(const at::Tensor& logprobs, const at::Tensor& ref_logprobs, const std::string& kind);

// Entropy of softmax(logits) over the last dim: [..., V] -> [...]. Computed as
// logsumexp(l) - sum(softmax(l) * l) on max-shifted logits, stable for large logits and for -inf
// (masked) entries; gradients stay finite.
// Half/bf16 logits are computed and returned in float32, so the entropy is not rounded away.
at::Tensor entropy_from_logits(const at::Tensor& logits);

// 1 - Var[returns - values] / Var[returns] over valid tokens, as a double (no gradient).
// Choice: returns 0 when there are no valid tokens or Var[returns] is 0 up to rounding (below
// 1e-10 of the mean square) — the value head then
// explains nothing measurable, and a logged 0 is more useful than NaN or -inf.
double explained_variance(const at::Tensor& values, const at::Tensor& returns, const at::Tensor& mask);

}  // namespace opforge::trainer
