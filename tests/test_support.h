// Helpers for the test suites: temporary folders and running the real opforge binary.
#pragma once
#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace opforge::test {

// A fresh folder removed at the end of the test (kept when OPFORGE_KEEP_TEST_DIRS is set).
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

struct CmdResult {
  int exit_code = -1;
  std::string out, err;
};

// Starts argv[0] (a path) with argv, stdin from /dev/null, stdout and stderr written to files (both
// to one when err == out), in a process group of its own when own_group (so kill(-pid) reaches its
// children too); returns its pid. Throws when it cannot be started.
pid_t spawn_process(const std::vector<std::string>& argv, const std::filesystem::path& out,
                    const std::filesystem::path& err, bool own_group = false);
// Runs build/opforge with args, waits, captures stdout and stderr.
CmdResult run_opforge(const std::vector<std::string>& args);
// Starts build/opforge in the background (output discarded); returns its pid.
pid_t spawn_opforge(const std::vector<std::string>& args);
// The same, with stdout and stderr written to files (a server's "listening on" line, its logs).
pid_t spawn_opforge_to(const std::vector<std::string>& args, const std::filesystem::path& out,
                       const std::filesystem::path& err);

// Polls count_sql on the database until it answers at least `at_least`, then SIGKILLs pid and
// reaps it. Returns false (after reaping) when pid ended or max_s passed first.
bool kill_when(pid_t pid, const std::filesystem::path& db, const std::string& count_sql, long at_least, int max_s);

// Runs a shell command; returns its exit status and stdout.
std::pair<int, std::string> shell(const std::string& cmd);

std::string read_file(const std::filesystem::path& p);
void write_file(const std::filesystem::path& p, const std::string& text);
std::filesystem::path fixtures();
// build/opforge, and the cache of built extensions the evaluator tests share (in the build tree).
std::filesystem::path opforge_bin();
std::filesystem::path eval_cache_dir();
// The venv's interpreter (OPFORGE_PYTHON), for tests that drive a Python client of opforge.
std::filesystem::path python_bin();
// tests/python/tiny_lm.py's tiny random checkpoints ("qwen2", "llama"), made once per version of
// the script in the build tree (whichever test runs first makes them; another process's copy wins).
std::filesystem::path tiny_model(const std::string& name);
// What tracing would record for each task of fixtures/dedup/tasks (tracing.py spelling), by stem.
const std::map<std::string, nlohmann::json>& dedup_fixture_ops();

}  // namespace opforge::test
