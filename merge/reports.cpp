// merge --reports: `opforge eval` report.json files of shards joined into one report.
#include <spdlog/spdlog.h>

#include <fstream>
#include <map>

#include "internal.h"  // evaluator::summarize: the merged summary is the evaluator's own, not a copy
#include "merge.h"
#include "opforge/core/error.h"

namespace opforge::merge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Options that change what a row means: rows judged under different ones cannot share a summary.
const std::vector<std::string> kSameOptions = {"judge", "policy", "device", "device_name", "torch", "trials",
                                               "correct_trials", "atol", "rtol", "speedup_margin"};
// Counts of each part that the rows do not carry; summed.
const std::vector<std::string> kSummedCounts = {"tasks", "tasks_without_solution", "unmatched_solutions", "resumed"};

json read_report(const fs::path& p) {
  return with_context(fmt::format("while reading the eval report {}", p.string()), [&] {
    std::ifstream f(p);
    OPFORGE_CHECK(f.good(), "cannot read {} (give the report.json files that `opforge eval` wrote)", p.string());
    json r = json::parse(f);
    OPFORGE_CHECK(r.contains("results") && r.contains("summary") && r.contains("options"),
                  "{} is not an `opforge eval` report.json (no results, summary or options)", p.string());
    return r;
  });
}

void check_same_options(const json& first, const json& r, const fs::path& first_path, const fs::path& p) {
  for (auto& k : kSameOptions) {
    json a = first["options"].value(k, json(nullptr)), b = r["options"].value(k, json(nullptr));
    OPFORGE_CHECK(a == b, "{} was judged with {} = {}, {} with {}: their rows cannot share one summary", p.string(),
                  k, b.dump(), first_path.string(), a.dump());
  }
}

// The rows of every part by (task, solution); a pair in two parts keeps the first part's row.
json joined_rows(const std::vector<json>& parts, const std::vector<fs::path>& paths, json& conflicts) {
  std::map<std::pair<std::string, std::string>, std::size_t> seen;
  json rows = json::array();
  for (std::size_t i = 0; i < parts.size(); ++i)
    for (auto& r : parts[i]["results"]) {
      auto key = std::make_pair(r["task"].get<std::string>(), r["solution"].get<std::string>());
      auto [it, fresh] = seen.emplace(key, rows.size());
      if (fresh) {
        rows.push_back(r);
      } else if (rows[it->second] != r) {
        spdlog::warn("merge --reports: {} / {} is in {} and in an earlier report with another result; the first is "
                     "kept", key.first, key.second, paths[i].string());
        conflicts.push_back({{"task", key.first}, {"solution", key.second}, {"report", paths[i].string()}});
      }
    }
  std::sort(rows.begin(), rows.end(), [](const json& a, const json& b) {
    return std::make_pair(a["task"].get<std::string>(), a["solution"].get<std::string>()) <
           std::make_pair(b["task"].get<std::string>(), b["solution"].get<std::string>());
  });
  return rows;
}

}  // namespace

json merge_reports(const std::vector<fs::path>& paths, const fs::path& out) {
  OPFORGE_CHECK(!paths.empty(), "merge --reports needs at least one report.json");
  std::vector<json> parts;
  for (auto& p : paths) {
    parts.push_back(read_report(p));
    check_same_options(parts.front(), parts.back(), paths.front(), p);
  }
  json conflicts = json::array();
  json rows = joined_rows(parts, paths, conflicts);
  json options = parts.front()["options"];
  double margin = options.value("speedup_margin", 0.05);
  json summary = evaluator::summarize(rows, margin);
  for (auto& k : kSummedCounts) {
    long n = 0;
    for (auto& p : parts) n += p["summary"].value(k, 0L);
    summary[k] = n;
  }
  long reused = 0;
  for (auto& r : rows) reused += r.value("baseline_cached", json(false)).is_boolean() && r["baseline_cached"].get<bool>();
  summary["baselines_reused"] = reused;
  json seeds = json::array(), sources = json::array();
  double seconds = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    seeds.push_back(parts[i]["options"].value("seed", json(nullptr)));
    sources.push_back(fs::absolute(paths[i]).string());
    seconds += parts[i].value("seconds", 0.0);
  }
  options["seeds"] = seeds;  // each part's input seed; "seed" stays the first's (report.md shows it)
  options["merged_from"] = sources;
  json report = {{"summary", summary}, {"results", rows}, {"options", options}, {"seconds", seconds},
                 {"version", parts.front().value("version", "")}, {"merge_conflicts", conflicts}};
  with_context(fmt::format("while writing the merged report into {}", out.string()), [&] {
    fs::create_directories(out);
    std::ofstream(out / "report.json") << report.dump(2) << "\n";
    std::ofstream(out / "report.md") << evaluator::report_markdown(report);
  });
  return report;
}

}  // namespace opforge::merge
