// The summary of an agent run (agent.h): what a trainer or a person looks at first.
#include <fmt/format.h>

#include <map>

#include "agent.h"

using nlohmann::json;

namespace opforge::agent {

json summarize_episodes(const std::vector<json>& records) {
  std::map<std::string, long> hist = {{"-1", 0}, {"1", 0}, {"2", 0}, {"3", 0}}, endings, reasons;
  long passed = 0, turns = 0, prompt = 0, completion = 0, estimated = 0;
  for (auto& r : records) {
    int rw = r.value("reward", json(-1)).is_number() ? r["reward"].get<int>() : -1;
    ++hist[std::to_string(rw)];
    passed += rw >= 1;
    turns += r.value("turns", 0);
    const json& tk = r.value("tokens", json::object());
    prompt += tk.value("prompt", 0L);
    completion += tk.value("completion", 0L);
    estimated += tk.value("estimated", false);
    ++endings[r.value("ended", std::string("?"))];
    if (r.contains("reason") && r["reason"].is_string()) ++reasons[r["reason"].get<std::string>()];
  }
  double n = records.empty() ? 1.0 : static_cast<double>(records.size());
  return {{"episodes", records.size()}, {"pass_rate", passed / n}, {"reward_histogram", hist},
          {"mean_turns", turns / n}, {"tokens", {{"prompt", prompt}, {"completion", completion},
                                                 {"episodes_estimated", estimated}}},
          {"endings", endings}, {"reasons", reasons}};
}

std::string summary_markdown(const json& s) {
  std::string md = "# opforge agent\n\n| | |\n| --- | --- |\n";
  md += fmt::format("| episodes | {} |\n| pass rate (reward >= 1) | {:.1f}% |\n| mean turns | {:.1f} |\n",
                    s["episodes"].get<long>(), 100 * s["pass_rate"].get<double>(), s["mean_turns"].get<double>());
  md += fmt::format("| tokens (prompt / completion) | {} / {}{} |\n", s["tokens"]["prompt"].get<long>(),
                    s["tokens"]["completion"].get<long>(),
                    s["tokens"]["episodes_estimated"].get<long>() ? " (some episodes: no usage, estimated)" : "");
  md += fmt::format("| not finished (errors.jsonl, run again next time) | {} |\n\n", s.value("errors_pending", 0L));
  md += "| reward | episodes |\n| --- | --- |\n";
  for (auto& [k, v] : s["reward_histogram"].items()) md += fmt::format("| {} | {} |\n", k, v.get<long>());
  md += "\n| ended | episodes |\n| --- | --- |\n";
  for (auto& [k, v] : s["endings"].items()) md += fmt::format("| {} | {} |\n", k, v.get<long>());
  if (!s["reasons"].empty()) {
    md += "\n| judge's reason | episodes |\n| --- | --- |\n";
    for (auto& [k, v] : s["reasons"].items()) md += fmt::format("| `{}` | {} |\n", k, v.get<long>());
  }
  return md;
}

}  // namespace opforge::agent
