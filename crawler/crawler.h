// opforge crawl: operators of torch and transformers → probed, runnable seed tasks.
//
// The stage owns the `seeds` table of the workspace database. Enumeration and code generation
// run in a worker (python/opforge/crawl.py, rules in data/crawl/); every candidate is probed in
// the worker pool, and each result is committed in its own transaction, so a killed crawl
// resumes where it stopped and a repeated crawl adds nothing.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "opforge/core/store.h"

namespace opforge::crawler {

struct CrawlOptions {
  std::vector<std::string> sources{"torch", "transformers"};  // any of torch, transformers; may be empty
  std::vector<std::filesystem::path> files;                   // extra seed files or folders (source "local")
  std::string match;                                          // regex on operator names; empty: all
  int limit = 0;                                              // first N enumerated operators; 0: all
  std::string device = "cpu";                                 // cpu | cuda | auto: where probes run
  int workers = 2;
  double timeout_s = 60;
  std::size_t memory_limit_mb = 0;
  bool retry_failed = false;  // probe again seeds whose probe failed (timeout, crash, error)
};

struct CrawlSummary {
  std::size_t enumerated = 0, added = 0, probed = 0, runnable = 0, failed = 0;
  double seconds = 0;
};

// Creates or upgrades the seeds table.
void migrate(Db& db);
// Throws opforge::Error when the workers cannot start or enumeration itself fails.
CrawlSummary crawl(Workspace& ws, const CrawlOptions& opts);
// The "seeds" section of `opforge status --json`.
nlohmann::json status(Db& db);

}  // namespace opforge::crawler
