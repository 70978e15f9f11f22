#include "export.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "opforge/core/error.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/files.h"
#include "opforge/core/worker_pool.h"
#include "evaluator.h"
#include "dedup.h"
#include "realism.h"

namespace opforge::exporter {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

long count(Db& db, const std::string& sql) {
  auto st = db.prepare(sql);
  return st.step() ? st.int64(0) : 0;
}

json parse_or(const Stmt& st, int col, json fallback) {
  if (st.is_null(col)) return fallback;
  return json::parse(st.text(col));
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  OPFORGE_CHECK(f.good(), "cannot write {}: check that --out is a writable folder", p.string());
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  OPFORGE_CHECK(f.good(), "writing {} failed (disk full?)", p.string());
}

// Pretty JSON with a final newline: the stats and the manifest are read by people too.
std::string pretty(const json& j) { return j.dump(2) + "\n"; }

struct Record {
  std::string id;
  json row;  // the exported object
  std::string source;
  double eager_ms = NAN, ref_sim = NAN, task_sim = NAN;
  std::string device, torch;  // from the filter's metrics
};

json histogram(const std::vector<double>& values, const std::vector<double>& edges, const std::string& what) {
  json bins = json::array();
  std::vector<long> n(edges.size() - 1, 0);
  long missing = 0, outside = 0;
  for (double v : values) {
    if (std::isnan(v)) {
      ++missing;
      continue;
    }
    auto it = std::upper_bound(edges.begin(), edges.end(), v);
    std::size_t b = static_cast<std::size_t>(it - edges.begin());
    // The last bin is closed: a cosine of exactly 1.0 belongs to [0.9, 1.0].
    if (b == edges.size() && v == edges.back()) b = edges.size() - 1;
    if (b == 0 || b == edges.size()) {
      ++outside;
      continue;
    }
    ++n[b - 1];
  }
  for (std::size_t b = 0; b + 1 < edges.size(); ++b)
    bins.push_back({{"from", edges[b]},
                    // Open-ended last bin: null rather than a huge number in the JSON.
                    {"to", edges[b + 1] == std::numeric_limits<double>::max() ? json(nullptr) : json(edges[b + 1])},
                    {"tasks", n[b]}});
  return {{"of", what}, {"bins", bins}, {"missing", missing}, {"outside", outside}};
}

std::string most_common(const std::map<std::string, long>& m) {
  std::string best;
  long n = -1;
  for (auto& [k, v] : m)  // map order: ties go to the smaller name
    if (v > n) best = k, n = v;
  return best;
}

}  // namespace

std::string split_of(const std::string& id, std::uint64_t split_seed, double test_fraction) {
  if (test_fraction <= 0) return "train";
  double u = static_cast<double>(xxh3_64(id, split_seed)) / 18446744073709551616.0;  // 2^64
  return u < test_fraction ? "test" : "train";
}

std::string kernelbench_name(const json& ops) {
  std::string name;
  if (ops.is_array())
    for (auto& op : ops) {
      if (!op.is_string()) continue;
      std::string s = op.get<std::string>();
      auto dot = s.rfind('.');
      if (dot != std::string::npos) s = s.substr(dot + 1);
      if (!name.empty()) name += '_';
      name += s;
    }
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  if (name.size() > 80) name.resize(80);
  return name.empty() ? "task" : name;
}

std::string gzip_bytes(const std::string& data) {
  z_stream zs{};
  // windowBits 15 + 16: a gzip wrapper; its header is set below so no mtime or name gets in.
  OPFORGE_CHECK(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK, "zlib deflateInit2 failed");
  gz_header h{};
  h.time = 0;
  h.os = 255;  // "unknown": the bytes do not depend on the machine that wrote them
  deflateSetHeader(&zs, &h);
  std::string out;
  out.resize(deflateBound(&zs, data.size()) + 64);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  int rc = deflate(&zs, Z_FINISH);
  deflateEnd(&zs);
  OPFORGE_CHECK(rc == Z_STREAM_END, "zlib deflate failed ({})", rc);
  out.resize(zs.total_out);
  return out;
}

namespace {

// The dataset is written into <out>.partial and swapped in whole at the end (publish), so a
// killed export leaves the previous dataset intact; --out must be empty, absent or an earlier
// export, because it is replaced as a whole.
fs::path staging_dir(const fs::path& out) {
  std::error_code ec;
  if (fs::exists(out)) {
    OPFORGE_CHECK(fs::is_directory(out), "--out {} is a file: give the folder the dataset goes to", out.string());
    OPFORGE_CHECK(fs::is_empty(out) || fs::exists(out / "manifest.json"),
                  "--out {} holds files that are not an opforge export (no manifest.json); an export replaces its "
                  "folder as a whole, so choose an empty or new folder",
                  out.string());
  }
  fs::path dir = out;
  dir += ".partial";
  fs::remove_all(dir, ec);  // a killed export's leftovers
  fs::create_directories(dir / "stats", ec);
  OPFORGE_CHECK(!ec, "cannot create {}: {} (choose a writable --out)", (dir / "stats").string(), ec.message());
  return dir;
}

void publish(const fs::path& dir, const fs::path& out) {
  fs::path old = out;
  old += ".previous";
  std::error_code ec;
  fs::remove_all(old, ec);
  if (fs::exists(out)) fs::rename(out, old);
  fs::rename(dir, out);
  fs::remove_all(old, ec);
}

json write_shards(const fs::path& dir, const std::vector<Record>& recs, const ExportOptions& opts) {
  json files = json::array();
  for (std::string split : {"train", "test"}) {
    std::vector<const Record*> part;
    for (auto& r : recs)
      if (r.row["split"] == split) part.push_back(&r);
    if (part.empty() && !(split == "train" && recs.empty())) continue;  // an empty dataset: one empty train shard
    long n = static_cast<long>(part.size()), n_shards = std::max<long>(1, (n + opts.shard_size - 1) / opts.shard_size);
    for (long s = 0; s < n_shards; ++s) {
      const long first = s * opts.shard_size, end = std::min(n, first + opts.shard_size);
      std::string text;
      for (long i = first; i < end; ++i) text += part[i]->row.dump() + "\n";
      std::string name = fmt::format("ops-{}-{:05d}-of-{:05d}.jsonl{}", split, s, n_shards, opts.gzip ? ".gz" : "");
      std::string bytes = opts.gzip ? gzip_bytes(text) : text;
      write_bytes(dir / name, bytes);
      files.push_back({{"file", name}, {"split", split}, {"records", end - first}, {"xxh3", xxh3_hex(bytes)},
                       {"bytes", bytes.size()}});
    }
  }
  return files;
}

// --format verl: <split>.parquet with the rows verl's RL dataset reads, written by
// python/opforge/verl_export.py (pyarrow) in the export's worker; checksummed here.
json write_verl_files(WorkerPool& pool, const fs::path& dir, const std::vector<Record>& recs) {
  json rows = json::array();
  for (auto& r : recs) rows.push_back(r.row);
  fs::create_directories(dir);
  WorkerResult res = pool.call({{"op", "write_verl"},
                                {"args", {{"records", rows}, {"out_dir", dir.string()}, {"data_dir", data_dir().string()}}}});
  OPFORGE_CHECK(res.outcome == Outcome::ok && res.reply.value("ok", false), "writing the verl parquet files failed "
                "({} {}: {}); is pyarrow in the venv?", outcome_name(res.outcome), res.reason,
                res.reply.value("message", ""));
  json files = res.reply["result"];
  for (auto& f : files) {
    std::string bytes = read_text(dir / f["file"].get<std::string>());
    f["xxh3"] = xxh3_hex(bytes);
    f["bytes"] = bytes.size();
  }
  return files;
}

json write_kernelbench_files(const fs::path& dir, const std::vector<Record>& recs) {
  json files = json::array();
  fs::create_directories(dir / "level_opforge");
  for (std::size_t i = 0; i < recs.size(); ++i) {
    std::string name = fmt::format("level_opforge/{}_{}.py", i + 1, kernelbench_name(recs[i].row["ops"]));
    const std::string& code = recs[i].row["code"].get_ref<const std::string&>();
    write_bytes(dir / name, code);
    files.push_back({{"file", name}, {"id", recs[i].id}, {"xxh3", xxh3_hex(code)}, {"bytes", code.size()}});
  }
  return files;
}

}  // namespace

namespace {

// Only kept tasks are exported, and "kept" means nothing until dedup has seen every accepted task.
// Returns the number of accepted tasks.
long check_deduped(Db& db, const Workspace& ws) {
  OPFORGE_CHECK(db.has_table("filter_results") && db.has_table("tasks"),
                "workspace {} has no filter results: run `opforge filter` and then `opforge dedup` first",
                ws.root().string());
  long accepted = count(db, "SELECT count(*) FROM filter_results WHERE verdict = 'accepted'");
  OPFORGE_CHECK(accepted > 0, "workspace {} has no accepted task: run `opforge filter` and then `opforge dedup` first",
                ws.root().string());
  long undeduped = accepted;
  if (db.has_table("dedup_results"))
    undeduped = count(db,
                      "SELECT count(*) FROM filter_results f LEFT JOIN dedup_results d ON d.task_id = f.task_id "
                      "WHERE f.verdict = 'accepted' AND d.task_id IS NULL");
  OPFORGE_CHECK(undeduped == 0,
                "{} of {} accepted tasks in workspace {} have no dedup result: run `opforge dedup --workspace {}` "
                "first",
                undeduped, accepted, ws.root().string(), ws.root().string());
  return accepted;
}

json nullable_text(const Stmt& st, int col) { return st.is_null(col) ? json(nullptr) : json(st.text(col)); }
json nullable_real(const Stmt& st, int col) { return st.is_null(col) ? json(nullptr) : json(st.real(col)); }

constexpr const char* kRecordsSql =
    "SELECT t.id, t.source, t.backend, t.num_ops, t.ops, t.seed_ids, t.provenance, coalesce(f.code, t.code), "
    "f.ops, f.metrics, d.nearest_ref, d.ref_similarity, d.nearest_task, d.task_similarity, "
    "d.kernelbench_problem FROM dedup_results d JOIN tasks t ON t.id = d.task_id "
    "JOIN filter_results f ON f.task_id = t.id WHERE d.kept = 1 AND f.verdict = 'accepted' ORDER BY t.id";

// A record's op signature: its traced ops in dedup's token vocabulary (aliases merged, layout-only
// ops left out). The split goes by its hash, so tasks computing one op sequence, which is what a
// renamed or resized near copy keeps, are never on both sides.
std::string signature_of(const json& ops, const json& table) {
  std::string sig;
  for (auto& t : dedup::op_tokens(ops, table)) sig += (sig.empty() ? "" : " ") + t;
  return sig;
}

// One exported record from a row of kRecordsSql.
Record record_of(const Stmt& st, const ExportOptions& opts, const json& table) {
  Record r;
  r.id = st.text(0);
  r.source = st.text(1);
  json ops = parse_or(st, 8, json::parse(st.text(4)));
  long num_ops = st.int64(3) > 0 ? st.int64(3) : static_cast<long>(ops.size());
  std::string data_source;
  if (r.source == "transformers") data_source = "transformers#1";
  else if (r.source == "imported") data_source = fmt::format("imported#{}", ops.size());
  else data_source = fmt::format("{}#{}", r.source, num_ops);
  json prov = parse_or(st, 6, json::object());
  if (!prov.is_object()) prov = json{{"value", prov}};
  prov["seed_ids"] = json::parse(st.text(5));
  prov["backend"] = st.text(2);
  json metrics = parse_or(st, 9, json::object());
  json decon = {{"nearest_ref", nullable_text(st, 10)}, {"ref_similarity", nullable_real(st, 11)},
                {"nearest_task", nullable_text(st, 12)}, {"task_similarity", nullable_real(st, 13)},
                {"kernelbench_problem", nullable_text(st, 14)},
                // A train record's nearest train record is itself (cosine 1); nearest_train() sets
                // the test records'. Never null: `datasets` takes one schema from the first shard.
                {"nearest_train", st.text(0)}, {"train_similarity", 1.0}};
  r.ref_sim = st.is_null(11) ? NAN : st.real(11);
  r.task_sim = st.is_null(13) ? NAN : st.real(13);
  if (metrics.is_object()) {
    if (auto it = metrics.find("eager_ms"); it != metrics.end() && it->is_number()) r.eager_ms = it->get<double>();
    if (auto it = metrics.find("device"); it != metrics.end() && it->is_string()) r.device = it->get<std::string>();
    if (auto it = metrics.find("torch"); it != metrics.end() && it->is_string()) r.torch = it->get<std::string>();
  }
  std::string sig = signature_of(ops, table);
  r.row = {{"id", r.id},         {"ops", ops},           {"data_source", data_source},
           {"code", st.text(7)}, {"num_ops", num_ops},   {"metrics", metrics},
           {"provenance", prov}, {"decontamination", decon},
           {"split", split_of(sig, opts.split_seed, opts.test_fraction)}, {"split_cluster", xxh3_hex(sig)}};
  return r;
}

// Kept tasks in id order; counts the splits into sum.
std::vector<Record> load_records(Db& db, const ExportOptions& opts, ExportSummary& sum) {
  std::vector<Record> recs;
  json table = json::parse(read_text(data_dir() / "kernelbench_ops.json"));
  auto st = db.prepare(kRecordsSql);
  while (st.step()) {
    recs.push_back(record_of(st, opts, table));
    (recs.back().row["split"] == "test" ? sum.test : sum.train)++;
  }
  sum.records = static_cast<long>(recs.size());
  return recs;
}

// {"<key column>": count} of a GROUP BY query, and their total.
std::pair<json, long> counts(Db& db, const std::string& sql) {
  json out = json::object();
  long total = 0;
  auto st = db.prepare(sql);
  while (st.step()) {
    out[st.text(0)] = st.int64(1);
    total += st.int64(1);
  }
  return {out, total};
}

json funnel_of(Db& db, long accepted, const ExportSummary& sum) {
  json funnel;
  if (db.has_table("seeds"))
    funnel["seeds"] = counts(db, "SELECT status, count(*) FROM seeds GROUP BY status ORDER BY status").first;
  auto [backends, candidates] = counts(db, "SELECT backend, count(*) FROM tasks GROUP BY backend ORDER BY backend");
  funnel["candidates"] = {{"total", candidates}, {"by_backend", backends}};
  auto [rejections, rejected] = counts(db,
                                       "SELECT coalesce(reason, 'unknown'), count(*) FROM filter_results WHERE "
                                       "verdict = 'rejected' GROUP BY 1 ORDER BY 1");
  funnel["filter"] = {{"accepted", accepted}, {"rejected", rejected}, {"rejected_by_reason", rejections}};
  auto [drops, dropped] = counts(db,
                                 "SELECT coalesce(reason, 'unknown'), count(*) FROM dedup_results WHERE kept = 0 "
                                 "GROUP BY 1 ORDER BY 1");
  long kept = count(db, "SELECT count(*) FROM dedup_results WHERE kept = 1");
  funnel["dedup"] = {{"kept", kept}, {"dropped", dropped}, {"dropped_by_reason", drops}};
  funnel["exported"] = {{"records", sum.records}, {"train", sum.train}, {"test", sum.test}};
  // Over every candidate drawn, a composition that failed included: what a draw yields.
  json failed = json::object();
  long failures = 0;
  if (db.has_table("compose_failures"))
    std::tie(failed, failures) = counts(db, "SELECT reason, count(*) FROM compose_failures GROUP BY 1 ORDER BY 1");
  long drawn = candidates + failures;
  auto share = [&](long n) { return drawn > 0 ? json(static_cast<double>(n) / static_cast<double>(drawn)) : json(nullptr); };
  funnel["drawn"] = {{"total", drawn}, {"compose_failed", failures}, {"compose_failed_by_reason", failed},
                     {"accepted_over_drawn", share(accepted)}, {"kept_over_drawn", share(kept)}};
  return funnel;
}

json stats_of(const std::vector<Record>& recs, json funnel) {
  std::map<std::string, long> op_freq;
  std::map<long, long> per_task;
  std::vector<double> eager, refsim, tasksim;
  for (auto& r : recs) {
    for (auto& op : r.row["ops"])
      if (op.is_string()) ++op_freq[op.get<std::string>()];
    ++per_task[r.row["ops"].size()];
    eager.push_back(r.eager_ms);
    refsim.push_back(r.ref_sim);
    tasksim.push_back(r.task_sim);
  }
  std::vector<std::pair<std::string, long>> freq(op_freq.begin(), op_freq.end());
  std::stable_sort(freq.begin(), freq.end(), [](auto& a, auto& b) { return a.second > b.second; });
  json op_frequency = json::array();
  for (auto& [op, n] : freq) op_frequency.push_back({{"op", op}, {"tasks", n}});
  json ops_per_task = json::array();
  for (auto& [k, n] : per_task) ops_per_task.push_back({{"num_ops", k}, {"tasks", n}});
  // Log-spaced: the filter's window is 1-100 ms by default, and timings spread multiplicatively.
  const std::vector<double> ms_edges = {0, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000,
                                        std::numeric_limits<double>::max()};
  std::vector<double> sim_edges;
  for (int b = 0; b <= 10; ++b) sim_edges.push_back(b / 10.0);
  return {{"funnel", std::move(funnel)},
          {"op_frequency", op_frequency},
          {"ops_per_task", ops_per_task},
          {"eager_ms", histogram(eager, ms_edges, "metrics.eager_ms of exported tasks")},
          {"similarity",
           {{"ref_similarity", histogram(refsim, sim_edges, "cosine to the nearest KernelBench reference")},
            {"task_similarity", histogram(tasksim, sim_edges, "cosine to the nearest other accepted task")}}}};
}

json write_stats(const fs::path& dir, const json& stats) {
  json stat_files = json::array();
  for (auto& [name, value] : stats.items()) {
    std::string bytes = pretty(value);
    write_bytes(dir / "stats" / (name + ".json"), bytes);
    stat_files.push_back({{"file", "stats/" + name + ".json"}, {"xxh3", xxh3_hex(bytes)}});
  }
  return stat_files;
}

// Versions: what the seeds were crawled with, else what the filter ran under.
json versions_of(Db& db, const std::vector<Record>& recs) {
  json versions = {{"opforge", version()}};
  if (db.has_table("seeds")) {
    auto st = db.prepare("SELECT versions FROM seeds WHERE versions IS NOT NULL ORDER BY name LIMIT 1");
    if (st.step())
      if (json v = json::parse(st.text(0)); v.is_object())
        for (auto& [k, x] : v.items()) versions[k] = x;
  }
  for (auto& r : recs)
    if (!versions.contains("torch") && !r.torch.empty()) versions["torch"] = r.torch;
  return versions;
}

json dedup_config_of(Db& db) {
  if (!db.has_table("dedup_config")) return nullptr;
  auto st = db.prepare("SELECT config FROM dedup_config WHERE id = 1");
  return st.step() ? json::parse(st.text(0)) : json(nullptr);
}

// The filter configurations the exported records were judged under, with their record counts.
json filter_configs_of(Db& db, const std::vector<Record>& recs) {
  if (!db.has_table("filter_configs")) return nullptr;
  std::map<std::string, long> used;
  auto st = db.prepare("SELECT coalesce(config, 'unrecorded') FROM filter_results WHERE task_id = ?");
  for (auto& r : recs) {
    st.reset();
    st.bind(1, r.id);
    if (st.step()) ++used[st.text(0)];
  }
  json out = json::object();
  auto cfg = db.prepare("SELECT config FROM filter_configs WHERE hash = ?");
  for (auto& [hash, n] : used) {
    cfg.reset();
    cfg.bind(1, hash);
    out[hash] = {{"records", n}, {"config", cfg.step() ? json::parse(cfg.text(0)) : json(nullptr)}};
  }
  return out;
}

std::map<std::string, long> devices_of(const std::vector<Record>& recs) {
  std::map<std::string, long> devices;
  for (auto& r : recs)
    if (!r.device.empty()) ++devices[r.device];
  return devices;
}

json manifest_of(Db& db, const std::vector<Record>& recs, const ExportOptions& opts, const ExportSummary& sum,
                 const json& files, const json& stat_files) {
  auto devices = devices_of(recs);
  return {
      {"records", sum.records},
      {"splits", {{"train", sum.train}, {"test", sum.test}}},
      {opts.format == "jsonl" ? "shards" : "files", files},
      {"stats", stat_files},
      {"config",
       {{"format", opts.format},
        {"shard_size", opts.shard_size},
        {"gzip", opts.gzip},
        {"split_seed", opts.split_seed},
        {"test_fraction", opts.test_fraction},
        {"dedup", dedup_config_of(db)},
        {"filter", filter_configs_of(db, recs)}}},
      {"versions", versions_of(db, recs)},
      {"device", most_common(devices)},
      {"devices", devices},
  };
}

// The dataset card: YAML configs Hugging Face `datasets` reads, then a short description.
// The card's realism lines: the corpus's figures, each reference's beside them.
std::string realism_lines(const json& stats) {
  if (!stats.contains("realism")) return "";
  auto pct = [](const json& v) { return v.is_null() ? std::string("-") : fmt::format("{:.1f}%", v.get<double>()); };
  auto row = [&](const std::string& name, const json& f) {
    return fmt::format("| {} | {} | {} | {} | {} | {} |\n", name, f["tasks"].get<long>(), pct(f["heavy_share"]),
                       pct(f["vocab_share"]), pct(f["pair_share"]), f["untraced"].get<long>());
  };
  const json& r = stats["realism"];
  std::string out =
      "\n## How much it looks like real models\n\n"
      "Traced on the meta device against the real-model table (`data/real_models/stats.json`): the share of multi-op\n"
      "tasks with a GEMM, convolution or attention, of op occurrences real models use, and of adjacent op pairs\n"
      "real models contain (opforge's docs/realism.md).\n\n"
      "| tasks | count | heavy | vocabulary | pairs | untraced |\n| --- | --- | --- | --- | --- | --- |\n";
  out += row("this dataset", r["corpus"]);
  for (auto& [name, f] : r["references"].items()) out += row(name, f);
  return out;
}

std::string card_of(const ExportOptions& opts, const ExportSummary& sum, const json& manifest, const json& stats) {
  std::string ext = opts.gzip ? ".jsonl.gz" : ".jsonl", data_files;
  // One entry per split that has records: a pattern matching no file would fail load_dataset.
  for (auto [split, n] : {std::pair{"train", sum.train}, std::pair{"test", sum.test}})
    if (n > 0 || (std::string(split) == "train" && sum.records == 0))
      data_files += fmt::format("  - split: {}\n    path: \"ops-{}-*{}\"\n", split, split, ext);
  return fmt::format(
      "---\n"
      "configs:\n"
      "- config_name: default\n"
      "  data_files:\n"
      "{}"
      "tags:\n"
      "- code\n"
      "- cuda\n"
      "- kernelbench\n"
      "---\n\n"
      "# opforge operator tasks\n\n"
      "GPU-kernel training tasks in KernelBench format (`class Model(nn.Module)`, `get_inputs()`,\n"
      "`get_init_inputs()`), built by opforge {}: crawled torch/transformers operators, fused, kept\n"
      "only when eager and `torch.compile` agree, deterministic and timed, then deduplicated and\n"
      "decontaminated against KernelBench.\n\n"
      "- records: {} ({} train, {} test: shards `ops-train-*` and `ops-test-*`, the dataset's two splits)\n"
      "- shards: {}\n"
      "- device of the timings: {}\n\n"
      "Fields: `ops` (traced operators), `data_source` (`torch#K`, `transformers#1`, `imported#K`), `code`,\n"
      "`id`, `num_ops`, `metrics` (eager and compile times, speed-up, ...), `provenance`, `decontamination`\n"
      "(nearest KernelBench reference and nearest other task, with cosines; for a test record its nearest train\n"
      "record, `nearest_train` and `train_similarity`, which for a train record are itself and 1), `split`,\n"
      "`split_cluster`.\n\n"
      "The splits are drawn by op-signature cluster (the hash of a record's op sequence, aliases merged), not by\n"
      "record: tasks that compute the same op sequence, as a renamed or resized near copy does, are on one side.\n\n"
      "License and attribution: tasks are derived from PyTorch (BSD-3-Clause) operators and from modules of\n"
      "Hugging Face transformers (Apache-2.0); KernelBench look-alikes were removed, and no KernelBench code is included.\n"
      "`manifest.json` holds checksums, the export config and versions; `stats/` the funnel and histograms.\n"
      "{}",
      data_files, version(), sum.records, sum.train, sum.test, manifest["shards"].size(),
      manifest["device"].get<std::string>(), realism_lines(stats));
}

// Each test record's nearest train record and their cosine, by dedup's structural vectors
// (dedup::hashed_vector over python/opforge/features.py's tokens): what a reader of the test
// split checks to see that it does not leak.
void nearest_train(WorkerPool& pool, std::vector<Record>& recs) {
  std::vector<std::size_t> train, test;
  for (std::size_t i = 0; i < recs.size(); ++i) (recs[i].row["split"] == "test" ? test : train).push_back(i);
  if (test.empty() || train.empty()) return;
  json items = json::array();
  for (auto& r : recs) items.push_back({{"code", r.row["code"]}, {"ops", r.row["ops"]}});
  WorkerResult res = pool.call({{"op", "features"}, {"args", {{"items", items}}}});
  OPFORGE_CHECK(res.outcome == Outcome::ok && res.reply.value("ok", false), "features of the exported records failed "
                "({} {}: {})", outcome_name(res.outcome), res.reason, res.reply.value("message", ""));
  dedup::DedupOptions d;
  std::vector<std::vector<float>> vec;
  for (auto& f : res.reply["result"]) vec.push_back(dedup::hashed_vector(f["tokens"], d.dims, d.ops_weight));
  for (std::size_t t : test) {
    std::size_t best = train.front();
    double best_cos = -2;
    for (std::size_t j : train) {
      double c = 0;
      for (std::size_t k = 0; k < vec[t].size(); ++k) c += static_cast<double>(vec[t][k]) * vec[j][k];
      if (c > best_cos) best = j, best_cos = c;
    }
    recs[t].row["decontamination"]["nearest_train"] = recs[best].id;
    recs[t].row["decontamination"]["train_similarity"] = std::round(best_cos * 1e4) / 1e4;
  }
}

// One worker for the realism traces, the test split's nearest train records and the plots,
// started only when one of them is wanted.
std::unique_ptr<WorkerPool> worker_for(const Workspace& ws, const ExportOptions& opts, const ExportSummary& sum) {
  if (!opts.plots && !opts.realism && sum.test == 0 && opts.format != "verl") return nullptr;
  WorkerPoolOptions popts;
  popts.workers = 1;
  popts.log_file = ws.logs_dir() / "workers.log";
  return std::make_unique<WorkerPool>(popts);
}

// stats/realism.json: the corpus's figures and each reference folder's, against one table.
json realism_of(WorkerPool& pool, const std::vector<Record>& recs, const ExportOptions& opts) {
  fs::path table = realism::default_stats();
  std::vector<std::string> codes;
  for (auto& r : recs) codes.push_back(r.row["code"]);
  json out = {{"table", {{"path", fs::relative(table, project_root()).string()}, {"xxh3", xxh3_hex(read_text(table))}}},
              {"corpus", realism::measure(pool, codes, table, "the exported records")},
              {"references", json::object()}};
  for (auto& ref : opts.realism_references) {
    std::vector<std::string> ref_codes;
    for (auto& t : evaluator::load_tasks(ref)) ref_codes.push_back(std::move(t.code));
    out["references"][ref.string()] = realism::measure(pool, ref_codes, table, ref.string());
  }
  return out;
}

void draw_plots(WorkerPool& pool, const json& stats, const fs::path& dir) {
  auto r = pool.call({{"op", "plots"}, {"args", {{"stats", stats}, {"out_dir", (dir / "stats").string()}}}});
  OPFORGE_CHECK(r.outcome == Outcome::ok && r.reply.value("ok", false),
                "drawing the stats plots failed ({} {}: {}); is matplotlib in the venv? pass --no-plots to skip them",
                outcome_name(r.outcome), r.reason, r.reply.value("message", ""));
}

}  // namespace

ExportSummary export_dataset(Workspace& ws, const ExportOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  Db& db = ws.db();
  ExportSummary sum;
  OPFORGE_CHECK(opts.format == "jsonl" || opts.format == "kernelbench" || opts.format == "verl",
                "--format {} is unknown: use jsonl, kernelbench or verl", opts.format);
  OPFORGE_CHECK(opts.shard_size > 0, "--shard-size must be positive");
  OPFORGE_CHECK(opts.test_fraction >= 0 && opts.test_fraction <= 1, "--test-fraction must be within [0, 1]");
  OPFORGE_CHECK(!opts.out.empty(), "--out is required: the folder the dataset is written to");
  long accepted = check_deduped(db, ws);
  std::vector<Record> recs = load_records(db, opts, sum);
  auto pool = worker_for(ws, opts, sum);
  if (sum.test > 0) nearest_train(*pool, recs);

  const fs::path dir = staging_dir(opts.out);
  json files = opts.format == "jsonl"   ? write_shards(dir, recs, opts)
               : opts.format == "verl" ? write_verl_files(*pool, dir, recs)
                                       : write_kernelbench_files(dir, recs);
  sum.files = static_cast<long>(files.size());
  json stats = stats_of(recs, funnel_of(db, accepted, sum));
  if (opts.realism) stats["realism"] = realism_of(*pool, recs, opts);
  json manifest = manifest_of(db, recs, opts, sum, files, write_stats(dir, stats));
  write_bytes(dir / "manifest.json", pretty(manifest));
  if (opts.format == "jsonl") write_bytes(dir / "README.md", card_of(opts, sum, manifest, stats));
  if (opts.plots) draw_plots(*pool, stats, dir);
  publish(dir, opts.out);
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace opforge::exporter
