// Past one machine (issue #16): compose and import as shards, merge their workspaces (and eval
// reports), status over several workspaces. Real binary, real workers, real SQLite.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "opforge/core/error.h"
#include "opforge/core/shard.h"
#include "opforge/core/store.h"
#include "test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge {
namespace {

// A small torch crawl (the tiny preset's ops): enough to chain, quick to judge on the CPU.
const char* kMatch =
    "^torch\\.(tanh|sigmoid|exp|abs|sin|cos|relu|cumsum|softmax)$|^torch\\.nn\\.(Linear|ReLU|GELU|LayerNorm)$";
// One fixed-count run: 12 indices in blocks of 4, so 3 shards get one block each. Half of them
// single ops of a small crawl, so two blocks make the same task (index 10 repeats index 1).
const std::vector<std::string> kCompose = {"--count", "12", "--block-size", "4", "--seed", "3", "--backend",
                                           "template", "--target-ms", "1", "-j", "1", "--mix", "1:50,2:50"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every row of a query, each as one string (columns joined by |), in the query's order.
std::vector<std::string> rows(const fs::path& ws, const std::string& sql) {
  Db db(ws / "opforge.db");
  std::vector<std::string> out;
  auto st = db.prepare(sql);
  while (st.step()) out.push_back(st.text(0));
  return out;
}

// Every row of every table, as JSON arrays in sorted order: the whole database, to show that a
// second merge changes nothing at all.
std::map<std::string, std::vector<std::string>> whole_db(const fs::path& ws) {
  std::map<std::string, std::vector<std::string>> out;
  for (auto& name : rows(ws, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")) {
    std::string cols;
    for (auto& c : rows(ws, "SELECT name FROM pragma_table_info('" + name + "')"))
      cols += (cols.empty() ? "\"" : ", \"") + c + "\"";
    out[name] = rows(ws, "SELECT json_array(" + cols + ") AS r FROM \"" + name + "\" ORDER BY r");
  }
  return out;
}

class Shard : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    auto r = test::run_opforge({"crawl", "--workspace", (*dir_ / "base").string(), "--sources", "torch", "--match",
                                kMatch, "--device", "cpu"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  // A fresh workspace holding the crawled seeds (what an array job copies to every shard).
  static fs::path fresh(const std::string& name) {
    auto ws = *dir_ / name;
    fs::create_directories(ws);
    fs::copy_file(*dir_ / "base" / "opforge.db", ws / "opforge.db");
    return ws;
  }
  static test::TempDir* dir_;
};
test::TempDir* Shard::dir_ = nullptr;

// The filter as the shards and the one run use it: CPU, a window no task is near the edge of (so
// no timing decides a verdict), the compile check off (seconds per task on the CPU, and not what
// is tested here), few trials. Twins are judged each (when this filter skips them by default):
// which of two twins is judged first depends on what else is in the workspace.
std::vector<std::string> filter_args(const fs::path& ws) {
  static const bool twins = test::run_opforge({"filter", "--help"}).out.find("--judge-twins") != std::string::npos;
  std::vector<std::string> a = {"filter",   "--workspace", ws.string(), "--device",     "cpu",     "--workers",
                                "2",        "--min-ms",    "0.0001",    "--max-ms",     "100000",  "--no-calibrate",
                                "--skip-check", "compile", "--trials",  "3"};
  if (twins) a.push_back("--judge-twins");
  return a;
}

const char* kTasks =
    "SELECT json_array(id, code, source, backend, num_ops, ops, seed_ids, provenance) FROM tasks ORDER BY id";
const char* kFailures =
    "SELECT json_array(backend, rng_seed, idx, bucket, reason, detail) FROM compose_failures ORDER BY backend, "
    "rng_seed, idx";
const char* kVerdicts =
    "SELECT json_array(task_id, verdict, reason, code, config) FROM filter_results ORDER BY task_id";

// Every exported record, file by file, without the fields that are timings (metrics).
std::map<std::string, std::vector<std::string>> exported(const fs::path& out) {
  std::map<std::string, std::vector<std::string>> files;
  for (auto& e : fs::directory_iterator(out)) {
    auto name = e.path().filename().string();
    if (name.rfind("ops-", 0) != 0) continue;
    std::istringstream in(test::read_file(e.path()));
    for (std::string line; std::getline(in, line);) {
      json r = json::parse(line);
      r.erase("metrics");
      files[name].push_back(r.dump());
    }
  }
  return files;
}

void run_ok(const std::vector<std::string>& args) {
  auto r = test::run_opforge(args);
  ASSERT_EQ(r.exit_code, 0) << args[0] << " failed:\n" << r.err;
}

// Compose and filter as 3 shards, merged: the tasks, failures, verdicts and code of the one
// fixed-count run; a finished shard run again does nothing; a second merge changes nothing;
// status adds the shards up; dedup and export on the merge write the one run's records.
TEST_F(Shard, ThreeShardsMergeIntoWhatOneRunMakes) {
  auto one = fresh("one");
  run_ok(with({"compose", "--workspace", one.string(), "--shard", "0/1"}, kCompose));
  run_ok(filter_args(one));
  std::vector<std::string> shards;
  for (int i = 0; i < 3; ++i) {
    auto ws = fresh("shard" + std::to_string(i));
    run_ok(with({"compose", "--workspace", ws.string(), "--shard", std::to_string(i) + "/3"}, kCompose));
    run_ok(filter_args(ws));
    EXPECT_TRUE(fs::exists(ws / "done" / ("compose.shard-" + std::to_string(i) + "-of-3.json")));
    // Only the shard's block: indices 4i .. 4i+3.
    for (auto& idx : rows(ws, "SELECT json_extract(provenance, '$.index') FROM tasks UNION ALL SELECT idx FROM "
                              "compose_failures")) {
      EXPECT_GE(std::stol(idx), 4 * i) << ws;
      EXPECT_LT(std::stol(idx), 4 * i + 4) << ws;
    }
    shards.push_back(ws.string());
  }
  auto tasks_one = rows(one, kTasks);
  ASSERT_GE(tasks_one.size(), 8u) << "12 indices, most of them tasks";
  ASSERT_GE(rows(one, "SELECT task_id FROM filter_results WHERE verdict = 'accepted'").size(), 3u);

  // The same command on a finished shard: its marker says so, and nothing changes.
  auto before = whole_db(shards[1]);
  auto again = test::run_opforge(with({"compose", "--workspace", shards[1], "--shard", "1/3"}, kCompose));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("already done"), std::string::npos) << again.err;
  EXPECT_EQ(whole_db(shards[1]), before);

  auto merged = *dir_ / "merged";
  auto r = test::run_opforge(with({"merge", "--out", merged.string()}, shards));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json report = json::parse(r.out);
  EXPECT_EQ(report["sources"].size(), 3u);
  EXPECT_EQ(report["conflicts"].size(), 0u) << report.dump(1);
  // A task two shards made is one task at the lower index, the other a duplicate, as in one run.
  ASSERT_GE(rows(one, "SELECT idx FROM compose_failures WHERE reason = 'duplicate'").size(), 1u)
      << "the fixture no longer makes a task twice: the merge's duplicate rule is not tested";
  EXPECT_EQ(report["duplicates"].size(), rows(one, "SELECT idx FROM compose_failures").size()) << report.dump(1);
  EXPECT_TRUE(fs::exists(merged / "merge-report.json"));
  EXPECT_EQ(rows(merged, kTasks), tasks_one);
  EXPECT_EQ(rows(merged, kFailures), rows(one, kFailures));
  EXPECT_EQ(rows(merged, kVerdicts), rows(one, kVerdicts));
  EXPECT_EQ(rows(merged, "SELECT count(*) FROM seeds"), rows(one, "SELECT count(*) FROM seeds"));
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(fs::exists(merged / "done" / ("compose.shard-" + std::to_string(i) + "-of-3.json"))) << i;

  // Merging again, and one source once more, changes nothing.
  auto snapshot = whole_db(merged);
  run_ok(with({"merge", "--out", merged.string()}, shards));
  run_ok({"merge", "--out", merged.string(), shards[2]});
  EXPECT_EQ(whole_db(merged), snapshot);

  // status over the shards: each, then the total.
  r = test::run_opforge({"status", "--json", "--workspace", shards[0], "--workspace", shards[1], shards[2]});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json st = json::parse(r.out);
  ASSERT_EQ(st["workspaces"].size(), 3u);
  long tasks = 0, judged = 0;
  for (auto& w : st["workspaces"]) {
    tasks += w["candidates"]["total"].get<long>();
    judged += w["filter"]["judged"].get<long>();
  }
  EXPECT_EQ(st["total"]["candidates"]["total"].get<long>(), tasks);
  EXPECT_EQ(st["total"]["filter"]["judged"].get<long>(), judged);
  EXPECT_EQ(tasks, static_cast<long>(rows(shards[0], "SELECT id FROM tasks").size() +
                                     rows(shards[1], "SELECT id FROM tasks").size() +
                                     rows(shards[2], "SELECT id FROM tasks").size()));
  EXPECT_EQ(st["total"]["done"]["compose"], 3);
  r = test::run_opforge({"status", shards[0], shards[1], shards[2]});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("total over 3 workspaces"), std::string::npos) << r.out;

  // dedup and export on the merge as on the one run: the same records, timings aside.
  for (auto& ws : {one, merged}) {
    run_ok({"dedup", "--workspace", ws.string()});
    run_ok({"export", "--workspace", ws.string(), "--out", (ws / "export").string(), "--no-plots", "--no-realism"});
  }
  auto recs = exported(one / "export");
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(exported(merged / "export"), recs);
}

// A shard killed while composing leaves no marker; started again it resumes each block after its
// last committed index and ends with exactly what an uninterrupted run of it makes.
TEST_F(Shard, AKilledComposeShardResumesToTheSameCandidates) {
  const std::vector<std::string> big = {"--count", "400", "--block-size", "4", "--seed", "5", "--backend",
                                        "template", "--target-ms", "1", "-j", "1", "--mix", "1:50,2:50"};
  auto whole = fresh("resume_whole"), killed = fresh("resume_killed");
  run_ok(with({"compose", "--workspace", whole.string(), "--shard", "1/2"}, big));
  pid_t pid = test::spawn_opforge(with({"compose", "--workspace", killed.string(), "--shard", "1/2"}, big));
  ASSERT_TRUE(test::kill_when(pid, killed / "opforge.db", "SELECT count(*) FROM tasks", 30, 120))
      << "the shard finished before it could be killed: raise --count";
  EXPECT_FALSE(fs::exists(killed / "done" / "compose.shard-1-of-2.json")) << "a killed shard has no marker";
  EXPECT_LT(rows(killed, "SELECT id FROM tasks").size(), rows(whole, "SELECT id FROM tasks").size());
  run_ok(with({"compose", "--workspace", killed.string(), "--shard", "1/2"}, big));
  EXPECT_TRUE(fs::exists(killed / "done" / "compose.shard-1-of-2.json"));
  EXPECT_EQ(rows(killed, kTasks), rows(whole, kTasks));
  EXPECT_EQ(rows(killed, kFailures), rows(whole, kFailures));
}

// A copy of a workspace's database (checkpointed first, so the copy holds every commit).
fs::path copy_ws(const fs::path& from, const fs::path& to) {
  {
    Db db(from / "opforge.db");
    db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  }
  fs::create_directories(to);
  fs::copy_file(from / "opforge.db", to / "opforge.db");
  return to;
}

std::string verdict_of(const fs::path& ws, const std::string& id) {
  auto v = rows(ws, "SELECT verdict || ':' || coalesce(reason, '') FROM filter_results WHERE task_id = '" + id + "'");
  return v.empty() ? "" : v[0];
}

// Two verdicts of one task: the one judged under the prevailing configuration wins, then the
// later, then (same second) rejected; whatever the order of the sources, the loser in the
// winner's history, each conflict on stderr and in the report.
TEST_F(Shard, ConflictingVerdictsFollowTheRuleInAnyOrder) {
  auto tasks = test::fixtures() / "dedup" / "tasks";
  auto a = *dir_ / "conf_a", b = *dir_ / "conf_b";
  run_ok({"import", "--workspace", a.string(), (tasks / "linear_tanh.py").string(), (tasks / "softmax_sum.py").string()});
  run_ok(filter_args(a));
  // b judges linear_tanh under another window, which it cannot meet.
  run_ok({"import", "--workspace", b.string(), (tasks / "linear_tanh.py").string()});
  auto fb = filter_args(b);
  fb[std::find(fb.begin(), fb.end(), "--max-ms") - fb.begin() + 1] = "0.0002";
  run_ok(fb);
  std::string id = rows(b, "SELECT id FROM tasks")[0];
  ASSERT_EQ(verdict_of(a, id), "accepted:");
  ASSERT_NE(verdict_of(b, id).rfind("rejected:", 0), std::string::npos) << verdict_of(b, id);

  // a's configuration judged two tasks, b's one: a's verdict stands, in either order.
  auto ab = *dir_ / "conf_ab", ba = *dir_ / "conf_ba";
  auto r = test::run_opforge({"merge", "--out", ab.string(), a.string(), b.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("conflict in filter_results"), std::string::npos) << r.err;
  json report = json::parse(test::read_file(ab / "merge-report.json"));
  ASSERT_EQ(report["conflicts"].size(), 1u) << report.dump(1);
  EXPECT_EQ(report["conflicts"][0]["kept"]["verdict"], "accepted");
  EXPECT_EQ(report["conflicts"][0]["dropped"]["verdict"], "rejected");
  run_ok({"merge", "--out", ba.string(), b.string(), a.string()});
  EXPECT_EQ(verdict_of(ab, id), "accepted:");
  EXPECT_EQ(whole_db(ab)["filter_results"], whole_db(ba)["filter_results"]) << "the order of the sources matters";
  json history = json::parse(rows(ab, "SELECT history FROM filter_results WHERE task_id = '" + id + "'")[0]);
  ASSERT_EQ(history.size(), 1u) << history.dump();
  EXPECT_EQ(history[0]["verdict"], "rejected");

  // Same configuration: the later verdict wins; judged in the same second, rejected wins.
  auto later = copy_ws(a, *dir_ / "conf_later"), tie = copy_ws(a, *dir_ / "conf_tie");
  Db(later / "opforge.db").exec("UPDATE filter_results SET verdict = 'rejected', reason = 'nondeterministic', "
                                "judged_at = datetime(judged_at, '+1 hour') WHERE task_id = '" + id + "'");
  Db(tie / "opforge.db").exec("UPDATE filter_results SET verdict = 'rejected', reason = 'nondeterministic' WHERE "
                              "task_id = '" + id + "'");
  auto m1 = *dir_ / "conf_m1", m2 = *dir_ / "conf_m2";
  run_ok({"merge", "--out", m1.string(), a.string(), later.string()});
  EXPECT_EQ(verdict_of(m1, id), "rejected:nondeterministic");
  run_ok({"merge", "--out", m2.string(), tie.string(), a.string()});
  EXPECT_EQ(verdict_of(m2, id), "rejected:nondeterministic");
  EXPECT_EQ(rows(m2, "SELECT count(*) FROM filter_results")[0], "2") << "softmax_sum's verdict is merged too";
}

// import --shard: the shards of one folder are disjoint, each id in its shard, together the
// whole import; a bad --shard says what to write.
TEST_F(Shard, ImportSplitsAFolderDisjointly) {
  auto folder = (test::fixtures() / "dedup" / "tasks").string();
  auto all = *dir_ / "imp_all";
  run_ok({"import", "--workspace", all.string(), folder});
  auto ids = rows(all, "SELECT id FROM tasks ORDER BY id");
  ASSERT_GE(ids.size(), 10u);
  std::vector<std::string> together;
  for (int i = 0; i < 3; ++i) {
    auto ws = *dir_ / ("imp_" + std::to_string(i));
    run_ok({"import", "--workspace", ws.string(), "--shard", std::to_string(i) + "/3", folder});
    for (auto& id : rows(ws, "SELECT id FROM tasks")) {
      EXPECT_TRUE(in_shard(id, {i, 3})) << id << " in shard " << i;
      together.push_back(id);
    }
  }
  std::sort(together.begin(), together.end());
  EXPECT_EQ(together, ids) << "the shards hold every file once";
  std::set<std::size_t> sizes;
  for (int i = 0; i < 3; ++i) sizes.insert(rows(*dir_ / ("imp_" + std::to_string(i)), "SELECT id FROM tasks").size());
  EXPECT_LT(*sizes.rbegin(), ids.size()) << "one shard took everything";

  auto r = test::run_opforge({"import", "--workspace", (*dir_ / "imp_bad").string(), "--shard", "3/3", folder});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad --shard '3/3'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("I/N"), std::string::npos) << r.err;
  r = test::run_opforge(with({"compose", "--workspace", fresh("bad_shard").string(), "--shard", "1of3"}, kCompose));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad --shard '1of3'"), std::string::npos) << r.err;
  EXPECT_THROW(parse_shard("-1/2"), Error);
  EXPECT_EQ(parse_shard("2/8").index, 2);
}

// One report row as `opforge eval` writes it (the fields the summary and report.md read).
json eval_row(const std::string& task, bool correct, int reward, double speedup) {
  return {{"task", task}, {"task_id", task}, {"solution", task + ".py"}, {"layout", "file"}, {"compiled", true},
          {"correct", correct}, {"reason", correct ? json(nullptr) : json("incorrect")}, {"detail", ""},
          {"max_error", 0.0}, {"flags", json::array()}, {"findings", json::array()},
          {"candidate_ms", correct ? json(1.0) : json(nullptr)}, {"eager_ms", speedup}, {"compile_ms", speedup},
          {"speedup_eager", correct ? json(speedup) : json(nullptr)},
          {"speedup_compile", correct ? json(speedup) : json(nullptr)}, {"reward", reward},
          {"reward_uncapped", reward}, {"baseline_cached", false}, {"sandbox", "bwrap"}};
}

json eval_report(const std::vector<json>& rows_, std::uint64_t seed, const std::string& policy) {
  json options = {{"judge", "judge-8"}, {"policy", policy}, {"device", "cpu"}, {"device_name", "cpu: test"},
                  {"torch", "2.x"}, {"trials", 20}, {"correct_trials", 3}, {"atol", 0.01}, {"rtol", 0.01},
                  {"speedup_margin", 0.05}, {"seed", seed}, {"sandbox_profile", "bwrap"}};
  return {{"results", rows_}, {"options", options}, {"seconds", 10.0}, {"version", "test"},
          {"summary", {{"tasks", rows_.size() + 1}, {"tasks_without_solution", 1}, {"unmatched_solutions", 0},
                       {"resumed", 0}}}};
}

// merge --reports: rows of both, the summary recomputed over them, counts of the parts summed;
// reports judged under another policy are refused.
TEST_F(Shard, EvalReportsMergeWithARecomputedSummary) {
  test::TempDir d;
  test::write_file(d / "a.json", eval_report({eval_row("t1", true, 3, 2.0), eval_row("t2", false, -1, 0)}, 1,
                                             "strict").dump());
  test::write_file(d / "b.json", eval_report({eval_row("t3", true, 3, 4.0), eval_row("t4", true, 1, 1.0)}, 2,
                                             "strict").dump());
  auto r = test::run_opforge({"merge", "--reports", (d / "out").string(), (d / "a.json").string(),
                              (d / "b.json").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json m = json::parse(test::read_file(d / "out" / "report.json"));
  EXPECT_EQ(m["results"].size(), 4u);
  EXPECT_EQ(m["summary"]["evaluated"], 4);
  EXPECT_EQ(m["summary"]["correct"], 3);
  EXPECT_DOUBLE_EQ(m["summary"]["mean_reward"].get<double>(), (3 - 1 + 3 + 1) / 4.0);
  EXPECT_NEAR(m["summary"]["geomean_speedup_eager"].get<double>(), 2.0, 1e-9) << "(2 * 4 * 1)^(1/3)";
  EXPECT_EQ(m["summary"]["tasks"], 6);
  EXPECT_EQ(m["summary"]["tasks_without_solution"], 2);
  EXPECT_EQ(m["options"]["seeds"], json::array({1, 2}));
  EXPECT_EQ(json::parse(r.out)["evaluated"], 4);
  EXPECT_TRUE(fs::exists(d / "out" / "report.md"));

  test::write_file(d / "c.json", eval_report({eval_row("t5", true, 3, 2.0)}, 3, "torch-allowed").dump());
  r = test::run_opforge({"merge", "--reports", (d / "out2").string(), (d / "a.json").string(), (d / "c.json").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("policy"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace opforge
