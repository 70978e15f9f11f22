#include "eval_stage.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>

#include "files.h"
#include "generate.h"
#include "judge_reward.h"
#include "opforge/core/error.h"
#include "opforge/core/progress.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using json = nlohmann::json;

json ModelEvalOptions::to_json() const {
  return {{"model", model.string()}, {"tasks", tasks.string()}, {"out", out.string()}, {"split", split},
          {"limit", limit}, {"max_new_tokens", max_new_tokens}, {"batch", batch}, {"device", device}};
}

namespace {

// What SRC is, for the error of --split on tasks that carry no split.
std::string source_kind(const fs::path& src) {
  if (fs::is_regular_file(src)) return src.extension() == ".py" ? "a .py task" : "a shard without split fields";
  if (fs::exists(src / "opforge.db")) return "a workspace";
  for (auto& e : list_dir(src))
    if (e.filename().string().find(".jsonl") != std::string::npos) return "shards without split fields";
  return "a folder of .py tasks";
}

}  // namespace

std::vector<Prompt> eval_prompts(const ModelEvalOptions& o, const Tokenizer& tok) {
  std::vector<evaluator::EvalTask> tasks = evaluator::load_tasks(o.tasks), picked;
  for (auto& t : tasks) {
    if (o.limit > 0 && static_cast<int64_t>(picked.size()) >= o.limit) break;
    OPFORGE_CHECK(o.split.empty() || !t.split.empty(), "--split: --tasks {} is {}, whose tasks have no split "
                  "(`opforge export` draws it into the shards' records): give the exported shards, or leave --split out",
                  o.tasks.string(), source_kind(o.tasks));
    if (o.split.empty() || t.split == o.split) picked.push_back(std::move(t));
  }
  OPFORGE_CHECK(!picked.empty(), "--tasks {}{} holds no task", o.tasks.string(),
                o.split.empty() ? "" : " (split " + o.split + ")");
  return task_prompts(picked, tok);  // only the picked tasks' prompts are rendered
}

namespace {

std::vector<Generation> greedy_answers(const ModelEvalOptions& o, const std::vector<Prompt>& prompts,
                                       const Tokenizer& tok) {
  CausalLM model = CausalLM::load(o.model, device_named(o.device));
  SampleOptions so;
  so.greedy = true;
  so.max_new_tokens = o.max_new_tokens;
  if (auto eos = tok.eos_id()) so.stop_ids.push_back(*eos);
  so.pad_id = tok.pad_id().value_or(tok.eos_id().value_or(0));
  std::vector<Generation> out;
  Progress progress("eval", prompts.size());
  for (std::size_t i = 0; i < prompts.size(); i += static_cast<std::size_t>(o.batch)) {
    std::vector<std::vector<int64_t>> ps;
    for (std::size_t k = i; k < std::min(prompts.size(), i + static_cast<std::size_t>(o.batch)); ++k)
      ps.push_back(prompts[k].ids);
    for (auto& g : generate(model, ps, so)) out.push_back(std::move(g));
    progress.tick(ps.size());
  }
  progress.finish();
  return out;
}

json summary(const std::vector<std::optional<double>>& rewards) {
  json hist = {{"-1", 0}, {"1", 0}, {"2", 0}, {"3", 0}};
  int64_t judged = 0, pass = 0;
  double sum = 0;
  for (auto& r : rewards) {
    if (!r) continue;
    ++judged;
    sum += *r;
    pass += *r >= 1;
    std::string k = fmt::format("{:g}", *r);
    hist[k] = hist.value(k, 0) + 1;
  }
  json none;  // null: nothing was judged, so there is no rate to give
  return {{"tasks", rewards.size()}, {"judged", judged}, {"null", static_cast<int64_t>(rewards.size()) - judged},
          {"pass_at_1", judged ? json(static_cast<double>(pass) / judged) : none},
          {"mean_reward", judged ? json(sum / judged) : none}, {"reward_hist", hist}};
}

}  // namespace

json eval_model(const ModelEvalOptions& o, const std::vector<Prompt>& prompts, const Tokenizer& tok,
                const RewardFn& reward) {
  OPFORGE_CHECK(o.batch > 0 && o.max_new_tokens > 0, "--batch and --max-new-tokens must be > 0");
  spdlog::info("eval options: {}", o.to_json().dump());
  std::vector<Generation> gens = greedy_answers(o, prompts, tok);
  std::vector<std::string> ids, texts;
  std::vector<std::vector<int64_t>> tokens;
  for (std::size_t i = 0; i < gens.size(); ++i) {
    ids.push_back(prompts[i].task_id);
    texts.push_back(tok.decode(gens[i].tokens));
    tokens.push_back(gens[i].tokens);
  }
  spdlog::info("eval: judging {} answers", texts.size());
  std::vector<std::optional<double>> rw = reward(ids, texts, tokens);
  OPFORGE_CHECK(rw.size() == texts.size(), "the reward function answered {} rewards for {} answers", rw.size(),
                texts.size());
  if (!o.out.empty()) {
    std::ofstream out(o.out, std::ios::trunc);
    OPFORGE_CHECK(out, "cannot write --out {}", o.out.string());
    for (std::size_t i = 0; i < rw.size(); ++i)
      out << json{{"task_id", ids[i]}, {"reward", rw[i] ? json(*rw[i]) : json()}, {"finish", gens[i].finish},
                  {"response_tokens", gens[i].tokens.size()}, {"response", texts[i]}}.dump() << "\n";
  }
  json s = summary(rw);
  s["model"] = o.model.string();
  s["split"] = o.split.empty() ? json() : json(o.split);
  return s;
}

}  // namespace opforge::trainer
