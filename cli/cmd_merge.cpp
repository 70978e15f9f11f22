#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.h"
#include "composer.h"
#include "crawler.h"
#include "dedup.h"
#include "filter.h"
#include "merge.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/llm_client.h"
#include "opforge/core/store.h"

namespace opforge::cli {

namespace fs = std::filesystem;

namespace {

// Every stage's schema at this opforge's version, so merge compares tables column for column.
void migrate_all(Db& db) {
  crawler::migrate(db);
  composer::migrate(db);
  llm::migrate_cache(db);
  filter::migrate(db);
  dedup::migrate(db);
}

struct MergeOpts {
  std::string out, reports, report_file;
  std::vector<std::string> sources;
};

int merge_workspaces(const MergeOpts& o) {
  OPFORGE_CHECK(!o.sources.empty(), "merge --out {} needs the shard workspaces to merge", o.out);
  std::vector<fs::path> sources(o.sources.begin(), o.sources.end());
  for (auto& s : sources) {
    OPFORGE_CHECK(fs::is_regular_file(s / "opforge.db"), "no workspace at {} (no opforge.db)", s.string());
    Db db(s / "opforge.db");
    with_context(fmt::format("while bringing {} to this opforge's schema", s.string()), [&] { migrate_all(db); });
  }
  Workspace ws(o.out);
  migrate_all(ws.db());
  nlohmann::json report = merge::merge_workspaces(ws, sources);
  fs::path file = o.report_file.empty() ? ws.root() / "merge-report.json" : fs::path(o.report_file);
  with_context(fmt::format("while writing the merge report {}", file.string()),
               [&] { write_text_atomic(file, report.dump(2) + "\n"); });
  spdlog::info("merge: {} sources into {}: {} conflicts, {} tasks made twice (report: {}); run `opforge dedup "
               "--workspace {}` before export", sources.size(), o.out, report["conflicts"].size(),
               report["duplicates"].size(), file.string(), o.out);
  std::cout << report.dump() << "\n";
  return 0;
}

int merge_reports(const MergeOpts& o) {
  OPFORGE_CHECK(!o.sources.empty(), "merge --reports {} needs the report.json files to merge", o.reports);
  std::vector<fs::path> paths(o.sources.begin(), o.sources.end());
  nlohmann::json r = merge::merge_reports(paths, o.reports);
  spdlog::info("merge --reports: {} reports, {} rows into {}/report.json", paths.size(), r["results"].size(),
               o.reports);
  std::cout << r["summary"].dump() << "\n";
  return 0;
}

}  // namespace

void add_merge(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "merge",
      std::string("Join the workspaces of shards (compose/filter --shard I/N) into one: seeds, tasks, compose "
                  "failures, LLM cache, filter verdicts and configurations, every other table; then run dedup and "
                  "export on it. Idempotent: merging twice, or a source again, changes nothing. Not merged: dedup's "
                  "tables (dedup runs again) and filter leases. A task id composed at two indices is kept at the "
                  "lower index, the other recorded as a duplicate failure. Two verdicts of one task: ") +
          merge::kPrefer +
          "; the loser goes into the winner's history. Every conflict is logged and listed in the merge report "
          "(--report, default OUT/merge-report.json; also printed on stdout). Or, with --reports DIR, join `opforge "
          "eval` report.json files of shards into DIR/report.json and report.md, the summary recomputed.");
  auto o = std::make_shared<MergeOpts>();
  auto* out = cmd->add_option("-o,--out", o->out, "The merged workspace (created if missing; may already hold merges)");
  auto* reports = cmd->add_option("--reports", o->reports,
                                  "Instead: the folder to write the merged eval report into; the sources are "
                                  "report.json files");
  out->excludes(reports);
  cmd->add_option("sources", o->sources, "Shard workspaces (or, with --reports, report.json files)")->required();
  cmd->add_option("--report", o->report_file, "Where to write the merge report JSON (default OUT/merge-report.json)")
      ->excludes(reports);
  cmd->callback([&run, o] {
    run = [o] {
      OPFORGE_CHECK(!o->out.empty() || !o->reports.empty(),
                    "merge needs --out WORKSPACE (shard workspaces) or --reports DIR (eval report.json files)");
      return o->reports.empty() ? merge_workspaces(*o) : merge_reports(*o);
    };
  });
}

}  // namespace opforge::cli
