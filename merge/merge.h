// opforge merge: shard workspaces (and shard eval reports) joined into one (issue #16).
//
// Workspaces: every table of every stage is copied row by row through SQLite's ATTACH, one
// transaction per source, so merging twice or merging a source again changes nothing. Rows are
// matched by their primary key; time stamps and timings (columns named *_at, *_ms) are not
// compared. Not merged: dedup_results and dedup_config (dedup runs again on the merged
// workspace, over all of its tasks at once), schema_versions (checked equal instead) and lease
// tables and their holders (*leases, *holders: which process judges which task, meaningless once
// the shards ended).
//
// Rules where two sources disagree (each one reported on stderr and in the report):
// - tasks: the same id composed at two indices is one task, kept at the lower index of its
//   backend and seed, the other index recorded in compose_failures as `duplicate`, which is what
//   one unsharded run commits. Other differing rows: the row already merged stays.
// - filter_results (verdict, reason or configuration differ): kPrefer below. The verdict that
//   loses goes into the winner's history, as a re-judged verdict does.
// - any other table: the row already merged stays (the first source on the command line).
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "opforge/core/store.h"

namespace opforge::merge {

// The filter's conflict rule, as --help and the report state it.
inline constexpr const char* kPrefer =
    "a verdict judged under the prevailing filter configuration (the one most of the merged tasks were judged "
    "under) beats one judged under another; then the later judged_at; then, judged in the same second, rejected "
    "beats accepted (a task judged both ways under one configuration is flaky)";

// Merges each source workspace's opforge.db into out's. The schemas must already be those of
// this opforge (the caller migrates every stage); a source that is out itself, lacks opforge.db
// or has another schema version is an opforge::Error. Copies the sources' done/ markers that out
// lacks. Returns the report: per source and table the rows added, the conflicts and duplicates.
nlohmann::json merge_workspaces(Workspace& out, const std::vector<std::filesystem::path>& sources);

// Joins `opforge eval` report.json files of shards into out/report.json and out/report.md: the
// rows concatenated (a task/solution pair in two reports kept from the first, reported), the
// summary recomputed by the evaluator's own code, counts of the parts summed. Reports judged under
// different judges, policies, devices, tolerances or margins are an opforge::Error. Returns the
// merged report.
nlohmann::json merge_reports(const std::vector<std::filesystem::path>& reports, const std::filesystem::path& out);

}  // namespace opforge::merge
