#include "python_bridge.h"

#include <memory>

#include "opforge/core/paths.h"
#include "opforge/core/python_runtime.h"

namespace opforge::trainer {
using json = nlohmann::json;

nlohmann::json call_python(const char* module, const char* function, const nlohmann::json& request) {
  // Made on first use: a trainer command that never tokenizes or plots never starts Python.
  static std::unique_ptr<PythonRuntime> rt = [] {
    auto r = std::make_unique<PythonRuntime>(python_executable(), python_package_dir());
    r->release_between_calls();  // autograd runs on this thread between calls
    return r;
  }();
  return json::parse(rt->call(module, function, request.dump()));
}

}  // namespace opforge::trainer
