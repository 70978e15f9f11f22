#include "dedup.h"
#include "index.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>  // before faiss: its headers use uint8_t without including it (faiss 1.7.3)
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

#include <faiss/IndexFlat.h>

#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"
#include "opforge/core/tasks.h"
#include "opforge/core/worker_pool.h"

namespace opforge::dedup {

using nlohmann::json;
using idx_t = faiss::Index::idx_t;

void migrate(Db& db) {
  tasks::migrate(db);
  db.migrate("dedup", {R"sql(
CREATE TABLE dedup_results (
  task_id          TEXT PRIMARY KEY REFERENCES tasks(id),
  kept             INTEGER NOT NULL CHECK (kept IN (0, 1)),
  reason           TEXT,     -- a fixed code (docs/reasons.md) when dropped
  duplicate_of     TEXT,     -- exact_duplicate / near_duplicate: the kept task it repeats
  nearest_ref      TEXT,     -- the most similar reference file, relative to its --reference folder
  ref_similarity   REAL,     -- cosine to nearest_ref (NULL without --reference)
  nearest_task     TEXT,     -- the most similar other accepted task
  task_similarity  REAL,
  kernelbench_problem TEXT,  -- kernelbench_ops: the level-2 problem whose op sequence it spells
  normal_hash      TEXT NOT NULL,  -- xxh3 of the normal form (python/opforge/features.py)
  op_sequence      TEXT            -- JSON list: the ops in KernelBench's vocabulary
);
CREATE INDEX dedup_results_kept ON dedup_results(kept, reason);
-- The options of the run that wrote dedup_results (one row), so export can state the thresholds.
CREATE TABLE dedup_config (
  id     INTEGER PRIMARY KEY CHECK (id = 1),
  config TEXT NOT NULL
);
)sql"});
}

namespace {

struct Item {
  std::string id;      // task id, or the reference's relative path
  std::string code;
  json ops;            // traced ops, or null
};

struct Features {
  std::uint64_t normal_hash = 0;
  json tokens, ops;
};

// Features of every item, computed in the worker pool in batches (python/opforge/features.py).
std::vector<Features> compute_features(WorkerPool& pool, const std::vector<Item>& items, const std::string& what) {
  constexpr std::size_t kBatch = 256;
  std::vector<json> reqs;
  for (std::size_t b = 0; b < items.size(); b += kBatch) {
    json batch = json::array();
    for (std::size_t i = b; i < std::min(items.size(), b + kBatch); ++i)
      batch.push_back({{"code", items[i].code}, {"ops", items[i].ops}});
    reqs.push_back({{"op", "features"}, {"args", {{"items", batch}}}});
  }
  std::vector<Features> out(items.size());
  Progress progress("features of " + what, items.size());
  pool.run(reqs, [&](WorkerResult&& r) {
    std::size_t first = r.index * kBatch;
    // Features are pure ast: a failure here is a broken installation, not a bad task.
    OPFORGE_CHECK(r.outcome == Outcome::ok, "computing features of {} failed ({}: {}); see the workers' log", what,
                  outcome_name(r.outcome), r.reason);
    OPFORGE_CHECK(r.reply.value("ok", false), "computing features of {} (item {}, {}) failed: {}: {}", what, first,
                  items[first].id, r.reply.value("error", ""), r.reply.value("message", ""));
    const json& res = r.reply["result"];
    for (std::size_t k = 0; k < res.size(); ++k) {
      Features& f = out[first + k];
      f.normal_hash = xxh3_64(res[k]["normal"].get<std::string>());
      f.tokens = res[k]["tokens"];
      f.ops = res[k]["ops"];
    }
    progress.tick(res.size());
  });
  progress.finish();
  return out;
}

std::vector<float> matrix(const std::vector<Features>& fs, int dims, double ops_weight) {
  std::vector<float> m(fs.size() * static_cast<std::size_t>(dims));
  for (std::size_t i = 0; i < fs.size(); ++i) {
    auto v = hashed_vector(fs[i].tokens, dims, ops_weight);
    std::copy(v.begin(), v.end(), m.begin() + static_cast<std::ptrdiff_t>(i * dims));
  }
  return m;
}

std::vector<Item> load_references(const std::vector<std::filesystem::path>& dirs) {
  std::vector<Item> refs;
  for (auto& dir : dirs) {
    OPFORGE_CHECK(std::filesystem::is_directory(dir),
                  "--reference {} is not a folder: give a folder of KernelBench-format .py files (e.g. a KernelBench "
                  "checkout's KernelBench/ folder)",
                  dir.string());
    auto files = python_files_under(dir);
    if (files.empty()) spdlog::warn("--reference {} holds no .py file", dir.string());
    for (auto& f : files) refs.push_back({std::filesystem::relative(f, dir).string(), read_text(f), nullptr});
  }
  return refs;
}

}  // namespace

std::vector<float> hashed_vector(const json& tokens, int dims, double ops_weight) {
  std::vector<double> ast(dims, 0.0), ops(dims, 0.0);
  // Each token lands in kHashes (dimension, sign) places, one per xxh3 seed: with one place, two
  // single-op tasks whose op tokens collide (1 in 2*dims) looked like duplicates (cosine 0.97
  // between torch.fft.hfftn and torch.unique_consecutive in bench/dedup_similarity.sh).
  constexpr int kHashes = 4;
  for (auto& [tok, count] : tokens.items()) {
    double w = 1.0 + std::log(std::max(1.0, count.get<double>()));
    auto& v = tok.rfind("op:", 0) == 0 ? ops : ast;
    for (int k = 0; k < kHashes; ++k) {
      std::uint64_t h = xxh3_64(tok, static_cast<std::uint64_t>(k));
      v[h % static_cast<std::uint64_t>(dims)] += (h >> 63) ? -w : w;
    }
  }
  auto norm = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s);
  };
  double na = norm(ast), no = norm(ops);
  // Without op tokens (code that does not parse into a Model) the AST part is all there is.
  double wa = no > 0 ? std::sqrt(1.0 - ops_weight) : 1.0, wo = na > 0 ? std::sqrt(ops_weight) : 1.0;
  std::vector<float> out(dims, 0.f);
  for (int i = 0; i < dims; ++i)
    out[i] = static_cast<float>((na > 0 ? wa * ast[i] / na : 0.0) + (no > 0 ? wo * ops[i] / no : 0.0));
  double n = 0;
  for (float x : out) n += static_cast<double>(x) * x;
  if (n > 0)
    for (float& x : out) x = static_cast<float>(x / std::sqrt(n));
  return out;
}

std::vector<std::string> op_tokens(const json& ops, const json& table) {
  std::vector<std::string> out;
  if (!ops.is_array()) return out;
  for (auto& op : ops) {
    std::string name = op.get<std::string>();
    for (auto& p : table["op_prefixes"]) {
      const std::string& prefix = p.get_ref<const std::string&>();
      if (name.rfind(prefix, 0) == 0) {
        name = name.substr(prefix.size());
        break;
      }
    }
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    auto it = table["op_tokens"].find(name);
    if (it == table["op_tokens"].end()) {
      out.push_back(name);  // unknown to the table: its own token, so it cannot match by accident
    } else if (!it->is_null()) {
      out.push_back(it->get<std::string>());
    }  // null: layout-only, not part of a spelled sequence
  }
  return out;
}

KernelBenchOps::KernelBenchOps(const json& table) {
  // Held in locals: a range-for over items() of a temporary would outlive the temporary.
  const json level2 = table.value("level2", json::object()), level1 = table.value("level1", json::object());
  for (auto& [name, seq] : level2.items()) level2_.emplace_back(name, seq.get<std::vector<std::string>>());
  for (auto& [name, token] : level1.items())
    if (token.is_string()) level1_.emplace(token.get<std::string>(), name);  // the first name of each op
}

namespace {

// Whether `needle` occurs in `hay` in order, other tokens allowed in between.
bool ordered_subsequence(const std::vector<std::string>& needle, const std::vector<std::string>& hay) {
  std::size_t k = 0;
  for (const auto& t : hay)
    if (k < needle.size() && t == needle[k]) ++k;
  return k == needle.size();
}

}  // namespace

std::optional<std::pair<std::string, std::string>> KernelBenchOps::match(const std::vector<std::string>& seq) const {
  if (seq.size() == 1)
    if (auto it = level1_.find(seq[0]); it != level1_.end()) return std::pair{"kernelbench_level1", it->second};
  // The shortest level-2 sequence wins a tie of several, then the first name: stable across runs.
  const std::pair<std::string, std::vector<std::string>>* best = nullptr;
  for (const auto& p : level2_)
    if (!p.second.empty() && ordered_subsequence(p.second, seq) && (!best || p.second.size() < best->second.size()))
      best = &p;
  if (best) return std::pair{"kernelbench_ops", best->first};
  return std::nullopt;
}

namespace {

// data/kernelbench_ops.json: how KernelBench's problems spell their ops (null with --no-kernelbench-names).
json kernelbench_table(const DedupOptions& opts) {
  if (!opts.kernelbench_names) return nullptr;
  auto path = data_dir() / "kernelbench_ops.json";
  OPFORGE_CHECK(std::filesystem::exists(path),
                "{} is missing (regenerate it with data/tools/kernelbench_ops.py, or pass --no-kernelbench-names)",
                path.string());
  return with_context("while reading " + path.string(), [&] { return json::parse(read_text(path)); });
}

std::vector<Item> load_accepted(Db& db) {
  std::vector<Item> items;
  if (!db.has_table("filter_results")) return items;
  auto st = db.prepare(
      "SELECT t.id, coalesce(f.code, t.code), f.ops FROM tasks t JOIN filter_results f ON f.task_id = t.id "
      "WHERE f.verdict = 'accepted' ORDER BY t.id");
  while (st.step()) items.push_back({st.text(0), st.text(1), st.is_null(2) ? json(nullptr) : json::parse(st.text(2))});
  return items;
}

// Exact duplicates: the first task (smallest id) of each normal form stands for the others.
struct ExactGroups {
  std::vector<long> exact_of;  // per task: the position of its first twin, or -1
  std::vector<idx_t> uniq;     // task positions of first occurrences
};

ExactGroups exact_groups(const std::vector<Features>& tfeat) {
  ExactGroups g{std::vector<long>(tfeat.size(), -1), {}};
  std::unordered_map<std::uint64_t, std::size_t> first;
  for (std::size_t i = 0; i < tfeat.size(); ++i) {
    auto [it, fresh] = first.emplace(tfeat[i].normal_hash, i);
    if (fresh) g.uniq.push_back(static_cast<idx_t>(i));
    else g.exact_of[i] = static_cast<long>(it->second);
  }
  return g;
}

// Each task's k most similar distinct normal forms (k = kNeighbours, or fewer forms).
struct Neighbours {
  int k = 0;
  std::vector<float> sim;     // n x k cosines, most similar first
  std::vector<idx_t> label;   // n x k positions in ExactGroups::uniq, -1 where none
};

// Near duplicates and each task's nearest other task, from one top-k search over the distinct
// normal forms (exact up to exact_up_to of them, index.h): the kNeighbours most similar, of
// which those at or above within_threshold are near duplicates. A task has more than a few
// such only inside a cluster of copies, and then the cluster's kept first member is among the
// closest; one search instead of a range search plus a top-2 halves the time at scale.
Neighbours search_tasks(const std::vector<float>& tx, const std::vector<idx_t>& uniq, int d, long exact_up_to) {
  constexpr int kNeighbours = 16;
  const std::size_t n = tx.size() / static_cast<std::size_t>(d);
  std::vector<float> ux(uniq.size() * static_cast<std::size_t>(d));
  for (std::size_t k = 0; k < uniq.size(); ++k)
    std::copy_n(tx.begin() + uniq[k] * d, d, ux.begin() + static_cast<std::ptrdiff_t>(k * d));
  auto index = make_index(d, static_cast<long>(uniq.size()), ux.data(), exact_up_to);
  Neighbours nb;
  nb.k = std::min<int>(kNeighbours, static_cast<int>(uniq.size()));
  nb.sim.resize(n * nb.k);
  nb.label.resize(n * nb.k);
  index->search(static_cast<idx_t>(n), tx.data(), nb.k, nb.sim.data(), nb.label.data());
  return nb;
}

// Every task's nearest reference (label -1 and similarity 0 without references).
std::pair<std::vector<float>, std::vector<idx_t>> nearest_references(const std::vector<float>& tx,
                                                                     const std::vector<Features>& rfeat,
                                                                     const DedupOptions& opts) {
  const std::size_t n = tx.size() / static_cast<std::size_t>(opts.dims);
  std::vector<float> rd(n, 0.f);
  std::vector<idx_t> rl(n, -1);
  if (rfeat.empty()) return {rd, rl};
  std::vector<float> rx = matrix(rfeat, opts.dims, opts.ops_weight);
  auto rindex = make_index(opts.dims, static_cast<long>(rfeat.size()), rx.data(), opts.exact_up_to);
  rindex->search(static_cast<idx_t>(n), tx.data(), 1, rd.data(), rl.data());
  return {rd, rl};
}

struct Row {
  bool kept = true;
  std::string reason, duplicate_of, kb_problem;
  long nearest_task = -1;
  double task_sim = 0;
  std::vector<std::string> seq;
};

// Cosines of equal unit vectors come out a hair below 1 in float: compare with slack.
constexpr double kSlack = 1e-5;

// Everything dedup needs to decide one task, computed once for all of them.
struct Evidence {
  const std::vector<Item>& items;
  const std::vector<Features>& tfeat;
  const ExactGroups& exact;
  const Neighbours& nb;
  const std::vector<float>& ref_sim;
  bool has_refs;
  const json& vocab;
  const KernelBenchOps& kb;
  const DedupOptions& opts;
};

// The most similar earlier task that is still kept, at or above within_threshold: (position, cosine).
std::pair<long, double> earlier_kept_twin(std::size_t i, const Evidence& ev, const std::vector<Row>& rows) {
  double best = -2;
  long best_j = -1;
  for (int e = 0; e < ev.nb.k; ++e) {
    idx_t q = ev.nb.label[i * ev.nb.k + e];
    float sim = ev.nb.sim[i * ev.nb.k + e];
    if (q < 0 || sim < ev.opts.within_threshold - kSlack) continue;
    long j = static_cast<long>(ev.exact.uniq[q]);
    if (j < static_cast<long>(i) && rows[j].kept && sim > best) {
      best = sim;
      best_j = j;
    }
  }
  return {best_j, best};
}

// One task's verdict; rows before i are already decided (id order keeps "earlier" stable).
Row decide(std::size_t i, const Evidence& ev, const std::vector<Row>& rows) {
  Row r;
  for (int k = 0; k < ev.nb.k; ++k) {
    idx_t j = ev.nb.label[i * ev.nb.k + k];
    if (j < 0 || static_cast<std::size_t>(ev.exact.uniq[j]) == i) continue;
    r.nearest_task = static_cast<long>(ev.exact.uniq[j]);
    r.task_sim = ev.nb.sim[i * ev.nb.k + k];
    break;
  }
  r.seq = op_tokens(ev.items[i].ops.is_null() ? ev.tfeat[i].ops : ev.items[i].ops, ev.vocab);
  auto drop = [&](std::string reason) {
    r.kept = false;
    r.reason = std::move(reason);
    return r;
  };
  if (long twin = ev.exact.exact_of[i]; twin >= 0) {
    r.duplicate_of = ev.items[twin].id;
    r.nearest_task = twin;
    r.task_sim = 1.0;
    return drop("exact_duplicate");
  }
  if (auto hit = ev.kb.match(r.seq)) {
    r.kb_problem = hit->second;
    return drop(hit->first);
  }
  if (ev.has_refs && ev.ref_sim[i] >= ev.opts.threshold - kSlack) return drop("kernelbench_similar");
  if (auto [j, sim] = earlier_kept_twin(i, ev, rows); j >= 0) {
    r.duplicate_of = ev.items[j].id;
    r.nearest_task = j;
    r.task_sim = sim;
    return drop("near_duplicate");
  }
  return r;
}

json run_config(const DedupOptions& opts, std::size_t reference_files) {
  json config = {{"references", json::array()},
                 {"threshold", opts.threshold},
                 {"within_threshold", opts.within_threshold},
                 {"kernelbench_names", opts.kernelbench_names},
                 {"dims", opts.dims},
                 {"ops_weight", opts.ops_weight},
                 {"reference_files", reference_files}};
  for (auto& p : opts.references) config["references"].push_back(std::filesystem::absolute(p).string());
  return config;
}

// From scratch, in one transaction: a killed run leaves the previous results whole.
void write_results(Db& db, const std::vector<Item>& items, const std::vector<Features>& tfeat,
                   const std::vector<Item>& refs, const std::pair<std::vector<float>, std::vector<idx_t>>& nearest_ref,
                   const std::vector<Row>& rows, const json& config, DedupSummary& sum) {
  const auto& [rd, rl] = nearest_ref;
  db.transaction([&] {
    db.exec("DELETE FROM dedup_results");
    auto st = db.prepare(
        "INSERT INTO dedup_results(task_id, kept, reason, duplicate_of, nearest_ref, ref_similarity, nearest_task, "
        "task_similarity, kernelbench_problem, normal_hash, op_sequence) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Row& r = rows[i];
      st.reset();
      st.bind(1, items[i].id).bind(2, r.kept ? 1 : 0);
      r.reason.empty() ? st.bind_null(3) : st.bind(3, r.reason);
      r.duplicate_of.empty() ? st.bind_null(4) : st.bind(4, r.duplicate_of);
      if (!refs.empty() && rl[i] >= 0) st.bind(5, refs[rl[i]].id).bind(6, static_cast<double>(rd[i]));
      else st.bind_null(5).bind_null(6);
      if (r.nearest_task >= 0) st.bind(7, items[r.nearest_task].id).bind(8, r.task_sim);
      else st.bind_null(7).bind_null(8);
      r.kb_problem.empty() ? st.bind_null(9) : st.bind(9, r.kb_problem);
      st.bind(10, fmt::format("{:016x}", tfeat[i].normal_hash)).bind(11, json(r.seq).dump());
      st.run();
      if (r.kept) {
        ++sum.kept;
      } else {
        ++sum.dropped;
        ++sum.reasons[r.reason];
      }
    }
    db.prepare("INSERT OR REPLACE INTO dedup_config(id, config) VALUES(1, ?)").bind(1, config.dump()).run();
  });
}

}  // namespace

DedupSummary dedup(Workspace& ws, const DedupOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  Db& db = ws.db();
  migrate(db);
  DedupSummary sum;
  OPFORGE_CHECK(opts.dims > 0, "--dims must be positive");
  // Checked before any work: a wrong path must not cost a features pass first.
  std::vector<Item> refs = load_references(opts.references);
  const json table = kernelbench_table(opts);
  std::vector<Item> items = load_accepted(db);
  sum.accepted = static_cast<long>(items.size());
  sum.references = static_cast<long>(refs.size());
  if (items.empty()) {
    spdlog::info("nothing to dedup: no accepted task (run `opforge filter` first)");
    db.transaction([&] { db.exec("DELETE FROM dedup_results"); });
    return sum;
  }

  auto tf = std::chrono::steady_clock::now();
  WorkerPoolOptions popts;
  std::size_t batches = (items.size() + 255) / 256 + (refs.size() + 255) / 256;
  popts.workers = static_cast<int>(std::clamp<std::size_t>(batches, 1, std::max(1, opts.workers)));
  popts.log_file = ws.logs_dir() / "workers.log";
  std::vector<Features> tfeat, rfeat;
  {
    WorkerPool pool(popts);
    tfeat = compute_features(pool, items, "accepted tasks");
    if (!refs.empty()) rfeat = compute_features(pool, refs, "references");
  }
  auto ts = std::chrono::steady_clock::now();
  sum.features_seconds = std::chrono::duration<double>(ts - tf).count();

  std::vector<float> tx = matrix(tfeat, opts.dims, opts.ops_weight);
  const ExactGroups exact = exact_groups(tfeat);
  const Neighbours nb = search_tasks(tx, exact.uniq, opts.dims, opts.exact_up_to);
  const auto nearest_ref = nearest_references(tx, rfeat, opts);
  // Without the table, op sequences are still recorded, spelled as lower-cased op names.
  const json vocab = table.is_null() ? json{{"op_prefixes", json::array()}, {"op_tokens", json::object()}} : table;
  const KernelBenchOps kb = opts.kernelbench_names ? KernelBenchOps(table) : KernelBenchOps();
  const Evidence ev{items, tfeat, exact, nb, nearest_ref.first, !refs.empty(), vocab, kb, opts};
  std::vector<Row> rows;
  rows.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) rows.push_back(decide(i, ev, rows));
  sum.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();

  write_results(db, items, tfeat, refs, nearest_ref, rows, run_config(opts, refs.size()), sum);
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return sum;
}

json status(Db& db) {
  migrate(db);
  json out = {{"kept", 0}, {"dropped", 0}, {"pending", 0}, {"reasons", json::object()}};
  auto st = db.prepare("SELECT kept, coalesce(reason, ''), count(*) FROM dedup_results GROUP BY kept, reason");
  while (st.step()) {
    if (st.int64(0)) {
      out["kept"] = out["kept"].get<long>() + st.int64(2);
    } else {
      out["dropped"] = out["dropped"].get<long>() + st.int64(2);
      out["reasons"][st.text(1)] = st.int64(2);
    }
  }
  // Accepted tasks the last dedup run did not see (accepted since).
  if (db.has_table("filter_results")) {
    auto p = db.prepare(
        "SELECT count(*) FROM filter_results f LEFT JOIN dedup_results d ON d.task_id = f.task_id "
        "WHERE f.verdict = 'accepted' AND d.task_id IS NULL");
    if (p.step()) out["pending"] = p.int64(0);
  }
  // Kept tasks by cosine to their nearest reference, bins [0, 0.1) ... [0.9, 1.0].
  json hist = json::array();
  std::vector<long> bins(10, 0);
  long with_ref = 0;
  auto h = db.prepare("SELECT ref_similarity FROM dedup_results WHERE kept = 1 AND ref_similarity IS NOT NULL");
  while (h.step()) {
    int b = static_cast<int>(std::floor(h.real(0) * 10));
    ++bins[std::clamp(b, 0, 9)];
    ++with_ref;
  }
  for (int b = 0; b < 10; ++b)
    hist.push_back({{"from", b / 10.0}, {"to", (b + 1) / 10.0}, {"kept", bins[b]}});
  out["ref_similarity_histogram"] = hist;
  out["kept_with_reference"] = with_ref;
  return out;
}

}  // namespace opforge::dedup
