// Where tasks and solutions come from (evaluator/README.md, "Layout of tasks and solutions").
#include <zlib.h>

#include <algorithm>
#include <sstream>

#include <spdlog/spdlog.h>

#include "evaluator.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"
#include "opforge/core/store.h"

namespace opforge::evaluator {

namespace fs = std::filesystem;
using nlohmann::json;

// ----------------------------------------------------------------------------------------------
// Tasks

namespace {

std::string read_gzip(const fs::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  OPFORGE_CHECK(f != nullptr, "cannot open {}", p.string());
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string why = err < 0 ? msg : "";
  gzclose(f);
  OPFORGE_CHECK(n == 0 && why.empty(), "{} is not a readable gzip file: {}", p.string(), why);
  return out;
}

bool is_shard(const fs::path& p) {
  std::string n = p.filename().string();
  auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
  return ends(".jsonl") || ends(".jsonl.gz");
}

void read_shard(const fs::path& p, std::vector<EvalTask>& out) {
  std::string text = p.extension() == ".gz" ? read_gzip(p) : read_text(p);
  std::stringstream ss(text);
  long line_no = 0;
  for (std::string line; std::getline(ss, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{} line {}: not JSON ({})", p.string(), line_no, e.what()));
    }
    OPFORGE_CHECK(j.is_object() && j.contains("code") && j["code"].is_string(),
                  "{} line {}: a task record needs a string \"code\" (as `opforge export` writes)", p.string(), line_no);
    std::string code = j["code"];
    std::string id = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>() : xxh3_hex(code);
    out.push_back({id, id, code, j.value("split", json()).is_string() ? j["split"].get<std::string>() : ""});
  }
}

void read_workspace(const fs::path& dir, std::vector<EvalTask>& out) {
  Db db(dir / "opforge.db");
  OPFORGE_CHECK(db.has_table("tasks"), "{} has no tasks table: compose or import tasks first", dir.string());
  std::string sql = "SELECT t.id, t.code FROM tasks t ORDER BY t.id";
  bool filtered = false;
  if (db.has_table("filter_results")) {
    auto st = db.prepare("SELECT 1 FROM filter_results LIMIT 1");
    filtered = st.step();
  }
  if (filtered) {
    // The filter's code is the calibrated one it timed: what export would ship.
    sql = "SELECT t.id, coalesce(f.code, t.code) FROM tasks t JOIN filter_results f ON f.task_id = t.id "
          "WHERE f.verdict = 'accepted'";
    if (db.has_table("dedup_results"))
      sql += " AND (NOT EXISTS (SELECT 1 FROM dedup_results) OR t.id IN (SELECT task_id FROM dedup_results WHERE kept = 1))";
    sql += " ORDER BY t.id";
  }
  auto st = db.prepare(sql);
  while (st.step()) out.push_back({st.text(0), st.text(0), st.text(1)});
}

}  // namespace

std::vector<EvalTask> load_tasks(const fs::path& src) {
  OPFORGE_CHECK(fs::exists(src), "--tasks {} does not exist (give shards, a workspace or a folder of .py tasks)",
                src.string());
  std::vector<EvalTask> out;
  if (fs::is_regular_file(src)) {
    if (is_shard(src)) {
      read_shard(src, out);
    } else {
      std::string code = read_text(src);
      out.push_back({xxh3_hex(code), src.stem().string(), code});
    }
    return out;
  }
  if (fs::exists(src / "opforge.db")) {
    read_workspace(src, out);
    return out;
  }
  std::vector<fs::path> shards;
  for (auto& e : fs::directory_iterator(src))
    if (e.is_regular_file() && is_shard(e.path())) shards.push_back(e.path());
  if (!shards.empty()) {
    std::sort(shards.begin(), shards.end());
    for (auto& s : shards) read_shard(s, out);
    return out;
  }
  for (auto& f : python_files_under(src)) {
    std::string code = read_text(f);
    out.push_back({xxh3_hex(code), f.stem().string(), code});
  }
  return out;
}

std::vector<SolutionEntry> find_solutions(const fs::path& dir) {
  OPFORGE_CHECK(fs::is_directory(dir), "--solutions {} is not a folder (one <task>.py or <task>/ per solution)",
                dir.string());
  std::vector<SolutionEntry> out;
  for (auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || name == "__pycache__") continue;
    if (e.is_directory())
      out.push_back({name, e.path(), true});
    else if (e.is_regular_file() && e.path().extension() == ".py")
      out.push_back({e.path().stem().string(), e.path(), false});
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.key < b.key; });
  return out;
}

}  // namespace opforge::evaluator
