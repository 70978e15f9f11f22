#include "tokenizer.h"

#include <memory>

#include "opforge/core/paths.h"
#include "opforge/core/python_runtime.h"

namespace opforge::trainer {
using json = nlohmann::json;

namespace {
PythonRuntime& runtime() {
  // Made on first use: a trainer command that never tokenizes never starts Python.
  static std::unique_ptr<PythonRuntime> rt = std::make_unique<PythonRuntime>(python_executable(), python_package_dir());
  return *rt;
}

std::optional<int64_t> id_or_none(const json& v) {
  return v.is_number_integer() ? std::optional<int64_t>(v.get<int64_t>()) : std::nullopt;
}
}  // namespace

Tokenizer::Tokenizer(const std::filesystem::path& model_dir) : model_(std::filesystem::absolute(model_dir).string()) {
  json i = call("info", json::object());
  eos_ = id_or_none(i["eos_id"]);
  pad_ = id_or_none(i["pad_id"]);
}

json Tokenizer::call(const char* fn, json request) const {
  request["model"] = model_;
  return json::parse(runtime().call("opforge.tokenizer", fn, request.dump()));
}

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  return call("encode", {{"text", text}})["ids"].get<std::vector<int64_t>>();
}

std::vector<int64_t> Tokenizer::encode_chat(const json& messages, const json& tools) const {
  json req = {{"messages", messages}};
  if (!tools.is_null()) req["tools"] = tools;
  return call("encode", req)["ids"].get<std::vector<int64_t>>();
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  return call("decode", {{"ids", ids}, {"skip_special", skip_special}})["text"].get<std::string>();
}

}  // namespace opforge::trainer
