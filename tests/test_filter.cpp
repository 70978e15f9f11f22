// `opforge import`, `opforge filter` and `opforge tasks` end to end on the CPU, with real
// torch.compile: every planted candidate gets exactly its expected verdict.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "opforge/core/shard.h"
#include "opforge/core/store.h"
#include "test_support.h"

using namespace opforge;
using nlohmann::json;

namespace {

std::map<std::string, json> by_file(const std::filesystem::path& ws) {
  auto r = test::run_opforge({"tasks", "--workspace", ws.string(), "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, json> out;
  std::stringstream ss(r.out);
  for (std::string line; std::getline(ss, line);) {
    json j = json::parse(line);
    out[std::filesystem::path(j["origin"]["path"].get<std::string>()).stem().string()] = j;
  }
  return out;
}

std::map<std::string, std::string> verdicts(const std::filesystem::path& ws) {
  std::map<std::string, std::string> out;
  for (auto& [name, j] : by_file(ws))
    out[name] = j["verdict"].get<std::string>() + ":" + (j["reason"].is_null() ? "" : j["reason"].get<std::string>());
  return out;
}

}  // namespace

TEST(Filter, PlantedCandidatesGetExactlyTheirVerdicts) {
  test::TempDir dir;
  auto ws = dir / "ws";
  auto r = test::run_opforge({"import", "--workspace", ws.string(), (test::fixtures() / "filter").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_opforge({"filter", "--workspace", ws.string(), "--device", "cpu", "--workers", "2", "--timeout-s",
                         "90", "--memory-limit-mb", "2000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, std::string> expected = {
      {"syntax_error", "rejected:syntax_error"},     {"missing_import", "rejected:import_error"},
      {"infinite_loop", "rejected:timeout"},         {"segfault", "rejected:worker_crash"},
      {"giant_allocation", "rejected:out_of_memory"}, {"dropout_train", "rejected:nondeterministic"},
      {"rand_in_forward", "rejected:nondeterministic"}, {"times_zero", "rejected:constant_output"},
      {"returns_parameter", "rejected:input_insensitive"}, {"nan_output", "rejected:non_finite"},
      {"too_fast_fixed", "rejected:too_fast"},       {"too_fast_scales", "accepted:"},
      {"chaotic_map", "rejected:ill_conditioned"},
      {"offset_correlation", "rejected:constant_within_tolerance"},
      {"weights_beside_input", "rejected:constant_within_tolerance"},
      {"small_residual", "rejected:input_within_tolerance"},
      {"layer_scale", "rejected:dead_compute"},      {"zero_gate", "rejected:dead_compute"},
  };
  EXPECT_EQ(verdicts(ws), expected);

  // The one that ran 1000x too fast was calibrated into the window; its original is kept.
  Db db(ws / "opforge.db");
  auto st = db.prepare(
      "SELECT f.code, t.code, f.calibration, f.metrics, f.ops FROM filter_results f JOIN tasks t ON t.id = f.task_id "
      "WHERE f.verdict = 'accepted'");
  ASSERT_TRUE(st.step());
  EXPECT_NE(st.text(0), st.text(1)) << "the stored code is the calibrated one";
  EXPECT_NE(st.text(1).find("batch_size = 1\n"), std::string::npos) << "the original stays in the task";
  json cal = json::parse(st.text(2));
  ASSERT_FALSE(cal.empty());
  EXPECT_EQ(cal[0]["size"], "batch_size");
  json m = json::parse(st.text(3));
  EXPECT_GE(m["eager_ms"].get<double>(), 1.0);
  EXPECT_LE(m["eager_ms"].get<double>(), 100.0);
  for (auto* k : {"compile_ms", "compile_speedup", "compile_wall_s", "device", "torch"}) EXPECT_TRUE(m.contains(k)) << k;
  EXPECT_EQ(m["conditioning"], "float64 agrees");
  // torch.compile is held to the judge's precision check (filter-7): well inside its 64.
  ASSERT_TRUE(m["compile_precision"].is_number()) << m.dump();
  EXPECT_LT(m["compile_precision"].get<double>(), 8.0);
  for (auto* k : {"build_s", "inputs_s", "checks_s", "eager_timing_s", "conditioning_s", "compile_s", "lock_wait_s"})
    EXPECT_TRUE(m["phases"].contains(k)) << "where the task's time went: " << k << " in " << m["phases"].dump();
  EXPECT_EQ(json::parse(st.text(4)), json({"nn.Linear", "torch.relu"}));

  // Rejections that may be the environment's were judged again alone, and stayed rejected there.
  for (auto* file : {"giant_allocation", "segfault"}) {
    auto a = db.prepare(
        "SELECT json_extract(f.metrics, '$.attempts'), f.config FROM filter_results f JOIN tasks t ON t.id = f.task_id "
        "WHERE json_extract(t.provenance, '$.path') LIKE ?");
    a.bind(1, std::string("%/") + file + ".py");
    ASSERT_TRUE(a.step()) << file;
    ASSERT_FALSE(a.is_null(0)) << file << " was not judged again alone";
    json att = json::parse(a.text(0));
    ASSERT_EQ(att.size(), 2u) << att.dump();
    EXPECT_EQ(att[0]["how"], "shared");
    EXPECT_EQ(att[1]["how"], "alone");
    EXPECT_EQ(att[1]["verdict"], "rejected") << att.dump();
    EXPECT_FALSE(a.is_null(1)) << "every verdict records its configuration";
  }

  // Status and a second run: nothing left to judge.
  json js = json::parse(test::run_opforge({"status", "--workspace", ws.string(), "--json"}).out);
  EXPECT_EQ(js["filter"]["accepted"], 1);
  EXPECT_EQ(js["filter"]["rejected"], static_cast<int>(expected.size()) - 1);
  r = test::run_opforge({"filter", "--workspace", ws.string(), "--device", "cpu"});
  EXPECT_NE(r.err.find("nothing to filter"), std::string::npos) << r.err;
}

TEST(Filter, KilledHalfWayAndRestartedEndsWithTheSameAcceptedSet) {
  test::TempDir dir;
  // Cheap rejects and a few tasks that need calibration and a compile.
  for (int i = 0; i < 4; ++i)
    test::write_file(dir / "in" / ("ok_" + std::to_string(i) + ".py"),
                     "import torch\nimport torch.nn as nn\n\nbatch_size = 1\nfeatures = " + std::to_string(128 + 64 * i) +
                         "\n\n\nclass Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                         "        self.linear = nn.Linear(features, features)\n\n    def forward(self, x):\n"
                         "        return torch.tanh(self.linear(x))\n\n\ndef get_inputs():\n"
                         "    return [torch.randn(batch_size, features)]\n\n\ndef get_init_inputs():\n    return []\n");
  for (int i = 0; i < 6; ++i)
    test::write_file(dir / "in" / ("zero_" + std::to_string(i) + ".py"),
                     "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                     "        return x * 0.0\n\n\ndef get_inputs():\n    return [torch.randn(64, " +
                         std::to_string(8 + i) + ")]\n\n\ndef get_init_inputs():\n    return []\n");
  auto ref = dir / "ref", ws = dir / "ws";
  for (auto& w : {ref, ws})
    ASSERT_EQ(test::run_opforge({"import", "--workspace", w.string(), (dir / "in").string()}).exit_code, 0);
  std::vector<std::string> args = {"filter", "--device", "cpu", "--workers", "2", "--timeout-s", "120"};
  auto with_ws = [&](const std::filesystem::path& w) {
    auto a = args;
    a.insert(a.begin() + 1, {"--workspace", w.string()});
    return a;
  };
  ASSERT_EQ(test::run_opforge(with_ws(ref)).exit_code, 0);

  pid_t pid = test::spawn_opforge(with_ws(ws));
  bool killed = test::kill_when(pid, ws / "opforge.db", "SELECT count(*) FROM filter_results", 3, 120);
  ASSERT_TRUE(killed);
  {
    Db db(ws / "opforge.db");
    auto st = db.prepare("SELECT count(*) FROM filter_results");
    ASSERT_TRUE(st.step());
    EXPECT_LT(st.int64(0), 10) << "the kill came after the end";
  }
  ASSERT_EQ(test::run_opforge(with_ws(ws)).exit_code, 0);
  auto want = verdicts(ref), got = verdicts(ws);
  EXPECT_EQ(got, want);
  // The ok_ tasks differ only in a number: twins. The first is judged and accepted, the others
  // are recorded exact_duplicate of it without running.
  int accepted = 0, twins = 0;
  for (auto& [n, v] : want) accepted += v == "accepted:", twins += v == "rejected:exact_duplicate";
  EXPECT_EQ(accepted, 1);
  EXPECT_EQ(twins, 3);
}

TEST(Filter, ImportOfAMissingPathIsAClearError) {
  test::TempDir dir;
  auto r = test::run_opforge({"import", "--workspace", (dir / "ws").string(), "/no/such/tasks"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/no/such/tasks does not exist"), std::string::npos) << r.err;
}

namespace {

const char* kPadded =
    "import torch\nimport torch.nn as nn\n\n# 700 MiB resident from import on: more than a worker's share here, less "
    "than alone.\n_PAD = torch.ones(700 * 1024 * 1024 // 4)\n\nbatch_size = 1\nfeatures = 256\n\n\nclass "
    "Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.linear = nn.Linear(features, "
    "features)\n\n    def forward(self, x):\n        return torch.tanh(self.linear(x))\n\n\ndef get_inputs():\n    "
    "return [torch.randn(batch_size, features)]\n\n\ndef get_init_inputs():\n    return []\n";
const char* kZero =
    "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return x * "
    "0.0\n\n\ndef get_inputs():\n    return [torch.randn(64, 8)]\n\n\ndef get_init_inputs():\n    return []\n";

struct Row {
  std::string verdict, reason, config;
  json attempts, history;
};

std::map<std::string, Row> rows(const std::filesystem::path& ws) {
  Db db(ws / "opforge.db");
  std::map<std::string, Row> out;
  auto st = db.prepare(
      "SELECT json_extract(t.provenance, '$.path'), f.verdict, coalesce(f.reason, ''), f.config, "
      "coalesce(json_extract(f.metrics, '$.attempts'), 'null'), f.history FROM filter_results f JOIN tasks t "
      "ON t.id = f.task_id");
  while (st.step())
    out[std::filesystem::path(st.text(0)).stem().string()] = {st.text(1), st.text(2), st.text(3),
                                                             json::parse(st.text(4)), json::parse(st.text(5))};
  return out;
}

}  // namespace

TEST(Filter, EnvironmentFailuresAreJudgedAloneRejudgedVerdictsKeepTheirHistoryAndConfigsDoNotMix) {
  test::TempDir dir;
  test::write_file(dir / "in" / "padded.py", kPadded);
  test::write_file(dir / "in" / "zero.py", kZero);
  auto ws = dir / "ws";
  ASSERT_EQ(test::run_opforge({"import", "--workspace", ws.string(), (dir / "in").string()}).exit_code, 0);
  std::vector<std::string> base = {"filter", "--workspace", ws.string(), "--device", "cpu", "--workers", "2",
                                   "--timeout-s", "120"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_opforge(args);
  };
  // Sharing the machine, the padded task is over its worker's share; alone it has both shares.
  auto r = with({"--memory-limit-mb", "1500"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = rows(ws);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got["padded"].verdict, "accepted") << got["padded"].reason;
  ASSERT_EQ(got["padded"].attempts.size(), 2u) << got["padded"].attempts.dump();
  EXPECT_EQ(got["padded"].attempts[0]["reason"], "out_of_memory");
  EXPECT_EQ(got["padded"].attempts[1]["verdict"], "accepted");
  EXPECT_EQ(got["zero"].reason, "constant_output");
  EXPECT_TRUE(got["zero"].attempts.is_null()) << "a rejection of the task's own is not judged again";
  EXPECT_EQ(got["zero"].config, got["padded"].config);

  // --rejudge: judged again, the old verdict kept in the history.
  r = with({"--memory-limit-mb", "3000", "--rejudge", "constant_output"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  got = rows(ws);
  ASSERT_EQ(got["zero"].history.size(), 1u);
  EXPECT_EQ(got["zero"].history[0]["reason"], "constant_output");
  EXPECT_TRUE(got["padded"].history.empty()) << "an accepted task is not a rejection to judge again";

  // Another configuration: the old verdicts are not mixed in silently, and can be judged again.
  r = with({"--memory-limit-mb", "3000", "--trials", "10"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("2 stored verdicts were made under another filter configuration"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing to filter"), std::string::npos) << r.err;
  std::string old_config = got["padded"].config;
  json js = json::parse(test::run_opforge({"status", "--workspace", ws.string(), "--json"}).out);
  EXPECT_EQ(js["filter"]["configs"], json({{old_config, 2}})) << "status counts verdicts by configuration";
  r = with({"--memory-limit-mb", "3000", "--trials", "10", "--rejudge-stale"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  got = rows(ws);
  EXPECT_NE(got["padded"].config, old_config);
  EXPECT_EQ(got["padded"].config, got["zero"].config);
  EXPECT_EQ(got["padded"].verdict, "accepted");
  EXPECT_EQ(got["zero"].history.size(), 2u);
}

// A check switched off for a run is part of its configuration: the constant task passes with
// non_constant, input_sensitive and judge_distinguishable off, and switching them back on judges
// that verdict again (--rejudge-stale).
TEST(Filter, ChecksCanBeSwitchedPerRunAndAppliedAgainToJudgedTasks) {
  test::TempDir dir;
  test::write_file(dir / "in" / "zero.py", kZero);
  auto ws = dir / "ws";
  ASSERT_EQ(test::run_opforge({"import", "--workspace", ws.string(), (dir / "in").string()}).exit_code, 0);
  std::vector<std::string> base = {"filter", "--workspace", ws.string(), "--device", "cpu", "--workers", "1",
                                   "--min-ms", "0", "--skip-check", "compile"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_opforge(args);
  };
  auto r = with({"--skip-check", "non_constant", "--skip-check", "input_sensitive", "--skip-check",
                 "judge_distinguishable"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(R"("skip_checks":["compile","input_sensitive","judge_distinguishable","non_constant"])"),
            std::string::npos)
      << r.err;
  auto got = rows(ws);
  EXPECT_EQ(got["zero"].verdict, "accepted") << got["zero"].reason;
  std::string skipped_config = got["zero"].config;

  r = with({"--rejudge-stale"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  got = rows(ws);
  EXPECT_EQ(got["zero"].reason, "constant_output");
  EXPECT_NE(got["zero"].config, skipped_config);
  ASSERT_EQ(got["zero"].history.size(), 1u);
  EXPECT_EQ(got["zero"].history[0]["verdict"], "accepted");

  r = test::run_opforge({"filter", "--workspace", ws.string(), "--skip-check", "nope"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;
}

namespace {

// A task that takes about a second to judge (its get_init_inputs sleeps) and is rejected
// constant_output; each op gives another normal form, so no two are twins.
std::string slow_constant(const std::string& op) {
  return "import time\n\nimport torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
         "        return torch." + op + "(x) * 0.0\n\n\ndef get_inputs():\n    return [torch.randn(64, 8)]\n\n\n"
         "def get_init_inputs():\n    time.sleep(1.0)\n    return []\n";
}

const std::vector<std::string> kOps = {"tanh", "sigmoid", "relu", "exp", "sin", "cos", "abs", "neg", "atan", "floor"};

// A workspace of the slow tasks; returns their ids.
std::set<std::string> slow_workspace(const test::TempDir& dir, const std::filesystem::path& ws) {
  for (auto& op : kOps) test::write_file(dir / "slow" / (op + ".py"), slow_constant(op));
  auto r = test::run_opforge({"import", "--workspace", ws.string(), (dir / "slow").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> ids;
  Db db(ws / "opforge.db");
  auto st = db.prepare("SELECT id FROM tasks");
  while (st.step()) ids.insert(st.text(0));
  return ids;
}

std::vector<std::string> quick_filter(const std::filesystem::path& ws, std::vector<std::string> extra = {},
                                      int workers = 1) {
  std::vector<std::string> a = {"filter", "--workspace", ws.string(), "--device", "cpu", "--workers",
                                std::to_string(workers), "--min-ms", "0", "--skip-check", "compile", "--trials", "3"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

long count_of(const std::filesystem::path& ws, const std::string& sql) {
  Db db(ws / "opforge.db");
  auto st = db.prepare(sql);
  return st.step() ? st.int64(0) : -1;
}

// Ids with a verdict, and how many verdicts replaced one (a task judged twice leaves one there).
std::set<std::string> judged_ids(const std::filesystem::path& ws) {
  Db db(ws / "opforge.db");
  std::set<std::string> out;
  auto st = db.prepare("SELECT task_id FROM filter_results");
  while (st.step()) out.insert(st.text(0));
  return out;
}

long judged_in(const std::string& err) {
  auto at = err.find("judged, ");
  if (at == std::string::npos) return -1;
  auto start = err.rfind(": ", at) + 2;
  return std::stol(err.substr(start, at - start));
}

}  // namespace

// Two filters started at once on one workspace split it: each task judged once, by one of them
// (a task judged twice would have the first verdict in its history), all of them judged.
TEST(Filter, TwoFiltersOnOneWorkspaceJudgeDisjointTasksAndTogetherAll) {
  test::TempDir dir;
  auto ws = dir / "ws";
  auto ids = slow_workspace(dir, ws);
  ASSERT_EQ(ids.size(), kOps.size());
  pid_t a = test::spawn_opforge_to(quick_filter(ws), dir / "a.out", dir / "a.err");
  pid_t b = test::spawn_opforge_to(quick_filter(ws), dir / "b.out", dir / "b.err");
  int sa = 0, sb = 0;
  waitpid(a, &sa, 0);
  waitpid(b, &sb, 0);
  std::string ea = test::read_file(dir / "a.err"), eb = test::read_file(dir / "b.err");
  ASSERT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0) << ea;
  ASSERT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0) << eb;
  EXPECT_EQ(judged_ids(ws), ids);
  EXPECT_EQ(count_of(ws, "SELECT count(*) FROM filter_results WHERE history != '[]'"), 0) << "a task judged twice";
  EXPECT_EQ(count_of(ws, "SELECT count(*) FROM filter_results WHERE reason != 'constant_output'"), 0);
  long ja = judged_in(ea), jb = judged_in(eb);
  EXPECT_EQ(ja + jb, static_cast<long>(ids.size())) << ea << eb;
  EXPECT_GT(ja, 0) << "both took part: " << ea;
  EXPECT_GT(jb, 0) << "both took part: " << eb;
  EXPECT_EQ(count_of(ws, "SELECT count(*) FROM filter_leases"), 0) << "leases end with their verdicts";
  EXPECT_EQ(count_of(ws, "SELECT count(*) FROM filter_holders"), 0) << "holders end with their process";
  EXPECT_FALSE(std::filesystem::exists(ws / "done")) << "a run without --shard leaves no marker";
}

// A filter killed mid-run leaves leases; the next one finds their holder gone, takes them over and
// judges only what has no verdict. A lease of a filter on another host is taken over once its
// heartbeat is stale, and left alone while it is fresh.
TEST(Filter, AKilledFiltersLeasesAreTakenOverAndFinishedTasksAreNotJudgedAgain) {
  test::TempDir dir;
  auto ws = dir / "ws";
  auto ids = slow_workspace(dir, ws);
  pid_t pid = test::spawn_opforge(quick_filter(ws));
  // Killed with two verdicts in and a third task under way (each takes a second).
  ASSERT_TRUE(test::kill_when(pid, ws / "opforge.db",
                              "SELECT (SELECT count(*) FROM filter_results) >= 2 AND (SELECT count(*) FROM filter_leases)",
                              1, 120));
  auto before = judged_ids(ws);
  ASSERT_LT(before.size(), ids.size()) << "the kill came after the end";
  ASSERT_GE(count_of(ws, "SELECT count(*) FROM filter_leases"), 1) << "the killed filter held the task it judged";
  std::vector<std::string> free;  // pending, not leased
  for (auto& id : ids)
    if (!before.count(id) && count_of(ws, "SELECT count(*) FROM filter_leases WHERE task_id = '" + id + "'") == 0)
      free.push_back(id);
  ASSERT_GE(free.size(), 2u);
  const std::string stale_task = free[0], live_task = free[1];
  {
    // Two filters elsewhere: one silent for 1000 s, one beating now.
    Db db(ws / "opforge.db");
    db.exec(
        "INSERT INTO filter_holders VALUES('elsewhere/b/ns/1', 'elsewhere', 'b', 'ns', 1, '1', '0/1', 0, "
        "strftime('%s', 'now') - 1000), ('elsewhere/b/ns/2', 'elsewhere', 'b', 'ns', 2, '1', '0/1', 0, strftime('%s', 'now'))");
    db.exec("INSERT INTO filter_leases VALUES('" + stale_task + "', 'elsewhere/b/ns/1', 0), ('" + live_task +
            "', 'elsewhere/b/ns/2', 0)");
  }
  auto r = test::run_opforge(quick_filter(ws, {"--lease-stale-s", "120", "--shard", "0/1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("(process " + std::to_string(pid) + " is gone): its 1 lease(s) taken over"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("elsewhere/b/ns/1 is gone (no heartbeat for"), std::string::npos) << r.err;
  auto after = judged_ids(ws);
  std::set<std::string> want = ids;
  want.erase(live_task);
  EXPECT_EQ(after, want) << "all but the task the live filter elsewhere holds";
  EXPECT_EQ(judged_in(r.err), static_cast<long>(ids.size() - before.size() - 1)) << r.err;
  EXPECT_EQ(count_of(ws, "SELECT count(*) FROM filter_results WHERE history != '[]'"), 0) << "judged again";
  EXPECT_EQ(count_of(ws, "SELECT count(*) FROM filter_leases"), 1);
  EXPECT_FALSE(std::filesystem::exists(ws / "done" / "filter.shard-0-of-1.json")) << "a task is still leased";
  r = test::run_opforge(quick_filter(ws, {"--shard", "0/1"}));
  EXPECT_NE(r.err.find("being judged by another filter"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(ws / "done" / "filter.shard-0-of-1.json"));
}

TEST(Filter, ShardsSplitTheWorkspaceIntoDisjointSetsWhoseUnionIsEverything) {
  test::TempDir dir;
  auto ws = dir / "ws";
  auto ids = slow_workspace(dir, ws);
  std::set<std::string> so_far;
  for (int i = 0; i < 3; ++i) {
    Shard shard{i, 3};
    std::set<std::string> mine;
    for (auto& id : ids)
      if (in_shard(id, shard)) mine.insert(id);
    ASSERT_FALSE(mine.empty()) << "the fixture leaves shard " << i << " empty";
    auto r = test::run_opforge(quick_filter(ws, {"--shard", std::to_string(i) + "/3"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (auto& id : so_far) mine.insert(id);
    EXPECT_EQ(judged_ids(ws), mine) << "shard " << i << " judged exactly its own tasks";
    so_far = mine;
    auto marker = ws / "done" / fmt::format("filter.shard-{}-of-3.json", i);
    ASSERT_TRUE(std::filesystem::exists(marker)) << r.err;
    json m = json::parse(test::read_file(marker));
    EXPECT_EQ(m["shard"], fmt::format("{}/3", i));
    EXPECT_EQ(m["this_run"]["judged"], judged_in(r.err));
    EXPECT_EQ(m["shard_verdicts"]["rejected"], judged_in(r.err));
  }
  EXPECT_EQ(so_far, ids);
  EXPECT_EQ(count_of(ws, "SELECT count(*) FROM filter_results WHERE history != '[]'"), 0);
  auto r = test::run_opforge(quick_filter(ws, {"--shard", "1/3"}));
  EXPECT_NE(r.err.find("every candidate of shard 1/3 has a verdict (finished before"), std::string::npos) << r.err;
  for (auto* bad : {"3/3", "1/0", "x", "-1/3", "1/2/3"}) {
    r = test::run_opforge(quick_filter(ws, {"--shard", bad}));
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find("--shard '" + std::string(bad) + "'"), std::string::npos) << r.err;
  }
}

namespace {

// Tasks that differ only in numbers (one normal form): x * 0.0 is constant, x * 2.0 is fine.
std::string scaled(const std::string& expr, const std::string& k, int width) {
  return "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return " +
         expr + " * " + k + "\n\n\ndef get_inputs():\n    return [torch.randn(64, " + std::to_string(width) +
         ")]\n\n\ndef get_init_inputs():\n    return []\n";
}

}  // namespace

// Twins are judged in id order until one is accepted; the later ones are recorded exact_duplicate
// naming it, and dedup keeps the same tasks as when every twin is judged.
TEST(Filter, TwinsAreJudgedOnceAndDedupKeepsTheSameTasks) {
  test::TempDir dir;
  // Sizes chosen so that the ids come in this order (asserted below): in the x group the constant
  // one is first, so the next is judged; in the tanh group an accepted one is first.
  test::write_file(dir / "in" / "x_zero.py", scaled("x", "0.0", 11));
  test::write_file(dir / "in" / "x_two.py", scaled("x", "2.0", 8));
  test::write_file(dir / "in" / "x_three.py", scaled("x", "3.0", 12));
  test::write_file(dir / "in" / "tanh_three.py", scaled("torch.tanh(x)", "3.0", 12));
  test::write_file(dir / "in" / "tanh_zero.py", scaled("torch.tanh(x)", "0.0", 9));
  auto once = dir / "once", all = dir / "all";
  for (auto& w : {once, all})
    ASSERT_EQ(test::run_opforge({"import", "--workspace", w.string(), (dir / "in").string()}).exit_code, 0);
  std::map<std::string, std::string> id;
  for (auto& [stem, j] : by_file(once)) id[stem] = j["id"];
  ASSERT_TRUE(id["x_zero"] < id["x_two"] && id["x_two"] < id["x_three"] && id["tanh_three"] < id["tanh_zero"])
      << "the fixture's ids moved (python/opforge/normalize.py changed?): pick sizes that give this order again";

  auto r = test::run_opforge(quick_filter(once, {}, 2));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(judged_in(r.err), 3) << r.err;
  EXPECT_NE(r.err.find("2 twins of accepted tasks recorded exact_duplicate without running"), std::string::npos)
      << r.err;
  std::map<std::string, std::string> want = {
      {"x_zero", "rejected:constant_output"},      {"x_two", "accepted:"},
      {"x_three", "rejected:exact_duplicate"},     {"tanh_three", "accepted:"},
      {"tanh_zero", "rejected:exact_duplicate"}};  // constant, had it run
  EXPECT_EQ(verdicts(once), want);
  auto rows = by_file(once);
  EXPECT_NE(rows["x_three"]["detail"].get<std::string>().find(id["x_two"]), std::string::npos) << rows["x_three"];
  EXPECT_NE(rows["tanh_zero"]["detail"].get<std::string>().find(id["tanh_three"]), std::string::npos);
  EXPECT_EQ(count_of(once, "SELECT count(DISTINCT normal_hash) FROM task_keys"), 2);

  // --judge-twins: every one judged; dedup then drops what the filter did not run.
  r = test::run_opforge(quick_filter(all, {"--judge-twins"}, 2));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(judged_in(r.err), 5) << r.err;
  auto every = verdicts(all);
  EXPECT_EQ(every["x_three"], "accepted:");
  EXPECT_EQ(every["tanh_zero"], "rejected:constant_output");
  auto kept = [](const std::filesystem::path& w) {
    auto d = test::run_opforge({"dedup", "--workspace", w.string()});
    EXPECT_EQ(d.exit_code, 0) << d.err;
    std::set<std::string> out;
    Db db(w / "opforge.db");
    auto st = db.prepare("SELECT task_id FROM dedup_results WHERE kept = 1");
    while (st.step()) out.insert(st.text(0));
    return out;
  };
  auto k = kept(once);
  EXPECT_FALSE(k.empty());
  EXPECT_EQ(k, kept(all));

  // A twin whose first is being judged by another filter waits for that verdict: here a filter on
  // another host leases x_two and goes silent; once its heartbeat is stale the lease is taken over.
  // Its last heartbeat is put 15 s ahead: a filter that took over 10 s to start (a loaded CI
  // machine) found it stale at once, and no twin waited.
  auto waits = dir / "waits";
  ASSERT_EQ(test::run_opforge({"import", "--workspace", waits.string(), (dir / "in").string()}).exit_code, 0);
  {
    Db db(waits / "opforge.db");
    db.exec("INSERT INTO filter_holders VALUES('elsewhere/b/ns/1', 'elsewhere', 'b', 'ns', 1, '1', '0/1', 0, "
            "strftime('%s', 'now') + 15)");
    db.exec("INSERT INTO filter_leases VALUES('" + id["x_two"] + "', 'elsewhere/b/ns/1', 0)");
  }
  r = test::run_opforge(quick_filter(waits, {"--lease-stale-s", "10"}, 2));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("1 candidates wait for the verdict of an earlier twin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("elsewhere/b/ns/1 is gone (no heartbeat for"), std::string::npos) << r.err;
  EXPECT_EQ(verdicts(waits), want);
  EXPECT_EQ(judged_in(r.err), 3) << r.err;

  // A rejudged twin that is no longer accepted reopens its duplicates.
  {
    Db db(once / "opforge.db");
    db.exec("UPDATE filter_results SET verdict = 'rejected', reason = 'too_fast' WHERE task_id = '" + id["x_two"] + "'");
  }
  r = test::run_opforge(quick_filter(once));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(verdicts(once)["x_three"], "accepted:") << r.err;
  EXPECT_TRUE(by_file(once)["x_three"]["metrics"].contains("eager_ms")) << "it ran";
}
