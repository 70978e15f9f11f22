#include "sft.h"

#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "checkpoint.h"
#include "data.h"
#include "device_memory.h"
#include "opforge/core/error.h"
#include "opforge/core/progress.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using json = nlohmann::json;

json SftOptions::to_json() const {
  return {{"model", model.string()}, {"data", data.string()}, {"val", val.string()}, {"out", out.string()},
          {"epochs", epochs}, {"steps", steps}, {"batch", batch}, {"micro_batch", micro_batch},
          {"max_len", max_len}, {"save_every", save_every}, {"lr", lr}, {"weight_decay", weight_decay},
          {"max_grad_norm", max_grad_norm}, {"seed", seed}, {"device", device}, {"precision", precision.to_json()}};
}

namespace {

// Summed negative log-likelihood of the loss tokens of one batch, and their count.
at::Tensor nll_sum(const CausalLM& model, const Batch& b) {
  at::Device d = model.device();
  at::Tensor logits = model.forward(b.ids.to(d), b.attention.to(d)).to(at::kFloat);
  int64_t T = b.ids.size(1);
  at::Tensor logp = logits.narrow(1, 0, T - 1).log_softmax(-1);
  at::Tensor target = b.ids.narrow(1, 1, T - 1).to(d).unsqueeze(-1);
  return -(logp.gather(-1, target).squeeze(-1) * b.loss_mask.narrow(1, 1, T - 1).to(d)).sum();
}

// One optimizer step over `pick`, in micro-batches whose gradients add up to the whole batch's
// token-mean loss. Returns {loss, grad_norm, tokens}.
json sft_step(const CausalLM& model, torch::optim::Optimizer& opt, const TokenRows& rows,
              const std::vector<int64_t>& pick, const SftOptions& o, int64_t pad) {
  std::vector<Batch> parts;
  int64_t tokens = 0;
  for (auto& c : micro_batches(pick, o.micro_batch)) {
    parts.push_back(collate(rows, c, pad));
    tokens += parts.back().tokens;
  }
  opt.zero_grad();
  double loss = 0;
  Autocast cast(model.device(), o.precision.bf16);
  for (auto& b : parts) {
    at::Tensor l = nll_sum(model, b) / static_cast<double>(std::max<int64_t>(tokens, 1));
    l.backward();
    loss += l.item<double>();
  }
  double norm = torch::nn::utils::clip_grad_norm_(model.parameters(), o.max_grad_norm);
  opt.step();
  return {{"loss", loss}, {"grad_norm", norm}, {"tokens", tokens}};
}

double val_loss(const CausalLM& model, const TokenRows& rows, int64_t batch, int64_t pad) {
  at::NoGradGuard no_grad;
  double sum = 0;
  int64_t tokens = 0;
  std::vector<int64_t> all(rows.ids.size());
  std::iota(all.begin(), all.end(), 0);
  for (auto& c : micro_batches(all, batch)) {
    Batch b = collate(rows, c, pad);
    sum += nll_sum(model, b).item<double>();
    tokens += b.tokens;
  }
  return sum / static_cast<double>(std::max<int64_t>(tokens, 1));
}

}  // namespace

namespace {

struct SftRun {
  CausalLM model;
  Tokenizer tok;
  TokenRows rows, val;
  int64_t pad = 0, total = 0;
};

// Weights in float32 on either device: the master copy AdamW updates (a bf16 weight would lose
// the small updates of a 1e-5 learning rate).
SftRun open_run(const SftOptions& o, bool resume) {
  SftRun r{CausalLM::load(resume ? checkpoint_dir(o.out) : o.model, device_named(o.device), at::kFloat), Tokenizer(o.model),
           {}, {}, 0, 0};
  r.rows = cached_chat_rows(o.data, r.tok, o.max_len, o.model, o.out / "rows");
  if (!o.val.empty()) r.val = cached_chat_rows(o.val, r.tok, o.max_len, o.model, o.out / "rows");
  r.pad = r.tok.pad_id().value_or(r.tok.eos_id().value_or(0));
  int64_t n = static_cast<int64_t>(r.rows.ids.size());
  r.total = o.steps > 0 ? o.steps : o.epochs * ((n + o.batch - 1) / o.batch);
  spdlog::info("sft: {} training rows ({} skipped{}{}), {} validation rows, {} steps", n, r.rows.skipped,
               r.rows.skip_reasons.empty() ? "" : ": ", r.rows.skip_reasons.empty() ? "" : r.rows.skip_reasons[0],
               r.val.ids.size(), r.total);
  r.model.set_requires_grad(true);
  r.model.set_checkpointing(o.precision.checkpointing);
  return r;
}

}  // namespace

SftResult train_sft(const SftOptions& o) {
  OPFORGE_CHECK(o.batch > 0 && o.micro_batch >= 0 && o.save_every > 0, "--batch and --save-every must be > 0");
  fs::create_directories(o.out);
  spdlog::info("sft options: {}", o.to_json().dump());
  bool resume = has_checkpoint(o.out);
  SftRun r = open_run(o, resume);
  torch::optim::AdamW opt(r.model.parameters(),
                          torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay).betas({0.9, 0.95}));
  std::vector<CheckpointPart> parts = {{"", [&](const fs::path& d) { r.model.save(d); }, &opt}};
  TrainState st = resume ? load_checkpoint(o.out, parts, "sft") : TrainState{};
  MetricsLog log(o.out / "metrics.jsonl", st.step);
  SftResult res;
  Progress progress("sft", static_cast<std::size_t>(r.total));
  progress.tick(static_cast<std::size_t>(st.step));
  for (int64_t step = st.step + 1; step <= r.total; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    reset_peak_memory(r.model.device());
    json m = sft_step(r.model, opt, r.rows, batch_of_step(step, static_cast<int64_t>(r.rows.ids.size()), o.batch, o.seed), o, r.pad);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.update({{"step", step}, {"lr", o.lr}, {"seconds", secs}, {"tokens_per_s", m["tokens"].get<double>() / secs}});
    if (auto gib = peak_memory_gib(r.model.device())) m["peak_mem_gib"] = *gib;
    res.last_loss = m["loss"].get<double>();
    bool save = step % o.save_every == 0 || step == r.total;
    if (save && !r.val.ids.empty()) {
      Autocast cast(r.model.device(), o.precision.bf16);
      m["val_loss"] = res.val_loss = val_loss(r.model, r.val, o.batch, r.pad);
    }
    log.write(m);
    if (save) save_checkpoint(o.out, parts, {step, {{"stage", "sft"}}});
    progress.tick(1, fmt::format("loss {:.4f}", res.last_loss));
  }
  progress.finish();
  res.steps = r.total;
  res.model_dir = o.out / "model";
  r.model.save(res.model_dir);
  log.plot(o.out / "metrics.png", "opforge train sft", {"loss", "val_loss", "grad_norm", "tokens_per_s"});
  return res;
}

}  // namespace opforge::trainer
