// opforge run: the whole pipeline from one command, resumable, ending in a corpus whose labels
// agree with its code.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "opforge/core/paths.h"
#include "opforge/core/store.h"
#include "test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge {
namespace {

std::vector<std::string> run_args(const fs::path& ws) {
  return {"run", "--workspace", ws.string(), "--preset", (test::fixtures() / "presets" / "tiny.json").string()};
}

// Every exported record by id.
std::map<std::string, json> records(const fs::path& out) {
  std::map<std::string, json> recs;
  for (auto& e : fs::directory_iterator(out)) {
    auto name = e.path().filename().string();
    if (name.rfind("ops-", 0) != 0 || e.path().extension() != ".jsonl") continue;
    std::istringstream in(test::read_file(e.path()));
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      json r = json::parse(line);
      recs[r.at("id").get<std::string>()] = r;
    }
  }
  return recs;
}

long count(const fs::path& ws, const std::string& sql) {
  Db db(ws / "opforge.db");
  auto st = db.prepare(sql);
  return st.step() ? st.int64(0) : -1;
}

std::map<std::string, std::string> verdict_rows(const fs::path& ws) {
  std::map<std::string, std::string> rows;
  Db db(ws / "opforge.db");
  auto st = db.prepare("SELECT task_id, verdict || ':' || coalesce(reason, '') || ':' || metrics FROM filter_results");
  while (st.step()) rows[st.text(0)] = st.text(1);
  return rows;
}

// Candidate sizes come from timings of this machine, so two workspaces do not hold the same
// tasks; resuming is shown on one workspace: killed in the filter, started again, run again.
TEST(Run, AKilledRunResumesWithoutRedoingWorkAndEndsInACorpusWhoseOpsMatchItsCode) {
  test::TempDir dir;
  auto ws = dir / "ws";

  pid_t pid = test::spawn_opforge(run_args(ws));
  ASSERT_TRUE(test::kill_when(pid, ws / "opforge.db", "SELECT count(*) FROM filter_results", 1, 600));
  EXPECT_FALSE(fs::exists(ws / "export" / "manifest.json")) << "the kill came after the end";
  auto before = verdict_rows(ws);
  ASSERT_GE(before.size(), 1u);
  ASSERT_LT(before.size(), 6u) << "the kill came after the filter";

  auto r = test::run_opforge(run_args(ws));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // stdout carries the export folder and nothing else; stderr the per-stage table.
  EXPECT_EQ(r.out, fs::absolute(ws / "export").string() + "\n");
  EXPECT_NE(r.err.find("run: total"), std::string::npos) << "the per-stage time table is missing";
  for (auto f : {"manifest.json", "README.md", "stats/funnel.json"}) EXPECT_TRUE(fs::exists(ws / "export" / f)) << f;
  // Nothing composed twice, every candidate judged, and what was judged before the kill kept as it was.
  EXPECT_EQ(count(ws, "SELECT count(*) FROM tasks"), 6);
  auto after = verdict_rows(ws);
  EXPECT_EQ(after.size(), 6u);
  for (auto& [id, row] : before) EXPECT_EQ(after[id], row) << id << " was judged again";
  auto recs = records(ws / "export");
  EXPECT_EQ(static_cast<long>(recs.size()), count(ws, "SELECT count(*) FROM dedup_results WHERE kept = 1"));
  ASSERT_GE(recs.size(), 3u) << r.err;
  // The funnel counts over every candidate drawn, failed compositions included.
  json drawn = json::parse(test::read_file(ws / "export" / "stats" / "funnel.json"))["drawn"];
  EXPECT_EQ(drawn["total"].get<long>(),
            count(ws, "SELECT count(*) FROM tasks") + count(ws, "SELECT count(*) FROM compose_failures"));
  EXPECT_DOUBLE_EQ(drawn["kept_over_drawn"].get<double>(),
                   static_cast<double>(recs.size()) / drawn["total"].get<double>());
  // The manifest says which filter configuration judged the records (one here: one run's).
  json filt = json::parse(test::read_file(ws / "export" / "manifest.json"))["config"]["filter"];
  ASSERT_EQ(filt.size(), 1u) << filt.dump();
  EXPECT_EQ(filt.begin().value()["records"], static_cast<long>(recs.size()));
  EXPECT_EQ(filt.begin().value()["config"]["device"], "cpu");

  // Loadable with the generic JSON loader of Hugging Face datasets, and every record's ops are
  // the ops traced from its code now.
  std::string py = python_executable().string();
  test::TempDir hf;
  auto [rc, out] = test::shell(
      "HF_DATASETS_OFFLINE=1 HF_HOME='" + hf.path().string() + "' '" + py +
      "' -c \"import datasets, glob, sys; ds = datasets.load_dataset('json', data_files=sorted(glob.glob(sys.argv[1] + "
      "'/ops-*.jsonl')), split='train'); print('rows', len(ds))\" '" + (ws / "export").string() + "' 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("rows " + std::to_string(recs.size())), std::string::npos) << out;
  auto [vrc, vout] = test::shell("cd '" + python_package_dir().string() + "' && '" + py + "' -m opforge.verify '" +
                                 (ws / "export").string() + "' 2>&1");
  EXPECT_EQ(vrc, 0) << vout;
  EXPECT_NE(vout.find(std::to_string(recs.size()) + " match their traced ops"), std::string::npos) << vout;

  // A finished run run again adds nothing (compose tops up to the preset's count, not past it)
  // and writes the same bytes.
  auto shard_bytes = [&] {
    std::map<std::string, std::string> m;
    for (auto& e : fs::directory_iterator(ws / "export"))
      if (e.path().extension() == ".jsonl") m[e.path().filename().string()] = test::read_file(e.path());
    return m;
  };
  auto shards = shard_bytes();
  r = test::run_opforge(run_args(ws));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(ws, "SELECT count(*) FROM tasks"), 6);
  EXPECT_EQ(shard_bytes(), shards);

  // A verdict of another filter version (a bump of filter::kFilterVersion) is kept as it is, with
  // a warning, unless --rejudge-stale judges it again.
  Db(ws / "opforge.db").exec("UPDATE filter_results SET config = 'filter-0' WHERE task_id = "
                             "(SELECT min(task_id) FROM filter_results)");
  r = test::run_opforge(run_args(ws));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("1 stored verdicts were made under another filter configuration"), std::string::npos) << r.err;
  EXPECT_EQ(count(ws, "SELECT count(*) FROM filter_results WHERE config = 'filter-0'"), 1);
  auto stale_args = run_args(ws);
  stale_args.push_back("--rejudge-stale");
  r = test::run_opforge(stale_args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(ws, "SELECT count(*) FROM filter_results WHERE config = 'filter-0'"), 0) << r.err;
  EXPECT_EQ(count(ws, "SELECT count(*) FROM filter_results"), 6);

  // --kept: rounds until that many tasks are kept after dedup, then the export holds them all.
  auto kept_args = run_args(ws);
  kept_args.insert(kept_args.end(), {"--kept", "8"});
  r = test::run_opforge(kept_args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("run: round 1: "), std::string::npos) << r.err;
  long kept = count(ws, "SELECT count(*) FROM dedup_results WHERE kept = 1");
  EXPECT_GE(kept, 8) << r.err;
  EXPECT_GT(count(ws, "SELECT count(*) FROM tasks"), 6);
  EXPECT_EQ(static_cast<long>(records(ws / "export").size()), kept);
}

TEST(Run, ABadPresetIsAClearErrorNamingTheKey) {
  test::TempDir dir;
  test::write_file(dir / "typo.json", R"({"compose": {"cuont": 5}})");
  auto r = test::run_opforge({"run", "--workspace", (dir / "ws").string(), "--preset", (dir / "typo.json").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown key compose.cuont"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("count"), std::string::npos) << "the known keys are listed: " << r.err;

  r = test::run_opforge({"run", "--workspace", (dir / "ws").string(), "--preset", "no_such_preset"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--list-presets"), std::string::npos) << r.err;

  r = test::run_opforge({"run", "--list-presets"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("default\t"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ops6k\t"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace opforge
