// Realism figures of a set of tasks (realism.h); the tracing is python/opforge/realism.py.
#include "realism.h"

#include <algorithm>

#include "opforge/core/error.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"

namespace opforge::realism {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Codes per request: tracing on meta takes milliseconds, the round trip is what costs.
constexpr std::size_t kBatch = 32;

json trace_request(const std::vector<std::string>& codes, std::size_t first, std::size_t n) {
  json batch = json::array();
  for (std::size_t i = first; i < first + n && i < codes.size(); ++i) batch.push_back(codes[i]);
  return {{"op", "realism_trace"}, {"args", {{"codes", batch}}}};
}

// A batch whose worker died (a task that crashes even on meta) is traced again one code per
// request, so only the code that crashes is lost, as an untraced task with the reason.
void retrace_alone(WorkerPool& pool, const std::vector<std::string>& codes, std::size_t first, json& traces) {
  for (std::size_t i = first; i < std::min(first + kBatch, codes.size()); ++i) {
    WorkerResult r = pool.call(trace_request(codes, i, 1));
    if (r.outcome == Outcome::ok && r.reply.value("ok", false))
      traces[i] = r.reply["result"][0];
    else
      traces[i] = {{"error", fmt::format("{}: {}", outcome_name(r.outcome), r.reason)}};
  }
}

}  // namespace

fs::path default_stats() { return data_dir() / "real_models" / "stats.json"; }

json measure(WorkerPool& pool, const std::vector<std::string>& codes, const fs::path& stats, const std::string& what) {
  OPFORGE_CHECK(fs::is_regular_file(stats), "the real-model table {} does not exist: regenerate it with `opforge "
                "model-stats` or pass --stats FILE", stats.string());
  std::vector<json> reqs;
  for (std::size_t first = 0; first < codes.size(); first += kBatch) reqs.push_back(trace_request(codes, first, kBatch));
  json traces = json::array();
  for (std::size_t i = 0; i < codes.size(); ++i) traces.push_back(nullptr);
  std::vector<std::size_t> crashed;
  Progress progress("realism of " + what, codes.size());
  pool.run(reqs, [&](WorkerResult&& r) {
    std::size_t first = r.index * kBatch;
    if (r.outcome != Outcome::ok) {
      crashed.push_back(first);
    } else {
      OPFORGE_CHECK(r.reply.value("ok", false), "tracing {} failed: {}: {}", what, r.reply.value("error", ""),
                    r.reply.value("message", ""));
      const json& res = r.reply["result"];
      for (std::size_t k = 0; k < res.size(); ++k) traces[first + k] = res[k];
    }
    progress.tick(std::min(kBatch, codes.size() - first));
  });
  progress.finish();
  for (std::size_t first : crashed) retrace_alone(pool, codes, first, traces);
  WorkerResult r = pool.call({{"op", "realism_figures"}, {"args", {{"traces", traces}, {"stats_path", stats.string()}}}});
  OPFORGE_CHECK(r.outcome == Outcome::ok && r.reply.value("ok", false), "computing the realism figures of {} failed "
                "({} {}: {})", what, outcome_name(r.outcome), r.reason, r.reply.value("message", ""));
  return r.reply["result"];
}

}  // namespace opforge::realism
