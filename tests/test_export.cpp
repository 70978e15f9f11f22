// `opforge export` end to end on the CPU: a workspace of imported fixtures (tests/fixtures/dedup),
// accepted by writing filter_results rows directly (the real filter is tested in test_filter.cpp)
// and deduplicated by the real `opforge dedup`. Exports must be byte-identical across runs, their
// manifest must checksum the shards, the dataset card must load with Hugging Face `datasets`, and
// a workspace that dedup has not seen must be refused with a message saying what to run.
#include <gtest/gtest.h>

#include <cmath>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "export.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/store.h"
#include "test_support.h"

using namespace opforge;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::map<std::string, json>& kTracedOps = test::dedup_fixture_ops();

// Imports the fixtures and accepts them all, with plausible metrics.
void accepted_workspace(const fs::path& ws) {
  auto r = test::run_opforge({"import", "--workspace", ws.string(), (test::fixtures() / "dedup" / "tasks").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Db db(ws / "opforge.db");
  std::vector<std::pair<std::string, std::string>> rows;
  {
    auto st = db.prepare("SELECT id, json_extract(provenance, '$.path') FROM tasks ORDER BY id");
    while (st.step()) rows.emplace_back(st.text(0), fs::path(st.text(1)).stem().string());
  }
  db.transaction([&] {
    int k = 0;
    for (auto& [id, stem] : rows) {
      json metrics = {{"device", "cpu"}, {"torch", "2.test"}, {"eager_ms", 1.5 + 7 * k++}, {"compile_ms", 1.25}};
      auto st = db.prepare(
          "INSERT INTO filter_results(task_id, verdict, code, ops, metrics) SELECT id, 'accepted', code, ?, ? FROM "
          "tasks WHERE id = ?");
      st.bind(1, kTracedOps.at(stem).dump()).bind(2, metrics.dump()).bind(3, id).run();
    }
  });
}

// One deduplicated workspace for the suite: import and dedup start workers, which takes seconds.
const fs::path& deduped_workspace() {
  static test::TempDir dir;
  static fs::path ws = [] {
    fs::path p = dir / "ws";
    accepted_workspace(p);
    auto r = test::run_opforge({"dedup", "--workspace", p.string(), "--no-kernelbench-names"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return ws;
}

// Every file under root except the PNG plots (matplotlib does not promise their bytes), by relative path.
std::map<std::string, std::string> tree(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file() && e.path().extension() != ".png")
      out[fs::relative(e.path(), root).string()] = test::read_file(e.path());
  return out;
}

std::vector<json> lines(const std::string& text) {
  std::vector<json> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    out.push_back(json::parse(text.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  return out;
}

}  // namespace

TEST(Export, SameWorkspaceGivesTheSameBytesAndTheManifestChecksumsThem) {
  const fs::path& ws = deduped_workspace();
  test::TempDir dir;
  std::vector<std::string> args = {"export", "--workspace", ws.string(), "--shard-size", "4", "--test-fraction", "0.5",
                                   "--split-seed", "7"};
  auto a = args, b = args;
  a.insert(a.end(), {"--out", (dir / "a").string()});
  b.insert(b.end(), {"--out", (dir / "b").string()});
  auto ra = test::run_opforge(a);
  ASSERT_EQ(ra.exit_code, 0) << ra.err;
  auto rb = test::run_opforge(b);
  ASSERT_EQ(rb.exit_code, 0) << rb.err;

  auto ta = tree(dir / "a"), tb = tree(dir / "b");
  EXPECT_EQ(ta, tb);
  for (auto* f : {"manifest.json", "README.md", "stats/funnel.json", "stats/op_frequency.json", "stats/ops_per_task.json", "stats/eager_ms.json",
                  "stats/similarity.json"})
    EXPECT_TRUE(ta.count(f)) << f;
  for (auto* png : {"funnel.png", "op_frequency.png", "ops_per_task.png", "eager_ms.png", "similarity.png", "realism.png"})
    EXPECT_TRUE(fs::exists(dir / "a" / "stats" / png)) << png;

  // 13 files, 12 tasks (a comments-only copy merges at import), 1 exact and 1 near duplicate dropped.
  json m = json::parse(ta.at("manifest.json"));
  EXPECT_EQ(m["records"], 10);
  EXPECT_EQ(m["splits"]["train"].get<long>() + m["splits"]["test"].get<long>(), 10);
  EXPECT_EQ(m["device"], "cpu");
  EXPECT_EQ(m["versions"]["torch"], "2.test");
  EXPECT_EQ(m["config"]["shard_size"], 4);
  EXPECT_FALSE(m["config"]["dedup"].is_null());
  EXPECT_EQ(ta.at("manifest.json").find("_at\""), std::string::npos) << "no timestamps";
  // One set of shards per split (4 records each at most), every record in its split's shards.
  ASSERT_GE(m["shards"].size(), 3u);
  for (auto& sh : m["shards"]) {
    std::string file = sh["file"], split = sh["split"];
    EXPECT_EQ(file.rfind("ops-" + split + "-", 0), 0u) << file;
    for (auto& rec : lines(ta.at(file))) EXPECT_EQ(rec["split"], split) << file;
  }
  long total = 0;
  std::vector<json> recs;
  for (auto& s : m["shards"]) {
    const std::string& bytes = ta.at(s["file"].get<std::string>());
    EXPECT_EQ(s["xxh3"], xxh3_hex(bytes)) << s["file"];
    auto ls = lines(bytes);
    EXPECT_EQ(s["records"], ls.size());
    total += static_cast<long>(ls.size());
    recs.insert(recs.end(), ls.begin(), ls.end());
  }
  EXPECT_EQ(total, 10);
  for (auto& s : m["stats"]) EXPECT_EQ(s["xxh3"], xxh3_hex(ta.at(s["file"].get<std::string>())));

  for (std::size_t i = 0; i < recs.size(); ++i) {
    const json& r = recs[i];
    for (auto* k : {"id", "ops", "data_source", "code", "num_ops", "metrics", "provenance", "decontamination", "split"})
      EXPECT_TRUE(r.contains(k)) << k << " in " << r.dump();
    EXPECT_TRUE(r["ops"].is_array());
    EXPECT_EQ(r["data_source"], "imported#" + std::to_string(r["ops"].size()));
    EXPECT_NE(r["code"].get<std::string>().find("class Model"), std::string::npos);
    EXPECT_EQ(r["provenance"]["backend"], "import");
    EXPECT_TRUE(r["provenance"]["seed_ids"].is_array());
    EXPECT_TRUE(r["decontamination"].contains("task_similarity"));
    // Split by op-signature cluster: the cluster's hash decides, so one cluster is on one side.
    EXPECT_EQ(r["split_cluster"].get<std::string>().size(), 16u);
    for (auto& other : recs)
      if (other["split_cluster"] == r["split_cluster"]) EXPECT_EQ(other["split"], r["split"]) << r["id"];
    if (r["split"] == "test") {
      // Its nearest train record, by the cosine dedup uses.
      const json& near = r["decontamination"]["nearest_train"];
      ASSERT_TRUE(near.is_string()) << r.dump();
      bool in_train = false;
      for (auto& other : recs) in_train |= other["id"] == near && other["split"] == "train";
      EXPECT_TRUE(in_train) << near;
      EXPECT_LE(std::abs(r["decontamination"]["train_similarity"].get<double>()), 1.0001);
    }
    // In id order within each split (the shards of train come first, then those of test).
    if (i > 0 && recs[i - 1]["split"] == r["split"])
      EXPECT_LT(recs[i - 1]["id"].get<std::string>(), r["id"].get<std::string>()) << "id order";
  }

  json funnel = json::parse(ta.at("stats/funnel.json"));
  EXPECT_EQ(funnel["filter"]["accepted"], 12);
  EXPECT_EQ(funnel["dedup"]["dropped_by_reason"], json({{"exact_duplicate", 1}, {"near_duplicate", 1}}));
  EXPECT_EQ(funnel["exported"]["records"], 10);

  std::string card = ta.at("README.md");
  EXPECT_EQ(card.rfind("---\nconfigs:\n- config_name: default\n", 0), 0u) << card;
  EXPECT_NE(card.find("- split: train\n    path: \"ops-train-*.jsonl\""), std::string::npos) << card;
  EXPECT_NE(card.find("- split: test\n    path: \"ops-test-*.jsonl\""), std::string::npos) << card;
  EXPECT_NE(card.find("License and attribution"), std::string::npos) << card;
  EXPECT_NE(card.find("| this dataset | 10 |"), std::string::npos) << "the realism figures\n" << card;

  // The card is what Hugging Face `datasets` reads when pointed at the folder.
  test::TempDir hf;
  std::string py = python_executable().string();
  auto [rc, out] = test::shell("HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 HF_HOME='" + hf.path().string() + "' '" + py +
                         "' -c \"import datasets, sys; d = datasets.load_dataset(sys.argv[1]); "
                         "assert all(isinstance(o, list) for o in d['train']['ops']); "
                         "assert set(d['test']['split']) == {'test'}; "
                         "print('rows', len(d['train']) + len(d['test']), 'test', len(d['test']))\" '" +
                         (dir / "a").string() + "' 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("rows 10 test " + std::to_string(m["splits"]["test"].get<long>())), std::string::npos) << out;
}

TEST(Export, GzipShardsDecompressToTheSameLines) {
  const fs::path& ws = deduped_workspace();
  test::TempDir dir;
  auto r = test::run_opforge({"export", "--workspace", ws.string(), "--out", (dir / "plain").string(), "--no-plots"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_opforge(
      {"export", "--workspace", ws.string(), "--out", (dir / "gz").string(), "--gzip", "--no-plots"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_opforge(
      {"export", "--workspace", ws.string(), "--out", (dir / "gz2").string(), "--gzip", "--no-plots"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string gz = test::read_file(dir / "gz" / "ops-train-00000-of-00001.jsonl.gz");
  EXPECT_EQ(gz, test::read_file(dir / "gz2" / "ops-train-00000-of-00001.jsonl.gz"));
  EXPECT_EQ(gz.substr(4, 4), std::string(4, '\0')) << "gzip mtime is 0";
  json m = json::parse(test::read_file(dir / "gz" / "manifest.json"));
  EXPECT_EQ(m["shards"][0]["xxh3"], xxh3_hex(gz));
  EXPECT_NE(test::read_file(dir / "gz" / "README.md").find("path: \"ops-train-*.jsonl.gz\""), std::string::npos);

  auto [rc, out] = test::shell("'" + python_executable().string() +
                         "' -c \"import gzip, sys; sys.stdout.write(gzip.open(sys.argv[1], 'rt').read())\" '" +
                         (dir / "gz" / "ops-train-00000-of-00001.jsonl.gz").string() + "'");
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(out, test::read_file(dir / "plain" / "ops-train-00000-of-00001.jsonl"));
}

TEST(Export, TheFolderIsReplacedWholeAndAForeignFolderIsRefused) {
  const fs::path& ws = deduped_workspace();
  test::TempDir dir;
  fs::path out = dir / "ds";
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"export", "--workspace", ws.string(), "--out", out.string(), "--no-plots"};
    a.insert(a.end(), extra.begin(), extra.end());
    return test::run_opforge(a);
  };
  ASSERT_EQ(run({"--shard-size", "2"}).exit_code, 0);
  test::write_file(dir / "ds.partial" / "ops-train-00099-of-00100.jsonl", "left by a killed export\n");
  // A second export with fewer, larger shards: nothing of the first (or of the killed one) is left.
  auto r = run({});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> names;
  for (auto& e : fs::directory_iterator(out)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"README.md", "manifest.json", "ops-train-00000-of-00001.jsonl", "stats"}));
  EXPECT_FALSE(fs::exists(dir / "ds.partial"));
  EXPECT_FALSE(fs::exists(dir / "ds.previous"));

  test::write_file(dir / "mine" / "notes.txt", "a user's file\n");
  r = test::run_opforge({"export", "--workspace", ws.string(), "--out", (dir / "mine").string(), "--no-plots"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("holds files that are not an opforge export"), std::string::npos) << r.err;
  EXPECT_EQ(test::read_file(dir / "mine" / "notes.txt"), "a user's file\n");
}

TEST(Export, KernelBenchLayoutWritesOneRunnableFilePerRecord) {
  const fs::path& ws = deduped_workspace();
  test::TempDir dir;
  auto r = test::run_opforge(
      {"export", "--workspace", ws.string(), "--out", dir.path().string(), "--format", "kernelbench", "--no-plots"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir / "level_opforge")) {
    names.push_back(e.path().filename().string());
    std::string code = test::read_file(e.path());
    EXPECT_NE(code.find("class Model"), std::string::npos) << e.path();
    EXPECT_NE(code.find("def get_inputs"), std::string::npos) << e.path();
  }
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 10u);
  // Numbered from 1 (sorted as text, "10_" comes before "1_").
  EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.rfind("1_", 0) == 0; }))
      << names[0];
  json m = json::parse(test::read_file(dir / "manifest.json"));
  ASSERT_EQ(m["files"].size(), 10u);
  for (auto& f : m["files"])
    EXPECT_EQ(f["xxh3"], xxh3_hex(test::read_file(dir / f["file"].get<std::string>()))) << f["file"];
}

// --format verl: the rows verl's RL dataset reads, one parquet file per split, checksummed in the
// manifest, the same bytes from the same workspace, readable by pyarrow and `datasets`.
TEST(Export, VerlFormatWritesTheRowsVerlReads) {
  const fs::path& ws = deduped_workspace();
  test::TempDir dir;
  for (auto* out : {"a", "b"}) {
    auto r = test::run_opforge({"export", "--workspace", ws.string(), "--out", (dir / out).string(), "--format", "verl",
                                "--test-fraction", "0.5", "--split-seed", "7", "--no-plots", "--no-realism"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  json m = json::parse(test::read_file(dir / "a" / "manifest.json"));
  ASSERT_EQ(m["files"].size(), 2u) << m.dump();
  for (auto& f : m["files"]) {
    std::string bytes = test::read_file(dir / "a" / f["file"].get<std::string>());
    EXPECT_EQ(f["xxh3"], xxh3_hex(bytes)) << f["file"];
    EXPECT_EQ(bytes, test::read_file(dir / "b" / f["file"].get<std::string>())) << "deterministic " << f["file"];
  }
  std::string py = python_executable().string();
  auto [rc, out] = test::shell(
      "HF_DATASETS_OFFLINE=1 HF_HOME='" + dir.path().string() + "/hf' '" + py + "' - '" + (dir / "a").string() +
      "' <<'PY' 2>&1\n"
      "import sys, pyarrow.parquet as pq, datasets\n"
      "d = sys.argv[1]\n"
      "rows = pq.read_table(d + '/train.parquet').to_pylist() + pq.read_table(d + '/test.parquet').to_pylist()\n"
      "assert len(rows) == 10, len(rows)\n"
      "for r in rows:\n"
      "    assert r['ability'] == 'cuda' and r['reward_model']['style'] == 'rule'\n"
      "    assert r['reward_model']['ground_truth'] == r['extra_info']['task_id']\n"
      "    assert [m['role'] for m in r['prompt']] == ['system', 'user']\n"
      "    assert r['extra_info']['code'].strip() in r['prompt'][1]['content'] and 'ModelNew' in r['prompt'][1]['content']\n"
      "    assert r['data_source'].startswith('imported#')\n"
      "ds = datasets.load_dataset('parquet', data_files={'train': d + '/train.parquet', 'test': d + '/test.parquet'})\n"
      "print('verl rows', len(ds['train']) + len(ds['test']))\n"
      "PY");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("verl rows 10"), std::string::npos) << out;
}

TEST(Export, WithoutDedupResultsItSaysToRunDedup) {
  test::TempDir dir;
  accepted_workspace(dir / "ws");
  auto r = test::run_opforge({"export", "--workspace", (dir / "ws").string(), "--out", (dir / "out").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("12 of 12 accepted tasks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("run `opforge dedup --workspace"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "out" / "manifest.json"));
}

TEST(Export, NamesAndSplitsAreStable) {
  EXPECT_EQ(exporter::kernelbench_name(json::array({"nn.Conv2d", "torch.relu", "Tensor.add_"})), "Conv2d_relu_add_");
  EXPECT_EQ(exporter::kernelbench_name(json::array()), "task");
  EXPECT_EQ(exporter::kernelbench_name(json::array({std::string(100, 'x')})).size(), 80u);
  EXPECT_EQ(exporter::kernelbench_name(json::array({"a<b>"})), "a_b_");
  int test = 0;
  for (int i = 0; i < 2000; ++i) test += exporter::split_of("task" + std::to_string(i), 3, 0.25) == "test";
  EXPECT_NEAR(test / 2000.0, 0.25, 0.04);
  EXPECT_EQ(exporter::split_of("x", 3, 0.0), "train");
  EXPECT_EQ(exporter::split_of("x", 3, 1.0), "test");
}
