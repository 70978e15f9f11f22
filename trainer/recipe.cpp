#include "recipe.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "evaluator.h"
#include "judge_process.h"
#include "multi_turn.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/paths.h"
#include "subprocess.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A preset section's keys as command-line options: {"max_new_tokens": 8} -> --max-new-tokens 8,
// true -> a flag, false -> nothing. Keys in `skip` belong to the recipe itself.
std::vector<std::string> options_of(const json& section, const std::set<std::string>& skip = {}) {
  std::vector<std::string> out;
  for (auto& [k, v] : section.items()) {
    if (skip.count(k) || v.is_object()) continue;
    std::string flag = "--" + k;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (v.is_boolean()) {
      if (v.get<bool>()) out.push_back(flag);
      continue;
    }
    out.push_back(flag);
    out.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  }
  return out;
}

struct Recipe {
  const RecipeOptions& o;
  json preset;
  std::string judge_url;

  json section(const std::string& name) const {
    OPFORGE_CHECK(preset.contains(name) && preset[name].is_object(), "recipe preset: no \"{}\" section (an object of "
                  "that stage's options)", name);
    return preset[name];
  }
  // The stage's result when an earlier run finished it (OUT/<dir>/stage.json).
  std::optional<json> done(const std::string& dir) const {
    fs::path f = o.out / dir / "stage.json";
    if (!fs::exists(f)) return std::nullopt;
    return json::parse(read_text(f));
  }
  void finish(const std::string& dir, const json& result) const {
    write_text_atomic(o.out / dir / "stage.json", result.dump(2) + "\n");
    spdlog::info("recipe: {} done: {}", dir, result.dump());
  }
  // `opforge train <args...>` in OUT/<dir>, its output in OUT/<dir>/stage.log.
  void train(const std::string& dir, std::vector<std::string> args) const {
    args.insert(args.begin(), {opforge_executable().string(), "train"});
    args.insert(args.end(), {"--device", o.device});
    spdlog::info("recipe: {}: {}", dir, fmt::join(args, " "));
    run_logged(args, "recipe stage " + dir, o.out / dir / "stage.log");
  }
};

fs::path warmup(const Recipe& r) {
  const std::string dir = "1_warmup";
  if (auto d = r.done(dir)) return d->at("actor").get<std::string>();
  auto args = options_of(r.section("warmup"));
  args.insert(args.begin(), {"ppo", "--actor", r.o.model.string(), "--tasks", r.o.tasks.string(), "--out",
                             (r.o.out / dir).string(), "--judge-url", r.judge_url});
  r.train(dir, args);
  r.finish(dir, {{"actor", (r.o.out / dir / "actor").string()}});
  return r.o.out / dir / "actor";
}

// Every turn of the RFT episodes in train value's trajectory format.
void write_trajectories(const std::vector<Sample>& samples, const fs::path& file) {
  std::ofstream out(file);
  for (const auto& s : samples) out << trajectory_record(s).dump() << "\n";
}

// Episodes of the warmed-up actor (served in this process), their turns as trajectories.
fs::path collect(const Recipe& r, const fs::path& actor, const json& rft, const fs::path& dir) {
  MultiTurnOptions m;
  m.tokenizer_dir = actor;
  m.out = dir / "rollouts";
  m.judge_url = r.judge_url;
  m.rollouts_per_task = rft.value("rollouts_per_task", int64_t{1});
  m.max_turns = rft.value("max_turns", int64_t{8});
  m.max_new_tokens = rft.value("max_new_tokens", int64_t{1024});
  m.agent_concurrency = rft.value("agent_concurrency", int64_t{4});
  m.temperature = rft.value("temperature", 1.0);
  std::vector<Prompt> tasks;
  for (const auto& t : evaluator::load_tasks(r.o.tasks)) {
    m.code[t.name] = t.code;
    tasks.push_back({t.name, {}});
  }
  CausalLM model = CausalLM::load(actor, device_named(r.o.device));
  json metrics;
  write_trajectories(multi_turn_episodes(m)(model, 0, tasks, metrics), dir / "trajectories.jsonl");
  spdlog::info("recipe: RFT episodes: {}", metrics.dump());
  return m.out / "step_0";
}

// The kept episodes of every agent run, as one chat-record file; how many were kept.
int64_t rft_set(const Recipe& r, const fs::path& runs, int64_t k_runs, const json& rft, const fs::path& file) {
  std::string all;
  for (int64_t k = 0; k < k_runs; ++k) {
    fs::path one = file.parent_path() / fmt::format("rft_r{}.jsonl", k);
    std::vector<std::string> args = {opforge_executable().string(), "agent", "sft", "--trajectories",
                                     (runs / fmt::format("r{}", k)).string(), "--out", one.string(), "--device", r.o.device,
                                     "--min-reward", std::to_string(rft.value("min_reward", 1)),
                                     "--max-failed-calls", std::to_string(rft.value("max_failed_calls", -1))};
    for (const auto& a : r.o.judge_args) args.push_back("--judge-arg=" + a);
    run_logged(args, "opforge agent sft", file.parent_path() / fmt::format("agent_sft_r{}.log", k));
    all += read_text(one);
  }
  write_text_atomic(file, all);
  return static_cast<int64_t>(std::count(all.begin(), all.end(), '\n'));
}

fs::path rft(const Recipe& r, const fs::path& warm) {
  const std::string dir = "2_rft";
  if (auto d = r.done(dir)) return d->at("actor").get<std::string>();
  json sec = r.section("rft");
  fs::path out = r.o.out / dir;
  fs::create_directories(out);
  fs::path runs = collect(r, warm, sec, out);
  int64_t kept = rft_set(r, runs, sec.value("rollouts_per_task", int64_t{1}), sec, out / "rft.jsonl");
  fs::path actor = warm;
  if (kept > 0) {
    auto args = options_of(sec.value("sft", json::object()));
    args.insert(args.begin(), {"sft", "--model", warm.string(), "--data", (out / "rft.jsonl").string(), "--out",
                               (out / "sft").string()});
    r.train(dir, args);
    actor = out / "sft" / "model";
  } else {
    spdlog::warn("recipe: no episode of the warmed-up actor was kept for RFT: its fine-tuning is skipped and the "
                 "warmed-up actor goes on (a stronger start, or more rollouts, would give some)");
  }
  r.finish(dir, {{"actor", actor.string()}, {"kept", kept}, {"trajectories", (out / "trajectories.jsonl").string()}});
  return actor;
}

fs::path value(const Recipe& r, const fs::path& actor) {
  const std::string dir = "3_value";
  if (auto d = r.done(dir)) return d->at("critic").get<std::string>();
  auto args = options_of(r.section("value"));
  args.insert(args.begin(), {"value", "--model", actor.string(), "--trajectories",
                             (r.o.out / "2_rft" / "trajectories.jsonl").string(), "--out", (r.o.out / dir).string()});
  r.train(dir, args);
  r.finish(dir, {{"critic", (r.o.out / dir / "critic").string()}});
  return r.o.out / dir / "critic";
}

fs::path agentic(const Recipe& r, const fs::path& actor, const fs::path& critic) {
  const std::string dir = "4_ppo";
  if (auto d = r.done(dir)) return d->at("actor").get<std::string>();
  auto args = options_of(r.section("ppo"));
  args.insert(args.begin(), {"ppo", "--multi-turn", "--actor", actor.string(), "--critic", critic.string(), "--tasks",
                             r.o.tasks.string(), "--out", (r.o.out / dir).string(), "--judge-url", r.judge_url});
  r.train(dir, args);
  r.finish(dir, {{"actor", (r.o.out / dir / "actor").string()}});
  return r.o.out / dir / "actor";
}

}  // namespace

fs::path run_recipe(const RecipeOptions& o) {
  fs::path preset = o.preset.empty() ? data_dir() / "recipes" / "paper.json" : o.preset;
  OPFORGE_CHECK(fs::exists(preset), "recipe preset {} not found (see data/recipes/)", preset.string());
  fs::create_directories(o.out);
  Recipe r{o, json::parse(read_text(preset)), o.judge_url};
  spdlog::info("recipe: preset {}: {}", preset.string(), r.preset.dump());
  std::unique_ptr<evaluator::JudgeProcess> judge;
  if (r.judge_url.empty()) {
    judge = std::make_unique<evaluator::JudgeProcess>(o.tasks, o.device, o.judge_args, o.out / "judge");
    r.judge_url = judge->url();
  }
  fs::path warm = warmup(r);
  fs::path actor = rft(r, warm);
  fs::path critic = value(r, actor);
  return agentic(r, actor, critic);
}

}  // namespace opforge::trainer
