// The `tasks` table: candidate tasks, the workspace's shared format between the stages that make
// tasks (compose, import) and those that judge them (filter, dedup, export). Each judging stage
// keeps its results in its own table keyed by task id.
//
// Errors: SQLite failures throw opforge::Error.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "opforge/core/store.h"

namespace opforge::tasks {

struct NewTask {
  std::string id;       // xxh3 hex of the normalised code
  std::string code;     // KernelBench format
  std::string source;   // torch | transformers | imported
  std::string backend;  // template | llm | import
  int num_ops = 0;      // as composed; the filter traces the real ops
  nlohmann::json ops = nlohmann::json::array();       // as composed
  nlohmann::json seed_ids = nlohmann::json::array();
  nlohmann::json provenance = nlohmann::json::object();  // backend, rng seed, model, prompt hash, path, ...
};

void migrate(Db& db);
// Inserts the task unless a task with the same id exists; returns whether it was added.
bool insert(Db& db, const NewTask& t);
// Number of tasks, optionally of one backend.
long count(Db& db, const std::string& backend = "");

}  // namespace opforge::tasks
