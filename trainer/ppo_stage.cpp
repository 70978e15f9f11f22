#include "ppo_stage.h"

#include <spdlog/spdlog.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <map>
#include <set>

#include "checkpoint.h"
#include "data.h"
#include "device_memory.h"
#include "generate.h"
#include "opforge/core/error.h"
#include "opforge/core/progress.h"
#include "ppo.h"
#include "value.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

json PpoOptions::to_json() const {
  return {{"actor", actor.string()}, {"critic", critic.string()}, {"out", out.string()}, {"steps", steps},
          {"batch", batch}, {"rollouts_per_task", rollouts_per_task}, {"ppo_epochs", ppo_epochs},
          {"mini_batch", mini_batch}, {"micro_batch", micro_batch}, {"max_new_tokens", max_new_tokens}, {"lr", lr}, {"critic_lr", critic_lr},
          {"temperature", temperature}, {"top_p", top_p}, {"clip_low", clip_low}, {"clip_high", clip_high},
          {"dual_clip", dual_clip}, {"value_clip", value_clip}, {"kl_coef", kl_coef}, {"gamma", gamma}, {"lam", lam},
          {"max_grad_norm", max_grad_norm}, {"weight_decay", weight_decay}, {"seed", seed}, {"device", device},
          {"advantage", advantage}, {"precision", precision.to_json()}};
}

namespace {

double secs_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What one iteration's update reads. Token t of row i predicts ids[i][t + 1]: every per-action
// tensor is [N, L - 1], `mask` 1 on the answer's tokens.
struct Rollouts {
  at::Tensor ids, attention, mask, rollout_logp;
  std::vector<double> rewards;
  std::vector<std::string> groups;  // each row's task: the group of --advantage rloo / grpo
  std::vector<int64_t> last;        // each row's last action position
};

Rollouts collate_rollouts(const std::vector<std::vector<int64_t>>& prompts, const std::vector<Generation>& gens,
                          const std::vector<std::size_t>& keep, int64_t pad) {
  int64_t L = 0;
  for (auto i : keep) L = std::max<int64_t>(L, static_cast<int64_t>(prompts[i].size() + gens[i].tokens.size()));
  const int64_t N = static_cast<int64_t>(keep.size());
  Rollouts r{at::full({N, L}, pad, at::kLong), at::zeros({N, L}, at::kLong), at::zeros({N, L - 1}, at::kFloat),
             at::zeros({N, L - 1}, at::kFloat), {}, {}};
  for (int64_t row = 0; row < N; ++row) {
    const auto& p = prompts[keep[row]];
    const auto& g = gens[keep[row]];
    int64_t P = static_cast<int64_t>(p.size()), R = static_cast<int64_t>(g.tokens.size());
    std::vector<int64_t> seq = p;
    seq.insert(seq.end(), g.tokens.begin(), g.tokens.end());
    r.ids[row].narrow(0, 0, P + R).copy_(at::tensor(seq, at::kLong));
    r.attention[row].narrow(0, 0, P + R).fill_(1);
    r.mask[row].narrow(0, P - 1, R).fill_(1);
    r.rollout_logp[row].narrow(0, P - 1, R).copy_(at::tensor(g.logprobs, at::kFloat));
    r.last.push_back(P + R - 2);
  }
  return r;
}

// log p(next token) at every position [N, L - 1], and the logits they came from, both under
// logits / temperature: the policy that drew the rollouts (generate.cpp records its logprobs so) is
// the one whose ratio, KL and entropy the update weighs. Raw logits at a temperature other than 1
// made every importance ratio off by the temperature's reshaping, even before the first update.
std::pair<at::Tensor, at::Tensor> action_logp(const CausalLM& m, const at::Tensor& ids, const at::Tensor& attention,
                                              double temperature) {
  at::Device d = m.device();
  at::Tensor logits = m.forward(ids.to(d), attention.to(d)).to(at::kFloat);
  if (temperature != 1.0) logits = logits / temperature;
  int64_t L = ids.size(1);
  at::Tensor lp = logits.narrow(1, 0, L - 1).log_softmax(-1).gather(-1, ids.narrow(1, 1, L - 1).to(d).unsqueeze(-1));
  return {lp.squeeze(-1), logits.narrow(1, 0, L - 1)};
}

}  // namespace

namespace {

struct PpoRun {
  const PpoOptions& o;
  EpisodeFn episodes;  // empty: single_turn
  CausalLM actor, ref;  // ref: the frozen starting actor, loaded only when kl_coef > 0
  ValueModel critic;
  std::unique_ptr<torch::optim::AdamW> actor_opt, critic_opt;
  int64_t pad = 0;
  std::vector<int64_t> stops;
};

// Every answer of the step in train value's trajectory format, those with a null reward too
// (train value counts and skips them): the critic can be pre-trained on PPO's rollouts.
void log_trajectories(MetricsLog& log, const std::vector<Sample>& samples, int64_t step) {
  for (const auto& x : samples) {
    json rec = trajectory_record(x);
    rec["step"] = step;
    log.write(rec);
  }
}

// K answers to each of the step's prompts, judged by the RewardFn: the single-turn episodes.
std::vector<Sample> single_turn(PpoRun& r, const std::vector<Prompt>& tasks, const Tokenizer& tok,
                                const RewardFn& reward, int64_t step, json& m) {
  const PpoOptions& o = r.o;
  std::vector<std::vector<int64_t>> ps;
  std::vector<std::string> ids;
  for (const auto& t : tasks)
    for (int64_t k = 0; k < o.rollouts_per_task; ++k) {
      ps.push_back(t.ids);
      ids.push_back(t.task_id);
    }
  SampleOptions so;
  so.max_new_tokens = o.max_new_tokens;
  so.temperature = o.temperature;
  so.top_p = o.top_p;
  so.stop_ids = r.stops;
  so.pad_id = r.pad;
  so.seed = o.seed * 1000003ULL + static_cast<uint64_t>(step);  // a resumed step draws the same answers
  auto t0 = Clock::now();
  std::vector<Generation> gens = generate(r.actor, ps, so);
  double gen_s = secs_since(t0);
  std::vector<std::string> texts;
  std::vector<std::vector<int64_t>> answers;
  int64_t tokens = 0;
  for (auto& g : gens) {
    texts.push_back(tok.decode(g.tokens));
    answers.push_back(g.tokens);
    tokens += static_cast<int64_t>(g.tokens.size());
  }
  auto t1 = Clock::now();
  std::vector<std::optional<double>> rw = reward(ids, texts, answers);
  OPFORGE_CHECK(rw.size() == texts.size(), "the reward function answered {} rewards for {} answers", rw.size(), texts.size());
  m.update({{"gen_tokens_per_s", tokens / gen_s}, {"gen_seconds", gen_s}, {"judge_seconds", secs_since(t1)}});
  std::vector<Sample> out;
  for (std::size_t i = 0; i < gens.size(); ++i) out.push_back({ids[i], ps[i], std::move(gens[i]), rw[i]});
  return out;
}

// Reward mean, pass rate and histogram of the judged samples (rows whose reward is null are left
// out); returns their positions.
std::vector<std::size_t> tally(const std::vector<Sample>& samples, json& m) {
  std::vector<std::size_t> keep;
  std::map<std::string, int64_t> hist;
  double sum = 0, pass = 0, tokens = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    tokens += static_cast<double>(samples[i].answer.tokens.size());
    if (!samples[i].reward) continue;
    keep.push_back(i);
    sum += *samples[i].reward;
    pass += *samples[i].reward >= 1;
    ++hist[fmt::format("{:g}", *samples[i].reward)];
  }
  double n = static_cast<double>(std::max<std::size_t>(keep.size(), 1));
  // Prompts whose judged answers did not all earn one reward: the only ones a group-relative
  // advantage learns from (and, with a critic, the ones whose signal is not the critic's error).
  std::map<std::string, std::set<double>> by_task;
  for (auto i : keep) by_task[samples[i].task_id].insert(*samples[i].reward);
  int64_t mixed = 0;
  for (const auto& [task, rewards] : by_task) mixed += rewards.size() > 1;
  m["mixed_groups"] = static_cast<double>(mixed) / static_cast<double>(std::max<std::size_t>(by_task.size(), 1));
  m.update({{"answers", samples.size()}, {"dropped", samples.size() - keep.size()}, {"reward_mean", sum / n},
            {"pass_rate", pass / n}, {"reward_hist", hist},
            {"response_length", tokens / static_cast<double>(std::max<std::size_t>(samples.size(), 1))}});
  return keep;
}

// The step's samples (single-turn, or the EpisodeFn's), logged and tallied; the judged ones
// collated for the update.
std::optional<Rollouts> rollout(PpoRun& r, const std::vector<Prompt>& prompts, const Tokenizer& tok,
                                const RewardFn& reward, int64_t step, json& m, MetricsLog& trajectories) {
  std::vector<Prompt> tasks;
  for (auto i : batch_of_step(step, static_cast<int64_t>(prompts.size()), r.o.batch, r.o.seed))
    tasks.push_back(prompts[i]);
  std::vector<Sample> samples =
      r.episodes ? r.episodes(r.actor, step, tasks, m) : single_turn(r, tasks, tok, reward, step, m);
  log_trajectories(trajectories, samples, step);
  std::vector<std::size_t> keep = tally(samples, m);
  if (keep.empty()) return std::nullopt;
  std::vector<std::vector<int64_t>> ps;
  std::vector<Generation> gens;
  for (auto& x : samples) {
    ps.push_back(x.prompt);
    gens.push_back(x.answer);
  }
  Rollouts ro = collate_rollouts(ps, gens, keep, r.pad);
  for (auto i : keep) {
    ro.rewards.push_back(*samples[i].reward);
    ro.groups.push_back(samples[i].task_id);
  }
  return ro;
}

struct Targets {
  at::Tensor old_logp, old_values, advantages, returns;
};

// Critic-free: each row's reward against its group (ppo.h, group_advantages), less kl_coef times
// its summed KL penalty against the group's others (leave-one-out, in reward units for either
// estimator: standardising it with GRPO would blow a group's KL noise up to unit scale), on every
// answer token. Not whitened: a batch whose groups all agree has (nearly) nothing to learn, and
// whitening would blow its near-zero advantages up to unit scale.
at::Tensor group_targets(const PpoOptions& o, const Rollouts& ro, const at::Tensor& kl) {
  std::vector<double> adv = group_advantages(ro.rewards, ro.groups, o.advantage);
  if (kl.defined()) {
    at::Tensor per_row = kl.sum(1).to(at::kDouble).contiguous();
    std::vector<double> sums(per_row.data_ptr<double>(), per_row.data_ptr<double>() + per_row.numel());
    std::vector<double> centred = group_advantages(sums, ro.groups, "rloo");
    for (std::size_t i = 0; i < adv.size(); ++i) adv[i] -= o.kl_coef * centred[i];
  }
  return at::tensor(adv, at::kFloat).unsqueeze(1) * ro.mask;
}

// The frozen quantities of the update: log-probabilities before it and the advantages: with a
// critic its values, the token rewards (the answer's reward on its last token, less the KL penalty
// on every token) and GAE; without one, group_targets.
Targets targets(PpoRun& r, const Rollouts& ro, json& m) {
  at::NoGradGuard no_grad;
  const PpoOptions& o = r.o;
  Targets t;
  t.old_logp = action_logp(r.actor, ro.ids, ro.attention, o.temperature).first.cpu();
  at::Tensor kl;
  if (o.kl_coef > 0) {
    at::Tensor ref = action_logp(r.ref, ro.ids, ro.attention, o.temperature).first.cpu();
    kl = kl_penalty(t.old_logp, ref, "k1") * ro.mask;
    m["kl_ref"] = masked_mean(kl, ro.mask).item<double>();
  }
  // The rollout's own log-probabilities against the trainer's recomputation: the mismatch the
  // paper names as a source of instability (0 up to float rounding for opforge's own rollouts).
  m["rollout_logp_gap"] = masked_mean((ro.rollout_logp - t.old_logp).abs(), ro.mask).item<double>();
  if (!o.has_critic()) {
    t.advantages = group_targets(o, ro, kl);
    return t;
  }
  int64_t L = ro.ids.size(1);
  at::Device d = r.critic.trunk().device();
  t.old_values = r.critic.values(ro.ids.to(d), ro.attention.to(d)).narrow(1, 0, L - 1).cpu();
  at::Tensor rewards = at::zeros_like(t.old_logp);
  for (std::size_t i = 0; i < ro.last.size(); ++i) rewards[static_cast<int64_t>(i)][ro.last[i]] = ro.rewards[i];
  if (kl.defined()) rewards = rewards - o.kl_coef * kl;
  Advantages a = gae(rewards, t.old_values, ro.mask, o.gamma, o.lam);
  t.advantages = ro.mask.sum().item<double>() >= 2 ? masked_whiten(a.advantages, ro.mask) : a.advantages;
  t.returns = a.returns;
  return t;
}

// Rollouts and their targets under one autocast scope, closed before the update: bf16 logprobs
// scored against float32 ones would be a mismatch of our own making (rollout_logp_gap), and
// autocast's cache of cast weights lives as long as its scope, so no optimizer step may fall
// inside one (the update opens one per mini-batch).
std::optional<std::pair<Rollouts, Targets>> scored_rollout(PpoRun& r, const std::vector<Prompt>& prompts,
                                                           const Tokenizer& tok, const RewardFn& reward, int64_t step,
                                                           json& m, MetricsLog& trajectories) {
  Autocast cast(r.actor.device(), r.o.precision.bf16);
  auto ro = rollout(r, prompts, tok, reward, step, m, trajectories);
  if (!ro) return std::nullopt;
  Targets t = targets(r, *ro, m);
  return std::make_pair(std::move(*ro), std::move(t));
}

double clip_and_step(torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params, double clip) {
  double norm = torch::nn::utils::clip_grad_norm_(params, clip);
  opt.step();
  return norm;
}

// Rows [start, start + rows) of a mini-batch, and their share of its scored tokens: a part's
// token-mean loss times its share, summed over the parts, is the mini-batch's token-mean loss, so
// their gradients add up to the whole's (one part with share 1 when --micro-batch is 0).
struct Part {
  int64_t start, rows;
  double share;
};

std::vector<Part> parts_of(const at::Tensor& mask, int64_t s, int64_t n, int64_t micro) {
  const double total = std::max(mask.narrow(0, s, n).sum().item<double>(), 1.0);
  const int64_t m = micro > 0 ? micro : n;
  std::vector<Part> out;
  for (int64_t k = s; k < s + n; k += m) {
    const int64_t rows = std::min(m, s + n - k);
    out.push_back({k, rows, mask.narrow(0, k, rows).sum().item<double>() / total});
  }
  return out;
}

// One actor step on a mini-batch's parts, their gradients accumulated; metrics weighted by share.
void actor_step(PpoRun& r, const Rollouts& ro, const Targets& t, const std::vector<Part>& parts,
                std::map<std::string, double>& acc) {
  const PpoOptions& o = r.o;
  at::Device d = r.actor.device();
  r.actor_opt->zero_grad();
  for (const Part& p : parts) {
    auto sel = [&](const at::Tensor& x) { return x.narrow(0, p.start, p.rows).to(d); };
    at::Tensor mask = sel(ro.mask);
    auto [logp, logits] = action_logp(r.actor, sel(ro.ids), sel(ro.attention), o.temperature);
    PolicyLoss pl = policy_loss(logp, sel(t.old_logp), sel(t.advantages), mask, o.clip_low, o.clip_high, o.dual_clip);
    (pl.loss * p.share).backward();
    acc["entropy"] += p.share * masked_mean(entropy_from_logits(logits.detach()), mask).item<double>();
    acc["policy_loss"] += p.share * pl.loss.item<double>();
    acc["clip_fraction"] += p.share * pl.clip_fraction;
    acc["dual_clip_fraction"] += p.share * pl.dual_clip_fraction;
    acc["approx_kl"] += p.share * pl.approx_kl;
  }
  acc["actor_grad_norm"] += clip_and_step(*r.actor_opt, r.actor.parameters(), o.max_grad_norm);
}

// One critic step on a mini-batch's parts, as actor_step.
void critic_step(PpoRun& r, const Rollouts& ro, const Targets& t, const std::vector<Part>& parts,
                 std::map<std::string, double>& acc) {
  const PpoOptions& o = r.o;
  at::Device d = r.critic.trunk().device();
  r.critic_opt->zero_grad();
  for (const Part& p : parts) {
    auto sel = [&](const at::Tensor& x) { return x.narrow(0, p.start, p.rows).to(d); };
    at::Tensor v = r.critic.values(sel(ro.ids), sel(ro.attention));
    ValueLoss vl = value_loss(v.narrow(1, 0, v.size(1) - 1), sel(t.old_values), sel(t.returns), sel(ro.mask),
                              o.value_clip);
    (vl.loss * p.share).backward();
    acc["value_loss"] += p.share * vl.loss.item<double>();
    acc["value_clip_fraction"] += p.share * vl.clip_fraction;
  }
  acc["critic_grad_norm"] += clip_and_step(*r.critic_opt, r.critic.parameters(), o.max_grad_norm);
}

// ppo_epochs passes over the rows in mini-batches, one actor and (with a critic) one critic step each.
void update(PpoRun& r, const Rollouts& ro, const Targets& t, json& m) {
  const PpoOptions& o = r.o;
  const int64_t N = ro.ids.size(0), mb = o.mini_batch > 0 ? o.mini_batch : N;
  std::map<std::string, double> acc;
  int64_t updates = 0;
  for (int64_t e = 0; e < o.ppo_epochs; ++e)
    for (int64_t s = 0; s < N; s += mb, ++updates) {
      Autocast cast(r.actor.device(), o.precision.bf16);  // closed after this mini-batch's optimizer steps
      const std::vector<Part> parts = parts_of(ro.mask, s, std::min(mb, N - s), o.micro_batch);
      actor_step(r, ro, t, parts, acc);
      if (o.has_critic()) critic_step(r, ro, t, parts, acc);
    }
  for (auto& [k, v] : acc) m[k] = v / static_cast<double>(std::max<int64_t>(updates, 1));
  if (o.has_critic()) m["explained_variance"] = explained_variance(t.old_values, t.returns, ro.mask);
}

}  // namespace

namespace {

// Actor and critic (--advantage gae only) from the checkpoint when there is one, else from --actor
// / --critic; float32 master weights on either device.
std::unique_ptr<PpoRun> open_run(const PpoOptions& o, const Tokenizer& tok, bool resume) {
  at::Device dev = device_named(o.device);
  auto r = std::make_unique<PpoRun>(PpoRun{o, {}, {}, {}, {}, nullptr, nullptr, 0, {}});
  r->actor = CausalLM::load(resume ? checkpoint_dir(o.out, "actor") : o.actor, dev, at::kFloat);
  if (o.kl_coef > 0) r->ref = CausalLM::load(o.actor, dev, at::kFloat);
  r->actor.set_requires_grad(true);
  r->actor.set_checkpointing(o.precision.checkpointing);
  r->actor_opt = std::make_unique<torch::optim::AdamW>(
      r->actor.parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  r->pad = tok.pad_id().value_or(tok.eos_id().value_or(0));
  if (auto eos = tok.eos_id()) r->stops.push_back(*eos);
  if (!o.has_critic()) return r;
  r->critic = ValueModel::load(resume ? checkpoint_dir(o.out, "critic") : (o.critic.empty() ? o.actor : o.critic), dev);
  r->critic.set_requires_grad(true);
  r->critic.set_checkpointing(o.precision.checkpointing);
  r->critic_opt = std::make_unique<torch::optim::AdamW>(
      r->critic.parameters(), torch::optim::AdamWOptions(o.critic_lr).weight_decay(o.weight_decay));
  return r;
}

}  // namespace

void check_ppo_options(const PpoOptions& o, bool multi_turn) {
  OPFORGE_CHECK(o.batch > 0 && o.rollouts_per_task > 0 && o.ppo_epochs > 0, "--batch, --rollouts-per-task and "
                "--ppo-epochs must be > 0");
  OPFORGE_CHECK(o.mini_batch >= 0 && o.micro_batch >= 0, "--mini-batch and --micro-batch must be >= 0 (0: all at once)");
  // The update scores logits / temperature (action_logp): 0 would divide by zero, and the policy
  // server takes at most 2 (--multi-turn's episodes would fail every request).
  OPFORGE_CHECK(o.temperature > 0, "--temperature must be > 0, not {} (PPO samples its answers)", o.temperature);
  OPFORGE_CHECK(!multi_turn || o.temperature <= 2, "--multi-turn: --temperature must be <= 2 (the policy server's "
                "limit), not {}", o.temperature);
  OPFORGE_CHECK(o.advantage == "gae" || o.advantage == "rloo" || o.advantage == "grpo",
                "--advantage must be gae, rloo or grpo, not \"{}\"", o.advantage);
  // A group estimator compares one prompt's answers, and --multi-turn makes a sample of every turn:
  // the turns of one episode would be each other's baseline.
  OPFORGE_CHECK(o.has_critic() || !multi_turn, "--advantage {} compares one prompt's answers, and --multi-turn makes "
                "a sample of every turn: use --advantage gae with --multi-turn", o.advantage);
  OPFORGE_CHECK(o.has_critic() || o.critic.empty(), "--critic {}: --advantage {} trains no critic; drop --critic or "
                "use --advantage gae", o.critic.string(), o.advantage);
}

json trajectory_record(const Sample& x) {
  std::vector<int64_t> seq = x.prompt;
  seq.insert(seq.end(), x.answer.tokens.begin(), x.answer.tokens.end());
  return {{"task_id", x.task_id}, {"ids", seq}, {"prompt_len", x.prompt.size()}, {"logprobs", x.answer.logprobs},
          {"reward", x.reward ? json(*x.reward) : json()}};
}

PpoResult train_ppo(const PpoOptions& o, const std::vector<Prompt>& prompts, const Tokenizer& tok,
                    const RewardFn& reward, const EpisodeFn& episodes) {
  OPFORGE_CHECK(!prompts.empty(), "train ppo: no task prompts");
  check_ppo_options(o, static_cast<bool>(episodes));
  fs::create_directories(o.out);
  spdlog::info("ppo options: {}", o.to_json().dump());
  bool resume = has_checkpoint(o.out);
  // A checkpoint of the other estimator has no critic, or one this run would drop: refuse to mix.
  const std::string was = resume ? checkpoint_extra(o.out).value("advantage", std::string("gae")) : o.advantage;
  OPFORGE_CHECK(was == o.advantage, "train ppo: {} was trained with --advantage {}, not {}: resume it with "
                "--advantage {}, or give a new --out", checkpoint_dir(o.out).string(), was, o.advantage, was);
  auto r = open_run(o, tok, resume);
  r->episodes = episodes;
  std::vector<CheckpointPart> parts = {{"actor", [&](const fs::path& d) { r->actor.save(d); }, r->actor_opt.get()}};
  if (o.has_critic())
    parts.push_back({"critic", [&](const fs::path& d) { r->critic.save(d); }, r->critic_opt.get()});
  TrainState st = resume ? load_checkpoint(o.out, parts, "ppo") : TrainState{};
  MetricsLog log(o.out / "metrics.jsonl", st.step), trajectories(o.out / "trajectories.jsonl", st.step);
  PpoResult res;
  Progress progress("ppo", static_cast<std::size_t>(o.steps));
  progress.tick(static_cast<std::size_t>(st.step));
  for (int64_t step = st.step + 1; step <= o.steps; ++step) {
    auto t0 = Clock::now();
    reset_peak_memory(r->actor.device());
    json m = {{"step", step}};
    if (auto ro = scored_rollout(*r, prompts, tok, reward, step, m, trajectories)) {
      update(*r, ro->first, ro->second, m);
    } else {
      spdlog::warn("ppo step {}: every answer's reward was null (the judge failed); no update", step);
    }
    m["seconds"] = secs_since(t0);
    if (auto gib = peak_memory_gib(r->actor.device())) m["peak_mem_gib"] = *gib;
    res.reward_mean.push_back(m["reward_mean"].get<double>());
    log.write(m);
    save_checkpoint(o.out, parts, {step, {{"stage", "ppo"}, {"advantage", o.advantage}}});
    progress.tick(1, fmt::format("reward {:.3f}", m["reward_mean"].get<double>()));
  }
  progress.finish();
  res.actor_dir = o.out / "actor";
  r->actor.save(res.actor_dir);
  if (o.has_critic()) {
    res.critic_dir = o.out / "critic";
    r->critic.save(res.critic_dir);
  }
  std::vector<std::string> panels = {"reward_mean", "pass_rate", "approx_kl", "entropy"};
  if (o.has_critic())
    panels.insert(panels.end(), {"value_loss", "explained_variance"});
  else
    panels.push_back("mixed_groups");
  log.plot(o.out / "metrics.png", "opforge train ppo", panels);
  return res;
}

}  // namespace opforge::trainer
