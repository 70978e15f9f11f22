#include "export.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <vector>

#include "opforge/core/error.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/worker_pool.h"

namespace opforge::exporter {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool table_exists(Db& db, const std::string& name) {
  auto st = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?");
  st.bind(1, name);
  return st.step();
}

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
  std::string device;
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
      std::string text;
      for (long i = s * opts.shard_size; i < std::min(n, (s + 1) * opts.shard_size); ++i) text += part[i]->row.dump() + "\n";
      std::string name = fmt::format("ops-{}-{:05d}-of-{:05d}.jsonl{}", split, s, n_shards, opts.gzip ? ".gz" : "");
      std::string bytes = opts.gzip ? gzip_bytes(text) : text;
      write_bytes(dir / name, bytes);
      files.push_back({{"file", name}, {"split", split}, {"records", std::min(n, (s + 1) * opts.shard_size) - s * opts.shard_size},
                       {"xxh3", xxh3_hex(bytes)}, {"bytes", bytes.size()}});
    }
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

ExportSummary export_dataset(Workspace& ws, const ExportOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  Db& db = ws.db();
  ExportSummary sum;
  OPFORGE_CHECK(opts.format == "jsonl" || opts.format == "kernelbench", "--format {} is unknown: use jsonl or kernelbench",
                opts.format);
  OPFORGE_CHECK(opts.shard_size > 0, "--shard-size must be positive");
  OPFORGE_CHECK(opts.test_fraction >= 0 && opts.test_fraction <= 1, "--test-fraction must be within [0, 1]");
  OPFORGE_CHECK(!opts.out.empty(), "--out is required: the folder the dataset is written to");

  // Only kept tasks are exported, and "kept" means nothing until dedup has seen every accepted task.
  OPFORGE_CHECK(table_exists(db, "filter_results") && table_exists(db, "tasks"),
                "workspace {} has no filter results: run `opforge filter` and then `opforge dedup` first",
                ws.root().string());
  long accepted = count(db, "SELECT count(*) FROM filter_results WHERE verdict = 'accepted'");
  OPFORGE_CHECK(accepted > 0, "workspace {} has no accepted task: run `opforge filter` and then `opforge dedup` first",
                ws.root().string());
  long undeduped = accepted;
  if (table_exists(db, "dedup_results"))
    undeduped = count(db,
                      "SELECT count(*) FROM filter_results f LEFT JOIN dedup_results d ON d.task_id = f.task_id "
                      "WHERE f.verdict = 'accepted' AND d.task_id IS NULL");
  OPFORGE_CHECK(undeduped == 0,
                "{} of {} accepted tasks in workspace {} have no dedup result: run `opforge dedup --workspace {}` "
                "first",
                undeduped, accepted, ws.root().string(), ws.root().string());

  // The records, in id order.
  std::vector<Record> recs;
  std::map<std::string, long> devices;
  std::string metrics_torch;
  {
    auto st = db.prepare(
        "SELECT t.id, t.source, t.backend, t.num_ops, t.ops, t.seed_ids, t.provenance, coalesce(f.code, t.code), "
        "f.ops, f.metrics, d.nearest_ref, d.ref_similarity, d.nearest_task, d.task_similarity, "
        "d.kernelbench_problem FROM dedup_results d JOIN tasks t ON t.id = d.task_id "
        "JOIN filter_results f ON f.task_id = t.id WHERE d.kept = 1 AND f.verdict = 'accepted' ORDER BY t.id");
    while (st.step()) {
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
      json decon = json::object();
      decon["nearest_ref"] = st.is_null(10) ? json(nullptr) : json(st.text(10));
      decon["ref_similarity"] = st.is_null(11) ? json(nullptr) : json(st.real(11));
      decon["nearest_task"] = st.is_null(12) ? json(nullptr) : json(st.text(12));
      decon["task_similarity"] = st.is_null(13) ? json(nullptr) : json(st.real(13));
      decon["kernelbench_problem"] = st.is_null(14) ? json(nullptr) : json(st.text(14));
      r.ref_sim = st.is_null(11) ? NAN : st.real(11);
      r.task_sim = st.is_null(13) ? NAN : st.real(13);
      if (metrics.is_object()) {
        if (auto it = metrics.find("eager_ms"); it != metrics.end() && it->is_number()) r.eager_ms = it->get<double>();
        if (auto it = metrics.find("device"); it != metrics.end() && it->is_string()) ++devices[it->get<std::string>()];
        if (auto it = metrics.find("torch"); it != metrics.end() && it->is_string() && metrics_torch.empty())
          metrics_torch = it->get<std::string>();
      }
      std::string split = split_of(r.id, opts.split_seed, opts.test_fraction);
      (split == "test" ? sum.test : sum.train)++;
      r.row = {{"id", r.id},
               {"ops", ops},
               {"data_source", data_source},
               {"code", st.text(7)},
               {"num_ops", num_ops},
               {"metrics", metrics},
               {"provenance", prov},
               {"decontamination", decon},
               {"split", split}};
      recs.push_back(std::move(r));
    }
  }
  sum.records = static_cast<long>(recs.size());

  const fs::path dir = staging_dir(opts.out);

  json files = opts.format == "jsonl" ? write_shards(dir, recs, opts) : write_kernelbench_files(dir, recs);
  sum.files = static_cast<long>(files.size());

  // Stats.
  json funnel;
  if (table_exists(db, "seeds")) {
    json seeds = json::object();
    auto st = db.prepare("SELECT status, count(*) FROM seeds GROUP BY status ORDER BY status");
    while (st.step()) seeds[st.text(0)] = st.int64(1);
    funnel["seeds"] = seeds;
  }
  {
    json cands = {{"total", 0}, {"by_backend", json::object()}};
    auto st = db.prepare("SELECT backend, count(*) FROM tasks GROUP BY backend ORDER BY backend");
    long total = 0;
    while (st.step()) {
      cands["by_backend"][st.text(0)] = st.int64(1);
      total += st.int64(1);
    }
    cands["total"] = total;
    funnel["candidates"] = cands;
    json filt = {{"accepted", accepted}, {"rejected", 0}, {"rejected_by_reason", json::object()}};
    auto fr = db.prepare(
        "SELECT coalesce(reason, 'unknown'), count(*) FROM filter_results WHERE verdict = 'rejected' GROUP BY 1 "
        "ORDER BY 1");
    long rejected = 0;
    while (fr.step()) {
      filt["rejected_by_reason"][fr.text(0)] = fr.int64(1);
      rejected += fr.int64(1);
    }
    filt["rejected"] = rejected;
    funnel["filter"] = filt;
    json dd = {{"kept", 0}, {"dropped", 0}, {"dropped_by_reason", json::object()}};
    auto dr = db.prepare(
        "SELECT kept, coalesce(reason, 'unknown'), count(*) FROM dedup_results GROUP BY 1, 2 ORDER BY 1, 2");
    long kept = 0, dropped = 0;
    while (dr.step()) {
      if (dr.int64(0)) {
        kept += dr.int64(2);
      } else {
        dd["dropped_by_reason"][dr.text(1)] = dr.int64(2);
        dropped += dr.int64(2);
      }
    }
    dd["kept"] = kept;
    dd["dropped"] = dropped;
    funnel["dedup"] = dd;
    funnel["exported"] = {{"records", sum.records}, {"train", sum.train}, {"test", sum.test}};
  }
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
  json stats = {{"funnel", funnel},
                {"op_frequency", op_frequency},
                {"ops_per_task", ops_per_task},
                {"eager_ms", histogram(eager, ms_edges, "metrics.eager_ms of exported tasks")},
                {"similarity",
                 {{"ref_similarity", histogram(refsim, sim_edges, "cosine to the nearest KernelBench reference")},
                  {"task_similarity", histogram(tasksim, sim_edges, "cosine to the nearest other accepted task")}}}};
  json stat_files = json::array();
  for (auto& [name, value] : stats.items()) {
    std::string bytes = pretty(value);
    write_bytes(dir / "stats" / (name + ".json"), bytes);
    stat_files.push_back({{"file", "stats/" + name + ".json"}, {"xxh3", xxh3_hex(bytes)}});
  }

  // Versions: what the seeds were crawled with, else what the filter ran under.
  json versions = {{"opforge", version()}};
  if (table_exists(db, "seeds")) {
    auto st = db.prepare("SELECT versions FROM seeds WHERE versions IS NOT NULL ORDER BY name LIMIT 1");
    if (st.step())
      if (json v = json::parse(st.text(0)); v.is_object())
        for (auto& [k, x] : v.items()) versions[k] = x;
  }
  if (!versions.contains("torch") && !metrics_torch.empty()) versions["torch"] = metrics_torch;
  json dedup_config = nullptr;
  if (table_exists(db, "dedup_config")) {
    auto st = db.prepare("SELECT config FROM dedup_config WHERE id = 1");
    if (st.step()) dedup_config = json::parse(st.text(0));
  }
  json manifest = {
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
        {"dedup", dedup_config}}},
      {"versions", versions},
      {"device", most_common(devices)},
      {"devices", devices},
  };
  write_bytes(dir / "manifest.json", pretty(manifest));

  if (opts.format == "jsonl") {
    std::string ext = opts.gzip ? ".jsonl.gz" : ".jsonl", data_files;
    // One entry per split that has records: a pattern matching no file would fail load_dataset.
    for (auto [split, n] : {std::pair{"train", sum.train}, std::pair{"test", sum.test}})
      if (n > 0 || (std::string(split) == "train" && sum.records == 0)) data_files += fmt::format("  - split: {}\n    path: \"ops-{}-*{}\"\n", split, split, ext);
    std::string card = fmt::format(
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
        "(nearest KernelBench reference and nearest other task, with cosines), `split`.\n"
        "`manifest.json` holds checksums, the export config and versions; `stats/` the funnel and histograms.\n",
        data_files, version(), sum.records, sum.train, sum.test, files.size(), most_common(devices));
    write_bytes(dir / "README.md", card);
  }

  if (opts.plots) {
    WorkerPoolOptions popts;
    popts.workers = 1;
    popts.log_file = ws.logs_dir() / "workers.log";
    WorkerPool pool(popts);
    auto r = pool.call({{"op", "plots"}, {"args", {{"stats", stats}, {"out_dir", (dir / "stats").string()}}}});
    OPFORGE_CHECK(r.outcome == Outcome::ok && r.reply.value("ok", false),
                  "drawing the stats plots failed ({} {}: {}); is matplotlib in the venv? pass --no-plots to skip them",
                  outcome_name(r.outcome), r.reason, r.reply.value("message", ""));
  }
  publish(dir, opts.out);
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

}  // namespace opforge::exporter
