#include "generate.h"

#include <algorithm>
#include <set>

#include "opforge/core/error.h"

namespace opforge::trainer {

namespace {

// Keeps the smallest set of tokens whose probability reaches top_p (nucleus sampling); the rest
// get -inf. The most likely token is always kept.
at::Tensor top_p_filter(const at::Tensor& logits, double top_p) {
  if (top_p >= 1.0) return logits;
  auto [sorted, idx] = logits.sort(-1, /*descending=*/true);
  at::Tensor cum = sorted.softmax(-1).cumsum(-1);
  at::Tensor drop = (cum - sorted.softmax(-1)) >= top_p;  // mass before this token already reaches top_p
  sorted = sorted.masked_fill(drop, -std::numeric_limits<double>::infinity());
  return at::full_like(logits, -std::numeric_limits<double>::infinity()).scatter(-1, idx, sorted);
}

// The next token of every row and its log-probability.
std::pair<at::Tensor, at::Tensor> pick(const at::Tensor& logits, const SampleOptions& o, at::Generator& gen) {
  at::Tensor l = logits.to(at::kFloat);
  if (o.greedy) {
    at::Tensor next = l.argmax(-1);
    return {next, l.log_softmax(-1).gather(-1, next.unsqueeze(-1)).squeeze(-1)};
  }
  l = l / o.temperature;
  at::Tensor probs = top_p_filter(l, o.top_p).softmax(-1);
  at::Tensor next = at::multinomial(probs, 1, false, gen).squeeze(-1);
  // Recorded under logits / temperature without the nucleus cut: what the trainer's forward pass
  // recomputes, so the importance ratio of an unchanged policy is exactly 1.
  return {next, l.log_softmax(-1).gather(-1, next.unsqueeze(-1)).squeeze(-1)};
}

// A sampling generator on the logits' device, seeded: on CUDA the draw stays on the GPU (copying
// [B, vocab] logits to the host each step, 0.6 MB a row at Qwen2's 151,936 tokens, and sampling
// there would cost more than the step's forward pass). A clone of the device's default
// generator, so the process's global one is neither advanced nor reseeded.
at::Generator sampling_generator(const at::Device& device, uint64_t seed) {
  if (device.is_cpu()) return at::detail::createCPUGenerator(seed);
  at::Generator gen = at::globalContext().defaultGenerator(device).clone();
  gen.set_current_seed(seed);
  return gen;
}

}  // namespace

std::vector<Generation> generate(const CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const SampleOptions& o) {
  OPFORGE_CHECK(!prompts.empty(), "generate: no prompts");
  OPFORGE_CHECK(o.greedy || o.temperature > 0, "generate: --temperature must be > 0 (or use --greedy)");
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t P = 0;
  for (auto& p : prompts) {
    OPFORGE_CHECK(!p.empty(), "generate: an empty prompt (a prompt needs at least one token)");
    P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
  }
  // Left padding: every row's last prompt token sits at the same column.
  at::Tensor ids = at::full({B, P}, o.pad_id, at::kLong), mask = at::zeros({B, P}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = static_cast<int64_t>(prompts[b].size());
    ids[b].narrow(0, P - n, n).copy_(at::tensor(prompts[b], at::kLong));
    mask[b].narrow(0, P - n, n).fill_(1);
  }
  std::set<int64_t> stops(o.stop_ids.begin(), o.stop_ids.end());
  stops.insert(model.config().eos_ids.begin(), model.config().eos_ids.end());
  at::InferenceMode guard;
  const at::Device dev = model.device();
  at::Generator gen = sampling_generator(dev, o.seed);
  KvCache cache = model.make_cache(B, P + o.max_new_tokens);
  std::vector<Generation> out(static_cast<std::size_t>(B));
  std::vector<bool> done(static_cast<std::size_t>(B), false);
  at::Tensor step_ids = ids.to(dev), full_mask = mask.to(dev), pad = at::full({B, 1}, o.pad_id, step_ids.options());
  for (int64_t t = 0; t < o.max_new_tokens; ++t) {
    at::Tensor logits = model.forward(step_ids, full_mask, &cache).select(1, -1);
    auto [next, logp] = pick(logits, o, gen);
    at::Tensor next_h = next.to(at::kCPU), logp_h = logp.to(at::kCPU), live = at::zeros({B, 1}, at::kLong);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      int64_t tok = next_h[b].item<int64_t>();
      out[b].tokens.push_back(tok);
      out[b].logprobs.push_back(logp_h[b].item<float>());
      done[b] = stops.count(tok) > 0;
      if (done[b]) out[b].finish = "stop";
      live[b][0] = 1;  // the token just drawn is real for the next step's attention
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    at::Tensor live_d = live.to(dev);
    step_ids = at::where(live_d.to(at::kBool), next.unsqueeze(1), pad);
    full_mask = at::cat({full_mask, live_d}, 1);
  }
  for (auto& g : out)
    if (g.finish.empty()) g.finish = "length";
  return out;
}

}  // namespace opforge::trainer
