// The PPO math of trainer/ppo.h checked against values worked out by hand (the arithmetic is in
// the comments), on tensors of a few elements, never against a second implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "ppo.h"

using namespace opforge::trainer;

namespace {

constexpr double kTol = 1e-5;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A float tensor of the given shape from row-major values.
at::Tensor F(std::initializer_list<double> v, at::IntArrayRef shape) {
  return at::tensor(std::vector<double>(v), at::kDouble).to(at::kFloat).view(shape).clone();
}

void expect_values(const at::Tensor& t, std::vector<double> want, double tol = kTol) {
  auto got = t.detach().to(at::kDouble).contiguous().view({-1});
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[static_cast<int64_t>(i)].item<double>(), want[i], tol) << "element " << i;
}

double scalar(const at::Tensor& t) { return t.detach().to(at::kDouble).item<double>(); }

// The message of the c10::Error `f` throws, or "" if it throws nothing.
template <class Fn>
std::string error_of(Fn f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Ppo, GaeFullSequence) {
  // gamma = 0.9, lambda = 0.8 (gamma * lambda = 0.72); reward 1 on the last token.
  // t=2: delta = 1 + 0 - 0.3 = 0.7;                A2 = 0.7
  // t=1: delta = 0 + 0.9*0.3 - 0.4 = -0.13;        A1 = -0.13 + 0.72*0.7   = 0.374
  // t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14;        A0 = -0.14 + 0.72*0.374 = 0.12928
  // returns = A + V = 0.62928, 0.774, 1.0
  auto r = gae(F({0, 0, 1}, {1, 3}), F({0.5, 0.4, 0.3}, {1, 3}), F({1, 1, 1}, {1, 3}), 0.9, 0.8);
  expect_values(r.advantages, {0.12928, 0.374, 0.7});
  expect_values(r.returns, {0.62928, 0.774, 1.0});
}

TEST(Ppo, GaeMaskedPaddingIgnored) {
  // Row 1 is padded at t=2 with junk (reward 9, value 7, then NaN): it must not bootstrap.
  // Row 1: t=1: delta = 2 + 0.9*0*V2 - 0.5 = 1.5;   A1 = 1.5
  //        t=0: delta = 0 + 0.9*0.5 - 1.0 = -0.55; A0 = -0.55 + 0.72*1.5 = 0.53
  //        returns = 1.53, 2.0; padding -> 0, 0.
  // Row 0 is the full sequence of GaeFullSequence.
  auto rewards = F({0, 0, 1, 0, 2, 9}, {2, 3});
  auto values = F({0.5, 0.4, 0.3, 1.0, 0.5, 7}, {2, 3});
  auto mask = F({1, 1, 1, 1, 1, 0}, {2, 3});
  auto r = gae(rewards, values, mask, 0.9, 0.8);
  expect_values(r.advantages, {0.12928, 0.374, 0.7, 0.53, 1.5, 0});
  expect_values(r.returns, {0.62928, 0.774, 1.0, 1.53, 2.0, 0});
  values.index_put_({1, 2}, kNaN);  // a NaN in padding changes nothing
  auto r2 = gae(rewards, values, mask, 0.9, 0.8);
  expect_values(r2.advantages, {0.12928, 0.374, 0.7, 0.53, 1.5, 0});
}

TEST(Ppo, GaeHasNoGradient) {
  auto values = F({0.5, 0.4}, {1, 2}).requires_grad_();
  auto r = gae(F({0, 1}, {1, 2}), values, F({1, 1}, {1, 2}), 1.0, 1.0);
  EXPECT_FALSE(r.advantages.requires_grad());
  EXPECT_FALSE(r.returns.requires_grad());
  // gamma = lambda = 1: A_t = (sum of rewards from t) - V_t = 1 - 0.5, 1 - 0.4.
  expect_values(r.advantages, {0.5, 0.6});
}

TEST(Ppo, GaeRejectsBadShapes) {
  auto msg = error_of([] { gae(F({0, 1}, {1, 2}), F({0, 1, 2}, {1, 3}), F({1, 1}, {1, 2}), 0.9, 0.8); });
  EXPECT_NE(msg.find("values"), std::string::npos) << msg;
  msg = error_of([] { gae(F({0, 1}, {2}), F({0, 1}, {2}), F({1, 1}, {2}), 0.9, 0.8); });
  EXPECT_NE(msg.find("rewards"), std::string::npos) << msg;
}

TEST(Ppo, MaskedMeanExcludesPadding) {
  // Valid: 1, 2, 4 -> (1 + 2 + 4) / 3 = 7/3; the 3, 100 and NaN in padding are ignored.
  auto x = F({1, 2, 3, 4, 100, kNaN}, {2, 3});
  auto mask = F({1, 1, 0, 1, 0, 0}, {2, 3});
  EXPECT_NEAR(scalar(masked_mean(x, mask)), 7.0 / 3.0, kTol);
  EXPECT_NEAR(scalar(masked_mean(x, mask.to(at::kBool))), 7.0 / 3.0, kTol);  // bool masks too
}

TEST(Ppo, MaskedMeanEmptyMaskIsZero) {
  EXPECT_EQ(scalar(masked_mean(F({1, 2}, {1, 2}), F({0, 0}, {1, 2}))), 0.0);
  EXPECT_THROW(masked_mean(F({1, 2}, {1, 2}), F({1, 1, 1}, {1, 3})), c10::Error);
}

TEST(Ppo, MaskedWhitenUnbiased) {
  // Valid 1, 3, 5: mean 3; squared deviations 4 + 0 + 4 = 8; unbiased var = 8 / (3 - 1) = 4;
  // std = 2 -> (-1, 0, 1); padding (100) -> 0.
  auto x = F({1, 3, 5, 100}, {1, 4});
  auto mask = F({1, 1, 1, 0}, {1, 4});
  expect_values(masked_whiten(x, mask), {-1, 0, 1, 0});
  // Without the shift the mean 3 is added back: (2, 3, 4).
  expect_values(masked_whiten(x, mask, /*shift_mean=*/false), {2, 3, 4, 0});
  // One valid token has no unbiased variance.
  EXPECT_THROW(masked_whiten(x, F({1, 0, 0, 0}, {1, 4})), c10::Error);
}

TEST(Ppo, PolicyLossHandValues) {
  // old = 0, so ratio = exp(logprobs); clip 0.2 -> [0.8, 1.2]; c = 3.
  //  tok  r    A    pg1=-A*r  pg2=-A*clamp(r)  max   dual (A<0: min(max, 3|A|))  ratio-clipped?
  //  0    1.5  +1   -1.5      -1.2             -1.2  -                          yes
  //  1    0.5  +2   -1.0      -1.6             -1.0  -                          no
  //  2    1.1  -1    1.1       1.1              1.1  min(1.1, 3) = 1.1          no (equal)
  //  3    4.0  -1    4.0       1.2              4.0  min(4.0, 3) = 3.0 (dual)   no
  //  4    0.5  -1    0.5       0.8              0.8  min(0.8, 3) = 0.8          yes
  //  5    pad (r = e^9, A = 5): ignored
  // loss = (-1.2 - 1.0 + 1.1 + 3.0 + 0.8) / 5 = 2.7 / 5 = 0.54
  // clip_fraction = 2/5, dual_clip_fraction = 1/5
  // approx_kl = mean(old - lp) = -(ln 1.5 + ln 0.5 + ln 1.1 + ln 4 + ln 0.5) / 5 = -ln(1.65) / 5
  //           = -0.500775 / 5 = -0.100155
  auto lp = F({std::log(1.5), std::log(0.5), std::log(1.1), std::log(4.0), std::log(0.5), 9}, {2, 3});
  auto old = at::zeros({2, 3});
  auto adv = F({1, 2, -1, -1, -1, 5}, {2, 3});
  auto mask = F({1, 1, 1, 1, 1, 0}, {2, 3});
  auto out = policy_loss(lp, old, adv, mask);
  EXPECT_NEAR(scalar(out.loss), 0.54, kTol);
  EXPECT_NEAR(out.clip_fraction, 0.4, kTol);
  EXPECT_NEAR(out.dual_clip_fraction, 0.2, kTol);
  EXPECT_NEAR(out.approx_kl, -0.100155, kTol);
}

TEST(Ppo, PolicyLossDualClipBranch) {
  // c = 3, clip 0.2.
  //  tok  r  A    pg1   pg2           max    A<0 -> min(max, -A*c)        dual?  clipped?
  //  0    5  -2   10    2*1.2 = 2.4   10     min(10, 6) = 6               yes    no (2.4 < 10)
  //  1    2  -1    2    1.2            2     min(2, 3)  = 2 (below c)     no     no
  //  2    5  +1   -5    -1.2          -1.2   A > 0: no dual clip          no     yes
  // loss = (6 + 2 - 1.2) / 3 = 6.8 / 3 = 2.266667; dual 1/3; clip 1/3
  auto lp = F({std::log(5.0), std::log(2.0), std::log(5.0)}, {1, 3});
  auto out = policy_loss(lp, at::zeros({1, 3}), F({-2, -1, 1}, {1, 3}), F({1, 1, 1}, {1, 3}));
  EXPECT_NEAR(scalar(out.loss), 6.8 / 3.0, kTol);
  EXPECT_NEAR(out.dual_clip_fraction, 1.0 / 3.0, kTol);
  EXPECT_NEAR(out.clip_fraction, 1.0 / 3.0, kTol);
  // The dual clip's c must exceed 1, and the message says which argument.
  auto msg = error_of([&] { policy_loss(lp, at::zeros({1, 3}), F({-2, -1, 1}, {1, 3}), F({1, 1, 1}, {1, 3}), 0.2, 0.2, 1.0); });
  EXPECT_NE(msg.find("dual_clip_c"), std::string::npos) << msg;
}

TEST(Ppo, PolicyLossAsymmetricClip) {
  // clip_low 0.2, clip_high 0.28 (DAPO's clip-higher): r = 1.5, A = +1 -> max(-1.5, -1.28) = -1.28;
  // r = 0.5, A = -1 -> max(0.5, 0.8) = 0.8. loss = (-1.28 + 0.8) / 2 = -0.24; both clipped.
  auto lp = F({std::log(1.5), std::log(0.5)}, {1, 2});
  auto out = policy_loss(lp, at::zeros({1, 2}), F({1, -1}, {1, 2}), F({1, 1}, {1, 2}), 0.2, 0.28);
  EXPECT_NEAR(scalar(out.loss), -0.24, kTol);
  EXPECT_NEAR(out.clip_fraction, 1.0, kTol);
  EXPECT_EQ(out.dual_clip_fraction, 0.0);
}

TEST(Ppo, PolicyLossBackpropagatesFiniteGradients) {
  // Same tokens as PolicyLossHandValues, N = 5 valid. d(-A*r)/d lp = -A*r where unclipped, else 0:
  //  tok0 ratio-clipped -> 0; tok1: -2*0.5/5 = -0.2; tok2: 1*1.1/5 = 0.22;
  //  tok3 dual-clipped (constant 3) -> 0; tok4 clipped -> 0; padding -> 0 (even with r = e^9).
  auto lp = F({std::log(1.5), std::log(0.5), std::log(1.1), std::log(4.0), std::log(0.5), 9}, {2, 3});
  lp.requires_grad_();
  auto old = at::zeros({2, 3}).requires_grad_();  // detached inside: gets no gradient
  auto out = policy_loss(lp, old, F({1, 2, -1, -1, -1, 5}, {2, 3}), F({1, 1, 1, 1, 1, 0}, {2, 3}));
  out.loss.backward();
  ASSERT_TRUE(lp.grad().defined());
  EXPECT_TRUE(at::isfinite(lp.grad()).all().item<bool>());
  expect_values(lp.grad(), {0, -0.2, 0.22, 0, 0, 0});
  EXPECT_FALSE(old.grad().defined());
}

TEST(Ppo, PolicyLossRejectsBadShapes) {
  auto msg = error_of([] { policy_loss(at::zeros({2, 3}), at::zeros({2, 4}), at::zeros({2, 3}), at::ones({2, 3})); });
  EXPECT_NE(msg.find("old_logprobs"), std::string::npos) << msg;
  msg = error_of([] { policy_loss(at::zeros({2, 3}), at::zeros({2, 3}), at::zeros({2, 3}), at::ones({3, 2})); });
  EXPECT_NE(msg.find("mask"), std::string::npos) << msg;
}

TEST(Ppo, ValueLossClipped) {
  // clip 0.2.
  //  tok  v     old  R     v-old -> clamp   v_clip  vf1=(v-R)^2  vf2=(v_clip-R)^2  max     clipped?
  //  0    1.0   0.5  1.25  0.5  -> 0.2     0.7     0.0625       0.3025           0.3025  yes
  //  1    0.75  0.5  0.0   0.25 -> 0.2     0.7     0.5625       0.49             0.5625  no
  //  2    0.0   0.5  1.0  -0.5  -> -0.2    0.3     1.0          0.49             1.0     no
  //  3    pad (v = 100)
  // loss = 0.5 * (0.3025 + 0.5625 + 1.0) / 3 = 0.5 * 1.865 / 3 = 0.3108333; clip_fraction = 1/3
  auto v = F({1.0, 0.75, 0.0, 100}, {1, 4});
  auto old = F({0.5, 0.5, 0.5, 0}, {1, 4});
  auto ret = F({1.25, 0.0, 1.0, 0}, {1, 4});
  auto mask = F({1, 1, 1, 0}, {1, 4});
  auto out = value_loss(v, old, ret, mask, 0.2);
  EXPECT_NEAR(scalar(out.loss), 0.5 * 1.865 / 3.0, kTol);
  EXPECT_NEAR(out.clip_fraction, 1.0 / 3.0, kTol);
}

TEST(Ppo, ValueLossUnclippedWhenRangeNotPositive) {
  // Plain 0.5 * MSE over valid tokens: 0.5 * (0.0625 + 0.5625 + 1.0) / 3 = 0.5 * 1.625 / 3 = 0.2708333.
  auto v = F({1.0, 0.75, 0.0, 100}, {1, 4});
  auto old = F({0.5, 0.5, 0.5, 0}, {1, 4});
  auto ret = F({1.25, 0.0, 1.0, 0}, {1, 4});
  auto out = value_loss(v, old, ret, F({1, 1, 1, 0}, {1, 4}), 0.0);
  EXPECT_NEAR(scalar(out.loss), 0.5 * 1.625 / 3.0, kTol);
  EXPECT_EQ(out.clip_fraction, 0.0);
}

TEST(Ppo, ValueLossBackpropagatesFiniteGradients) {
  // Tokens of ValueLossClipped, N = 3, loss = 0.5/3 * sum max(vf1, vf2):
  //  tok0: vf2 wins, v_clip saturated -> 0
  //  tok1: vf1 wins, d vf1/dv = 2*(0.75 - 0) = 1.5 -> 0.5/3 * 1.5 = 0.25
  //  tok2: vf1 wins, d vf1/dv = 2*(0 - 1) = -2     -> 0.5/3 * -2  = -0.333333
  //  pad -> 0
  auto v = F({1.0, 0.75, 0.0, 100}, {1, 4}).requires_grad_();
  auto out = value_loss(v, F({0.5, 0.5, 0.5, 0}, {1, 4}), F({1.25, 0.0, 1.0, 0}, {1, 4}), F({1, 1, 1, 0}, {1, 4}));
  out.loss.backward();
  EXPECT_TRUE(at::isfinite(v.grad()).all().item<bool>());
  expect_values(v.grad(), {0, 0.25, -1.0 / 3.0, 0});
}

TEST(Ppo, KlPenaltyKinds) {
  // d = lp - ref = 0.5, -1, 0.
  // k1 = d                       = 0.5, -1, 0
  // k2 = 0.5 d^2                 = 0.125, 0.5, 0
  // k3 = e^{-d} + d - 1: d=0.5 -> 0.6065307 - 0.5 = 0.1065307; d=-1 -> 2.7182818 - 2 = 0.7182818; 0
  auto lp = F({0.5, -1.5, -2}, {1, 3});
  auto ref = F({0.0, -0.5, -2}, {1, 3});
  expect_values(kl_penalty(lp, ref, "k1"), {0.5, -1, 0});
  expect_values(kl_penalty(lp, ref, "k2"), {0.125, 0.5, 0});
  expect_values(kl_penalty(lp, ref, "k3"), {0.1065307, 0.7182818, 0});
  expect_values(kl_penalty(lp, ref, "low_var_kl"), {0.1065307, 0.7182818, 0});
}

TEST(Ppo, KlPenaltyLowVarIsClamped) {
  // d = lp - ref = -20: e^{20} - 21 is about 4.85e8 -> clamped to 10.
  expect_values(kl_penalty(F({-20}, {1, 1}), F({0}, {1, 1}), "k3"), {10});
}

TEST(Ppo, KlPenaltyUnknownKindNamesAllowed) {
  auto msg = error_of([] { kl_penalty(at::zeros({1, 2}), at::zeros({1, 2}), "k4"); });
  EXPECT_NE(msg.find("k4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("low_var_kl"), std::string::npos) << msg;
}

TEST(Ppo, EntropyFromLogits) {
  // [0, 0]: uniform over 2 -> ln 2 = 0.6931472.
  // [0, ln 3]: p = (1/4, 3/4) -> -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.25*1.3862944 + 0.75*0.2876821
  //          = 0.3465736 + 0.2157616 = 0.5623351.
  auto h = entropy_from_logits(F({0, 0, 0, std::log(3.0)}, {2, 2}));
  EXPECT_EQ(h.sizes(), (at::IntArrayRef{2}));
  expect_values(h, {0.6931472, 0.5623351});
}

TEST(Ppo, EntropyStableForLargeAndMaskedLogits) {
  // [1000, 1000] would overflow a naive exp: still ln 2. [0, -inf]: all mass on one token -> 0.
  auto logits = F({1000, 1000, 0, -kInf}, {2, 2}).requires_grad_();
  auto h = entropy_from_logits(logits);
  expect_values(h, {0.6931472, 0});
  h.sum().backward();
  EXPECT_TRUE(at::isfinite(logits.grad()).all().item<bool>());
  // Half logits come back in float32.
  EXPECT_EQ(entropy_from_logits(at::zeros({4}, at::kHalf)).scalar_type(), at::kFloat);
}

TEST(Ppo, ExplainedVariance) {
  // returns 1, 2, 3 (padding 50 ignored): Var = ((1)^2 + 0 + (1)^2) / 3 = 2/3.
  // values = returns -> residual 0 -> EV = 1.  values = 0 -> residual = returns -> EV = 0.
  // values 1, 2, 2 -> residual 0, 0, 1: mean 1/3, Var = (1/9 + 1/9 + 4/9) / 3 = 2/9
  //                -> EV = 1 - (2/9) / (2/3) = 1 - 1/3 = 2/3.
  auto ret = F({1, 2, 3, 50}, {1, 4});
  auto mask = F({1, 1, 1, 0}, {1, 4});
  EXPECT_NEAR(explained_variance(F({1, 2, 3, -7}, {1, 4}), ret, mask), 1.0, kTol);
  EXPECT_NEAR(explained_variance(F({0, 0, 0, -7}, {1, 4}), ret, mask), 0.0, kTol);
  EXPECT_NEAR(explained_variance(F({1, 2, 2, -7}, {1, 4}), ret, mask), 2.0 / 3.0, kTol);
}

TEST(Ppo, ExplainedVarianceDegenerateIsZero) {
  // Constant returns (Var = 0) and an all-padding mask both give 0 by contract, not NaN.
  EXPECT_EQ(explained_variance(F({0, 1}, {1, 2}), F({2, 2}, {1, 2}), F({1, 1}, {1, 2})), 0.0);
  EXPECT_EQ(explained_variance(F({0, 1}, {1, 2}), F({1, 2}, {1, 2}), F({0, 0}, {1, 2})), 0.0);
}

TEST(Ppo, GroupAdvantagesRlooLeavesOneOut) {
  // Group a: rewards 1, 1, 1, -1. Each 1 against the mean of the others (1 + 1 - 1) / 3 = 1/3:
  // 1 - 1/3 = 2/3; the -1 against (1 + 1 + 1) / 3 = 1: -1 - 1 = -2.
  // Group b (interleaved with a): 3, 1 -> 3 - 1 = 2, 1 - 3 = -2. Group c: all 1 -> 0 each.
  // Group d: one answer, nothing to compare it with -> 0.
  std::vector<double> r = {1, 3, 1, 1, -1, 1, 1, 1, 2};
  std::vector<std::string> g = {"a", "b", "a", "a", "a", "b", "c", "c", "d"};
  std::vector<double> want = {2.0 / 3, 2, 2.0 / 3, 2.0 / 3, -2, -2, 0, 0, 0};
  std::vector<double> got = group_advantages(r, g, "rloo");
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "sample " << i;
}

TEST(Ppo, GroupAdvantagesGrpoIsStandardisedWithinTheGroup) {
  // Group a: 1, 1, 1, -1: mean 0.5, deviations 0.5, 0.5, 0.5, -1.5; unbiased variance
  // (3 * 0.25 + 2.25) / 3 = 1, std 1 -> 0.5, 0.5, 0.5, -1.5 (over 1 + 1e-6).
  // Group b: 3, 1: mean 2, variance (1 + 1) / 1 = 2, std 1.4142136 -> +-0.7071068.
  // Group c: 2, 2: std 0 -> 0 / 1e-6 = 0.
  std::vector<double> r = {1, 1, 1, -1, 3, 1, 2, 2};
  std::vector<std::string> g = {"a", "a", "a", "a", "b", "b", "c", "c"};
  std::vector<double> want = {0.5, 0.5, 0.5, -1.5, 0.7071068, -0.7071068, 0, 0};
  std::vector<double> got = group_advantages(r, g, "grpo");
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << "sample " << i;
}

TEST(Ppo, GroupAdvantagesRejectsAnUnknownKindAndMismatchedSizes) {
  auto msg = error_of([] { group_advantages({1, 2}, {"a", "a"}, "gae"); });
  EXPECT_NE(msg.find("gae"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rloo or grpo"), std::string::npos) << msg;
  msg = error_of([] { group_advantages({1, 2}, {"a"}, "rloo"); });
  EXPECT_NE(msg.find("2 rewards for 1 group ids"), std::string::npos) << msg;
}
