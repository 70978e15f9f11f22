#include "test_support.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <signal.h>
#include <thread>

#include "opforge/core/hash.h"
#include "opforge/core/store.h"
#include <fmt/format.h>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace opforge::test {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "opforge-test-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  if (!std::getenv("OPFORGE_KEEP_TEST_DIRS")) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

pid_t spawn_process(const std::vector<std::string>& argv, const std::filesystem::path& out,
                    const std::filesystem::path& err, bool own_group) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (err == out)
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  else
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  if (own_group) {
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&at, 0);
  }
  pid_t pid = -1;
  int rc = posix_spawn(&pid, cargv[0], &fa, &at, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) throw std::runtime_error("posix_spawn " + args[0] + " failed");
  return pid;
}

namespace {
pid_t spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  std::vector<std::string> full = {OPFORGE_BIN};
  full.insert(full.end(), args.begin(), args.end());
  return spawn_process(full, out, err);
}
}  // namespace

CmdResult run_opforge(const std::vector<std::string>& args) {
  TempDir io;
  auto out = (io / "out").string(), err = (io / "err").string();
  pid_t pid = spawn(args, out, err);
  int status = 0;
  waitpid(pid, &status, 0);
  CmdResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

pid_t spawn_opforge(const std::vector<std::string>& args) { return spawn(args, "/dev/null", "/dev/null"); }

pid_t spawn_opforge_to(const std::vector<std::string>& args, const std::filesystem::path& out,
                       const std::filesystem::path& err) {
  return spawn(args, out.string(), err.string());
}

bool kill_when(pid_t pid, const std::filesystem::path& db, const std::string& count_sql, long at_least, int max_s) {
  bool killed = false;
  for (int i = 0; i < max_s * 20 && !killed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (waitpid(pid, nullptr, WNOHANG) == pid) return false;  // it finished first
    if (!std::filesystem::exists(db)) continue;
    try {
      Db d(db);
      auto st = d.prepare(count_sql);
      if (st.step() && st.int64(0) >= at_least) {
        kill(pid, SIGKILL);
        killed = true;
      }
    } catch (const std::exception&) {
      // the schema may not exist yet
    }
  }
  if (!killed) kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return killed;
}

std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, out};
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream f(p);
  f << text;
}

std::filesystem::path fixtures() { return OPFORGE_FIXTURES; }
std::filesystem::path opforge_bin() { return OPFORGE_BIN; }
std::filesystem::path eval_cache_dir() { return OPFORGE_TEST_EVAL_CACHE; }
std::filesystem::path python_bin() { return OPFORGE_TEST_PYTHON; }

const std::map<std::string, nlohmann::json>& dedup_fixture_ops() {
  using nlohmann::json;
  static const std::map<std::string, json> ops = {
      {"linear_tanh", json::array({"nn.Linear", "torch.tanh"})},
      {"linear_tanh_renamed", json::array({"nn.Linear", "torch.tanh"})},
      {"layernorm_gelu", json::array({"nn.LayerNorm", "F.gelu"})},
      {"layernorm_gelu_reordered", json::array({"nn.LayerNorm", "F.gelu"})},
      {"softmax_sum", json::array({"torch.softmax", "Tensor.sum"})},
      {"bmm_scale_sigmoid", json::array({"torch.bmm", "torch.mul", "torch.sigmoid"})},
      {"conv_relu_bias", json::array({"nn.Conv2d", "torch.relu", "torch.add"})},
      {"deconv_softplus_clamp", json::array({"nn.ConvTranspose2d", "F.softplus", "torch.clamp"})},
      {"hardtanh_single", json::array({"nn.Hardtanh"})},
      {"conv_relu_scale_bias", json::array({"nn.Conv2d", "torch.relu", "torch.mul", "torch.add"})},
      {"cummax_single", json::array({"torch.cummax"})},
      {"mlp_block_renamed", json::array({"nn.LayerNorm", "nn.Linear", "F.gelu", "nn.Linear", "torch.add"})},
  };
  return ops;
}

std::filesystem::path tiny_model(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path script = fixtures().parent_path() / "python" / "tiny_lm.py";
  fs::path dir = eval_cache_dir().parent_path() / ("tiny_lm-" + xxh3_hex(read_file(script)));
  if (!fs::exists(dir / "llama" / "reference.json")) {
    fs::path tmp = dir.string() + ".tmp" + std::to_string(::getpid());
    auto [rc, out] = shell(fmt::format("{} {} make {} 2>&1", python_bin().string(), script.string(), tmp.string()));
    if (rc != 0) throw std::runtime_error("tiny_lm.py make failed: " + out);
    std::error_code ec;
    fs::rename(tmp, dir, ec);
    if (ec) fs::remove_all(tmp);
  }
  return dir / name;
}

}  // namespace opforge::test
