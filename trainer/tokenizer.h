// A model folder's tokenizer, run by transformers in this process's embedded interpreter
// (python/opforge/tokenizer.py), so token ids and chat templates are exactly transformers'.
// Typed requests and replies across the seam; a Python failure throws opforge::Error with its
// traceback. One per process (one interpreter), used from the thread that made it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace opforge::trainer {

struct ChatMessage {
  std::string role, content;
};

class Tokenizer {
 public:
  explicit Tokenizer(const std::filesystem::path& model_dir);
  std::vector<int64_t> encode(const std::string& text) const;
  // The chat template applied, with the generation prompt (an assistant turn begins).
  std::vector<int64_t> encode_chat(const nlohmann::json& messages, const nlohmann::json& tools = nullptr) const;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const;
  // Chat records ({messages, tools?}) as token ids with the loss mask of SFT: 1 on the tokens of
  // assistant turns, 0 on the rest (python/opforge/tokenizer.py, chat_tokens). A record that
  // cannot be rendered comes back with `error` set instead.
  struct ChatRow {
    std::vector<int64_t> ids;
    std::vector<uint8_t> mask;
    std::string error;
  };
  std::vector<ChatRow> chat_rows(const nlohmann::json& records, int64_t max_len) const;
  std::optional<int64_t> eos_id() const { return eos_; }
  std::optional<int64_t> pad_id() const { return pad_; }

 private:
  nlohmann::json call(const char* fn, nlohmann::json request) const;
  std::string model_;
  std::optional<int64_t> eos_, pad_;
};

}  // namespace opforge::trainer
