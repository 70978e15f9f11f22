// The real-model tables (realism.h: model_stats); the tracing is python/opforge/model_stats.py.
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>

#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"
#include "realism.h"

namespace opforge::realism {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string entry_name(const json& e) { return e.is_array() ? e[0].get<std::string>() : e["name"].get<std::string>(); }

json read_families(const fs::path& p) {
  json spec;
  try {
    spec = json::parse(read_text(p));
  } catch (const json::exception& e) {
    throw Error(fmt::format("{} is not JSON ({}); fix it or pass --families FILE", p.string(), e.what()));
  }
  for (const char* key : {"families", "torch_modules", "inputs", "sizes", "layers", "fallback"})
    OPFORGE_CHECK(spec.contains(key), "{} has no \"{}\" (data/README.md, real_models/, lists the keys)", p.string(), key);
  return spec;
}

void write_atomically(const fs::path& out, const std::string& bytes) {
  fs::path tmp = out;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    OPFORGE_CHECK(f.good(), "cannot write {}: check that its folder exists and is writable", tmp.string());
    f << bytes;
    OPFORGE_CHECK(f.good(), "writing {} failed (disk full?)", tmp.string());
  }
  fs::rename(tmp, out);  // a killed run leaves the old table, never half a new one
}

json provenance(const json& spec_info, const WorkerPool& pool, const ModelStatsSummary& sum, const json& devices) {
  const json& info = pool.worker_info();
  return {{"command", "opforge model-stats"},
          {"opforge", version()},
          {"torch", info.value("torch", "")},
          {"transformers", info.value("transformers", "")},
          {"families_file", spec_info},
          {"traced", devices},
          {"failed", sum.failed}};
}

}  // namespace

ModelStatsSummary model_stats(const ModelStatsOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  fs::path families = opts.families.empty() ? data_dir() / "real_models" / "families.json" : opts.families;
  fs::path out = opts.out.empty() ? default_stats() : opts.out;
  json spec = read_families(families);
  std::vector<json> entries, reqs;
  for (const auto& e : spec["families"]) entries.push_back(e);
  for (const auto& e : spec["torch_modules"]) entries.push_back(e);
  for (const auto& e : entries)
    reqs.push_back({{"op", "trace_family"}, {"args", {{"spec", spec}, {"entry", e}}}, {"timeout_s", opts.timeout_s}});

  WorkerPoolOptions popts;
  popts.workers = opts.workers;
  popts.timeout_s = opts.timeout_s;
  WorkerPool pool(popts);
  ModelStatsSummary sum;
  json traces = json::array(), devices = json::object();
  Progress progress("model-stats", reqs.size());
  pool.run(reqs, [&](WorkerResult&& r) {
    std::string name = entry_name(entries[r.index]);
    if (r.outcome != Outcome::ok)
      sum.failed[name] = fmt::format("{}: {}", outcome_name(r.outcome), r.reason);
    else if (!r.reply.value("ok", false))
      sum.failed[name] = fmt::format("{}: {}", r.reply.value("error", ""), r.reply.value("message", "").substr(0, 300));
    else
      traces.push_back(r.reply["result"]), devices[name] = r.reply["result"]["device"];
    progress.tick(1, fmt::format("{} failed", sum.failed.size()));
  });
  progress.finish();
  // Completion order is not deterministic; the table must be.
  std::sort(traces.begin(), traces.end(), [](const json& a, const json& b) { return a["family"] < b["family"]; });
  sum.traced = static_cast<long>(traces.size());
  OPFORGE_CHECK(sum.traced > 0, "no family of {} could be traced; see the workers' log", families.string());
  json spec_info = {{"path", fs::relative(families, project_root()).string()}, {"xxh3", xxh3_hex(read_text(families))}};
  WorkerResult m = pool.call(
      {{"op", "merge_stats"}, {"args", {{"traces", traces}, {"provenance", provenance(spec_info, pool, sum, devices)}}}});
  OPFORGE_CHECK(m.outcome == Outcome::ok && m.reply.value("ok", false), "merging the family traces failed ({} {}: {})",
                outcome_name(m.outcome), m.reason, m.reply.value("message", ""));
  const json& table = m.reply["result"];
  sum.ops = static_cast<long>(table["ops"].size());
  sum.pairs = static_cast<long>(table["pairs"].size());
  sum.edges = static_cast<long>(table["edges"].size());
  write_atomically(out, table.dump(1) + "\n");
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace opforge::realism
