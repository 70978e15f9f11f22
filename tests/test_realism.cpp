// `opforge realism` and `opforge model-stats` through the real binary: the figures of a fixture
// folder whose ops are known, the real-model table regenerated from a small families file, and
// the errors a user meets.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

using namespace opforge;
using nlohmann::json;

TEST(Realism, FiguresOfAFolderWhoseOpsAreKnown) {
  auto dir = test::fixtures() / "realism";
  auto r = test::run_opforge({"realism", "--tasks", dir.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json f = json::parse(r.out)[dir.string()];
  // 5 files, one reads its data (untraced); 12 ops: linear gelu linear add | conv2d batch_norm
  // relu max_pool2d | zeta rot90 tanh | softmax.
  EXPECT_EQ(f["tasks"], 5);
  EXPECT_EQ(f["untraced"], 1);
  EXPECT_EQ(f["multi_op"], 3);
  EXPECT_EQ(f["op_occurrences"], 12);
  EXPECT_DOUBLE_EQ(f["heavy_share"].get<double>(), 66.7);   // the zeta chain has no heavy op
  EXPECT_DOUBLE_EQ(f["vocab_share"].get<double>(), 83.3);   // zeta and rot90 are in no real model
  EXPECT_DOUBLE_EQ(f["pair_share"].get<double>(), 75.0);    // 6 of 8 pairs; zeta->rot90, rot90->tanh not
  EXPECT_NE(f["untraced_examples"][0].get<std::string>().find("meta"), std::string::npos);

  auto table = test::run_opforge({"realism", "--tasks", dir.string(), "--tasks", (dir / "conv_bn_relu.py").string()});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("conv_bn_relu.py"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("100.0%"), std::string::npos) << "the stem alone is all heavy, real, real pairs\n"
                                                         << table.out;
}

TEST(Realism, ModelStatsTracesEachFamilyAndRecordsWhatFailed) {
  test::TempDir dir;
  // Two families of the real list, a torch module, and a family that does not exist.
  test::write_file(dir / "families.json", R"J({
    "sizes": {"batch": 2, "seq_len": 64, "decoder_len": 8},
    "layers": 1,
    "fallback": {"config": {"hidden_size": 64}, "sizes": {"batch": 2, "seq_len": 16, "decoder_len": 4}},
    "inputs": {"text": {"input_ids": "torch.randint(0, cfg.vocab_size, (batch, seq_len))"},
               "vision": {"pixel_values": "torch.randn(batch, 3, image_size(cfg), image_size(cfg))"}},
    "families": [["bert", "text"], ["resnet", "vision"], ["no_such_family", "text"]],
    "torch_modules": [{"name": "nn.GRU", "init": "nn.GRU(32, 64, batch_first=True)",
                       "inputs": ["torch.randn(batch, seq_len, 32)"]}]
  })J");
  auto out = dir / "stats.json";
  auto r = test::run_opforge(
      {"model-stats", "--families", (dir / "families.json").string(), "--out", out.string(), "--workers", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no_such_family not traced"), std::string::npos) << r.err;
  json t = json::parse(test::read_file(out));
  EXPECT_EQ(t["provenance"]["failed"].size(), 1u);
  EXPECT_EQ(t["provenance"]["traced"]["bert"], "meta");
  EXPECT_EQ(t["provenance"]["traced"]["nn.GRU"], "meta");
  for (const char* op : {"linear", "layer_norm", "gelu", "conv2d", "batch_norm", "relu", "gru", "embedding"})
    EXPECT_TRUE(t["ops"].contains(op)) << op;
  EXPECT_TRUE(t["pairs"].contains("conv2d -> batch_norm"));
  EXPECT_TRUE(t["edges"].contains("batch_norm -> relu"));
  EXPECT_EQ(t["families_per_op"]["linear"], 1) << "bert only: resnet's base model has no classifier";
  EXPECT_EQ(t["families_per_op"]["batch_norm"], 1);
  // bert-base's real width, traced on meta: 768.
  EXPECT_TRUE(t["layouts"]["linear"]["shapes"].contains("[2, 64, 768]")) << t["layouts"]["linear"].dump();

  // Against this table the figures change: no max_pool2d in it, bert has no softmax op (sdpa).
  auto dir2 = test::fixtures() / "realism";
  auto f = test::run_opforge({"realism", "--tasks", dir2.string(), "--stats", out.string(), "--json"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_LT(json::parse(f.out)[dir2.string()]["vocab_share"].get<double>(), 83.3);
}

TEST(Realism, MissingInputsAreClearErrors) {
  test::TempDir dir;
  auto r = test::run_opforge({"realism", "--tasks", (test::fixtures() / "realism").string(), "--stats",
                              (dir / "none.json").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("opforge model-stats"), std::string::npos) << r.err;
  r = test::run_opforge({"realism", "--tasks", (dir / "nowhere").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nowhere"), std::string::npos) << r.err;
  test::write_file(dir / "families.json", R"({"families": []})");
  r = test::run_opforge({"model-stats", "--families", (dir / "families.json").string(), "--out",
                         (dir / "out.json").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("has no \"torch_modules\""), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.json"));
}
