// The agent's `bash` tool: one command in a fresh bubblewrap sandbox (`opforge sandbox-exec`)
// whose only writable place is the task's working folder, with no network; the judge is reached
// through a socket on fd 3 that this process relays (agent/README.md, "The judge from inside").
//
// Errors: a command that fails, hangs or floods its output is a value (ShellResult); only a
// sandbox that cannot be started at all (no bwrap, no opforge binary) throws opforge::Error.
// Thread safety: run_shell may run on several threads at once (one call per thread).
#pragma once
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace opforge::agent {

struct ShellRequest {
  std::string command;             // bash -c COMMAND, in the folder (/work inside)
  std::filesystem::path folder;    // the working folder, bound read-write at /work
  std::vector<std::string> ro;     // more host paths visible read-only (the venv)
  std::map<std::string, std::string> env;  // added to the sandbox's own environment
  double timeout_s = 300;          // of the command's own time; the judge's answers do not count
  std::size_t output_cap = 16000;  // characters kept of stdout + stderr (head and tail)
  std::size_t memory_mb = 8192;    // the sandbox's memory limit, where the machine has cgroups
  bool no_sandbox = false;         // run bash directly in the folder (a machine without bwrap)
  // Answers one request line that came on fd 3 (no newline in either); may take long.
  std::function<std::string(const std::string& line)> judge;
};

struct ShellResult {
  int exit_code = 0;
  bool timed_out = false;
  std::string output;       // stdout and stderr as they interleaved, truncated with a marker
  std::size_t output_bytes = 0;  // what the command wrote in all
  double seconds = 0;       // the command's own time (the judge's answers excluded)
  double judge_seconds = 0;
  int judge_requests = 0;
};

ShellResult run_shell(const ShellRequest& req);

// The text the model sees: the output, then "[exit N]" or "[killed after N s: ...]".
std::string shell_report(const ShellResult& r, double timeout_s);

}  // namespace opforge::agent
