#include <nlohmann/json.hpp>

#include "internal.h"
#include "opforge/core/error.h"

namespace opforge::evaluator {

using nlohmann::json;

BaselineCache::BaselineCache(const std::filesystem::path& file) : db_(file) {
  // A new table name: rows of the first judge (in-process timing, no judge version in the key)
  // are never read by this one.
  db_.migrate("eval_baselines_v2", {R"sql(
CREATE TABLE eval_baselines_v2 (
  code_hash   TEXT NOT NULL,   -- xxh3 hex of the task's code as evaluated
  key         TEXT NOT NULL,   -- device name + uuid + CUDA, torch, judge version, trials
  eager       TEXT NOT NULL,   -- opforge.timing.time_calls stats (JSON)
  compile     TEXT,            -- NULL when torch.compile failed on the reference
  note        TEXT,
  measured_at TEXT NOT NULL DEFAULT (datetime('now')),
  PRIMARY KEY (code_hash, key)
);
)sql"});
}

std::optional<json> BaselineCache::get(const std::string& code_hash, const std::string& key) {
  auto st = db_.prepare("SELECT eager, compile, note FROM eval_baselines_v2 WHERE code_hash = ? AND key = ?");
  st.bind(1, code_hash).bind(2, key);
  if (!st.step()) return std::nullopt;
  return json{{"eager", json::parse(st.text(0))},
              {"compile", st.is_null(1) ? json(nullptr) : json::parse(st.text(1))},
              {"note", st.is_null(2) ? "" : st.text(2)},
              {"cached", true}};
}

void BaselineCache::put(const std::string& code_hash, const std::string& key, const json& b) {
  with_context("while caching baselines", [&] {
    db_.transaction([&] {
      auto st = db_.prepare("INSERT OR REPLACE INTO eval_baselines_v2(code_hash, key, eager, compile, note) "
                            "VALUES(?, ?, ?, ?, ?)");
      st.bind(1, code_hash).bind(2, key).bind(3, b["eager"].dump());
      if (b["compile"].is_null()) st.bind_null(4); else st.bind(4, b["compile"].dump());
      st.bind(5, b.value("detail", ""));
      st.run();
    });
  });
}

}  // namespace opforge::evaluator
