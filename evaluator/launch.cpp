// The sandbox every solution's child starts in (docs/architecture.md, "The judge"): probed once per
// run with `opforge sandbox-exec --probe`, then handed to python/opforge/judge.py as a launch spec.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

#include "internal.h"
#include "opforge/core/error.h"
#include "opforge/core/paths.h"
#include "opforge/core/worker_pool.h"

namespace opforge::evaluator {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json probe(bool gpu) {
  std::string cmd = "'" + self_executable().string() + "' sandbox-exec --probe" + (gpu ? " --gpu" : "") + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
  if (!p) return {{"ok", false}, {"why", "cannot run opforge sandbox-exec --probe"}};
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p.get())) out.append(buf, n);
  auto brace = out.rfind("\n{");
  try {
    return json::parse(brace == std::string::npos ? out : out.substr(brace + 1));
  } catch (const std::exception&) {
    return {{"ok", false}, {"why", "sandbox-exec --probe answered: " + out.substr(0, 300)}};
  }
}

// The environment inside: nothing of the judge's (no API keys, no tokens), only what the child
// needs to find the venv and run torch on its cores.
// The venv's own folder: resolving the interpreter's path itself would end in /usr (its python is a
// link to the system's), which is neither the venv nor what the child must see.
fs::path venv_dir() { return fs::canonical(fs::absolute(python_executable()).parent_path().parent_path()); }

json child_env(const std::string& device, unsigned threads) {
  fs::path venv = venv_dir();
  // The venv's bin first: builds need its ninja (pip's) when the system has none.
  json env = {{"HOME", "/home"}, {"PATH", (venv / "bin").string() + ":/usr/local/bin:/usr/bin:/bin"}, {"LANG", "C.UTF-8"}, {"TMPDIR", "/tmp"},
              {"PYTHONUNBUFFERED", "1"}, {"PYTHONDONTWRITEBYTECODE", "1"}, {"OPFORGE_WORK", "/work"},
              {"OPFORGE_HOME", project_root().string()},
              {"OPFORGE_PYTHON", (fs::canonical(venv) / "bin" / python_executable().filename()).string()},
              {"OMP_NUM_THREADS", std::to_string(threads)}, {"TORCHINDUCTOR_COMPILE_THREADS", "1"},
              {"MAX_JOBS", std::to_string(threads)}};
  for (const char* k : {"CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"})
    if (const char* v = std::getenv(k); v && *v) env[k] = v;
  // With no GPU to ask, torch cannot tell which architecture to build CUDA code for: Hopper, the
  // GPU machine's (a CPU run can then still build a CUDA solution).
  if (!env.contains("TORCH_CUDA_ARCH_LIST") && device != "cuda") env["TORCH_CUDA_ARCH_LIST"] = "9.0";
  if (device != "cuda") env["CUDA_VISIBLE_DEVICES"] = "";
  else env["OPFORGE_CHILD_DEVICE"] = "cuda";
  return env;
}

// Folders the binary and torch load libraries from besides the system's (LD_LIBRARY_PATH: the GPU
// machine's unpacked Debian packages, a CUDA install): the child must see them to start at all.
json library_dirs() {
  json dirs = json::array();
  const char* lp = std::getenv("LD_LIBRARY_PATH");
  std::string rest = lp ? lp : "";
  for (std::size_t pos = 0; pos <= rest.size();) {
    std::size_t next = rest.find(':', pos);
    std::string d = rest.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    std::error_code ec;
    if (!d.empty() && d[0] == '/' && fs::is_directory(d, ec) && d.rfind("/usr/", 0) != 0) dirs.push_back(d);
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return dirs;
}

}  // namespace

Launch choose_launch(const EvalOptions& o, const std::string& device) {
  Launch l;
  unsigned threads = std::max(1u, usable_cpus() / static_cast<unsigned>(std::max(1, o.workers)));
  fs::path venv = venv_dir();
  json ro = json::array({(project_root() / "python").string(), venv.string(), self_executable().string()});
  for (auto& d : library_dirs()) ro.push_back(d);
  json spec = {{"ro", ro},
               {"gpu", device == "cuda"},
               {"env", child_env(device, threads)},
               {"memory_mb", o.child_memory_mb},
               {"max_pids", 512}};
  l.spec = {{"mode", "off"}, {"exe", self_executable().string()},
            {"sandbox_exec", json::array({self_executable().string(), "sandbox-exec"})}, {"spec", spec}};
  std::string why = "--no-sandbox";
  if (o.sandbox) {
    json p = probe(device == "cuda");
    if (p.value("ok", false)) {
      l.sandboxed = true;
      l.spec["mode"] = "bwrap";
      l.profile = p.value("profile", std::string("bwrap"));
    } else {
      why = p.value("why", std::string("the sandbox probe failed"));
    }
  }
  if (!l.sandboxed) {
    OPFORGE_CHECK(!o.require_sandbox, "--require-sandbox, but solutions cannot be sandboxed here: {}", why);
    l.profile = "off: " + why;
    spdlog::warn("solutions run WITHOUT a sandbox ({}); every row is flagged sandbox_off", why);
  }
  l.spec["profile"] = l.profile;
  return l;
}

}  // namespace opforge::evaluator
