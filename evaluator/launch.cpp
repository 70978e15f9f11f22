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
  json env = {{"HOME", "/home"}, {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"LANG", "C.UTF-8"}, {"TMPDIR", "/tmp"},
              {"PYTHONUNBUFFERED", "1"}, {"PYTHONDONTWRITEBYTECODE", "1"}, {"OPFORGE_WORK", "/work"},
              {"OPFORGE_HOME", project_root().string()},
              {"OPFORGE_PYTHON", (fs::canonical(venv) / "bin" / python_executable().filename()).string()},
              {"OMP_NUM_THREADS", std::to_string(threads)}, {"TORCHINDUCTOR_COMPILE_THREADS", "1"},
              {"MAX_JOBS", std::to_string(threads)}};
  for (const char* k : {"CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"})
    if (const char* v = std::getenv(k); v && *v) env[k] = v;
  if (device != "cuda") env["CUDA_VISIBLE_DEVICES"] = "";
  return env;
}

}  // namespace

Launch choose_launch(const EvalOptions& o, const std::string& device, const fs::path& cache) {
  (void)cache;
  Launch l;
  unsigned threads = std::max(1u, usable_cpus() / static_cast<unsigned>(std::max(1, o.workers)));
  fs::path venv = venv_dir();
  json spec = {{"ro", json::array({(project_root() / "python").string(), venv.string(), self_executable().string()})},
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
