// Seed sources added through the registry (python/opforge/sources.py): a folder registered by a
// file in $OPFORGE_SOURCES and a package registered by an `opforge.sources` entry point are
// crawled, probed and composed under their own mix buckets; unknown names are clear errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "opforge/core/store.h"
#include "test_support.h"

using namespace opforge;

namespace {

// The registry's two outside places, for the opforge processes this test starts (and their workers).
class Sources : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = test::fixtures() / "sources";
    ::setenv("OPFORGE_SOURCES", (dir / "defs").c_str(), 1);
    ::setenv("PYTHONPATH", (dir / "pkg").c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("OPFORGE_SOURCES");
    ::unsetenv("PYTHONPATH");
  }
};

std::map<std::string, long> count_by(const std::filesystem::path& ws, const std::string& sql) {
  Db db(ws / "opforge.db");
  std::map<std::string, long> out;
  auto st = db.prepare(sql);
  while (st.step()) out[st.text(0)] = st.int64(1);
  return out;
}

}  // namespace

TEST_F(Sources, ARegisteredFolderAndAnEntryPointAreCrawledAndComposed) {
  test::TempDir dir;
  auto ws = dir / "ws";
  auto r = test::run_opforge({"crawl", "--workspace", ws.string(), "--sources", "blocks,example"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto seeds = count_by(ws, "SELECT name || ':' || source || ':' || status, 1 FROM seeds");
  EXPECT_EQ(seeds.size(), 3u);
  EXPECT_TRUE(seeds.count("blocks.swiglu_mlp:blocks:runnable"));
  EXPECT_TRUE(seeds.count("blocks.se_block:blocks:runnable"));
  EXPECT_TRUE(seeds.count("example.swish_gate:example:runnable"));

  r = test::run_opforge({"compose", "--workspace", ws.string(), "--count", "12", "--mix", "2:50,blocks:25,example:25"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto by = count_by(ws, "SELECT json_extract(provenance, '$.bucket') || ':' || source, count(*) FROM tasks GROUP BY 1");
  EXPECT_EQ(by["blocks:blocks"], 3);
  EXPECT_EQ(by["example:example"], 3);
  EXPECT_EQ(by["2:torch"], 6) << "the graph backend's chains need no torch seeds";
}

TEST_F(Sources, UnknownSourcesAndEmptyBucketsAreClearErrors) {
  test::TempDir dir;
  auto r = test::run_opforge({"crawl", "--workspace", (dir / "a").string(), "--sources", "nope"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown source 'nope'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("blocks"), std::string::npos) << "the error lists what is registered\n" << r.err;
  ASSERT_EQ(test::run_opforge({"crawl", "--workspace", (dir / "b").string(), "--sources", "example"}).exit_code, 0);
  r = test::run_opforge({"compose", "--workspace", (dir / "b").string(), "--count", "4", "--mix", "2:50,blocks:50"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no runnable seed of source 'blocks'"), std::string::npos) << r.err;
}

TEST_F(Sources, AComposerBackendRegisteredByAnEntryPointComposes) {
  test::TempDir dir;
  auto ws = dir / "ws";
  ASSERT_EQ(test::run_opforge({"crawl", "--workspace", ws.string(), "--sources", "example"}).exit_code, 0);
  auto r = test::run_opforge({"compose", "--workspace", ws.string(), "--backend", "example", "--count", "6", "--mix",
                              "2:100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto by = count_by(ws, "SELECT backend || ':' || num_ops, count(*) FROM tasks GROUP BY 1");
  EXPECT_EQ(by["example:2"], 6);
  r = test::run_opforge({"compose", "--workspace", ws.string(), "--backend", "nope", "--count", "2", "--mix", "2:100"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("registered are example, graph, template"), std::string::npos) << r.err;
}

// A filter check registered by an entry point runs when `--check` names it, with its own reason;
// naming an unregistered one is an error before anything is judged.
TEST_F(Sources, AFilterCheckRegisteredByAnEntryPointRejectsWithItsReason) {
  test::TempDir dir;
  test::write_file(dir / "in" / "big.py",
                   "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                   "        return torch.tanh(x)\n\ndef get_inputs():\n    return [torch.randn(2048, 1024)]\n\n"
                   "def get_init_inputs():\n    return []\n");
  auto ws = dir / "ws";
  ASSERT_EQ(test::run_opforge({"import", "--workspace", ws.string(), (dir / "in").string()}).exit_code, 0);
  std::vector<std::string> base = {"filter", "--workspace", ws.string(), "--device", "cpu", "--workers", "1",
                                   "--min-ms", "0", "--skip-check", "compile"};
  auto r = test::run_opforge([&] { auto a = base; a.insert(a.end(), {"--check", "nope"}); return a; }());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--check nope: no such registered check (registered: no_huge_outputs)"), std::string::npos)
      << r.err;
  r = test::run_opforge([&] { auto a = base; a.insert(a.end(), {"--check", "no_huge_outputs"}); return a; }());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto reasons = count_by(ws, "SELECT coalesce(reason, verdict), count(*) FROM filter_results GROUP BY 1");
  EXPECT_EQ(reasons["output_too_large"], 1) << r.err;
}
