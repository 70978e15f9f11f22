// The sandbox launcher against real bubblewrap: `build/opforge sandbox-exec` runs real commands
// and each test shows from the inside what they can and cannot see, reach or outlive.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "opforge/core/error.h"
#include "opforge/core/sandbox.h"
#include "test_support.h"

using namespace opforge;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

test::CmdResult sandbox_exec(const json& spec, const std::vector<std::string>& command) {
  std::vector<std::string> args = {"sandbox-exec", "--spec", spec.dump(), "--"};
  args.insert(args.end(), command.begin(), command.end());
  return test::run_opforge(args);
}

test::CmdResult python_in(const json& spec, const std::string& script, const std::vector<std::string>& args = {}) {
  std::vector<std::string> cmd = {"/usr/bin/python3", "-c", script};
  cmd.insert(cmd.end(), args.begin(), args.end());
  return sandbox_exec(spec, cmd);
}

const json& probe() {
  static const json p = json::parse(test::run_opforge({"sandbox-exec", "--probe"}).out);
  return p;
}

// Host pids whose command line holds marker and starts with argv0 (a prefix of it).
std::vector<pid_t> pids_with(const std::string& marker, const std::string& argv0) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/proc", ec)) {
    std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::string cmdline = test::read_file(e.path() / "cmdline");
    if (cmdline.find(marker) != std::string::npos && cmdline.rfind(argv0, 0) == 0) out.push_back(std::stoi(name));
  }
  return out;
}

// The sandboxed python processes (not sandbox-exec or bwrap, whose argv holds the marker too).
int processes_with(const std::string& marker) {
  return static_cast<int>(pids_with(marker, "python3").size() + pids_with(marker, "/usr/bin/python3").size());
}

bool gone_within(const std::string& marker, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (processes_with(marker) > 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (processes_with(marker) == 0) return true;
  std::cerr << test::shell("ps -eo pid,ppid,stat,args | grep " + marker).second;
  return false;
}

// A python that starts a setsid child and sleeps, both with marker in their argv.
std::vector<std::string> sleeping_tree(const std::string& marker) {
  const char* script =
      "import os, sys, time\n"
      "if os.fork() == 0:\n"
      "    os.setsid()\n"
      "    os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(300)', sys.argv[1]])\n"
      "time.sleep(300)\n";
  return {"sandbox-exec", "--spec", R"({"max_pids": 32})", "--", "/usr/bin/python3", "-c", script, marker};
}

// The command and its setsid child are both running (the child past its exec: until then it is a
// second /usr/bin/python3).
bool tree_started(const std::string& marker) {
  auto up = [&] { return pids_with(marker, "/usr/bin/python3").size() == 1 && pids_with(marker, "python3").size() == 1; };
  for (int i = 0; i < 400 && !up(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return up();
}

std::string unique_marker() {
  return "opforge-marker-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

// The v1 pids cgroup of this process, where sandbox-exec (our child) makes its cgroups.
fs::path own_pids_cgroup_v1() {
  std::string text = test::read_file("/proc/self/cgroup");
  auto at = text.find(":pids:");
  if (at == std::string::npos) return {};
  std::string rel = text.substr(at + 6, text.find('\n', at) - at - 6);
  return fs::path("/sys/fs/cgroup/pids") / fs::path(rel).relative_path();
}

int cgroups_of(pid_t pid, const fs::path& base) {
  int n = 0;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(base, ec))
    if (e.path().filename().string().rfind(fmt::format("opforge-{}-", pid), 0) == 0) ++n;
  return n;
}

}  // namespace

TEST(SandboxSpec, JsonRoundTripsAndBadSpecsNameTheKey) {
  SandboxSpec s;
  s.ro = {"/opt/x"};
  s.rw = {"/var/y"};
  s.work = "/srv/w";
  s.gpu = true;
  s.env = {{"A", "1"}};
  s.memory_mb = 64;
  s.max_pids = 16;
  s.keep_fds = {3};
  json j = s;
  SandboxSpec back = j.get<SandboxSpec>();
  EXPECT_EQ(json(back), j);
  EXPECT_EQ(json::parse("{}").get<SandboxSpec>().cwd, "/work");

  auto error_of = [](const std::string& text) {
    try {
      json::parse(text).get<SandboxSpec>();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(R"({"memroy_mb": 64})").find("unknown key \"memroy_mb\""), std::string::npos);
  EXPECT_NE(error_of(R"({"memory_mb": "lots"})").find("\"memory_mb\" must be a non-negative integer"), std::string::npos);
  EXPECT_NE(error_of(R"({"memory_mb": -1})").find("memory_mb"), std::string::npos);
  EXPECT_NE(error_of(R"({"ro": "/usr"})").find("\"ro\" must be an array"), std::string::npos);
  EXPECT_NE(error_of(R"({"env": {"A": 1}})").find("env.A"), std::string::npos);
  EXPECT_NE(error_of(R"({"gpu": "yes"})").find("\"gpu\""), std::string::npos);
  EXPECT_NE(error_of(R"({"ro": ["relative/path"]})").find("absolute"), std::string::npos);
  EXPECT_NE(error_of(R"({"rw": ["/work"]})").find("use \"work\""), std::string::npos);
  EXPECT_NE(error_of(R"({"keep_fds": [1]})").find("keep_fds"), std::string::npos);

  // Through the command: exit 125 (the sandbox's own failure, not the command's) and the key.
  auto r = sandbox_exec(json::parse(R"({"memroy_mb": 64})"), {"true"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("memroy_mb"), std::string::npos) << r.err;
  r = sandbox_exec(json::parse(R"({"max_pids": true})"), {"true"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("max_pids"), std::string::npos) << r.err;
  r = test::run_opforge({"sandbox-exec", "--spec", "{not json", "--", "true"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
}

TEST(SandboxSpec, ArgvIsTheProfileParentsFirst) {
  SandboxSpec s;
  s.ro = {"/srv/a/b/c"};
  s.rw = {"/srv/a/b"};
  s.work = "/srv/w";
  s.env = {{"HOME", "/home/u"}, {"X", "1"}};
  auto a = bwrap_argv(s, {"sh", "-c", "true"});
  auto at = [&](const std::vector<std::string>& seq) {
    auto it = std::search(a.begin(), a.end(), seq.begin(), seq.end());
    return it == a.end() ? -1 : static_cast<int>(it - a.begin());
  };
  EXPECT_EQ(a[0], "bwrap");
  for (auto seq : std::vector<std::vector<std::string>>{{"--unshare-all"}, {"--unshare-user"}, {"--uid", "65534"},
                                                        {"--gid", "65534"}, {"--die-with-parent"}, {"--new-session"},
                                                        {"--cap-drop", "ALL"}, {"--clearenv"}, {"--proc", "/proc"},
                                                        {"--dev", "/dev"}, {"--tmpfs", "/tmp"}, {"--ro-bind", "/etc", "/etc"},
                                                        {"--bind", "/srv/w", "/work"}, {"--setenv", "X", "1"},
                                                        {"--dir", "/home/u"}, {"--chdir", "/work"}})
    EXPECT_GE(at(seq), 0) << seq[0];
  EXPECT_LT(at({"--bind", "/srv/a/b", "/srv/a/b"}), at({"--ro-bind", "/srv/a/b/c", "/srv/a/b/c"}));
  EXPECT_LT(at({"--remount-ro", "/"}), at({"--", "sh", "-c", "true"}));
  EXPECT_EQ(a.back(), "true");
  EXPECT_EQ(at({"--dev-bind"}), -1);  // no devices without gpu
  if (fs::exists("/etc/shadow")) {
    EXPECT_GE(at({"--ro-bind", "/dev/null", "/etc/shadow"}), 0);
  }

  Limits l;
  l.mechanism = "cgroup v1";
  l.memory_mb = 2048;
  l.max_pids = 256;
  std::string d = describe(s, l);
  EXPECT_NE(d.find("ro-root, net none, pid/ipc/uts ns, uid nobody, caps dropped, no_new_privs"), std::string::npos) << d;
  EXPECT_NE(d.find(", env 2 vars; limits cgroup v1 memory=2048M pids=256"), std::string::npos) << d;
  EXPECT_NE(describe(s, Limits{"none", "v1: not writable"}).find("limits none (v1: not writable)"), std::string::npos);
}

TEST(SandboxExec, ProbeIsOkHere) {
  const json& p = probe();
  EXPECT_TRUE(p["ok"].get<bool>()) << p.dump();
  EXPECT_FALSE(p["version"].get<std::string>().empty());
  EXPECT_TRUE(fs::exists(p["bwrap"].get<std::string>()));
  std::string limits = p["limits"];
  EXPECT_TRUE(limits == "cgroup v1" || limits == "cgroup v2" || limits == "none") << limits;
  EXPECT_EQ(p["profile"].get<std::string>().rfind("bwrap " + p["version"].get<std::string>() + ": ro-root", 0), 0u);
}

TEST(SandboxExec, OnlyListedPathsAreVisibleAndOnlyWorkAndTmpAreWritable) {
  test::TempDir secret, ro, rw, work;
  test::write_file(secret / "hidden.txt", "secret");
  test::write_file(ro / "data.txt", "data");
  json spec = {{"ro", {ro.path().string()}}, {"rw", {rw.path().string()}}, {"work", work.path().string()}};
  std::string tmp_name = unique_marker();
  const char* script = R"py(
import json, os, sys
secret, ro, rw, fixtures, tmp_name = sys.argv[1:6]
def can_write(p):
    try:
        open(p, "w").write("x"); return True
    except OSError:
        return False
def can_read(p):
    try:
        open(p).read(); return True
    except OSError:
        return False
print(json.dumps({
  "secret": os.path.exists(secret), "fixtures": os.path.exists(fixtures), "ro_read": open(ro + "/data.txt").read(),
  "ro_write": can_write(ro + "/new.txt"), "rw_write": can_write(rw + "/new.txt"),
  "work_write": can_write("/work/out.txt"), "tmp_write": can_write("/tmp/" + tmp_name), "root_write": can_write("/x"),
  "usr_write": can_write("/usr/x"), "etc_write": can_write("/etc/x"), "shadow_read": can_read("/etc/shadow"),
  "uid": os.getuid(), "cwd": os.getcwd()}))
)py";
  auto r = python_in(spec, script, {(secret / "hidden.txt").string(), ro.path().string(), rw.path().string(),
                                    test::fixtures().string(), tmp_name});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json got = json::parse(r.out);
  EXPECT_FALSE(got["secret"].get<bool>());
  EXPECT_FALSE(got["fixtures"].get<bool>());  // the project tree
  EXPECT_EQ(got["ro_read"], "data");
  EXPECT_FALSE(got["ro_write"].get<bool>());
  EXPECT_TRUE(got["rw_write"].get<bool>());
  EXPECT_TRUE(got["work_write"].get<bool>());
  EXPECT_TRUE(got["tmp_write"].get<bool>());
  EXPECT_FALSE(got["root_write"].get<bool>());
  EXPECT_FALSE(got["usr_write"].get<bool>());
  EXPECT_FALSE(got["etc_write"].get<bool>());
  EXPECT_FALSE(got["shadow_read"].get<bool>());
  EXPECT_EQ(got["uid"], 65534);
  EXPECT_EQ(got["cwd"], "/work");
  EXPECT_EQ(test::read_file(work / "out.txt"), "x");  // /work is the host's work folder
  EXPECT_TRUE(fs::exists(rw / "new.txt"));
  EXPECT_FALSE(fs::exists(ro / "new.txt"));
  EXPECT_FALSE(fs::exists(fs::path("/tmp") / tmp_name));  // /tmp inside is the sandbox's own
}

TEST(SandboxExec, PathsUnderWorkLeaveNoMountPointsInTheWorkFolder) {
  std::string fixtures = test::fixtures().string();
  if (fixtures.rfind("/work/", 0) != 0) GTEST_SKIP() << "needs a project tree under /work (here: " << fixtures << ")";
  test::TempDir work;
  auto r = sandbox_exec({{"work", work.path().string()}, {"ro", {fixtures}}},
                        {"sh", "-c", "test -d " + fixtures + " && echo kept > /work/kept.txt"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> left;
  for (auto& e : fs::recursive_directory_iterator(work.path())) left.push_back(e.path().lexically_relative(work.path()));
  EXPECT_EQ(left, std::vector<std::string>{"kept.txt"});
}

TEST(SandboxExec, NoCapabilitiesNoNewPrivsNoNestedUserNamespaces) {
  auto r = sandbox_exec(json::object(), {"sh", "-c", "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; "
                                                      "unshare -U true 2>/dev/null && echo nested userns; exit 0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("CapEff:\t0000000000000000\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CapBnd:\t0000000000000000\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NoNewPrivs:\t1\n"), std::string::npos) << r.out;
  if (probe()["profile"].get<std::string>().find("no nested userns") != std::string::npos) {
    EXPECT_EQ(r.out.find("nested userns"), std::string::npos) << r.out;
  }
}

TEST(SandboxExec, NoNetworkNotEvenTheHostLoopbackOrAbstractSockets) {
  int tcp = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(tcp, reinterpret_cast<sockaddr*>(&in), sizeof in), 0);
  ASSERT_EQ(::listen(tcp, 4), 0);
  socklen_t len = sizeof in;
  ::getsockname(tcp, reinterpret_cast<sockaddr*>(&in), &len);
  int port = ntohs(in.sin_port);

  std::string name = unique_marker();
  int unix_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path + 1, name.data(), name.size());  // sun_path[0] == 0: abstract
  socklen_t un_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(unix_fd, reinterpret_cast<sockaddr*>(&un), un_len), 0);
  ASSERT_EQ(::listen(unix_fd, 4), 0);
  // The same probe from the host reaches both: what fails inside fails because of the sandbox.
  const char* script = R"py(
import socket, sys
def reach(family, addr):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(addr); return "connected"
    except OSError as e:
        return type(e).__name__
print(reach(socket.AF_INET, ("127.0.0.1", int(sys.argv[1]))), reach(socket.AF_UNIX, "\0" + sys.argv[2]))
)py";
  auto host = test::shell(fmt::format("/usr/bin/python3 -c '{}' {} {}", script, port, name));
  EXPECT_EQ(host.second, "connected connected\n");
  auto r = python_in(json::object(), script, {std::to_string(port), name});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "ConnectionRefusedError ConnectionRefusedError\n");
  ::close(tcp);
  ::close(unix_fd);
}

TEST(SandboxExec, EnvironmentIsExactlyTheSpecs) {
  ::setenv("OPFORGE_TEST_SECRET", "1", 1);
  auto r = sandbox_exec({{"env", {{"A", "1"}, {"PATH", "/usr/bin:/bin"}}}}, {"env"});
  ::unsetenv("OPFORGE_TEST_SECRET");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // PWD is bwrap's (it always exports the cwd).
  EXPECT_EQ(r.out, "A=1\nPATH=/usr/bin:/bin\nPWD=/work\n");
}

TEST(SandboxExec, CannotSignalItsLauncherAndExitsWithItsOwnCode) {
  const char* script = R"py(
import os, sys
os.kill(os.getppid(), 9)          # bwrap's pid 1: immune from inside its namespace
try:
    os.kill(int(sys.argv[1]), 0)  # a host pid does not exist in here
    print("host pid visible")
except ProcessLookupError:
    pass
sys.exit(7)
)py";
  auto r = python_in(json::object(), script, {std::to_string(::getpid())});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(SandboxExec, NothingItStartedOutlivesIt) {
  std::string marker = unique_marker();
  // A setsid grandchild, seen running before the command returns.
  const char* script = R"py(
import os, sys, time
marker = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/python3", ["python3", "-c", "import time; time.sleep(300)", marker])
    os._exit(0)
os.wait()
def seen():
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and marker.encode() in open(f"/proc/{p}/cmdline", "rb").read() and int(p) != os.getpid():
                return True
        except OSError:
            pass
for _ in range(200):
    if seen():
        print("seen"); break
    time.sleep(0.01)
)py";
  auto r = python_in(json::object(), script, {marker});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "seen\n");
  EXPECT_EQ(processes_with(marker), 0);
}

TEST(SandboxExec, SigtermKillsTheWholeTreeAndRemovesTheCgroup) {
  std::string marker = unique_marker();
  pid_t pid = test::spawn_opforge(sleeping_tree(marker));
  bool started = tree_started(marker);
  fs::path base = own_pids_cgroup_v1();
  int cgroups_while_running = cgroups_of(pid, base);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(started);
  if (probe()["limits"] == "cgroup v1") {
    EXPECT_EQ(cgroups_while_running, 1);
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL);
  EXPECT_EQ(processes_with(marker), 0);
  if (probe()["limits"] == "cgroup v1") {
    EXPECT_EQ(cgroups_of(pid, base), 0);
  }
}

TEST(SandboxExec, AKilledJudgeOrLauncherStillTakesTheTreeWithIt) {
  // The judge (our forked child) is SIGKILLed: sandbox-exec gets SIGTERM (PR_SET_PDEATHSIG) and
  // cleans up as if asked to stop, cgroup included.
  std::string marker = unique_marker();
  pid_t judge = ::fork();
  if (judge == 0) {
    test::spawn_opforge(sleeping_tree(marker));
    ::pause();
    ::_exit(0);
  }
  bool started = tree_started(marker);
  auto launcher = pids_with(marker, test::opforge_bin().string());
  ::kill(judge, SIGKILL);
  ::waitpid(judge, nullptr, 0);
  EXPECT_TRUE(started);
  EXPECT_TRUE(gone_within(marker, 5));
  ASSERT_EQ(launcher.size(), 1u);
  if (probe()["limits"] == "cgroup v1") {
    for (int i = 0; i < 500 && cgroups_of(launcher[0], own_pids_cgroup_v1()) > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(cgroups_of(launcher[0], own_pids_cgroup_v1()), 0);
  }

  // sandbox-exec itself SIGKILLed: bwrap dies with it (PDEATHSIG), the namespace with bwrap. Its
  // empty cgroup stays until the next launch sweeps it.
  marker = unique_marker();
  pid_t pid = test::spawn_opforge(sleeping_tree(marker));
  started = tree_started(marker);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(started);
  EXPECT_TRUE(gone_within(marker, 5));
  sandbox_exec(json::object(), {"true"});
  if (probe()["limits"] == "cgroup v1") {
    EXPECT_EQ(cgroups_of(pid, own_pids_cgroup_v1()), 0);
  }
}

TEST(SandboxExec, MemoryLimitEndsAHogWith137) {
  if (probe()["limits"] == "none") GTEST_SKIP() << "no cgroup limits here: " << probe()["why"];
  auto r = python_in({{"memory_mb", 64}}, "s = b'x' * (512 << 20); print(len(s))");
  EXPECT_EQ(r.exit_code, 137) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("[sandbox] out_of_memory: "), std::string::npos) << r.err;
  // Within the limit the same code runs.
  r = python_in({{"memory_mb", 256}}, "s = b'x' * (64 << 20); print(len(s))");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("out_of_memory"), std::string::npos) << r.err;
}

TEST(SandboxExec, PidsLimitStopsForkBombs) {
  if (probe()["limits"] == "none") GTEST_SKIP() << "no cgroup limits here: " << probe()["why"];
  const char* script = R"py(
import os, time
made = failed = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        failed += 1
        continue
    if pid == 0:
        time.sleep(300)
        os._exit(0)
    made += 1
print(made, failed)
)py";
  auto t0 = std::chrono::steady_clock::now();
  auto r = python_in({{"max_pids", 16}}, script);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int made = 0, failed = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "%d %d", &made, &failed), 2) << r.out;
  EXPECT_LT(made, 16);  // bwrap's two processes and python count too
  EXPECT_GT(failed, 0);
  EXPECT_NE(r.err.find("[sandbox] pids_limit: "), std::string::npos) << r.err;
  // A shell fork bomb: the run still ends once its first process exits (its status depends on
  // which fork failed first: dash gives up with 2 when its own fork fails).
  r = sandbox_exec({{"max_pids", 16}}, {"sh", "-c", "b() { b | b & }; b; sleep 1; exit 3"});
  EXPECT_TRUE(r.exit_code == 3 || r.exit_code == 2) << r.exit_code;
  EXPECT_NE(r.err.find("[sandbox] pids_limit: "), std::string::npos) << r.err.substr(r.err.size() - 300);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20);
}

TEST(SandboxExec, KeepFdsAreInheritedAndOtherFdsClosed) {
  test::TempDir t;
  auto [rc, out] = test::shell(fmt::format(
      "{} sandbox-exec --spec '{{\"keep_fds\": [3]}}' -- sh -c 'echo kept >&3; echo leaked >&4 && echo fd4-open' "
      "3>{} 4>{} 2>/dev/null",
      test::opforge_bin().string(), (t / "fd3").string(), (t / "fd4").string()));
  EXPECT_EQ(rc, 2);  // sh: the redirect to fd 4 fails
  EXPECT_EQ(out, "");
  EXPECT_EQ(test::read_file(t / "fd3"), "kept\n");
  EXPECT_EQ(test::read_file(t / "fd4"), "");
  // A keep_fd that is not open is the launcher's error, not the command's.
  auto r = sandbox_exec({{"keep_fds", {97}}}, {"true"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("fd 97"), std::string::npos) << r.err;
}

TEST(SandboxExec, StaleCgroupsOfDeadLaunchersAreSwept) {
  if (probe()["limits"] != "cgroup v1") GTEST_SKIP() << "checks the v1 layout; limits here: " << probe()["limits"];
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  fs::path stale = own_pids_cgroup_v1() / fmt::format("opforge-{}-0", dead);
  ASSERT_TRUE(fs::create_directory(stale));
  auto r = sandbox_exec(json::object(), {"true"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  if (fs::exists(stale)) fs::remove(stale);
}
