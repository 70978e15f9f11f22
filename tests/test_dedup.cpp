// `opforge dedup` end to end on the CPU over our own fixtures (tests/fixtures/dedup): planted
// exact and near duplicates go, distinct tasks stay, a perturbed copy of a reference file and a
// task spelling a KernelBench level-2 op sequence are dropped, and a rerun changes nothing.
// Tasks are marked accepted by writing filter_results rows directly: the real filter is slow and
// tested on its own (test_filter.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "dedup.h"
#include "opforge/core/paths.h"
#include "opforge/core/store.h"
#include "test_support.h"

using namespace opforge;
using nlohmann::json;

namespace {

const std::map<std::string, json>& kTracedOps = test::dedup_fixture_ops();

// Imports the fixture tasks and accepts them all; returns the import's stderr.
std::string accepted_workspace(const std::filesystem::path& ws) {
  auto r = test::run_opforge({"import", "--workspace", ws.string(), (test::fixtures() / "dedup" / "tasks").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  Db db(ws / "opforge.db");
  std::vector<std::pair<std::string, std::string>> rows;
  {
    auto st = db.prepare("SELECT id, json_extract(provenance, '$.path') FROM tasks");
    while (st.step()) rows.emplace_back(st.text(0), std::filesystem::path(st.text(1)).stem().string());
  }
  db.transaction([&] {
    for (auto& [id, stem] : rows) {
      auto st = db.prepare(
          "INSERT INTO filter_results(task_id, verdict, code, ops) SELECT id, 'accepted', code, ? FROM tasks WHERE id = ?");
      st.bind(1, kTracedOps.at(stem).dump()).bind(2, id).run();
    }
  });
  return r.err;
}

struct Result {
  std::string id;
  bool kept = false;
  std::string reason, duplicate_of, nearest_ref, kb_problem;
  double ref_sim = NAN, task_sim = NAN;
};

std::map<std::string, Result> results(const std::filesystem::path& ws) {
  Db db(ws / "opforge.db");
  auto st = db.prepare(
      "SELECT json_extract(t.provenance, '$.path'), d.task_id, d.kept, coalesce(d.reason, ''), "
      "coalesce(d.duplicate_of, ''), coalesce(d.nearest_ref, ''), d.ref_similarity, d.task_similarity, "
      "coalesce(d.kernelbench_problem, '') FROM dedup_results d JOIN tasks t ON t.id = d.task_id");
  std::map<std::string, Result> out;
  while (st.step()) {
    Result r{st.text(1), st.int64(2) != 0, st.text(3), st.text(4), st.text(5), st.text(8)};
    r.ref_sim = st.is_null(6) ? NAN : st.real(6);
    r.task_sim = st.is_null(7) ? NAN : st.real(7);
    out[std::filesystem::path(st.text(0)).stem().string()] = r;
  }
  return out;
}

std::string dump_table(const std::filesystem::path& ws) {
  Db db(ws / "opforge.db");
  auto st = db.prepare(
      "SELECT task_id, kept, coalesce(reason, '-'), coalesce(duplicate_of, '-'), coalesce(nearest_ref, '-'), "
      "coalesce(ref_similarity, -9), coalesce(nearest_task, '-'), coalesce(task_similarity, -9), "
      "coalesce(kernelbench_problem, '-'), normal_hash, op_sequence FROM dedup_results ORDER BY task_id");
  std::string out;
  while (st.step())
    for (int c = 0; c < 11; ++c) out += st.text(c) + (c == 10 ? "\n" : "|");
  return out;
}

// Of a pair that differ only in what dedup ignores: the smaller id is kept, the other points at it.
void expect_pair(const std::map<std::string, Result>& res, const std::string& a, const std::string& b,
                 const std::string& reason) {
  ASSERT_TRUE(res.count(a) && res.count(b)) << a << " " << b;
  const Result& first = res.at(a).id < res.at(b).id ? res.at(a) : res.at(b);
  const Result& second = res.at(a).id < res.at(b).id ? res.at(b) : res.at(a);
  EXPECT_TRUE(first.kept) << a << "/" << b << ": " << first.reason;
  EXPECT_FALSE(second.kept);
  EXPECT_EQ(second.reason, reason);
  EXPECT_EQ(second.duplicate_of, first.id);
}

}  // namespace

TEST(Dedup, PlantedDuplicatesAndKernelBenchLookalikesAreDropped) {
  test::TempDir dir;
  auto ws = dir / "ws";
  std::string import_log = accepted_workspace(ws);
  // The comments-and-whitespace copy has the same task id as its original: import already merges it.
  EXPECT_NE(import_log.find("imported 12 candidates (1 already present)"), std::string::npos) << import_log;

  auto r = test::run_opforge({"dedup", "--workspace", ws.string(), "--reference",
                              (test::fixtures() / "dedup" / "reference").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::cerr << r.err;
  auto res = results(ws);
  ASSERT_EQ(res.size(), 12u);

  expect_pair(res, "linear_tanh", "linear_tanh_renamed", "exact_duplicate");
  expect_pair(res, "layernorm_gelu", "layernorm_gelu_reordered", "near_duplicate");
  const Result& near = res.at("layernorm_gelu").kept ? res.at("layernorm_gelu_reordered") : res.at("layernorm_gelu");
  EXPECT_GE(near.task_sim, 0.98);
  // Node-type n-grams do not see which module an import names: the vectors are equal, the
  // normal forms are not (the order of the imports differs).

  for (auto* distinct : {"softmax_sum", "bmm_scale_sigmoid", "cummax_single"}) {
    EXPECT_TRUE(res.at(distinct).kept) << distinct << ": " << res.at(distinct).reason;
    EXPECT_LT(res.at(distinct).ref_sim, 0.95) << distinct;
    EXPECT_LT(res.at(distinct).task_sim, 0.98) << distinct;
  }

  const Result& kb = res.at("conv_relu_bias");
  EXPECT_FALSE(kb.kept);
  EXPECT_EQ(kb.reason, "kernelbench_ops");
  EXPECT_EQ(kb.kb_problem, "1_Conv2D_ReLU_BiasAdd");
  // A level-2 chain with an op slipped in, and one op that is a level-1 problem, go too.
  const Result& added = res.at("conv_relu_scale_bias");
  EXPECT_EQ(added.reason, "kernelbench_ops");
  EXPECT_EQ(added.kb_problem, "1_Conv2D_ReLU_BiasAdd");
  const Result& single = res.at("hardtanh_single");
  EXPECT_EQ(single.reason, "kernelbench_level1");
  EXPECT_EQ(single.kb_problem, "32_HardTanh");

  const Result& copy = res.at("deconv_softplus_clamp");
  EXPECT_FALSE(copy.kept);
  EXPECT_EQ(copy.reason, "kernelbench_similar");
  EXPECT_EQ(copy.nearest_ref, "level2/7_ConvTranspose2d_Softplus_Clamp.py");
  EXPECT_GE(copy.ref_sim, 0.95);
  // A level-3-style block renamed, resized and without its docstring is still its reference.
  const Result& block = res.at("mlp_block_renamed");
  EXPECT_EQ(block.reason, "kernelbench_similar");
  EXPECT_EQ(block.nearest_ref, "level3/1_ResidualMLPBlock.py");

  json st = json::parse(test::run_opforge({"status", "--workspace", ws.string(), "--json"}).out)["dedup"];
  EXPECT_EQ(st["kept"], 5);
  EXPECT_EQ(st["dropped"], 7);
  EXPECT_EQ(st["pending"], 0);
  EXPECT_EQ(st["reasons"], json({{"exact_duplicate", 1}, {"near_duplicate", 1}, {"kernelbench_ops", 2},
                                 {"kernelbench_level1", 1}, {"kernelbench_similar", 2}}));
  long binned = 0;
  for (auto& b : st["ref_similarity_histogram"]) binned += b["kept"].get<long>();
  EXPECT_EQ(binned, 5);
  EXPECT_NE(test::run_opforge({"status", "--workspace", ws.string()}).out.find("dropped kernelbench_ops"),
            std::string::npos);

  // Recomputed from scratch: the same rows again.
  std::string before = dump_table(ws);
  r = test::run_opforge({"dedup", "--workspace", ws.string(), "--reference",
                         (test::fixtures() / "dedup" / "reference").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(dump_table(ws), before);

  // The inverted file used above --exact-up-to vectors decides the same here (bench/dedup_scale
  // measures it at 100k tasks).
  r = test::run_opforge({"dedup", "--workspace", ws.string(), "--exact-up-to", "0", "--reference",
                         (test::fixtures() / "dedup" / "reference").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(dump_table(ws), before);
}

TEST(Dedup, WithoutReferencesAndNamesOnlyDuplicatesGo) {
  test::TempDir dir;
  auto ws = dir / "ws";
  accepted_workspace(ws);
  auto r = test::run_opforge({"dedup", "--workspace", ws.string(), "--no-kernelbench-names"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto res = results(ws);
  long kept = 0;
  for (auto& [name, x] : res) {
    kept += x.kept;
    EXPECT_TRUE(std::isnan(x.ref_sim)) << name;
  }
  EXPECT_EQ(kept, 10);
  EXPECT_TRUE(res.at("conv_relu_bias").kept);
  EXPECT_TRUE(res.at("hardtanh_single").kept);
  EXPECT_TRUE(res.at("deconv_softplus_clamp").kept);
}

TEST(Dedup, AMissingReferenceFolderIsAClearError) {
  test::TempDir dir;
  auto r = test::run_opforge({"dedup", "--workspace", (dir / "ws").string(), "--reference", "/no/such/kernelbench"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--reference /no/such/kernelbench is not a folder"), std::string::npos) << r.err;
}

TEST(Dedup, OpSequencesMapOntoKernelBenchWordsAndVectorsAreUnit) {
  json table = json::parse(test::read_file(data_dir() / "kernelbench_ops.json"));
  EXPECT_EQ(dedup::op_tokens(json::array({"nn.Conv2d", "Tensor.view", "F.relu", "torch.add"}), table),
            std::vector<std::string>({"conv2d", "relu", "add"}));
  EXPECT_EQ(dedup::op_tokens(json::array({"nn.Linear", "torch.mul", "F.leaky_relu"}), table),
            std::vector<std::string>({"gemm", "multiply", "leakyrelu"}));
  EXPECT_EQ(table["level2"]["12_Gemm_Multiply_LeakyReLU"], json::array({"gemm", "multiply", "leakyrelu"}));
  EXPECT_EQ(dedup::op_tokens(json::array({"torch.cummax"}), table), std::vector<std::string>({"cummax"}))
      << "an op the table does not know stays itself";
  EXPECT_EQ(table["level1"]["50_conv_standard_2D__square_input__square_kernel"], "conv2d");
  EXPECT_EQ(table["level1"]["47_Sum_reduction_over_a_dimension"], "sum");
  for (auto& [name, token] : table["level1"].items()) EXPECT_TRUE(token.is_string()) << name << " has no op";

  dedup::KernelBenchOps kb(table);
  using V = std::vector<std::string>;
  auto hit = kb.match(V{"gemm", "add", "multiply", "relu", "leakyrelu"});  // level-2 12 with ops between
  ASSERT_TRUE(hit);
  EXPECT_EQ(*hit, std::make_pair(std::string("kernelbench_ops"), std::string("12_Gemm_Multiply_LeakyReLU")));
  EXPECT_FALSE(kb.match(V{"leakyrelu", "multiply", "gemm"})) << "the order counts";
  EXPECT_EQ(kb.match(V{"softsign"})->first, "kernelbench_level1");
  EXPECT_FALSE(kb.match(V{"cummax"}));
  EXPECT_FALSE(kb.match(V{"softsign", "cummax"})) << "two ops are no level-1 problem";
  EXPECT_FALSE(dedup::KernelBenchOps().match(V{"conv2d", "relu", "add"})) << "no table, no match";

  json a = {{"Module", 1}, {"Call|Attribute", 7}, {"op:nn.Linear", 1}};
  json b = {{"Module", 1}, {"Call|Attribute", 7}, {"op:nn.Conv2d", 1}};
  auto va = dedup::hashed_vector(a, 256, 0.5), vb = dedup::hashed_vector(b, 256, 0.5);
  double na = 0, dot = 0;
  for (int i = 0; i < 256; ++i) {
    na += va[i] * va[i];
    dot += va[i] * vb[i];
  }
  EXPECT_NEAR(na, 1.0, 1e-5);
  EXPECT_NEAR(dot, 0.5, 0.05) << "same structure, other ops: the op half differs";
}
