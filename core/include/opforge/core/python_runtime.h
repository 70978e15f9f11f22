// The embedded CPython interpreter of an `opforge worker` process.
//
// One per process, created on the main thread, which keeps the GIL. The interpreter runs with the
// project venv (sys.prefix is the venv, sys.executable the venv's python, which inductor needs to
// spawn its compile workers) and python/ on sys.path so `import opforge` finds our modules.
#pragma once
#include <filesystem>
#include <string>

namespace opforge {

class PythonRuntime {
 public:
  PythonRuntime(const std::filesystem::path& python_exe, const std::filesystem::path& package_dir);
  // Leaves the interpreter alive: finalising after torch has started threads can hang, and the
  // process is about to exit anyway.
  ~PythonRuntime() = default;
  PythonRuntime(const PythonRuntime&) = delete;
  PythonRuntime& operator=(const PythonRuntime&) = delete;

  // Calls module.function(arg) and returns its str result. A Python exception becomes
  // opforge::Error carrying the formatted traceback.
  std::string call(const std::string& module, const std::string& function, const std::string& arg);

  // Gives the GIL up between calls (each call takes it back): for a process whose C++ also runs
  // libtorch's autograd, which refuses to run while the GIL is held once Python imported torch.
  void release_between_calls();

 private:
  std::string call_locked(const std::string& module, const std::string& function, const std::string& arg);
  void* saved_ = nullptr;  // the PyThreadState given up, when released
};

// Body of `opforge worker`: imports opforge.worker (and so torch) once, writes one ready line,
// then answers each JSON line read from stdin with one JSON line on `protocol_fd`. Task code
// printing to stdout cannot corrupt the protocol: fd 1 is the log, not the protocol pipe.
// Returns when stdin closes.
int serve_worker(int protocol_fd);

// Body of `opforge worker --candidate`: the single-use child that runs one untrusted solution
// for the judge (python/opforge/candidate.py), speaking on the inherited socket `socket_fd`.
// Returns when the judge closes the socket or says exit.
int serve_candidate(int socket_fd);

}  // namespace opforge
