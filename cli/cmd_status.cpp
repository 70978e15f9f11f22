#include <fmt/format.h>

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
  if (!seeds["top_skip_reasons"].empty()) {
    std::cout << "\n  top skip reasons\n";
    for (auto& r : seeds["top_skip_reasons"])
      std::cout << fmt::format("  {:>6}  {:<14} {}\n", r["count"].get<long>(), r["source"].get<std::string>(),
                               r["reason"].get<std::string>());
  }
}

}  // namespace

void add_status(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("status", "Counts per stage: where every seed and task went, and why");
  auto workspace = std::make_shared<std::string>("workspace");
  auto as_json = std::make_shared<bool>(false);
  add_workspace_option(*cmd, *workspace);
  cmd->add_flag("--json", *as_json, "Print one JSON object on stdout instead of tables");
  cmd->callback([&run, workspace, as_json] {
    run = [workspace, as_json] {
      OPFORGE_CHECK(std::filesystem::exists(std::filesystem::path(*workspace) / "opforge.db"),
                    "no workspace at {} (no opforge.db): run `opforge crawl --workspace {}` first", *workspace,
                    *workspace);
      Workspace ws(*workspace);
      nlohmann::json st = {{"workspace", std::filesystem::absolute(*workspace).string()},
                           {"seeds", crawler::status(ws.db())},
                           {"candidates", composer::status(ws.db())},
                           {"filter", filter::status(ws.db())},
                           {"dedup", dedup::status(ws.db())}};
      if (*as_json)
        std::cout << st.dump() << "\n";
      else
        print_table(st);
      return 0;
    };
  });
}

}  // namespace opforge::cli
