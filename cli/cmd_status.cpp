#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "commands.h"
#include "composer.h"
#include "crawler.h"
#include "dedup.h"
#include "filter.h"
#include "opforge/core/error.h"
#include "opforge/core/store.h"

namespace opforge::cli {

namespace {

// Candidates, filter and dedup: the counts of one workspace, or the total of several.
void print_stages(const nlohmann::json& st) {
  const auto& cands = st["candidates"];
  std::cout << fmt::format("\ncandidates: {} total\n", cands["total"].get<long>());
  for (auto& [b, n] : cands["by_backend"].items()) std::cout << fmt::format("  backend {:<12} {:>7}\n", b, n.get<long>());
  for (auto& [k, n] : cands["by_num_ops"].items()) std::cout << fmt::format("  {:<20} {:>7}\n", k, n.get<long>());
  for (auto& [b, reasons] : cands["failures"].items())
    for (auto& [r, n] : reasons.items())
      std::cout << fmt::format("  failed ({}) {:<22} {:>7}\n", b, r, n.get<long>());
  const auto& fl = st["filter"];
  std::cout << fmt::format("\nfilter: {} judged, {} accepted, {} rejected, {} pending\n", fl["judged"].get<long>(),
                           fl["accepted"].get<long>(), fl["rejected"].get<long>(), fl["pending"].get<long>());
  for (auto& [r, n] : fl["reasons"].items()) std::cout << fmt::format("  rejected {:<22} {:>7}\n", r, n.get<long>());
  if (fl["configs"].size() > 1)
    for (auto& [c, n] : fl["configs"].items())
      std::cout << fmt::format("  configuration {:<17} {:>7}  (verdicts of several: `filter --rejudge-stale`)\n", c,
                               n.get<long>());
  const auto& dd = st["dedup"];
  std::cout << fmt::format("\ndedup: {} kept, {} dropped, {} accepted since the last run\n", dd["kept"].get<long>(),
                           dd["dropped"].get<long>(), dd["pending"].get<long>());
  for (auto& [r, n] : dd["reasons"].items()) std::cout << fmt::format("  dropped {:<23} {:>7}\n", r, n.get<long>());
  if (dd["kept_with_reference"].get<long>() > 0) {
    std::cout << "  kept by cosine to the nearest reference\n";
    for (auto& b : dd["ref_similarity_histogram"])
      std::cout << fmt::format("  [{:.1f}, {:.1f}) {:>7}\n", b["from"].get<double>(), b["to"].get<double>(),
                               b["kept"].get<long>());
  }
}

void print_table(const nlohmann::json& st) {
  const auto& seeds = st["seeds"];
  std::cout << fmt::format("workspace {}\n\n", st["workspace"].get<std::string>());
  std::cout << fmt::format("seeds: {} total, {} runnable, {} skipped, {} pending\n\n", seeds["total"].get<long>(),
                           seeds["runnable"].get<long>(), seeds["skipped"].get<long>(), seeds["pending"].get<long>());
  std::cout << fmt::format("  {:<14} {:<22} {:>9} {:>9} {:>9}\n", "source", "category", "runnable", "skipped", "pending");
  for (auto& [source, cats] : seeds["by_category"].items()) {
    for (auto& [cat, c] : cats.items())
      std::cout << fmt::format("  {:<14} {:<22} {:>9} {:>9} {:>9}\n", source, cat, c["runnable"].get<long>(),
                               c["skipped"].get<long>(), c["pending"].get<long>());
    const auto& s = seeds["by_source"][source];
    std::cout << fmt::format("  {:<14} {:<22} {:>9} {:>9} {:>9}\n", source, "(all)", s["runnable"].get<long>(),
                             s["skipped"].get<long>(), s["pending"].get<long>());
  }
  print_stages(st);
  if (st.contains("done") && !st["done"].empty()) {
    std::cout << "\nfinished shards (done/):";
    for (auto& m : st["done"]) std::cout << " " << m.get<std::string>();
    std::cout << "\n";
  }
  if (!seeds["top_skip_reasons"].empty()) {
    std::cout << "\n  top skip reasons\n";
    for (auto& r : seeds["top_skip_reasons"])
      std::cout << fmt::format("  {:>6}  {:<14} {}\n", r["count"].get<long>(), r["source"].get<std::string>(),
                               r["reason"].get<std::string>());
  }
}

// The completion markers of shards (done/*.json: compose, filter, a launcher's), by name.
nlohmann::json markers(const std::filesystem::path& ws) {
  std::vector<std::string> names;
  if (std::filesystem::is_directory(ws / "done"))
    for (auto& e : std::filesystem::directory_iterator(ws / "done"))
      if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

nlohmann::json workspace_status(const std::string& dir) {
  OPFORGE_CHECK(std::filesystem::exists(std::filesystem::path(dir) / "opforge.db"),
                "no workspace at {} (no opforge.db): run `opforge crawl --workspace {}` first", dir, dir);
  Workspace ws(dir);
  return {{"workspace", std::filesystem::absolute(dir).string()},
          {"seeds", crawler::status(ws.db())},
          {"candidates", composer::status(ws.db())},
          {"filter", filter::status(ws.db())},
          {"dedup", dedup::status(ws.db())},
          {"done", markers(dir)}};
}

// Adds the counts (integers) of `part` into `total`, key by key; lists of bins element by
// element; anything else (bin edges, names) is taken from the first workspace.
void add_counts(nlohmann::json& total, const nlohmann::json& part) {
  if (total.is_null()) {
    total = part;
  } else if (total.is_number_integer() && part.is_number_integer()) {
    total = total.get<long>() + part.get<long>();
  } else if (total.is_object() && part.is_object()) {
    for (auto& [k, v] : part.items()) add_counts(total[k], v);
  } else if (total.is_array() && part.is_array() && total.size() == part.size()) {
    for (std::size_t i = 0; i < part.size(); ++i) add_counts(total[i], part[i]);
  }
}

// Candidates, verdicts and dedup summed over the workspaces (seeds are not: shards share them),
// and the markers of finished shards counted.
nlohmann::json total_of(const std::vector<nlohmann::json>& all) {
  nlohmann::json total = {{"workspaces", all.size()}, {"candidates", nullptr}, {"filter", nullptr},
                          {"dedup", nullptr}, {"done", nlohmann::json::object()}};
  for (auto& st : all) {
    for (auto* k : {"candidates", "filter", "dedup"}) add_counts(total[k], st[k]);
    for (auto& m : st["done"]) {
      std::string stage = m.get<std::string>().substr(0, m.get<std::string>().find('.'));
      total["done"][stage] = total["done"].value(stage, 0L) + 1;
    }
  }
  return total;
}

void print_total(const nlohmann::json& total) {
  std::cout << fmt::format("\n==== total over {} workspaces (seeds: per workspace above)\n",
                           total["workspaces"].get<long>());
  print_stages(total);
  std::cout << "\nfinished shards (done/ markers)\n";
  for (auto& [stage, n] : total["done"].items()) std::cout << fmt::format("  {:<14} {:>7}\n", stage, n.get<long>());
}

}  // namespace

void add_status(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "status", "Counts per stage: where every seed and task went, and why. Several workspaces (the shards of an array "
                "job): each, then the total of candidates, verdicts and dedup and the shards finished per stage");
  auto workspaces = std::make_shared<std::vector<std::string>>();
  auto as_json = std::make_shared<bool>(false);
  cmd->add_option("-w,--workspace,workspaces", *workspaces,
                  "Workspace folders (repeat --workspace or list them; default: workspace)");
  cmd->add_flag("--json", *as_json,
                "Print one JSON object on stdout instead of tables; with several workspaces "
                "{\"workspaces\": [...], \"total\": {...}}");
  cmd->callback([&run, workspaces, as_json] {
    run = [workspaces, as_json] {
      if (workspaces->empty()) workspaces->push_back("workspace");
      std::vector<nlohmann::json> all;
      for (auto& w : *workspaces) all.push_back(workspace_status(w));
      if (all.size() == 1) {
        if (*as_json) std::cout << all[0].dump() << "\n";
        else print_table(all[0]);
        return 0;
      }
      nlohmann::json total = total_of(all);
      if (*as_json) {
        std::cout << nlohmann::json{{"workspaces", all}, {"total", total}}.dump() << "\n";
        return 0;
      }
      for (std::size_t i = 0; i < all.size(); ++i) {
        if (i) std::cout << "\n";
        print_table(all[i]);
      }
      print_total(total);
      return 0;
    };
  });
}

}  // namespace opforge::cli
