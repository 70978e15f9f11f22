#include "data.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>

#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"

namespace opforge::trainer {
using json = nlohmann::json;

namespace {
json as_chat(const json& j) {
  if (j.contains("messages")) return j;
  std::string answer = j.contains("completion") ? "completion" : "response";
  if (!j.contains("prompt") || !j["prompt"].is_string() || !j.contains(answer) || !j[answer].is_string())
    return nullptr;
  return {{"messages", json::array({{{"role", "user"}, {"content", j["prompt"]}},
                                    {{"role", "assistant"}, {"content", j[answer]}}})}};
}

void skip(TokenRows& rows, std::string why) {
  ++rows.skipped;
  if (rows.skip_reasons.size() < 5) rows.skip_reasons.push_back(std::move(why));
}
}  // namespace

TokenRows read_chat_rows(const std::filesystem::path& file, const Tokenizer& tok, int64_t max_len) {
  std::ifstream in(file);
  OPFORGE_CHECK(in, "cannot read {}: give a JSONL file of chat records", file.string());
  TokenRows rows;
  json records = json::array();
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    json chat = j.is_object() ? as_chat(j) : json(nullptr);
    if (chat.is_null()) {
      skip(rows, fmt::format("line {}: not a JSON object with messages, or prompt and completion", n));
      continue;
    }
    records.push_back(std::move(chat));
  }
  for (auto& r : tok.chat_rows(records, max_len)) {
    if (!r.error.empty()) {
      skip(rows, r.error);
      continue;
    }
    rows.ids.push_back(std::move(r.ids));
    rows.loss_mask.push_back(std::move(r.mask));
  }
  OPFORGE_CHECK(!rows.ids.empty(), "{} holds no usable chat record ({} skipped{}{})", file.string(), rows.skipped,
                rows.skip_reasons.empty() ? "" : ": ", rows.skip_reasons.empty() ? "" : rows.skip_reasons.front());
  return rows;
}

namespace {

// A tokenizer file the model folder may not have reads as empty.
std::string file_bytes(const std::filesystem::path& p) { return std::filesystem::exists(p) ? read_text(p) : ""; }

// What the rows depend on: the data, every file of the model folder that tokenising reads, max_len.
std::string rows_key(const std::filesystem::path& file, const std::filesystem::path& model_dir, int64_t max_len) {
  std::string all = file_bytes(file) + "\n" + std::to_string(max_len);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                        "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt"})
    all += std::string("\n") + f + "\n" + file_bytes(model_dir / f);
  return xxh3_hex(all);
}

template <class T>
void put(std::ostream& out, const std::vector<T>& v) {
  uint64_t n = v.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof n);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
}

template <class T>
bool get(std::istream& in, std::vector<T>& v) {
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), sizeof n) || n > (uint64_t{1} << 32)) return false;
  v.resize(n);
  return static_cast<bool>(in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T))));
}

// The cache file: the row count, the skipped count, then each row's ids and mask. The skip
// reasons are not kept (the first run logged them).
void write_rows(const std::filesystem::path& p, const TokenRows& rows) {
  std::ostringstream out;
  put(out, std::vector<int64_t>{static_cast<int64_t>(rows.ids.size()), rows.skipped});
  for (std::size_t i = 0; i < rows.ids.size(); ++i) {
    put(out, rows.ids[i]);
    put(out, rows.loss_mask[i]);
  }
  try {
    write_text_atomic(p, out.str());
  } catch (const std::exception& e) {  // a cache that cannot be written is only a slower next run
    spdlog::warn("tokenised rows not cached: {}", e.what());
  }
}

std::optional<TokenRows> load_rows(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<int64_t> head;
  if (!in || !get(in, head) || head.size() != 2) return std::nullopt;
  TokenRows rows;
  rows.skipped = head[1];
  rows.ids.resize(static_cast<std::size_t>(head[0]));
  rows.loss_mask.resize(rows.ids.size());
  for (std::size_t i = 0; i < rows.ids.size(); ++i)
    if (!get(in, rows.ids[i]) || !get(in, rows.loss_mask[i])) return std::nullopt;
  return rows;
}

}  // namespace

TokenRows cached_chat_rows(const std::filesystem::path& file, const Tokenizer& tok, int64_t max_len,
                           const std::filesystem::path& model_dir, const std::filesystem::path& cache_dir) {
  OPFORGE_CHECK(std::filesystem::exists(file), "cannot read {}: give a JSONL file of chat records", file.string());
  std::filesystem::path p = cache_dir / ("rows-" + rows_key(file, model_dir, max_len) + ".bin");
  if (auto rows = load_rows(p)) {
    spdlog::info("{}: {} tokenised rows from {}", file.string(), rows->ids.size(), p.string());
    return *rows;
  }
  TokenRows rows = read_chat_rows(file, tok, max_len);
  write_rows(p, rows);
  return rows;
}

Batch collate(const TokenRows& rows, const std::vector<int64_t>& pick, int64_t pad_id) {
  int64_t T = 0;
  for (auto i : pick) T = std::max<int64_t>(T, static_cast<int64_t>(rows.ids[i].size()));
  const int64_t B = static_cast<int64_t>(pick.size());
  Batch b;
  b.ids = at::full({B, T}, pad_id, at::kLong);
  b.attention = at::zeros({B, T}, at::kLong);
  b.loss_mask = at::zeros({B, T}, at::kFloat);
  for (int64_t r = 0; r < B; ++r) {
    const auto& ids = rows.ids[pick[r]];
    const auto& m = rows.loss_mask[pick[r]];
    int64_t n = static_cast<int64_t>(ids.size());
    b.ids[r].narrow(0, 0, n).copy_(at::tensor(ids, at::kLong));
    b.attention[r].narrow(0, 0, n).fill_(1);
    std::vector<float> mf(m.begin(), m.end());
    b.loss_mask[r].narrow(0, 0, n).copy_(at::tensor(mf, at::kFloat));
  }
  // A token's loss is predicted from the one before it: the first token of a row never counts.
  b.tokens = b.loss_mask.narrow(1, 1, std::max<int64_t>(T - 1, 0)).sum().item<int64_t>();
  return b;
}

std::vector<std::vector<int64_t>> micro_batches(const std::vector<int64_t>& pick, int64_t micro) {
  std::vector<std::vector<int64_t>> out;
  const std::size_t m = micro > 0 ? static_cast<std::size_t>(micro) : pick.size();
  for (std::size_t i = 0; i < pick.size(); i += m)
    out.emplace_back(pick.begin() + static_cast<std::ptrdiff_t>(i),
                     pick.begin() + static_cast<std::ptrdiff_t>(std::min(pick.size(), i + m)));
  return out;
}

std::vector<int64_t> batch_of_step(int64_t step, int64_t n, int64_t batch, uint64_t seed) {
  int64_t per_epoch = (n + batch - 1) / batch, epoch = (step - 1) / per_epoch, k = (step - 1) % per_epoch;
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 1000003ULL + static_cast<uint64_t>(epoch));
  std::shuffle(order.begin(), order.end(), rng);
  auto first = order.begin() + k * batch;
  return std::vector<int64_t>(first, std::min(first + batch, order.end()));
}

}  // namespace opforge::trainer
