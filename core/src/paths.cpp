#include "opforge/core/paths.h"

#include <cstdlib>

#include "opforge/core/error.h"

namespace opforge {

std::filesystem::path project_root() {
  if (const char* home = std::getenv("OPFORGE_HOME"); home && *home) return home;
  return OPFORGE_SOURCE_DIR;
}

std::filesystem::path data_dir() { return project_root() / "data"; }

std::filesystem::path python_package_dir() { return project_root() / "python"; }

std::filesystem::path python_executable() {
  std::filesystem::path p = OPFORGE_DEFAULT_PYTHON;
  if (const char* env = std::getenv("OPFORGE_PYTHON"); env && *env) p = env;
  OPFORGE_CHECK(std::filesystem::exists(p),
                "Python interpreter {} not found: run `make setup` to create the project venv, or set "
                "OPFORGE_PYTHON to a venv's python that has torch installed",
                p.string());
  return p;
}

std::filesystem::path self_executable() { return std::filesystem::read_symlink("/proc/self/exe"); }

std::filesystem::path opforge_executable() {
  std::filesystem::path self = self_executable();
  return self.filename() == "opforge" ? self : self.parent_path() / "opforge";
}

const char* version() { return OPFORGE_VERSION; }

std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int run_python_module(const std::string& module, const std::vector<std::string>& args) {
  std::string cmd = "PYTHONPATH=" + shell_quoted(python_package_dir().string()) + " " +
                    shell_quoted(python_executable().string()) + " -m " + shell_quoted(module);
  for (auto& a : args) cmd += " " + shell_quoted(a);
  return std::system((cmd + " 1>&2").c_str());
}

}  // namespace opforge
