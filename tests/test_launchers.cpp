// opforge slurm and opforge ray end to end on this machine, on the real schedulers: a one-node
// Slurm (munged, slurmctld and slurmd from scripts/local_slurm.sh, as root) and a local Ray
// cluster (`ray start --head`). Each runs a small corpus as 2 shards, and the merged workspace
// must hold the ids and verdicts of one process's run of the same corpus. A resubmission must
// leave finished shards alone.
//
// Needs root and the set-up's slurm-wlm, munge and ray (`make setup`); a machine that cannot is
// skipped only when OPFORGE_SKIP_LAUNCHER_TESTS is set, which CI does not set.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "opforge/core/store.h"
#include "test_support.h"

namespace fs = std::filesystem;
using Args = std::vector<std::string>;

namespace opforge {
namespace {

const char* kSkipEnv = "OPFORGE_SKIP_LAUNCHER_TESTS";

// A small crawl the graph composer can chain (GEMM and convolution anchors, element-wise ops).
const char* kMatch =
    "^(torch\\.nn\\.(ReLU|GELU|Tanh|Conv2d|LayerNorm|Linear|Softmax)|torch\\.(abs|exp|neg|sigmoid|tanh|relu|mean|amax))$";
// 8 graph candidates in blocks of 2, so both shards get some; the graph backend sizes by a cost
// model, so every process composes the same tasks.
const Args kCount = {"--count", "8", "--seed", "3"};
const Args kCompose = {"--block-size", "2", "--mix", "1:20,2:60,3:20", "--device", "cpu", "--workers", "1"};
// Verdicts that do not depend on this machine's timings (no window, no calibration), and no
// torch.compile (30 s a task on a CPU).
const Args kFilter = {"--device", "cpu", "--workers", "1", "--skip-check", "compile", "--skip-check", "time_window",
                      "--no-calibrate", "--trials", "5"};

fs::path project_root() { return test::fixtures().parent_path().parent_path(); }

fs::path crawl_base(const fs::path& ws) {
  auto r = test::run_opforge({"crawl", "--workspace", ws.string(), "--sources", "torch", "--match", kMatch});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return ws;
}

// task id -> "verdict:reason" of the filter.
std::map<std::string, std::string> verdicts(const fs::path& ws) {
  std::map<std::string, std::string> out;
  Db db(ws / "opforge.db");
  auto st = db.prepare("SELECT task_id, verdict || ':' || coalesce(reason, '') FROM filter_results");
  while (st.step()) out[st.text(0)] = st.text(1);
  return out;
}

std::set<std::string> kept(const fs::path& ws) {
  std::set<std::string> out;
  Db db(ws / "opforge.db");
  auto st = db.prepare("SELECT task_id FROM dedup_results WHERE kept = 1");
  while (st.step()) out.insert(st.text(0));
  return out;
}

// One process's run of the corpus the shards split: compose --shard 0/1 (the unsharded run),
// filter, dedup, on a copy of the base.
fs::path reference_run(const fs::path& base, const fs::path& ws) {
  fs::create_directories(ws);
  fs::copy_file(base / "opforge.db", ws / "opforge.db");
  auto step = [&](Args args, const Args& extra) {
    args.insert(args.end(), {"--workspace", ws.string()});
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = test::run_opforge(args);
    EXPECT_EQ(r.exit_code, 0) << args[0] << ": " << r.err;
  };
  Args compose = {"compose", "--shard", "0/1"};
  compose.insert(compose.end(), kCount.begin(), kCount.end());
  step(compose, kCompose);
  step({"filter"}, kFilter);
  step({"dedup"}, {});
  return ws;
}

// The launcher's command line for 2 shards of that corpus.
Args launch_args(const std::string& cmd, const fs::path& root, const fs::path& base) {
  Args a = {cmd, "--shards", "2", "--cpus-per-shard", "1", "--workspace-root", root.string(), "--base", base.string()};
  a.insert(a.end(), kCount.begin(), kCount.end());
  for (auto& [flag, list] : {std::pair{"--compose-arg=", kCompose}, std::pair{"--filter-arg=", kFilter}})
    for (std::size_t i = 0; i < list.size(); ++i) {
      bool has_value = i + 1 < list.size() && list[i + 1].rfind("-", 0) != 0;
      a.push_back(flag + list[i] + (has_value ? "=" + list[i + 1] : ""));
      if (has_value) ++i;
    }
  a.insert(a.end(), {"--export-arg=--no-plots", "--export-arg=--no-realism"});
  return a;
}

std::string logs_of(const fs::path& root) {
  std::string s;
  if (!fs::exists(root / "logs")) return s;
  for (auto& e : fs::directory_iterator(root / "logs"))
    s += "---- " + e.path().string() + "\n" + test::read_file(e.path());
  return s;
}

// The merged workspace against the reference: same tasks, same verdicts, same kept set.
void expect_same_corpus(const fs::path& root, const fs::path& ref) {
  ASSERT_TRUE(fs::exists(root / "merged" / "opforge.db")) << logs_of(root);
  auto want = verdicts(ref);
  ASSERT_EQ(want.size(), 8u);
  EXPECT_EQ(verdicts(root / "merged"), want) << logs_of(root);
  EXPECT_EQ(kept(root / "merged"), kept(ref));
  EXPECT_TRUE(fs::exists(root / "merged" / "export" / "manifest.json")) << logs_of(root);
  for (int i : {0, 1}) {
    auto shard = verdicts(root / "shards" / std::to_string(i));
    EXPECT_GE(shard.size(), 1u) << "shard " << i << " judged nothing: the test no longer splits the corpus";
  }
}

// A one-node Slurm for the test's lifetime: stopped in the destructor, also when the test fails.
class LocalSlurm {
 public:
  explicit LocalSlurm(const fs::path& dir) : dir_(dir) {
    auto [rc, out] = test::shell(script() + " start '" + dir.string() + "' 2>&1");
    std::smatch m;
    if (rc == 0 && std::regex_search(out, m, std::regex("export SLURM_CONF=(\\S+)"))) {
      ::setenv("SLURM_CONF", m[1].str().c_str(), 1);  // sbatch, scontrol and opforge slurm's children
      started_ = true;
    } else {
      error_ = out;
    }
  }
  ~LocalSlurm() {
    auto [rc, out] = test::shell(script() + " stop '" + dir_.string() + "' 2>&1");
    EXPECT_EQ(rc, 0) << out;
    ::unsetenv("SLURM_CONF");
  }
  bool started() const { return started_; }
  const std::string& error() const { return error_; }

  // JobState of a job, and its Reason ("DependencyNeverSatisfied" ends a wait too).
  static std::pair<std::string, std::string> state(const std::string& id) {
    auto [rc, out] = test::shell("scontrol show job -o " + id + " 2>&1");
    std::smatch s, r;
    std::regex_search(out, s, std::regex("JobState=(\\S+)"));
    std::regex_search(out, r, std::regex("Reason=(\\S+)"));
    return {s.size() > 1 ? s[1].str() : out, r.size() > 1 ? r[1].str() : ""};
  }
  // Waits until the job ends; returns its last state.
  static std::string wait(const std::string& id, int max_s) {
    std::pair<std::string, std::string> st;
    for (int i = 0; i < max_s * 2; ++i) {
      st = state(id);
      if (st.first != "PENDING" && st.first != "RUNNING" && st.first != "CONFIGURING" && st.first != "COMPLETING")
        return st.first;
      if (st.second == "DependencyNeverSatisfied") return "DependencyNeverSatisfied";
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return "still " + st.first + " after " + std::to_string(max_s) + " s";
  }

 private:
  static std::string script() { return "'" + (project_root() / "scripts" / "local_slurm.sh").string() + "'"; }
  fs::path dir_;
  bool started_ = false;
  std::string error_;
};

// Job ids from opforge slurm --submit's stdout ("shards\tID", "merge\tID").
std::map<std::string, std::string> job_ids(const std::string& out) {
  std::map<std::string, std::string> ids;
  std::smatch m;
  for (auto it = out.cbegin(); std::regex_search(it, out.cend(), m, std::regex("(\\w+)\t(\\d+)")); it = m.suffix().first)
    ids[m[1]] = m[2];
  return ids;
}

bool skipped() { return std::getenv(kSkipEnv) != nullptr; }

TEST(Launchers, SlurmArrayAndAfterokMergeMakeTheCorpusOfOneProcess) {
  if (skipped()) GTEST_SKIP() << kSkipEnv << " is set";
  ASSERT_EQ(::getuid(), 0u) << "slurmd runs jobs as their user and is started as root here; run as root or set "
                            << kSkipEnv;
  test::TempDir dir;
  LocalSlurm slurm(dir / "slurm");
  ASSERT_TRUE(slurm.started()) << "scripts/local_slurm.sh start failed (run `make setup` for slurm-wlm and munge):\n"
                               << slurm.error();
  auto base = crawl_base(dir / "base");
  auto root = dir / "root";
  auto args = launch_args("slurm", root, base);
  args.push_back("--submit");
  auto r = test::run_opforge(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ids = job_ids(r.out);
  ASSERT_TRUE(ids.count("shards") && ids.count("merge")) << r.out << r.err;
  auto ref = reference_run(base, dir / "ref");  // one process's run, while Slurm runs the shards
  EXPECT_EQ(LocalSlurm::wait(ids["merge"], 600), "COMPLETED") << logs_of(root);
  EXPECT_EQ(LocalSlurm::state(ids["shards"]).first, "COMPLETED");
  expect_same_corpus(root, ref);

  // Shard 1 lost (as if its node died before staging), submitted again: the array holds shard 1
  // alone, shard 0 is left as it was, and the merge sees both.
  auto marker0 = test::read_file(root / "shards/0/done/launch.shard-0-of-2.json");
  fs::remove_all(root / "shards" / "1");
  r = test::run_opforge(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ids = job_ids(r.out);
  ASSERT_TRUE(ids.count("shards") && ids.count("merge")) << r.out << r.err;
  EXPECT_NE(test::read_file(root / "launch" / "shards.sbatch").find("#SBATCH --array=1\n"), std::string::npos);
  EXPECT_EQ(LocalSlurm::wait(ids["merge"], 600), "COMPLETED") << logs_of(root);
  EXPECT_EQ(test::read_file(root / "shards/0/done/launch.shard-0-of-2.json"), marker0) << "shard 0 ran again";
  expect_same_corpus(root, ref);
}

// A port nothing listens on now (the kernel's pick for a socket bound to port 0).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// A local Ray cluster for the test's lifetime: `ray start --head --block` in a process group of
// its own, ended in the destructor by signalling that group (its GCS, raylet and workers), not
// by `ray stop`, which ends every Ray process of the machine by name.
class LocalRay {
 public:
  // Up to three tries, each on a fresh port: the port free_port saw free can be taken before
  // Ray's GCS binds it (a test running beside this one binding port 0 got it once in CI, and
  // the GCS failed with "Failed to start the grpc server").
  explicit LocalRay(const fs::path& dir) {
    fs::create_directories(dir);
    for (int attempt = 1; attempt <= 3 && !started(); ++attempt) start(dir, attempt);
  }
  ~LocalRay() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGTERM);
    bool reaped = false;
    for (int i = 0; i < 60 && !reaped; ++i) {
      reaped = ::waitpid(pid_, nullptr, WNOHANG) == pid_;
      if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    // Whatever of the group outlived the head's own shutdown.
    for (int i = 0; i < 20 && ::kill(-pid_, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (::kill(-pid_, 0) == 0) ::kill(-pid_, SIGKILL);
    if (!reaped) ::waitpid(pid_, nullptr, 0);
  }
  bool started() const {
    return !log_.empty() && test::read_file(log_).find("Ray runtime started") != std::string::npos;
  }
  std::string log() const { return test::read_file(log_); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void start(const fs::path& dir, int attempt) {
    log_ = dir / ("ray-" + std::to_string(attempt) + ".log");
    port_ = free_port();
    Args args = {(test::python_bin().parent_path() / "ray").string(), "start", "--head", "--block", "--num-cpus", "2",
                 "--port", std::to_string(port_), "--temp-dir", (dir / ("t" + std::to_string(attempt))).string(),
                 "--include-dashboard", "false", "--disable-usage-stats"};
    try {
      pid_ = test::spawn_process(args, log_, log_, /*own_group=*/true);
    } catch (const std::exception&) {
      pid_ = -1;  // started() is false: the test says so with the log
      return;
    }
    for (int i = 0; i < 240 && !started(); ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        if (::kill(-pid_, 0) == 0) ::kill(-pid_, SIGKILL);  // what the failed head left of its group
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    if (!started()) {  // still starting after two minutes: not a cluster to build on
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  fs::path log_;
  int port_ = 0;
  pid_t pid_ = -1;
};

TEST(Launchers, RayTasksAndAMergeTaskMakeTheCorpusOfOneProcess) {
  if (skipped()) GTEST_SKIP() << kSkipEnv << " is set";
  test::TempDir dir;
  auto base = crawl_base(dir / "base");
  // One process's run, beside the cluster's.
  auto ref = std::async(std::launch::async, [&] { return reference_run(base, dir / "ref"); });
  LocalRay ray(dir / "ray");
  ASSERT_TRUE(ray.started()) << "ray start failed (run `make setup`: ray is in python/requirements.lock):\n" << ray.log();
  auto root = dir / "root";
  auto args = launch_args("ray", root, base);
  args.insert(args.end(), {"--address", ray.address()});
  auto r = test::run_opforge(args);
  ASSERT_EQ(r.exit_code, 0) << r.err << logs_of(root);
  EXPECT_EQ(r.out, (root / "merged" / "export").string() + "\n") << "stdout is the export folder alone";
  expect_same_corpus(root, ref.get());

  // Run again: both shards have their marker, so no shard task runs; the merge runs again.
  r = test::run_opforge(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("0 of 2 shards to run"), std::string::npos) << r.err;
  expect_same_corpus(root, dir / "ref");

  // Other compose options on the same root: the finished shards are not mixed into another corpus.
  args.push_back("--compose-arg=--edge-smoothing=1");
  r = test::run_opforge(args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("finished with other stages or compose/filter options"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace opforge
