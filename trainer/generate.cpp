#include "generate.h"

#include <algorithm>
#include <limits>
#include <set>

#include "opforge/core/error.h"

namespace opforge::trainer {

namespace {

// Keeps the smallest set of tokens whose probability reaches top_p (nucleus sampling); the rest
// get -inf. The most likely token is always kept.
at::Tensor top_p_filter(const at::Tensor& logits, double top_p) {
  if (top_p >= 1.0) return logits;
  auto [sorted, idx] = logits.sort(-1, /*descending=*/true);
  at::Tensor probs = sorted.softmax(-1);
  at::Tensor drop = (probs.cumsum(-1) - probs) >= top_p;  // mass before this token already reaches top_p
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

// Keeps SDPA off cuDNN's attention for its scope. torch 2.11 prefers cuDNN on sm90 (H100/H200)
// with cuDNN > 9.15, and cuDNN builds (and caches) an execution graph for every new shape: each
// decode step has one more key, so every step paid a graph build (tens of ms) for a kernel of
// microseconds. Flash (no mask) and memory-efficient attention (a mask) take any length as it
// comes. Restores the previous setting; a process-wide flag, and a model is used from one thread.
class NoCudnnAttention {
 public:
  NoCudnnAttention() : was_(at::globalContext().userEnabledCuDNNSDP()) { at::globalContext().setSDPUseCuDNN(false); }
  ~NoCudnnAttention() { at::globalContext().setSDPUseCuDNN(was_); }
  NoCudnnAttention(const NoCudnnAttention&) = delete;
  NoCudnnAttention& operator=(const NoCudnnAttention&) = delete;

 private:
  bool was_;
};

// The prompts left-padded to their longest ([B, P] ids and 0/1 mask, on the CPU): every row's last
// prompt token sits at the same column.
std::pair<at::Tensor, at::Tensor> left_padded(const std::vector<std::vector<int64_t>>& prompts, int64_t P, int64_t pad) {
  const auto B = static_cast<int64_t>(prompts.size());
  std::vector<int64_t> ids(static_cast<std::size_t>(B * P), pad), mask(ids.size(), 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<std::size_t>(b)];
    auto row = static_cast<std::ptrdiff_t>(b * P + P - static_cast<int64_t>(p.size()));
    std::copy(p.begin(), p.end(), ids.begin() + row);
    std::fill(mask.begin() + row, mask.begin() + row + static_cast<std::ptrdiff_t>(p.size()), 1);
  }
  return {at::tensor(ids, at::kLong).view({B, P}), at::tensor(mask, at::kLong).view({B, P})};
}

// Appends each live row's token and log-probability (host copies); true when every row is done.
bool record(const at::Tensor& next_h, const at::Tensor& logp_h, const std::set<int64_t>& stops,
            std::vector<Generation>& out, std::vector<bool>& done) {
  const int64_t* tok = next_h.data_ptr<int64_t>();
  const float* lp = logp_h.data_ptr<float>();
  bool all = true;
  for (std::size_t b = 0; b < out.size(); ++b) {
    if (!done[b]) {
      out[b].tokens.push_back(tok[b]);
      out[b].logprobs.push_back(lp[b]);
      done[b] = stops.count(tok[b]) > 0;
      if (done[b]) out[b].finish = "stop";
    }
    all = all && done[b];
  }
  return all;
}

}  // namespace

// Rows never exchange values (attention, norms and projections are per row), so a finished row
// keeps being fed its own drawn tokens as real ones: what it computes is never read, and the
// live rows get exactly what they would alone. So the mask is fixed before the loop (all ones
// after the prompts), and with prompts of one length there is none at all: the ids of the next
// step are the drawn tokens, on the device, and one copy to the host a step (ids and
// log-probabilities, for the stop tokens) is the only synchronisation.
std::vector<Generation> generate(const CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const SampleOptions& o) {
  OPFORGE_CHECK(!prompts.empty(), "generate: no prompts");
  OPFORGE_CHECK(o.greedy || o.temperature > 0, "generate: --temperature must be > 0 (or use --greedy)");
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t P = 0, shortest = std::numeric_limits<int64_t>::max();
  for (auto& p : prompts) {
    OPFORGE_CHECK(!p.empty(), "generate: an empty prompt (a prompt needs at least one token)");
    P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
    shortest = std::min<int64_t>(shortest, static_cast<int64_t>(p.size()));
  }
  std::set<int64_t> stops(o.stop_ids.begin(), o.stop_ids.end());
  stops.insert(model.config().eos_ids.begin(), model.config().eos_ids.end());
  at::InferenceMode guard;
  NoCudnnAttention no_cudnn;
  const at::Device dev = model.device();
  at::Generator gen = sampling_generator(dev, o.seed);
  KvCache cache = model.make_cache(B, P + o.max_new_tokens);
  auto [ids, prompt_mask] = left_padded(prompts, P, o.pad_id);
  at::Tensor mask;  // undefined: no padding anywhere
  if (shortest < P)
    mask = at::cat({prompt_mask, at::ones({B, o.max_new_tokens}, at::kLong)}, 1).to(dev);
  std::vector<Generation> out(static_cast<std::size_t>(B));
  std::vector<bool> done(static_cast<std::size_t>(B), false);
  at::Tensor step_ids = ids.to(dev);
  for (int64_t t = 0; t < o.max_new_tokens; ++t) {
    const int64_t seen = cache.length + step_ids.size(1);
    at::Tensor h = model.hidden(step_ids, mask.defined() ? mask.narrow(1, 0, seen) : mask, &cache);
    auto [next, logp] = pick(model.logits(h.select(1, -1)), o, gen);
    if (record(next.to(at::kCPU).contiguous(), logp.to(at::kCPU).contiguous(), stops, out, done)) break;
    step_ids = next.unsqueeze(1);
  }
  for (auto& g : out)
    if (g.finish.empty()) g.finish = "length";
  return out;
}

}  // namespace opforge::trainer
