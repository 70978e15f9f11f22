#include "value_stage.h"

#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>

#include "files.h"
#include "checkpoint.h"
#include "device_memory.h"
#include "opforge/core/error.h"
#include "opforge/core/progress.h"
#include "ppo.h"
#include "value.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using json = nlohmann::json;

json ValueOptions::to_json() const {
  return {{"model", model.string()}, {"critic_init", critic_init.string()}, {"trajectories", trajectories.string()},
          {"out", out.string()}, {"epochs", epochs}, {"steps", steps}, {"batch", batch}, {"micro_batch", micro_batch},
          {"max_len", max_len},
          {"save_every", save_every}, {"lr", lr}, {"weight_decay", weight_decay}, {"max_grad_norm", max_grad_norm},
          {"gamma", gamma}, {"lam", lam}, {"seed", seed}, {"device", device},
          {"precision", precision.to_json()}};
}

namespace {

std::vector<fs::path> trajectory_files(const fs::path& src) {
  OPFORGE_CHECK(fs::exists(src), "--trajectories {} does not exist (give train ppo's trajectories.jsonl or a folder "
                "of JSONL files)", src.string());
  if (!fs::is_directory(src)) return {src};
  std::vector<fs::path> files;
  for (auto& e : list_dir(src))
    // train ppo's OUT holds its metrics.jsonl beside trajectories.jsonl: a log, not trajectories.
    if (fs::is_regular_file(e) && e.extension() == ".jsonl" && e.filename() != "metrics.jsonl") files.push_back(e);
  std::sort(files.begin(), files.end());
  OPFORGE_CHECK(!files.empty(), "--trajectories {} holds no .jsonl file", src.string());
  return files;
}

struct Reader {
  Trajectories& out;
  const fs::path& model;
  int64_t max_len;
  std::optional<Tokenizer> tok;  // made for the first chat record: token-id records need none

  void skip(const std::string& why) {
    ++out.rows.skipped;
    if (out.rows.skip_reasons.size() < 5) out.rows.skip_reasons.push_back(why);
  }
  void add(const std::string& where, std::vector<int64_t> ids, std::vector<uint8_t> mask, double reward) {
    if (max_len > 0 && static_cast<int64_t>(ids.size()) > max_len)
      return skip(fmt::format("{}: {} tokens, over --max-len {}", where, ids.size(), max_len));
    // A value belongs to the state before the token it precedes: token 0 is never an action.
    if (ids.size() < 2 || std::find(mask.begin() + 1, mask.end(), 1) == mask.end())
      return skip(where + ": no response token");
    out.rows.ids.push_back(std::move(ids));
    out.rows.loss_mask.push_back(std::move(mask));
    out.rewards.push_back(reward);
  }
};

// The response mask of a token-id record, from prompt_len or loss_mask; or why neither fits.
std::pair<std::vector<uint8_t>, std::string> response_mask(const json& j) {
  const json& ids = j["ids"];
  if (!ids.is_array() || !std::all_of(ids.begin(), ids.end(), [](const json& x) { return x.is_number_integer(); }))
    return {{}, "ids is not a list of token ids"};
  std::vector<uint8_t> mask;
  if (j.contains("loss_mask")) {
    const json& m = j["loss_mask"];
    if (!m.is_array() || m.size() != ids.size()) return {{}, "loss_mask is not a list as long as ids"};
    for (auto& x : m) {
      if (!x.is_number()) return {{}, "loss_mask holds a non-number"};
      mask.push_back(x.get<double>() != 0);
    }
    return {mask, ""};
  }
  if (!j.contains("prompt_len") || !j["prompt_len"].is_number_integer()) return {{}, "neither prompt_len nor loss_mask"};
  auto p = j["prompt_len"].get<int64_t>();
  if (p < 1 || p > static_cast<int64_t>(ids.size())) return {{}, "prompt_len is outside 1..len(ids)"};
  mask.assign(ids.size(), 0);
  std::fill(mask.begin() + p, mask.end(), 1);
  return {mask, ""};
}

// One file's records in line order; its chat records are rendered together, in one call to the
// tokenizer, and follow its token-id records.
void read_trajectory_file(const fs::path& file, Reader& r) {
  std::ifstream in(file);
  OPFORGE_CHECK(in, "cannot read {}: give a JSONL file of trajectories", file.string());
  json chats = json::array();
  std::vector<std::pair<std::string, double>> chat_of;  // where, reward
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string where = fmt::format("{} line {}", file.filename().string(), n);
    json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("reward")) {
      r.skip(where + ": not a JSON object with a reward");
    } else if (j["reward"].is_null()) {
      ++r.out.null_reward;
    } else if (!j["reward"].is_number()) {
      r.skip(where + ": reward is not a number");
    } else if (j.contains("messages")) {
      chat_of.emplace_back(where, j["reward"].get<double>());
      chats.push_back(std::move(j));
    } else if (!j.contains("ids")) {
      r.skip(where + ": neither ids nor messages");
    } else if (auto [mask, why] = response_mask(j); !why.empty()) {
      r.skip(where + ": " + why);
    } else {
      r.add(where, j["ids"].get<std::vector<int64_t>>(), std::move(mask), j["reward"].get<double>());
    }
  }
  if (chats.empty()) return;
  if (!r.tok) r.tok.emplace(r.model);
  auto rows = r.tok->chat_rows(chats, 0);  // no cut here: add() skips what is too long
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].error.empty()) r.skip(chat_of[i].first + ": " + rows[i].error);
    else r.add(chat_of[i].first, std::move(rows[i].ids), std::move(rows[i].mask), chat_of[i].second);
  }
}

}  // namespace

Trajectories read_trajectories(const fs::path& src, const fs::path& model, int64_t max_len) {
  Trajectories t;
  Reader r{t, model, max_len, std::nullopt};
  for (auto& f : trajectory_files(src)) read_trajectory_file(f, r);
  auto why = [&] { return t.rows.skip_reasons.empty() ? std::string() : ": " + t.rows.skip_reasons.front(); };
  OPFORGE_CHECK(!t.rows.ids.empty(), "--trajectories {} holds no usable trajectory ({} with a null reward, {} "
                "skipped{}); the format is in trainer/README.md", src.string(), t.null_reward, t.rows.skipped, why());
  spdlog::info("value: {} trajectories ({} with a null reward skipped, {} skipped{})", t.rows.ids.size(),
               t.null_reward, t.rows.skipped, why());
  return t;
}

namespace {

// Returns at the action positions of a batch ([B, T - 1], zero elsewhere) by ppo.h's GAE, with
// each row's final reward on its last action. Each row's actions are packed to the left first:
// the tool output between the turns of a multi-turn trajectory is no step of the policy, so it
// neither discounts nor cuts the chain.
//
// With lam = 1 (the default) these are Monte-Carlo returns, gamma^k * R for an action k actions
// before the last, whatever the critic's values: what train ppo regresses its critic on with its
// own defaults (gamma = lam = 1), so value pre-training fits the critic to exactly the targets
// PPO will give it; and a critic whose head starts at zero has no values worth bootstrapping
// from. lam < 1 bootstraps from the critic's own values before the step, for a PPO run that uses
// lam < 1.
at::Tensor action_returns(const at::Tensor& values, const at::Tensor& mask, const std::vector<double>& rewards,
                          double gamma, double lam) {
  at::Tensor m = mask.cpu(), v = values.cpu();
  const int64_t B = m.size(0), K = std::max<int64_t>(m.sum(1).max().item<int64_t>(), 1);
  at::Tensor idx = at::zeros({B, K}, at::kLong), packed = at::zeros({B, K}, at::kFloat), r = at::zeros({B, K}, at::kFloat);
  for (int64_t b = 0; b < B; ++b) {
    at::Tensor pos = m[b].nonzero().squeeze(-1);
    int64_t n = pos.size(0);
    idx[b].narrow(0, 0, n).copy_(pos);
    packed[b].narrow(0, 0, n).fill_(1);
    r[b][n - 1] = rewards[static_cast<std::size_t>(b)];
  }
  Advantages a = gae(r, v.gather(1, idx), packed, gamma, lam);
  // Padding slots point at position 0 and carry 0, so adding them changes nothing.
  return at::zeros_like(v).scatter_add(1, idx, a.returns * packed).to(values.device());
}

// One micro-batch's forward and backward: its share of the batch's token-mean loss (so the
// micro-batches' gradients add up to the whole batch's), and its scored values and returns.
struct ValuePart {
  double loss = 0;
  at::Tensor values, returns;  // the scored positions only, flattened
};

ValuePart value_part(ValueModel& critic, const Trajectories& t, const std::vector<int64_t>& pick, const Batch& b,
                     double batch_tokens, const ValueOptions& o) {
  at::Device d = critic.trunk().device();
  const int64_t T = b.ids.size(1);
  at::Tensor v = critic.values(b.ids.to(d), b.attention.to(d)).narrow(1, 0, T - 1);
  at::Tensor mask = b.loss_mask.narrow(1, 1, T - 1).to(d);
  std::vector<double> rewards;
  for (auto i : pick) rewards.push_back(t.rewards[static_cast<std::size_t>(i)]);
  at::Tensor ret = action_returns(v.detach(), mask, rewards, o.gamma, o.lam);
  at::Tensor loss = value_loss(v, v.detach(), ret, mask, 0.0).loss * (static_cast<double>(b.tokens) / batch_tokens);
  loss.backward();
  at::Tensor scored = mask > 0;
  return {loss.item<double>(), v.detach().masked_select(scored).to(at::kFloat), ret.masked_select(scored)};
}

// One optimizer step on the trajectories `pick`, in micro-batches (--micro-batch). Each batch is
// seen once, so the values it is scored with are those it moves from and PPO's value clip could
// never bind: the plain loss.
json value_step(ValueModel& critic, torch::optim::Optimizer& opt, const Trajectories& t,
                const std::vector<int64_t>& pick, const ValueOptions& o) {
  std::vector<std::vector<int64_t>> parts = micro_batches(pick, o.micro_batch);
  std::vector<Batch> batches;
  int64_t tokens = 0;
  for (auto& c : parts) {
    batches.push_back(collate(t.rows, c, 0));  // padding is neither attended to nor scored: its id is immaterial
    tokens += batches.back().tokens;
  }
  opt.zero_grad();
  Autocast cast(critic.trunk().device(), o.precision.bf16);
  double loss = 0;
  std::vector<at::Tensor> vs, rs;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    ValuePart p = value_part(critic, t, parts[k], batches[k], static_cast<double>(std::max<int64_t>(tokens, 1)), o);
    loss += p.loss;
    vs.push_back(p.values);
    rs.push_back(p.returns);
  }
  double norm = torch::nn::utils::clip_grad_norm_(critic.parameters(), o.max_grad_norm);
  opt.step();
  at::Tensor v = at::cat(vs), ret = at::cat(rs), all = at::ones_like(v);
  return {{"value_loss", loss}, {"explained_variance", explained_variance(v, ret, all)},
          {"value_mean", masked_mean(v, all).item<double>()}, {"return_mean", masked_mean(ret, all).item<double>()},
          {"grad_norm", norm}, {"tokens", tokens}};
}

struct ValueRun {
  ValueModel critic;
  Trajectories data;
  int64_t total = 0;
};

// The critic from the checkpoint when there is one, else from --critic-init (or --model); ids
// beyond its vocabulary mean trajectories of another tokenizer.
ValueRun open_run(const ValueOptions& o, bool resume) {
  fs::path init = resume ? checkpoint_dir(o.out) : (o.critic_init.empty() ? o.model : o.critic_init);
  ValueRun r{ValueModel::load(init, device_named(o.device)), read_trajectories(o.trajectories, o.model, o.max_len), 0};
  const int64_t vocab = r.critic.trunk().config().vocab;
  for (auto& ids : r.data.rows.ids)
    for (auto id : ids)
      OPFORGE_CHECK(id >= 0 && id < vocab, "--trajectories {}: token id {} is outside the critic's vocabulary of {} "
                    "(trajectories of another model's tokenizer?)", o.trajectories.string(), id, vocab);
  const int64_t n = static_cast<int64_t>(r.data.rows.ids.size());
  r.total = o.steps > 0 ? o.steps : o.epochs * ((n + o.batch - 1) / o.batch);
  r.critic.set_requires_grad(true);
  r.critic.set_checkpointing(o.precision.checkpointing);
  return r;
}

}  // namespace

ValueResult train_value(const ValueOptions& o) {
  OPFORGE_CHECK(o.batch > 0 && o.save_every > 0, "--batch and --save-every must be > 0");
  OPFORGE_CHECK(o.micro_batch >= 0, "--micro-batch must be >= 0 (0: the whole batch at once)");
  OPFORGE_CHECK(o.gamma >= 0 && o.gamma <= 1 && o.lam >= 0 && o.lam <= 1, "--gamma and --lam must lie in [0, 1]");
  fs::create_directories(o.out);
  spdlog::info("value options: {}", o.to_json().dump());
  bool resume = has_checkpoint(o.out);
  ValueRun r = open_run(o, resume);
  torch::optim::AdamW opt(r.critic.parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  std::vector<CheckpointPart> parts = {{"", [&](const fs::path& d) { r.critic.save(d); }, &opt}};
  TrainState st = resume ? load_checkpoint(o.out, parts, "value") : TrainState{};
  MetricsLog log(o.out / "metrics.jsonl", st.step);
  ValueResult res;
  const at::Device dev = r.critic.trunk().device();
  const int64_t n = static_cast<int64_t>(r.data.rows.ids.size());
  Progress progress("value", static_cast<std::size_t>(r.total));
  progress.tick(static_cast<std::size_t>(st.step));
  for (int64_t step = st.step + 1; step <= r.total; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    reset_peak_memory(dev);
    json m = value_step(r.critic, opt, r.data, batch_of_step(step, n, o.batch, o.seed), o);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.update({{"step", step}, {"lr", o.lr}, {"seconds", secs}, {"tokens_per_s", m["tokens"].get<double>() / secs}});
    if (auto gib = peak_memory_gib(dev)) m["peak_mem_gib"] = *gib;
    res.value_loss.push_back(m["value_loss"].get<double>());
    log.write(m);
    if (step % o.save_every == 0 || step == r.total) save_checkpoint(o.out, parts, {step, {{"stage", "value"}}});
    progress.tick(1, fmt::format("value loss {:.4f}", res.value_loss.back()));
  }
  progress.finish();
  res.critic_dir = o.out / "critic";
  r.critic.save(res.critic_dir);
  log.plot(o.out / "metrics.png", "opforge train value", {"value_loss", "explained_variance", "value_mean", "return_mean"});
  return res;
}

}  // namespace opforge::trainer
