#include "tokenizer.h"

#include "python_bridge.h"

namespace opforge::trainer {
using json = nlohmann::json;

namespace {
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
  return call_python("opforge.tokenizer", fn, request);
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

std::vector<Tokenizer::ChatRow> Tokenizer::chat_rows(const json& records, int64_t max_len) const {
  json r = call("chat_tokens", {{"records", records}, {"max_len", max_len}});
  std::vector<ChatRow> out;
  for (auto& row : r["rows"]) {
    ChatRow c;
    if (row.contains("error")) {
      c.error = row["error"].get<std::string>();
    } else {
      c.ids = row["ids"].get<std::vector<int64_t>>();
      c.mask = row["mask"].get<std::vector<uint8_t>>();
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace opforge::trainer
