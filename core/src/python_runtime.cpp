#include "opforge/core/python_runtime.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <unistd.h>

#include <iostream>

#include "opforge/core/error.h"
#include "opforge/core/paths.h"

namespace opforge {

namespace {

// Formats the pending Python exception (with traceback) and clears it.
std::string fetch_python_error() {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string out = "unknown Python error";
  if (PyObject* mod = PyImport_ImportModule("traceback")) {
    if (PyObject* lines = PyObject_CallMethod(mod, "format_exception", "OOO", type ? type : Py_None,
                                              value ? value : Py_None, tb ? tb : Py_None)) {
      PyObject* empty = PyUnicode_FromString("");
      if (PyObject* joined = PyUnicode_Join(empty, lines)) {
        out = PyUnicode_AsUTF8(joined);
        Py_DECREF(joined);
      }
      Py_XDECREF(empty);
      Py_DECREF(lines);
    }
    Py_DECREF(mod);
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return out;
}

void check_status(PyStatus status, const char* what) {
  if (PyStatus_Exception(status)) {
    throw Error(fmt::format("cannot start the embedded Python ({}): {}", what,
                            status.err_msg ? status.err_msg : "unknown"));
  }
}

}  // namespace

PythonRuntime::PythonRuntime(const std::filesystem::path& python_exe, const std::filesystem::path& package_dir) {
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  // Pointing program_name and executable at the venv's python makes CPython's path calculation
  // find pyvenv.cfg, so site-packages (torch, transformers) come from the venv.
  check_status(PyConfig_SetBytesString(&config, &config.program_name, python_exe.c_str()), "program_name");
  check_status(PyConfig_SetBytesString(&config, &config.executable, python_exe.c_str()), "executable");
  // Our own signal handling: the supervisor kills us; Python must not swallow SIGINT silently.
  config.install_signal_handlers = 1;
  PyStatus status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  check_status(status, python_exe.c_str());

  PyObject* sys_path = PySys_GetObject("path");  // borrowed
  PyObject* dir = PyUnicode_FromString(package_dir.c_str());
  PyList_Insert(sys_path, 0, dir);
  Py_DECREF(dir);
}

void PythonRuntime::release_between_calls() {
  if (!saved_) saved_ = PyEval_SaveThread();
}

std::string PythonRuntime::call(const std::string& module, const std::string& function, const std::string& arg) {
  if (!saved_) return call_locked(module, function, arg);
  PyGILState_STATE g = PyGILState_Ensure();
  try {
    std::string out = call_locked(module, function, arg);
    PyGILState_Release(g);
    return out;
  } catch (...) {
    PyGILState_Release(g);
    throw;
  }
}

std::string PythonRuntime::call_locked(const std::string& module, const std::string& function, const std::string& arg) {
  PyObject* mod = PyImport_ImportModule(module.c_str());
  if (!mod) throw Error(fmt::format("cannot import {}: {}", module, fetch_python_error()));
  PyObject* fn = PyObject_GetAttrString(mod, function.c_str());
  Py_DECREF(mod);
  if (!fn) throw Error(fmt::format("{}.{} not found: {}", module, function, fetch_python_error()));
  PyObject* result = PyObject_CallFunction(fn, "s#", arg.data(), static_cast<Py_ssize_t>(arg.size()));
  Py_DECREF(fn);
  if (!result) throw Error(fmt::format("{}.{} raised: {}", module, function, fetch_python_error()));
  Py_ssize_t size = 0;
  const char* s = PyUnicode_AsUTF8AndSize(result, &size);
  if (!s) {
    Py_DECREF(result);
    throw Error(fmt::format("{}.{} did not return a str: {}", module, function, fetch_python_error()));
  }
  std::string out(s, static_cast<size_t>(size));
  Py_DECREF(result);
  return out;
}

namespace {
bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}
}  // namespace

int serve_worker(int protocol_fd) {
  PythonRuntime rt(python_executable(), python_package_dir());
  std::string ready = rt.call("opforge.worker", "startup", "");
  if (!write_all(protocol_fd, ready + "\n")) return 1;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::string reply = rt.call("opforge.worker", "handle", line);
    if (!write_all(protocol_fd, reply + "\n")) return 1;
  }
  std::cout.flush();
  return 0;
}

int serve_candidate(int socket_fd) {
  PythonRuntime rt(python_executable(), python_package_dir());
  rt.call("opforge.candidate", "main", std::to_string(socket_fd));
  return 0;
}

}  // namespace opforge
