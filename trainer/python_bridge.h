// The trainer process's embedded interpreter (one per process, made on first use, used from the
// thread that made it): typed JSON requests to functions of python/opforge/ (the tokenizer, the
// plots). A Python exception throws opforge::Error with its traceback.
#pragma once
#include <nlohmann/json.hpp>

namespace opforge::trainer {

nlohmann::json call_python(const char* module, const char* function, const nlohmann::json& request);

}  // namespace opforge::trainer
