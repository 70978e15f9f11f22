// The sandbox an untrusted solution runs in: a fresh child process under bubblewrap (bwrap), with
// its memory and process count capped by a cgroup of its own where the machine lets us.
//
// Profile (bwrap_argv): a read-only root made of the system folders that exist (/usr, /bin, /lib,
// /lib64, /lib32, /sbin, /etc; files of /etc that others may not read are masked, because the
// sandbox's uid maps to its launcher's, which may be root), plus the spec's `ro` and `rw` paths at
// their own place; fresh tmpfs at /tmp and /home; /work a tmpfs or the spec's `work` folder; a new
// /proc and a minimal /dev (the NVIDIA devices added only with `gpu`); new user, pid, ipc, net,
// uts and cgroup namespaces (no network at all, not even the host's loopback); uid/gid 65534
// (nobody) inside; no nested user namespaces (bwrap >= 0.8.0); every capability dropped;
// no_new_privs (bwrap always sets it); a new session (no TIOCSTI into a terminal); the environment
// exactly `env` plus PWD=cwd, which bwrap always exports. Nothing else of the host (home, project
// tree, caches, workspaces) is visible. Mount points that bwrap makes in the `work` folder for
// ro/rw paths under /work are removed after the run.
//
// Limits (run_sandbox): a fresh cgroup opforge-<pid>-<n> under the launcher's own, cgroup v2 when
// its memory and pids controllers are delegated there, else v1 (memory + pids hierarchies); the
// launched process joins it before bwrap runs, so bwrap and every descendant count. When neither
// is writable the sandbox runs without limits and Limits says why.
//
// Thread safety: bwrap_argv, describe and the json conversions are thread-safe (describe runs
// `bwrap --version` once per process).
// run_sandbox and probe_sandbox are for a process that runs one sandbox at a time and has no
// other children (`opforge sandbox-exec`): they install signal handlers and reap every child.
// Errors: malformed specs and launch failures (no bwrap, cannot fork) throw opforge::Error; what
// the sandboxed command does (exit codes, OOM, pids limit) comes back as a SandboxRun value.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace opforge {

// What a sandbox sees. JSON: every key optional, unknown keys and wrong types are errors:
//   {"ro": [paths], "rw": [paths], "work": "path", "gpu": false, "env": {"K": "V"},
//    "memory_mb": 0, "max_pids": 0, "cwd": "/work", "keep_fds": [3]}
struct SandboxSpec {
  std::vector<std::string> ro;  // absolute host paths, bound read-only at the same path
  std::vector<std::string> rw;  // absolute host paths, bound read-write at the same path
  std::string work;             // host folder bound read-write at /work; empty: a fresh tmpfs
  bool gpu = false;             // /dev/nvidia*, /dev/nvidia-caps and /proc/driver/nvidia
  // The complete environment inside (replaced, not merged, when given in JSON).
  std::map<std::string, std::string> env = {
      {"HOME", "/home"}, {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"LANG", "C.UTF-8"}, {"TMPDIR", "/tmp"}};
  std::size_t memory_mb = 0;  // cgroup memory limit of the whole sandbox (swap included); 0: none
  std::size_t max_pids = 0;   // cgroup task limit, bwrap's own two processes included; 0: none
  std::string cwd = "/work";
  std::vector<int> keep_fds;  // inherited by the command (e.g. a socket on fd 3); others above 2 are closed
};

void to_json(nlohmann::json& j, const SandboxSpec& s);
// Throws opforge::Error naming the key: "sandbox spec: unknown key \"memroy_mb\" (known: ...)".
void from_json(const nlohmann::json& j, SandboxSpec& s);
// Checks what can be checked without the file system (absolute paths, reserved places, fds).
void validate(const SandboxSpec& s);

// The limits a launch got.
struct Limits {
  std::string mechanism = "none";  // "cgroup v1", "cgroup v2" or "none"
  std::string why;                 // why none, when none
  std::size_t memory_mb = 0;       // enforced, 0: unlimited
  std::size_t max_pids = 0;        // enforced, 0: unlimited
};

// bwrap's argv for running `command` (argv[0] is "bwrap"; the caller puts the real path there).
// Reads the file system only to see which system folders exist and which /etc files to mask, and
// asks bwrap its version (once) for the options it understands.
std::vector<std::string> bwrap_argv(const SandboxSpec& spec, const std::vector<std::string>& command);

// One line for report rows: "bwrap 0.8.0: ro-root, net none, pid/ipc/uts ns, uid nobody, caps
// dropped, no_new_privs, no nested userns, env 4 vars; limits cgroup v1 memory=2048M pids=256".
std::string describe(const SandboxSpec& spec, const Limits& applied);

// $OPFORGE_BWRAP, else `bwrap` looked up on PATH; empty when there is none.
std::string find_bwrap();
// "0.8.0" from `bwrap --version` (cached per path); empty when it does not answer.
std::string bwrap_version(const std::string& bwrap);

struct SandboxRun {
  int exit_code = 0;           // the command's status; 128+signal when killed; 137 on out of memory
  bool out_of_memory = false;  // the cgroup's OOM killer fired
  bool pids_limit = false;     // a fork failed on max_pids
  bool terminated = false;     // we were asked to stop (SIGTERM, SIGINT, SIGHUP) and killed it
  std::vector<std::string> notes;  // "out_of_memory: ...", one line each, for stderr
  Limits limits;
};

// Runs command in the sandbox and waits. The command's stdin/stdout/stderr are ours (stderr_fd,
// when >= 0, replaces its stderr). SIGTERM, SIGINT and SIGHUP received meanwhile SIGKILL the
// sandbox (its whole process tree dies with bwrap: --die-with-parent and the pid namespace).
// Nothing it started outlives the call: leftovers in the cgroup are killed, orphans reaped, the
// cgroup removed. Throws opforge::Error when the sandbox cannot be started at all.
SandboxRun run_sandbox(const SandboxSpec& spec, const std::vector<std::string>& command, int stderr_fd = -1);

// Runs `true` in the default profile (with a small memory and pids limit, to see that limits can
// be set). {"ok", "bwrap", "version", "profile", "limits", "why"}: why says what to install or
// enable when ok is false, or why there are no limits. Never throws.
nlohmann::json probe_sandbox(bool gpu);

}  // namespace opforge
