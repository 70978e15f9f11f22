#include "eval_stage.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <functional>

#include "generate.h"
#include "judge_reward.h"
#include "opforge/core/error.h"
#include "opforge/core/hash.h"
#include "opforge/core/progress.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using json = nlohmann::json;

json ModelEvalOptions::to_json() const {
  return {{"model", model.string()}, {"tasks", tasks.string()}, {"out", out.string()}, {"split", split},
          {"limit", limit}, {"max_new_tokens", max_new_tokens}, {"batch", batch}, {"device", device}};
}

namespace {

bool is_shard(const fs::path& p) {
  std::string n = p.filename().string();
  return n.ends_with(".jsonl") || n.ends_with(".jsonl.gz");
}

// The shard files of SRC as load_tasks picks them; what SRC is instead, when it is not shards.
std::vector<fs::path> shard_files(const fs::path& src, std::string& instead) {
  OPFORGE_CHECK(fs::exists(src), "--tasks {} does not exist (give shards, a workspace or a folder of .py tasks)",
                src.string());
  std::vector<fs::path> out;
  if (fs::is_regular_file(src)) {
    if (is_shard(src)) out.push_back(src);
    instead = "a .py task";
  } else if (fs::exists(src / "opforge.db")) {
    instead = "a workspace";
  } else {
    for (auto& e : fs::directory_iterator(src))
      if (e.is_regular_file() && is_shard(e.path())) out.push_back(e.path());
    instead = "a folder of .py tasks";
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Each line of a shard with its number; zlib reads a plain file through as it is.
void for_each_line(const fs::path& p, const std::function<void(const std::string&, int64_t)>& f) {
  gzFile in = gzopen(p.c_str(), "rb");
  OPFORGE_CHECK(in != nullptr, "cannot open {}", p.string());
  std::string line;
  int64_t n = 0;
  for (char buf[1 << 16]; gzgets(in, buf, sizeof buf) != nullptr;) {
    line += buf;
    if (line.back() != '\n') continue;  // the rest of a long line comes with the next call
    line.pop_back();
    f(line, ++n);
    line.clear();
  }
  if (!line.empty()) f(line, ++n);
  int err = 0;
  std::string why = gzerror(in, &err);
  gzclose(in);
  OPFORGE_CHECK(err >= 0, "{} is not a readable shard: {}", p.string(), why);
}

}  // namespace

std::map<std::string, std::string> task_splits(const fs::path& src) {
  std::string instead;
  std::vector<fs::path> shards = shard_files(src, instead);
  OPFORGE_CHECK(!shards.empty(), "--split: --tasks {} is {}, whose tasks have no split (`opforge export` draws it "
                "into the shards' records): give the exported shards, or leave --split out", src.string(), instead);
  std::map<std::string, std::string> out;
  for (auto& s : shards)
    for_each_line(s, [&](const std::string& line, int64_t n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) return;
      json j = json::parse(line, nullptr, false);
      OPFORGE_CHECK(j.is_object() && j.contains("split") && j["split"].is_string() && j.contains("code"),
                    "--split: {} line {} has no split field (shards of `opforge export` have one): leave --split "
                    "out for these shards", s.string(), n);
      // The id load_tasks gives the record, which task_prompts names it by.
      std::string id = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>()
                                                               : xxh3_hex(j["code"].get<std::string>());
      out[id] = j["split"].get<std::string>();
    });
  return out;
}

std::vector<Prompt> eval_prompts(const ModelEvalOptions& o, const Tokenizer& tok) {
  std::map<std::string, std::string> split;
  if (!o.split.empty()) split = task_splits(o.tasks);
  std::vector<Prompt> out;
  for (auto& p : task_prompts(o.tasks, tok)) {
    if (o.limit > 0 && static_cast<int64_t>(out.size()) >= o.limit) break;
    if (o.split.empty() || split[p.task_id] == o.split) out.push_back(std::move(p));
  }
  OPFORGE_CHECK(!out.empty(), "--tasks {}{} holds no task", o.tasks.string(),
                o.split.empty() ? "" : " (split " + o.split + ")");
  return out;
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
