// `opforge import`, `opforge filter` and `opforge tasks` end to end on the CPU, with real
// torch.compile: every planted candidate gets exactly its expected verdict.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

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
  EXPECT_EQ(js["filter"]["rejected"], 12);
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
  int accepted = 0;
  for (auto& [n, v] : want) accepted += v == "accepted:";
  EXPECT_EQ(accepted, 4);
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
// non_constant and input_sensitive off, and switching them back on judges that verdict again
// (--rejudge-stale).
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
  auto r = with({"--skip-check", "non_constant", "--skip-check", "input_sensitive"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("\"skip_checks\":[\"compile\",\"input_sensitive\",\"non_constant\"]"), std::string::npos)
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
