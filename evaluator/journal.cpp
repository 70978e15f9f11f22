// The journal of an `opforge eval` run: verdicts appended as they come, reused on a restart
// (journal.h says when a row may be reused).
#include "journal.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <chrono>
#include <vector>

#include "opforge/core/error.h"
#include "opforge/core/hash.h"

namespace opforge::evaluator {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Throws when the file cannot be read: such a solution gets no digest (solution_digest).
std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  OPFORGE_CHECK(f.good(), "cannot read {}", p.string());
  return {std::istreambuf_iterator<char>(f), {}};
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string digest_of(const std::string& task_code, const SolutionEntry& s, std::uint64_t key) {
  auto keyed = [key](const std::string& x) { return fmt::format("{:016x}", xxh3_64(x, key)); };
  std::string h = "task " + xxh3_hex(task_code) + "\n";
  if (!s.folder) return keyed(h + "file " + s.path.filename().string() + "\n" + read_bytes(s.path));
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(s.path); it != fs::recursive_directory_iterator(); ++it)
    if (it->is_symlink() || it->is_regular_file()) files.push_back(it->path());
  std::sort(files.begin(), files.end());
  for (auto& p : files) {
    std::string rel = fs::relative(p, s.path).string();
    // A link is keyed by its target, not followed: the judge refuses links, whatever they point at.
    std::string body = fs::is_symlink(p) ? "link " + fs::read_symlink(p).string() : "file " + keyed(read_bytes(p));
    h += fmt::format("{}:{}{}:{}", rel.size(), rel, body.size(), body);  // lengths: no name can pose as two
  }
  return keyed(h);
}

}  // namespace

std::string solution_digest(const std::string& task_code, const SolutionEntry& s, std::uint64_t key) {
  try {
    return digest_of(task_code, s, key);
  } catch (const std::exception&) {
    return "";  // unreadable: judged (and failing) as it is, never reused
  }
}

Journal::Journal(const fs::path& out, const std::string& fingerprint, std::optional<std::uint64_t> seed,
                 std::uint64_t drawn_seed, bool fresh) {
  fs::path file = out / "journal.jsonl";
  bool kept = !fresh && fs::exists(file) && load(file, fingerprint, seed);
  if (!kept) {
    rows_.clear();
    sessions_ = json::array();
    seed_ = seed.value_or(drawn_seed);
    digest_key_ = std::random_device{}() * 4294967296ULL + std::random_device{}();
  }
  // Written anew from what was read: a line cut short by a kill is gone, not warned about again.
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream w(tmp, std::ios::trunc);
    w << json{{"journal", 1}, {"fingerprint", fingerprint}, {"seed", seed_}, {"digest_key", digest_key_}}.dump() << "\n";
    for (auto& l : kept ? good_ : std::vector<std::string>{}) w << l << "\n";
    w.flush();  // a full disk shows here, before the rename replaces the old journal
    OPFORGE_CHECK(w.good(), "cannot write the run's journal {}: check that --out is writable", tmp.string());
  }
  fs::rename(tmp, file);
  good_.clear();
  f_.open(file, std::ios::app);
  OPFORGE_CHECK(f_.good(), "cannot write the run's journal {}: check that --out is writable", file.string());
  if (kept && !rows_.empty())
    spdlog::info("resuming: {} solution(s) already judged in {} (same judge, options and files; --fresh judges "
                 "them again)", rows_.size(), file.string());
}

bool Journal::load(const fs::path& file, const std::string& fingerprint, std::optional<std::uint64_t> seed) {
  std::ifstream in(file);
  std::string line;
  if (!std::getline(in, line)) return false;
  json head = json::parse(line, nullptr, false);
  if (!head.is_object() || head.value("fingerprint", "") != fingerprint || !head["seed"].is_number_unsigned()) {
    spdlog::info("{} is from a run with other options or another judge: judging every solution anew", file.string());
    return false;
  }
  seed_ = head["seed"].get<std::uint64_t>();
  if (!head["digest_key"].is_number_unsigned()) return false;
  digest_key_ = head["digest_key"].get<std::uint64_t>();
  if (seed && *seed != seed_) {
    spdlog::info("{} was judged with seed {}, not {}: judging every solution anew", file.string(), seed_, *seed);
    return false;
  }
  for (long n = 2; std::getline(in, line); ++n) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      spdlog::warn("{} line {} is cut short (a killed run?): skipped, that solution is judged again", file.string(), n);
      continue;
    }
    if (j.contains("session")) sessions_.push_back(j["session"]);
    else if (j.contains("key") && j.contains("row")) rows_[j["key"].get<std::string>()] = j["row"];
    else if (!j.contains("phase")) continue;
    good_.push_back(line);
  }
  return true;
}

const json* Journal::find(const std::string& key) const {
  auto it = rows_.find(key);
  return it == rows_.end() ? nullptr : &it->second;
}

void Journal::add(const std::string& key, const std::string& solution, const json& row) {
  rows_[key] = row;
  // One line per verdict, flushed: a kill loses at most the line being written.
  f_ << json{{"key", key}, {"solution", solution}, {"at", now_s()}, {"row", row}}.dump() << "\n" << std::flush;
}

void Journal::mark(const std::string& phase, std::size_t jobs) {
  f_ << json{{"phase", phase}, {"at", now_s()}, {"jobs", jobs}}.dump() << "\n" << std::flush;
}

void Journal::end_session(const json& session) { f_ << json{{"session", session}}.dump() << "\n" << std::flush; }

}  // namespace opforge::evaluator
