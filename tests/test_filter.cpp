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
  EXPECT_EQ(json::parse(st.text(4)), json({"nn.Linear", "torch.relu"}));

  // Status and a second run: nothing left to judge.
  json js = json::parse(test::run_opforge({"status", "--workspace", ws.string(), "--json"}).out);
  EXPECT_EQ(js["filter"]["accepted"], 1);
  EXPECT_EQ(js["filter"]["rejected"], 11);
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
