// `opforge crawl` and `opforge status` end to end, through the real binary.
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

struct Row {
  std::string id, status, reason;
  bool operator==(const Row&) const = default;
};

std::map<std::string, Row> seeds(const std::filesystem::path& ws) {
  Db db(ws / "opforge.db");
  std::map<std::string, Row> out;
  auto st = db.prepare("SELECT name, coalesce(id, ''), status, coalesce(reason, '') FROM seeds");
  while (st.step()) out[st.text(0)] = {st.text(1), st.text(2), st.text(3)};
  return out;
}

json status_json(const std::filesystem::path& ws) {
  auto r = test::run_opforge({"status", "--workspace", ws.string(), "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

// Seeds that take ~0.25 s each, so a crawl of them can be killed half-way.
void write_slow_seeds(const std::filesystem::path& dir, int n) {
  for (int i = 0; i < n; ++i) {
    test::write_file(dir / ("slow_" + std::to_string(100 + i) + ".py"),
                     "import time\nimport torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                     "    def forward(self, x):\n        time.sleep(0.25)\n        return x * " +
                         std::to_string(i + 1) + ".0\n\n\ndef get_inputs():\n    return [torch.randn(4, " +
                         std::to_string(i + 1) + ")]\n\n\ndef get_init_inputs():\n    return []\n");
  }
}

}  // namespace

TEST(Crawl, PlantedSeedsGetDistinctReasonsAndTheCrawlFinishes) {
  test::TempDir dir;
  auto ws = dir / "ws";
  auto r = test::run_opforge({"crawl", "--workspace", ws.string(), "--sources", "none", "--add",
                              (test::fixtures() / "planted").string(), "--timeout-s", "8", "--memory-limit-mb",
                              "1500", "--workers", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto s = seeds(ws);
  EXPECT_EQ(s["local.good_relu"].status, "runnable");
  EXPECT_EQ(s["local.good_relu"].id.size(), 16u);
  EXPECT_EQ(s["local.noisy_stdout"].status, "runnable");
  EXPECT_EQ(s["local.segfault"].reason, "worker_crash");
  EXPECT_EQ(s["local.abort"].reason, "worker_crash");
  EXPECT_EQ(s["local.hang"].reason, "timeout");
  EXPECT_EQ(s["local.memory_hog"].reason, "out_of_memory");
  EXPECT_EQ(s["local.syntax_error"].reason, "syntax_error");
  for (auto& name : {"local.segfault", "local.hang", "local.memory_hog", "local.syntax_error"})
    EXPECT_EQ(s[name].status, "skipped") << name;

  // The detail says what happened, for a person reading `opforge tasks`/the db.
  Db db(ws / "opforge.db");
  auto st = db.prepare("SELECT detail FROM seeds WHERE name = 'local.segfault'");
  ASSERT_TRUE(st.step());
  EXPECT_NE(st.text(0).find("Segmentation fault"), std::string::npos) << st.text(0);

  json js = status_json(ws);
  EXPECT_EQ(js["seeds"]["by_source"]["local"]["runnable"], 2);
  EXPECT_EQ(js["seeds"]["by_source"]["local"]["skipped"], 5);
}

TEST(Crawl, TracedOpsAndSeedCodeForRealTorchOperators) {
  test::TempDir dir;
  auto ws = dir / "ws";
  auto r = test::run_opforge({"crawl", "--workspace", ws.string(), "--sources", "torch", "--match",
                              "^torch\\.(nn\\.Conv2d|cumsum|nn\\.functional\\.gelu|nn\\.Sequential)$"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Db db(ws / "opforge.db");
  std::map<std::string, std::pair<std::string, std::string>> got;
  auto st = db.prepare("SELECT name, coalesce(ops, ''), coalesce(code, ''), status, coalesce(reason, '') FROM seeds");
  while (st.step()) got[st.text(0)] = {st.text(1), st.text(2)};
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(json::parse(got["torch.nn.Conv2d"].first), json({"nn.Conv2d"}));
  EXPECT_EQ(json::parse(got["torch.cumsum"].first), json({"torch.cumsum"}));
  EXPECT_EQ(json::parse(got["torch.nn.functional.gelu"].first), json({"F.gelu"}));
  const std::string& code = got["torch.nn.Conv2d"].second;
  for (auto* needle : {"class Model(nn.Module)", "def get_inputs()", "def get_init_inputs()", "nn.Conv2d(", "batch_size = "})
    EXPECT_NE(code.find(needle), std::string::npos) << needle << "\n" << code;
  auto seq = db.prepare("SELECT status, reason FROM seeds WHERE name = 'torch.nn.Sequential'");
  ASSERT_TRUE(seq.step());
  EXPECT_EQ(seq.text(0), "skipped");
  EXPECT_EQ(seq.text(1), "container");
}

TEST(Crawl, ASecondCrawlAddsNothingAndIdsAreStable) {
  test::TempDir dir;
  auto ws = dir / "ws";
  std::vector<std::string> args = {"crawl", "--workspace", ws.string(), "--sources", "torch", "--match",
                                   "^torch\\.(special|fft)\\."};
  ASSERT_EQ(test::run_opforge(args).exit_code, 0);
  auto first = seeds(ws);
  ASSERT_GT(first.size(), 40u);
  auto again = test::run_opforge(args);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find(" 0 new"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("nothing to probe"), std::string::npos) << again.err;
  EXPECT_EQ(seeds(ws), first);
  // A separate workspace derives the same ids from the same code.
  auto ws2 = dir / "ws2";
  args[2] = ws2.string();
  ASSERT_EQ(test::run_opforge(args).exit_code, 0);
  EXPECT_EQ(seeds(ws2), first);
}

TEST(Crawl, KilledWithSigkillAndResumedEndsWithTheSameSeeds) {
  test::TempDir dir;
  write_slow_seeds(dir / "slow", 24);
  auto args_for = [&](const std::filesystem::path& ws) {
    return std::vector<std::string>{"crawl", "--workspace", ws.string(), "--sources", "torch", "--match",
                                    "^(torch\\.special\\.|local\\.)", "--add", (dir / "slow").string(), "--workers", "2"};
  };
  auto ref_ws = dir / "reference", ws = dir / "killed";
  ASSERT_EQ(test::run_opforge(args_for(ref_ws)).exit_code, 0);
  auto reference = seeds(ref_ws);

  pid_t pid = test::spawn_opforge(args_for(ws));
  // Wait until some, not all, seeds are probed, then kill without warning.
  bool killed = test::kill_when(pid, ws / "opforge.db",
                                "SELECT count(*) FROM seeds WHERE source = 'local' AND status = 'runnable'", 6, 30);
  ASSERT_TRUE(killed) << "the crawl finished before it could be killed";
  auto partial = seeds(ws);
  size_t pending = 0;
  for (auto& [n, r] : partial) pending += r.status == "pending";
  EXPECT_GT(pending, 0u) << "the kill came after the end";

  auto resumed = test::run_opforge(args_for(ws));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_EQ(seeds(ws), reference);
}

TEST(Crawl, BadInputGetsAClearError) {
  test::TempDir dir;
  auto r = test::run_opforge({"crawl", "--workspace", (dir / "ws").string(), "--sources", "none", "--add", "/no/such/dir"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/no/such/dir does not exist"), std::string::npos) << r.err;

  r = test::run_opforge({"crawl", "--workspace", (dir / "ws").string(), "--sources", "torch,jax"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown source 'jax'"), std::string::npos) << r.err;

  r = test::run_opforge({"status", "--workspace", (dir / "nothing-here").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("run `opforge crawl"), std::string::npos) << r.err;
}

// The acceptance figure of the crawl: the whole of torch and transformers, on this machine.
TEST(Crawl, FullCrawlYieldsEnoughRunnableSeeds) {
  test::TempDir dir;
  auto ws = dir / "ws";
  auto r = test::run_opforge({"crawl", "--workspace", ws.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json js = status_json(ws);
  auto by = js["seeds"]["by_source"];
  EXPECT_GE(by["torch"]["runnable"].get<int>(), 400) << js.dump(2);
  EXPECT_GE(by["transformers"]["runnable"].get<int>(), 150) << js.dump(2);
  EXPECT_EQ(js["seeds"]["pending"], 0);
  auto table = test::run_opforge({"status", "--workspace", ws.string()});
  EXPECT_NE(table.out.find("top skip reasons"), std::string::npos) << table.out;
}
