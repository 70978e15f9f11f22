// `opforge compose --backend template` and `--backend graph` end to end, through the real binary.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "composer.h"
#include "opforge/core/error.h"
#include "opforge/core/store.h"
#include "test_support.h"

using namespace opforge;
using nlohmann::json;

namespace {

// A small crawl: enough ops of each layout to chain, and two transformers modules.
const char* kMatch =
    "^(torch\\.nn\\.(ReLU|GELU|Tanh|Sigmoid|Conv2d|BatchNorm2d|LayerNorm|Linear|MaxPool2d|Softmax|Hardswish)|"
    "torch\\.(abs|exp|neg|cumsum|sigmoid|tanh|relu|mean|amax|flip)|"
    "transformers\\.models\\.(llama|mistral)\\.modeling_(llama|mistral)\\.(Llama|Mistral)(MLP|RMSNorm))$";

class Compose : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    auto r = test::run_opforge({"crawl", "--workspace", (*dir_ / "seeded").string(), "--match", kMatch});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  // A fresh workspace holding the crawled seeds.
  std::filesystem::path fresh(const std::string& name) {
    auto ws = *dir_ / name;
    std::filesystem::create_directories(ws);
    std::filesystem::copy_file(*dir_ / "seeded" / "opforge.db", ws / "opforge.db");
    return ws;
  }
  static std::vector<std::pair<std::string, std::string>> tasks(const std::filesystem::path& ws) {
    Db db(ws / "opforge.db");
    std::vector<std::pair<std::string, std::string>> out;
    auto st = db.prepare("SELECT id, code FROM tasks ORDER BY json_extract(provenance, '$.index')");
    while (st.step()) out.emplace_back(st.text(0), st.text(1));
    return out;
  }
  static test::TempDir* dir_;
};
test::TempDir* Compose::dir_ = nullptr;

}  // namespace

TEST_F(Compose, SameSeedSameCandidatesAndOpCountsFollowTheMix) {
  auto a = fresh("a"), b = fresh("b");
  for (auto& ws : {a, b}) {
    auto r = test::run_opforge({"compose", "--workspace", ws.string(), "--count", "200", "--seed", "7", "-j", "1",
                                "--mix", "1:10,2:60,3:25,transformers:5", "--backend", "template"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  auto ta = tasks(a);
  ASSERT_EQ(ta.size(), 200u);
  EXPECT_EQ(ta, tasks(b));
  std::set<std::string> ids;
  for (auto& [id, code] : ta) ids.insert(id);
  EXPECT_EQ(ids.size(), 200u) << "no two candidates share normalised code";

  Db db(a / "opforge.db");
  std::map<std::string, int> buckets;
  auto st = db.prepare("SELECT json_extract(provenance, '$.bucket'), num_ops, source FROM tasks");
  while (st.step()) {
    buckets[st.text(0)]++;
    if (st.text(0) != "transformers") EXPECT_EQ(std::to_string(st.int64(1)), st.text(0));
    else EXPECT_EQ(st.text(2), "transformers");
  }
  EXPECT_NEAR(buckets["1"], 20, 4);
  EXPECT_NEAR(buckets["2"], 120, 4);
  EXPECT_NEAR(buckets["3"], 50, 4);
  EXPECT_NEAR(buckets["transformers"], 10, 4);
  EXPECT_EQ(buckets.count("4") + buckets.count("5"), 0u);

  json js = json::parse(test::run_opforge({"status", "--workspace", a.string(), "--json"}).out);
  EXPECT_EQ(js["candidates"]["total"], 200);
  EXPECT_EQ(js["candidates"]["by_backend"]["template"], 200);
}

TEST_F(Compose, CandidatesAreReadableKernelBenchCodeThatRuns) {
  auto ws = fresh("runs");
  ASSERT_EQ(test::run_opforge({"compose", "--workspace", ws.string(), "--count", "12", "--seed", "3", "--backend",
                               "template"}).exit_code, 0);
  auto ts = tasks(ws);
  ASSERT_EQ(ts.size(), 12u);
  // Probe each candidate as a seed file: it must build and run in eager on the CPU.
  test::TempDir files;
  for (auto& [id, code] : ts) {
    for (auto* needle : {"class Model(nn.Module)", "def forward(self, x):", "def get_inputs():", "def get_init_inputs():",
                         "batch_size = "})
      EXPECT_NE(code.find(needle), std::string::npos) << needle << "\n" << code;
    test::write_file(files / (id + ".py"), code);
  }
  auto r = test::run_opforge({"crawl", "--workspace", (files / "probe").string(), "--sources", "none", "--add",
                              files.path().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Db db(files / "probe" / "opforge.db");
  auto st = db.prepare("SELECT count(*) FROM seeds WHERE status = 'runnable'");
  ASSERT_TRUE(st.step());
  EXPECT_EQ(st.int64(0), 12);
}

TEST_F(Compose, ARerunAddsNewCandidatesAndTheSequenceIsReproducible) {
  auto a = fresh("seq_a"), b = fresh("seq_b");
  for (auto& ws : {a, b}) {
    for (int run = 0; run < 2; ++run) {
      ASSERT_EQ(test::run_opforge({"compose", "--workspace", ws.string(), "--count", "30", "--seed", "1", "--backend",
                                   "template"}).exit_code, 0);
      ASSERT_EQ(tasks(ws).size(), 30u * (run + 1));
    }
  }
  auto ta = tasks(a);
  EXPECT_EQ(ta.size(), 60u) << "the second run continues after the first instead of repeating it";
  EXPECT_EQ(ta, tasks(b));
}

TEST_F(Compose, BadOptionsAreClearErrors) {
  auto ws = fresh("bad");
  auto r = test::run_opforge({"compose", "--workspace", ws.string(), "--mix", "2:50,7:50"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad --mix bucket '7'"), std::string::npos) << r.err;
  r = test::run_opforge({"compose", "--workspace", (*dir_ / "empty").string(), "--count", "5"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("run `opforge crawl"), std::string::npos) << r.err;
  EXPECT_THROW(composer::parse_mix("2:abc", 5), Error);
  auto mix = composer::parse_mix("1:50,2:25,5:25", 2);
  ASSERT_EQ(mix.size(), 2u);
  EXPECT_DOUBLE_EQ(mix[0].second, 50.0 / 75.0);
}

// The graph backend (the default): the same seed gives the same candidates whatever the number
// of workers, the mix holds within 2 points over 2,000 candidates, a run cut in two continues
// where it stopped, and what it composes looks like real models by the realism tool's figures.
TEST_F(Compose, GraphBackendIsDeterministicFollowsTheMixAndLooksLikeRealModels) {
  auto a = fresh("graph_a"), b = fresh("graph_b"), c = fresh("graph_c");
  auto compose = [](const std::filesystem::path& ws, const std::string& count, const std::string& workers) {
    // Ops-6K's mix less its transformers bucket: the small crawl has too few modules for 24.
    auto r = test::run_opforge({"compose", "--workspace", ws.string(), "--count", count, "--seed", "11", "-j", workers,
                                "--mix", "1:3.4,2:83.8,3:7.6,4:2.8,5:1.2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  };
  compose(a, "2000", "1");
  compose(b, "2000", "2");
  compose(c, "800", "2");
  compose(c, "1200", "2");
  auto ta = tasks(a);
  ASSERT_EQ(ta.size(), 2000u);
  EXPECT_EQ(ta, tasks(b)) << "the candidates depend on the seed, not on the workers";
  auto tc = tasks(c);
  ASSERT_EQ(tc.size(), 2000u) << "the second run continues after the first";
  std::set<std::string> ids;
  for (auto& [id, code] : tc) ids.insert(id);
  EXPECT_EQ(ids.size(), 2000u) << "a resumed run repeats nothing";

  // Percent per bucket over the 2,000 (the mix's percentages renormalised over 98.8).
  const std::map<std::string, double> mix = {{"1", 3.4 / 0.988}, {"2", 83.8 / 0.988}, {"3", 7.6 / 0.988},
                                             {"4", 2.8 / 0.988}, {"5", 1.2 / 0.988}};
  for (auto& ws : {a, c}) {
    Db db(ws / "opforge.db");
    std::map<std::string, double> got;
    auto st = db.prepare("SELECT json_extract(provenance, '$.bucket'), count(*) FROM tasks WHERE backend = 'graph' "
                         "GROUP BY 1");
    while (st.step()) got[st.text(0)] = 100.0 * static_cast<double>(st.int64(1)) / 2000.0;
    for (auto& [bucket, pct] : mix) EXPECT_NEAR(got[bucket], pct, 2.0) << bucket << " in " << ws;
  }
  auto r = test::run_opforge({"realism", "--tasks", a.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json f = json::parse(r.out)[a.string()];
  EXPECT_GE(f["heavy_share"].get<double>(), 80.0) << f.dump();
  EXPECT_GE(f["vocab_share"].get<double>(), 90.0) << f.dump();
  EXPECT_GE(f["pair_share"].get<double>(), 50.0) << f.dump();
  EXPECT_LE(f["untraced"].get<long>(), 40) << f.dump();
}

TEST_F(Compose, GraphCandidatesRunInEagerWithRealWidths) {
  auto ws = fresh("graph_runs");
  ASSERT_EQ(test::run_opforge({"compose", "--workspace", ws.string(), "--count", "16", "--seed", "4"}).exit_code, 0);
  auto ts = tasks(ws);
  ASSERT_EQ(ts.size(), 16u);
  test::TempDir files;
  for (auto& [id, code] : ts) {
    EXPECT_NE(code.find("class Model(nn.Module)"), std::string::npos) << code;
    EXPECT_NE(code.find("batch_size = "), std::string::npos) << "the filter's calibration scales batch_size\n" << code;
    test::write_file(files / (id + ".py"), code);
  }
  auto r = test::run_opforge({"crawl", "--workspace", (files / "probe").string(), "--sources", "none", "--add",
                              files.path().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Db db(files / "probe" / "opforge.db");
  auto st = db.prepare("SELECT count(*) FROM seeds WHERE status = 'runnable'");
  ASSERT_TRUE(st.step());
  EXPECT_EQ(st.int64(0), 16);
  // Provenance says which backend and which device the sizes were aimed at.
  Db wdb(ws / "opforge.db");
  auto pv = wdb.prepare("SELECT count(*) FROM tasks WHERE backend = 'graph' AND json_extract(provenance, '$.device') = "
                        "'cpu'");
  ASSERT_TRUE(pv.step());
  EXPECT_EQ(pv.int64(0), 16);
}

// A seed op that kills the composer's worker (here a segfault when the template backend runs it
// to check a chain's shapes) costs only the indices that drew it: each is a recorded failure
// with the pool's reason, and the command adds its count from the other indices.
TEST_F(Compose, ASeedThatKillsTheWorkerIsARecordedFailureNotTheEndOfTheCommand) {
  auto ws = fresh("crash");
  {
    Db db(ws / "opforge.db");
    db.exec("CREATE TEMP TABLE t AS SELECT * FROM seeds WHERE name = 'torch.abs';"
            "UPDATE t SET name = 'torch.zz_segfault', id = 'c0ffee0000000000', "
            "spec = json_set(spec, '$.forward', '__import__(''ctypes'').string_at(0)', '$.name', 'torch.zz_segfault');"
            "INSERT INTO seeds SELECT * FROM t;");
  }
  auto r = test::run_opforge({"compose", "--workspace", ws.string(), "--backend", "template", "--count", "20", "--mix",
                              "1:100", "--seed", "5", "-j", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tasks(ws).size(), 20u);
  EXPECT_NE(r.err.find("killed its worker"), std::string::npos) << r.err;
  Db db(ws / "opforge.db");
  auto st = db.prepare("SELECT count(*) FROM compose_failures WHERE reason = 'worker_crash'");
  ASSERT_TRUE(st.step());
  EXPECT_GE(st.int64(0), 1) << "the crashing seed was drawn at least once\n" << r.err;
  auto used = db.prepare("SELECT count(*) FROM tasks WHERE ops LIKE '%zz_segfault%'");
  ASSERT_TRUE(used.step());
  EXPECT_EQ(used.int64(0), 0);
}

// run --kept tops up each bucket at its own yield: a bucket that kept a quarter of what it drew
// is asked four times what it misses (a tenth more), a full bucket nothing, an untried one what it
// misses. The kept mix then holds the preset's, where topping up with the preset's mix would not.
TEST(ComposeMix, TheNextRoundOfKeptAsksEachBucketForWhatItMissesAtItsYield) {
  using opforge::composer::BucketYield;
  auto mix = opforge::composer::parse_mix("2:20,3:50,5:25,transformers:5", 5);
  std::map<std::string, BucketYield> y = {{"2", {400, 100}}, {"3", {500, 500}}, {"transformers", {100, 50}}};
  long count = 0;
  std::string next = opforge::composer::deficit_mix(mix, y, 1000, count);
  // 2: (200 - 100) / (101 / 402) * 1.1 = 437.8; 3: full; 5: never drawn, 250 * 1.1 = 275;
  // transformers: full.
  EXPECT_EQ(next, "2:438,5:275");
  EXPECT_EQ(count, 713);
  y["2"] = {400, 0};  // kept none of many: drawn as if 1 in 50 survived
  next = opforge::composer::deficit_mix(mix, y, 1000, count);
  EXPECT_EQ(next, "2:11000,5:275");
  y["2"] = {900, 300};
  y["5"] = {300, 250};
  EXPECT_EQ(opforge::composer::deficit_mix(mix, y, 1000, count), "");
  EXPECT_EQ(count, 0);
  // A small want in Ops-6K's mix: transformers' share of 8 is 0.1 of a task, so the next round does
  // not ask for one (a workspace that crawled torch only would be refused such a mix). Of 8, the
  // quotas are 2:7 and 3:1; bucket 2 kept 6 of 7, so it is asked (7 - 6) / (7/9) x 1.1 -> 2.
  mix = opforge::composer::parse_mix("1:3.4,2:83.8,3:7.6,4:2.8,5:1.2,transformers:1.2", 5);
  y = {{"2", {7, 6}}, {"3", {1, 1}}};
  EXPECT_EQ(opforge::composer::deficit_mix(mix, y, 8, count), "2:2");
  EXPECT_EQ(count, 2);
  // A bucket that kept 0 of 1 is asked 1 / (1/3) x 1.1 -> 4, not 55 as if 1 in 50 survived.
  y = {{"2", {7, 7}}, {"3", {1, 0}}};
  EXPECT_EQ(opforge::composer::deficit_mix(mix, y, 8, count), "3:4");
}
