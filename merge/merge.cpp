#include "merge.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "opforge/core/error.h"

namespace opforge::merge {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// dedup runs again on the merged workspace; schema_versions is compared, not merged; leases and
// their holders (filter_leases, filter_holders) say which running process judges which task,
// which means nothing once the shards have ended.
bool merged_table(const std::string& name) {
  if (name.rfind("sqlite_", 0) == 0 || name == "schema_versions" || name == "dedup_results" || name == "dedup_config")
    return false;
  return !ends_with(name, "leases") && !ends_with(name, "holders");
}

struct Table {
  std::string name;
  std::vector<std::string> cols, pk;
};

// The columns two rows of one key must agree on: not the key, nor time stamps and timings
// (*_at, *_ms), which differ between any two runs of the same work.
std::vector<std::string> compared_columns(const Table& t) {
  std::vector<std::string> cmp;
  for (auto& c : t.cols)
    if (!ends_with(c, "_at") && !ends_with(c, "_ms") && std::find(t.pk.begin(), t.pk.end(), c) == t.pk.end())
      cmp.push_back(c);
  return cmp;
}

Table table_info(Db& db, const std::string& schema, const std::string& name) {
  Table t{name, {}, {}};
  std::vector<std::pair<long, std::string>> pk;
  auto st = db.prepare(fmt::format("PRAGMA {}.table_info(\"{}\")", schema, name));
  while (st.step()) {
    t.cols.push_back(st.text(1));
    if (st.int64(5) > 0) pk.emplace_back(st.int64(5), st.text(1));
  }
  std::sort(pk.begin(), pk.end());
  for (auto& [i, c] : pk) t.pk.push_back(c);
  return t;
}

std::vector<std::string> tables(Db& db, const std::string& schema) {
  std::vector<std::string> out;
  auto st = db.prepare(fmt::format("SELECT name FROM {}.sqlite_master WHERE type = 'table' ORDER BY name", schema));
  while (st.step()) out.push_back(st.text(0));
  return out;
}

// The order rows must arrive in: tasks before the tables that refer to them.
std::vector<std::string> merge_order(std::vector<std::string> names) {
  const std::vector<std::string> first = {"seeds", "tasks", "compose_failures", "llm_cache", "filter_configs",
                                          "filter_results"};
  std::vector<std::string> out;
  for (auto& f : first)
    if (std::find(names.begin(), names.end(), f) != names.end()) out.push_back(f);
  for (auto& n : names)
    if (std::find(first.begin(), first.end(), n) == first.end() && merged_table(n)) out.push_back(n);
  return out;
}

std::string quoted_list(const std::vector<std::string>& cols, const std::string& prefix = "") {
  std::string s;
  for (auto& c : cols) s += (s.empty() ? "" : ", ") + prefix + "\"" + c + "\"";
  return s;
}

// "s.a IS m.a AND s.b IS m.b" over the columns that must agree.
std::string same_row(const std::vector<std::string>& cols) {
  std::string s;
  for (auto& c : cols) s += fmt::format("{}s.\"{}\" IS m.\"{}\"", s.empty() ? "" : " AND ", c, c);
  return s.empty() ? "1" : s;
}

long changes(Db& db) { return sqlite3_changes(db.raw()); }

// A filter verdict as the conflict rule sees it (NULL reason or config as "").
struct Verdict {
  std::string verdict, reason, config, judged_at;
  json history;
  json entry() const {
    return {{"verdict", verdict}, {"reason", reason.empty() ? json(nullptr) : json(reason)},
            {"config", config.empty() ? json(nullptr) : json(config)}, {"judged_at", judged_at}};
  }
};

// kPrefer: a strict order, so the winner does not depend on the order of the sources.
bool beats(const Verdict& a, const Verdict& b, const std::string& prevailing) {
  bool ap = a.config == prevailing, bp = b.config == prevailing;
  if (ap != bp) return ap;
  if (a.judged_at != b.judged_at) return a.judged_at > b.judged_at;
  if (a.verdict != b.verdict) return a.verdict == "rejected";
  if (a.reason != b.reason) return a.reason < b.reason;
  return a.config < b.config;
}

// Both histories and the loser, each entry once, in the order they were judged.
json joined_history(const Verdict& win, const Verdict& lose) {
  std::vector<json> all;
  for (auto* h : {&win.history, &lose.history})
    for (auto& e : *h) all.push_back(e);
  all.push_back(lose.entry());
  auto key = [](const json& e) { return std::make_tuple(e.value("judged_at", ""), e.dump()); };
  std::sort(all.begin(), all.end(), [&](const json& a, const json& b) { return key(a) < key(b); });
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return json(all);
}

// The (backend, rng seed, index) a composed task was made at, when its provenance has one.
std::optional<std::tuple<std::string, std::int64_t, std::int64_t>> composed_at(const json& p) {
  if (!p.is_object() || !p.contains("index") || !p.contains("rng_seed") || !p.contains("backend")) return std::nullopt;
  return std::make_tuple(p["backend"].get<std::string>(), p["rng_seed"].get<std::int64_t>(),
                         p["index"].get<std::int64_t>());
}

class Merger {
 public:
  Merger(Db& db, json& report) : db_(db), report_(report) {}

  // The configuration most tasks' verdicts were made under, over out and every source.
  void find_prevailing(const std::vector<fs::path>& sources) {
    std::map<std::string, std::set<std::string>> tasks_of;
    auto count = [&](Db& d) {
      auto st = d.prepare("SELECT task_id, coalesce(config, '') FROM filter_results");
      while (st.step()) tasks_of[st.text(1)].insert(st.text(0));
    };
    count(db_);
    for (auto& s : sources) {
      Db d(s / "opforge.db");
      count(d);
    }
    std::size_t best = 0;
    for (auto& [config, ids] : tasks_of)  // ties: the smaller hash (the map's order), so any order agrees
      if (ids.size() > best) best = ids.size(), prevailing_ = config;
    report_["prevailing_config"] = prevailing_;
  }

  json source(const fs::path& ws);

 private:
  void check_schema();
  long generic(const Table& t);
  long tasks(const Table& t);
  long filter_results(const Table& t);
  long add_missing(const Table& t);
  void conflict(json c) {
    spdlog::warn("merge: conflict in {} at {}: {}", c["table"].get<std::string>(), c["key"].dump(),
                 c["resolution"].get<std::string>());
    report_["conflicts"].push_back(std::move(c));
    ++conflicts_;
  }

  Db& db_;
  json& report_;
  std::string prevailing_, source_;
  long conflicts_ = 0, duplicates_ = 0;
};

// Every component at the same schema version in out and the source (the caller migrated both
// with this opforge), so their tables have the same columns.
void Merger::check_schema() {
  auto st = db_.prepare(
      "SELECT s.component, s.version, m.version FROM src.schema_versions s LEFT JOIN main.schema_versions m USING "
      "(component) WHERE m.version IS NOT s.version");
  while (st.step())
    throw Error(fmt::format("{} has {} schema version {}, the merged workspace {}: open both with the same opforge "
                            "(any command, e.g. `opforge status`, brings a workspace to its schema)",
                            source_, st.text(0), st.int64(1), st.is_null(2) ? "none" : std::to_string(st.int64(2))));
}

// The source's rows whose key out lacks, added; the number added.
long Merger::add_missing(const Table& t) {
  db_.exec(fmt::format("INSERT INTO main.\"{0}\"({1}) SELECT {1} FROM src.\"{0}\" WHERE true ON CONFLICT DO NOTHING",
                       t.name, quoted_list(t.cols)));
  return changes(db_);
}

// Rows whose key out lacks are added; a differing row already there stays (reported).
long Merger::generic(const Table& t) {
  if (t.pk.empty()) {
    db_.exec(fmt::format("INSERT INTO main.\"{0}\"({1}) SELECT {1} FROM src.\"{0}\" EXCEPT SELECT {1} FROM main.\"{0}\"",
                         t.name, quoted_list(t.cols)));
    return changes(db_);
  }
  std::string on;
  for (auto& k : t.pk) on += fmt::format("{}s.\"{}\" = m.\"{}\"", on.empty() ? "" : " AND ", k, k);
  auto st = db_.prepare(fmt::format("SELECT json_array({}) FROM src.\"{}\" s JOIN main.\"{}\" m ON {} WHERE NOT ({})",
                                    quoted_list(t.pk, "s."), t.name, t.name, on, same_row(compared_columns(t))));
  while (st.step())
    conflict({{"table", t.name}, {"key", json::parse(st.text(0))}, {"source", source_},
              {"resolution", "kept the row merged first; this source's differs"}});
  return add_missing(t);
}

// A task id in out and the source with another row is one task composed twice (or imported
// twice). Composed by the same backend and seed, it is kept at the lower index and the other
// index becomes a `duplicate` failure: what one unsharded run commits. Otherwise out's row stays.
long Merger::tasks(const Table& t) {
  std::vector<std::tuple<std::string, json, json>> twice;  // id, source's provenance, out's
  {
    auto st = db_.prepare(fmt::format("SELECT s.id, s.provenance, m.provenance FROM src.tasks s JOIN main.tasks m "
                                      "USING (id) WHERE NOT ({})", same_row(compared_columns(t))));
    while (st.step()) twice.emplace_back(st.text(0), json::parse(st.text(1)), json::parse(st.text(2)));
  }
  for (auto& [id, theirs, ours] : twice) {
    auto a = composed_at(theirs), b = composed_at(ours);
    bool same_run = a && b && std::get<0>(*a) == std::get<0>(*b) && std::get<1>(*a) == std::get<1>(*b);
    bool theirs_wins = same_run && std::get<2>(*a) < std::get<2>(*b);
    const json& lost = theirs_wins ? ours : theirs;
    if (theirs_wins)
      db_.prepare(fmt::format("UPDATE main.tasks SET ({0}) = (SELECT {0} FROM src.tasks WHERE id = ?1) WHERE id = ?1",
                              quoted_list(t.cols)))
          .bind(1, id)
          .run();
    if (auto l = composed_at(lost))
      db_.prepare("INSERT OR IGNORE INTO main.compose_failures(backend, rng_seed, idx, bucket, reason, detail) "
                  "VALUES(?, ?, ?, ?, 'duplicate', ?)")
          .bind(1, std::get<0>(*l))
          .bind(2, std::get<1>(*l))
          .bind(3, std::get<2>(*l))
          .bind(4, lost.value("bucket", ""))
          .bind(5, "same normalised code as task " + id)
          .run();
    json d = {{"task_id", id}, {"source", source_}, {"kept", theirs_wins ? theirs : ours},
              {"dropped", lost}};
    spdlog::info("merge: task {} made twice: kept {}, the other recorded as a duplicate", id,
                 (theirs_wins ? theirs : ours).value("index", json(nullptr)).dump());
    report_["duplicates"].push_back(std::move(d));
    ++duplicates_;
  }
  return add_missing(t);
}

Verdict read_verdict(Stmt& st, int col) {
  return {st.text(col), st.text(col + 1), st.text(col + 2), st.text(col + 3), json::parse(st.text(col + 4))};
}

// Two verdicts of one task that differ in verdict, reason or configuration: kPrefer decides, the
// loser joins the winner's history.
long Merger::filter_results(const Table& t) {
  auto cols = [](const char* a) {
    return fmt::format("{0}.verdict, coalesce({0}.reason, ''), coalesce({0}.config, ''), {0}.judged_at, {0}.history", a);
  };
  std::vector<std::tuple<std::string, Verdict, Verdict>> differ;  // id, source's, out's
  {
    auto st = db_.prepare(fmt::format(
        "SELECT s.task_id, {}, {} FROM src.filter_results s JOIN main.filter_results m USING (task_id) WHERE NOT "
        "(s.verdict IS m.verdict AND s.reason IS m.reason AND s.config IS m.config)",
        cols("s"), cols("m")));
    while (st.step()) differ.emplace_back(st.text(0), read_verdict(st, 1), read_verdict(st, 6));
  }
  for (auto& [id, theirs, ours] : differ) {
    bool theirs_wins = beats(theirs, ours, prevailing_);
    const Verdict& win = theirs_wins ? theirs : ours;
    const Verdict& lose = theirs_wins ? ours : theirs;
    json history = joined_history(win, lose);
    if (theirs_wins)
      db_.prepare(fmt::format("INSERT OR REPLACE INTO main.filter_results({0}) SELECT {0} FROM src.filter_results "
                              "WHERE task_id = ?",
                              quoted_list(t.cols)))
          .bind(1, id)
          .run();
    db_.prepare("UPDATE main.filter_results SET history = ? WHERE task_id = ?").bind(1, history.dump()).bind(2, id).run();
    conflict({{"table", "filter_results"}, {"key", json::array({id})}, {"source", source_},
              {"kept", win.entry()}, {"dropped", lose.entry()},
              {"resolution", fmt::format("kept the {} verdict{}; the other is in its history", win.verdict,
                                         theirs_wins ? " of this source" : " merged before")}});
  }
  return add_missing(t);
}

// The source's done/ markers that out lacks (which shards of which stage the merge holds).
json copy_markers(const fs::path& from, const fs::path& to) {
  json copied = json::array();
  if (!fs::is_directory(from / "done")) return copied;
  fs::create_directories(to / "done");
  for (auto& e : fs::directory_iterator(from / "done")) {
    if (e.path().extension() != ".json") continue;
    auto dest = to / "done" / e.path().filename();
    if (fs::exists(dest)) continue;
    fs::copy_file(e.path(), dest);
    copied.push_back(e.path().filename().string());
  }
  return copied;
}

json Merger::source(const fs::path& ws) {
  source_ = fs::absolute(ws).string();
  conflicts_ = duplicates_ = 0;
  json added = json::object();
  db_.prepare("ATTACH DATABASE ? AS src").bind(1, (ws / "opforge.db").string()).run();
  try {
    db_.transaction([&] {
      check_schema();
      for (auto& name : merge_order(tables(db_, "src"))) {
        OPFORGE_CHECK(db_.has_table(name),
                      "{} has a table {} that this opforge does not make: merge with the opforge that made it",
                      source_, name);
        Table t = table_info(db_, "main", name);
        Table theirs = table_info(db_, "src", name);
        OPFORGE_CHECK(theirs.cols == t.cols, "table {} of {} has the columns {}, the merged workspace {}", name,
                      source_, fmt::join(theirs.cols, ","), fmt::join(t.cols, ","));
        long n = name == "tasks" ? tasks(t) : name == "filter_results" ? filter_results(t) : generic(t);
        added[name] = n;
      }
    });
  } catch (...) {
    db_.exec("DETACH DATABASE src");
    throw;
  }
  db_.exec("DETACH DATABASE src");
  return {{"path", source_}, {"added", added}, {"conflicts", conflicts_}, {"duplicates", duplicates_}};
}

}  // namespace

json merge_workspaces(Workspace& out, const std::vector<fs::path>& sources) {
  for (auto& s : sources) {
    OPFORGE_CHECK(fs::is_regular_file(s / "opforge.db"), "no workspace at {} (no opforge.db)", s.string());
    OPFORGE_CHECK(!fs::equivalent(s / "opforge.db", out.root() / "opforge.db"),
                  "{} is the merged workspace itself: give --out another folder", s.string());
  }
  json report = {{"out", fs::absolute(out.root()).string()}, {"rule", kPrefer}, {"sources", json::array()},
                 {"conflicts", json::array()}, {"duplicates", json::array()},
                 {"not_merged", {"dedup_results", "dedup_config", "schema_versions", "*leases", "*holders"}}};
  Merger m(out.db(), report);
  m.find_prevailing(sources);
  for (auto& s : sources) {
    json r = with_context(fmt::format("while merging {}", s.string()), [&] { return m.source(s); });
    r["markers"] = copy_markers(s, out.root());
    spdlog::info("merge: {}: {} rows added, {} conflicts, {} tasks made twice", r["path"].get<std::string>(),
                 [&] { long n = 0; for (auto& [k, v] : r["added"].items()) n += v.get<long>(); return n; }(),
                 r["conflicts"].get<long>(), r["duplicates"].get<long>());
    report["sources"].push_back(std::move(r));
  }
  json totals = json::object();
  for (auto& name : merge_order(tables(out.db(), "main"))) {
    auto st = out.db().prepare(fmt::format("SELECT count(*) FROM \"{}\"", name));
    st.step();
    totals[name] = st.int64(0);
  }
  report["rows"] = totals;
  return report;
}

}  // namespace opforge::merge
