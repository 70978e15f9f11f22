// Where opforge finds its own files and its Python, so the binary works from any directory.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace opforge {

// The project tree holding data/ and python/: $OPFORGE_HOME, else the source tree it was built from.
std::filesystem::path project_root();
std::filesystem::path data_dir();
// The folder put on sys.path of embedded interpreters (holds the `opforge` package).
std::filesystem::path python_package_dir();
// The venv interpreter the workers embed: $OPFORGE_PYTHON, else the one chosen at configure time.
// Throws opforge::Error saying how to fix it when it does not exist.
std::filesystem::path python_executable();
// `s` as one word for a POSIX shell: single-quoted, its own single quotes escaped.
std::string shell_quoted(const std::string& s);
// `python -m MODULE ARGS...` with the venv's interpreter and opforge's package on its path, its
// stdout sent to stderr (stdout is the command's data); returns the exit status.
int run_python_module(const std::string& module, const std::vector<std::string>& args);
// This binary (/proc/self/exe), used to spawn `opforge worker` children.
std::filesystem::path self_executable();
// The opforge binary: this process's own executable when it is named opforge, else `opforge` beside it.
std::filesystem::path opforge_executable();
const char* version();

}  // namespace opforge
