// opforge run: crawl → compose → filter → dedup → export in one command, configured by a preset.
//
// Resumable at any point because every stage is: crawl skips probed operators, compose tops the
// workspace up to the preset's count (it never adds twice), filter judges only tasks without a
// verdict, dedup and export recompute from the workspace. So a killed run, started again, ends
// where an uninterrupted one would.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <set>

#include "commands.h"
#include "composer.h"
#include "crawler.h"
#include "dedup.h"
#include "export.h"
#include "filter.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/paths.h"
#include "opforge/core/store.h"
#include "opforge/core/tasks.h"

namespace opforge::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct Preset {
  std::string name, description;
  crawler::CrawlOptions crawl;
  composer::ComposeOptions compose;
  filter::FilterOptions filter;
  dedup::DedupOptions dedup;
  exporter::ExportOptions exp;
};

// Reads the keys of one preset section into options; an unknown key is an error naming it, so a
// typo in a preset never silently falls back to a default.
class Section {
 public:
  Section(const json& preset, const std::string& name, const std::string& where) : name_(name), where_(where) {
    if (!preset.contains(name)) return;
    sec_ = preset.at(name);
    OPFORGE_CHECK(sec_.is_object(), "{}: \"{}\" must be a JSON object", where_, name_);
  }
  template <class T>
  Section& field(const char* key, T& out) {
    known_.insert(key);
    if (!sec_.contains(key)) return *this;
    try {
      out = sec_.at(key).get<T>();
    } catch (const json::exception& e) {
      throw Error(fmt::format("{}: {}.{} has the wrong type ({})", where_, name_, key, e.what()));
    }
    return *this;
  }
  void done() const {
    for (auto& [k, _] : sec_.items())
      OPFORGE_CHECK(known_.count(k), "{}: unknown key {}.{} (known: {})", where_, name_, k, fmt::join(known_, ", "));
  }

 private:
  std::string name_, where_;
  json sec_ = json::object();
  std::set<std::string> known_;
};

fs::path preset_path(const std::string& name_or_path) {
  fs::path p(name_or_path);
  if (p.extension() == ".json" || p.has_parent_path()) return p;
  return data_dir() / "presets" / (name_or_path + ".json");
}

Preset load_preset(const std::string& name_or_path) {
  fs::path p = preset_path(name_or_path);
  OPFORGE_CHECK(fs::exists(p),
                "preset '{}' not found at {}; `opforge run --list-presets` lists the presets in {}, or pass a path "
                "to a .json file",
                name_or_path, p.string(), (data_dir() / "presets").string());
  json j;
  try {
    j = json::parse(read_text(p));
  } catch (const json::exception& e) {
    throw Error(fmt::format("preset {} is not valid JSON: {}", p.string(), e.what()));
  }
  OPFORGE_CHECK(j.is_object(), "preset {} must be a JSON object", p.string());
  std::string where = "preset " + p.string();
  Preset s;
  s.name = p.stem().string();
  for (auto& [k, _] : j.items())
    OPFORGE_CHECK(std::set<std::string>({"description", "crawl", "compose", "filter", "dedup", "export"}).count(k),
                  "{}: unknown section \"{}\" (known: description, crawl, compose, filter, dedup, export)", where, k);
  s.description = j.value("description", "");
  Section(j, "crawl", where)
      .field("sources", s.crawl.sources)
      .field("match", s.crawl.match)
      .field("limit", s.crawl.limit)
      .field("device", s.crawl.device)
      .field("workers", s.crawl.workers)
      .field("timeout_s", s.crawl.timeout_s)
      .done();
  Section(j, "compose", where)
      .field("count", s.compose.count)
      .field("max_ops", s.compose.max_ops)
      .field("mix", s.compose.mix)
      .field("backend", s.compose.backend)
      .field("seed", s.compose.seed)
      .field("target_ms", s.compose.target_ms)
      .field("device", s.compose.device)
      .field("stats", s.compose.stats)
      .field("anchor_share", s.compose.anchor_share)
      .field("exotic_share", s.compose.exotic_share)
      .field("edge_smoothing", s.compose.edge_smoothing)
      .field("workers", s.compose.workers)
      .field("llm_url", s.compose.llm_url)
      .field("llm_model", s.compose.llm_model)
      .field("llm_key_env", s.compose.llm_key_env)
      .field("llm_concurrency", s.compose.llm_concurrency)
      .done();
  Section(j, "filter", where)
      .field("device", s.filter.device)
      .field("workers", s.filter.workers)
      .field("workers_per_gpu", s.filter.workers_per_gpu)
      .field("min_ms", s.filter.min_ms)
      .field("max_ms", s.filter.max_ms)
      .field("timeout_s", s.filter.timeout_s)
      .field("calibrate", s.filter.calibrate)
      .field("trials", s.filter.trials)
      .done();
  std::vector<std::string> refs;
  Section(j, "dedup", where)
      .field("threshold", s.dedup.threshold)
      .field("within_threshold", s.dedup.within_threshold)
      .field("kernelbench_names", s.dedup.kernelbench_names)
      .field("references", refs)
      .field("dims", s.dedup.dims)
      .done();
  s.dedup.references.assign(refs.begin(), refs.end());
  Section(j, "export", where)
      .field("shard_size", s.exp.shard_size)
      .field("gzip", s.exp.gzip)
      .field("format", s.exp.format)
      .field("test_fraction", s.exp.test_fraction)
      .field("split_seed", s.exp.split_seed)
      .field("plots", s.exp.plots)
      .field("realism", s.exp.realism)
      .done();
  OPFORGE_CHECK(s.compose.count >= 0, "{}: compose.count must be >= 0", where);
  return s;
}

void list_presets() {
  fs::path dir = data_dir() / "presets";
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (auto& f : files) {
    auto p = load_preset(f.string());
    std::cout << p.name << "\t" << p.description << "\n";
  }
}

// --kept N: rounds of compose, filter and dedup until N tasks are kept, a round adds no candidate
// (the composer has nothing new to draw) or kMaxRounds pass. The first round composes N with the
// preset's mix; each later one composes, per bucket, what is missing of the preset's share at that
// bucket's own yield (composer::deficit_mix), so the kept tasks hold the preset's mix.
constexpr int kMaxRounds = 8;

template <class Round>
void until_kept(Workspace& ws, const composer::ComposeOptions& c, long want, Round&& round) {
  const auto mix = composer::parse_mix(c.mix, c.max_ops);
  long total = std::max<long>(c.count, want);
  std::string round_mix = c.mix;
  for (int r = 1; r <= kMaxRounds; ++r) {
    long kept = round(total, round_mix, r == 1 ? "" : fmt::format("#{}", r));
    long drawn = tasks::count(ws.db(), c.backend);
    spdlog::info("run: round {}: {} kept of {} candidates drawn (want {})", r, kept, drawn, want);
    if (kept >= want) return;
    if (drawn < total) {
      spdlog::warn("run: the composer added no more candidates ({} drawn of {} asked); stopping with {} kept of {}",
                   drawn, total, kept, want);
      return;
    }
    long more = 0;
    round_mix = composer::deficit_mix(mix, composer::bucket_yields(ws.db(), c.backend), want, more);
    if (more == 0) {
      spdlog::warn("run: every bucket holds its share of {} but {} are kept; stopping", want, kept);
      return;
    }
    spdlog::info("run: next round composes {} more, per bucket {}", more, round_mix);
    total = drawn + more;
  }
  spdlog::warn("run: {} rounds did not keep {} tasks; run again to go on", kMaxRounds, want);
}

// The stages of one `opforge run`, each timed and its failure given the stage's context.
class Pipeline {
 public:
  Pipeline(Workspace& ws, const Preset& p) : ws_(ws), p_(p) {}

  template <class Body>
  void stage(const std::string& name, Body&& body) {
    spdlog::info("run: -- {} --", name);
    auto t0 = std::chrono::steady_clock::now();
    std::string result = with_context(
        fmt::format("while running stage {} of preset {} (fix the cause and run again: finished work is kept)", name,
                    p_.name),
        body);
    times_.push_back({name, result, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()});
  }

  // One round: compose up to `total` candidates (with `mix`), judge the new ones, dedup; returns
  // the kept count.
  long round(long total, const std::string& mix, const std::string& tag) {
    long kept = 0;
    stage("compose" + tag, [&] {
      tasks::migrate(ws_.db());
      long have = tasks::count(ws_.db(), p_.compose.backend);
      composer::ComposeOptions c = p_.compose;
      c.mix = mix;
      c.count = static_cast<int>(std::max(0L, total - have));
      if (c.count == 0) return fmt::format("{} candidates already there", have);
      auto s = composer::compose(ws_, c);
      return fmt::format("{} added ({} failed), {} in all", s.added, s.failed, have + s.added);
    });
    stage("filter" + tag, [&] {
      filter::FilterOptions f = p_.filter;
      f.memory_limit_mb = default_memory_limit_mb(std::max(2, f.workers));
      auto s = filter::filter(ws_, f);
      return fmt::format("{} judged now: {} accepted, {} rejected", s.judged, s.accepted, s.rejected);
    });
    stage("dedup" + tag, [&] {
      auto s = dedup::dedup(ws_, p_.dedup);
      kept = s.kept;
      return fmt::format("{} accepted, {} kept, {} dropped", s.accepted, s.kept, s.dropped);
    });
    return kept;
  }

  void print_times() const {
    double total = 0;
    spdlog::info("run: {:<8} {:>9}  {}", "stage", "seconds", "result");
    for (auto& t : times_) {
      spdlog::info("run: {:<8} {:>9.1f}  {}", t.stage, t.seconds, t.result);
      total += t.seconds;
    }
    spdlog::info("run: {:<8} {:>9.1f}  shards, manifest.json, README.md and stats/ in {}", "total", total,
                 p_.exp.out.string());
  }

 private:
  struct StageTime {
    std::string stage, result;
    double seconds;
  };
  Workspace& ws_;
  const Preset& p_;
  std::vector<StageTime> times_;
};

}  // namespace

void add_run(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "run",
      "Crawl, compose, filter, dedup and export in one command, configured by a preset (data/presets/NAME.json). "
      "Resumable: run it again after a kill or a crash and it goes on where it stopped; run it again after it "
      "finished and it only re-exports. Prints the export folder on stdout.");
  struct Opts {
    std::string workspace = "workspace";
    std::string preset = "default";
    std::string out, device;
    std::vector<std::string> references;
    long count = -1, kept = 0;
    int workers = 0;
    bool list = false, no_plots = false, rejudge_stale = false;
  };
  auto o = std::make_shared<Opts>();
  add_workspace_option(*cmd, o->workspace);
  cmd->add_option("-p,--preset", o->preset, "Preset name in data/presets/ (default, ops6k, ...) or a path to a .json")
      ->capture_default_str();
  cmd->add_flag("--list-presets", o->list, "Print the presets with their descriptions and stop");
  cmd->add_option("-o,--out", o->out, "Export folder (default: WORKSPACE/export)");
  cmd->add_option("--count", o->count, "Override the preset's number of candidates to compose (a total, not a "
                                       "increment: a rerun tops up to it)");
  cmd->add_option("--kept", o->kept, "Compose, filter and dedup in rounds until N tasks are kept after dedup; --count "
                                     "is then the first round's size (at least N), and each later round composes, per "
                                     "bucket of the mix, what is missing of its share at that bucket's yield so far, "
                                     "so the kept tasks hold the preset's mix");
  cmd->add_option("--reference", o->references,
                  "A folder of KernelBench-format .py files (e.g. a KernelBench checkout's level1, level2, level3) that "
                  "dedup drops look-alikes of, added to the preset's dedup.references; repeatable")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--device", o->device, "Override where probes and the filter run: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("-j,--workers", o->workers, "Override the worker count of every stage (filter: in total)");
  cmd->add_flag("--no-plots", o->no_plots, "Skip the PNG plots of the export's stats/");
  cmd->add_flag("--rejudge-stale", o->rejudge_stale,
                "Filter again the candidates whose verdicts were made by another filter version or configuration "
                "(without it they are kept as they are, with a warning)");
  cmd->callback([&run, o] {
    run = [o] {
      if (o->list) {
        list_presets();
        return 0;
      }
      Preset p = load_preset(o->preset);
      if (o->count >= 0) p.compose.count = static_cast<int>(o->count);
      if (!o->device.empty()) p.crawl.device = p.filter.device = o->device;
      if (o->workers > 0) p.crawl.workers = p.compose.workers = p.filter.workers = p.dedup.workers = o->workers;
      else p.crawl.workers = p.compose.workers = p.dedup.workers = default_workers();
      if (o->no_plots) p.exp.plots = false;
      p.filter.rejudge_stale = o->rejudge_stale;
      p.dedup.references.insert(p.dedup.references.end(), o->references.begin(), o->references.end());
      p.exp.out = o->out.empty() ? fs::path(o->workspace) / "export" : fs::path(o->out);
      p.crawl.memory_limit_mb = default_memory_limit_mb(p.crawl.workers);
      spdlog::info("run: preset {} ({})", p.name, p.description);

      Workspace ws(o->workspace);
      Pipeline pipe(ws, p);
      pipe.stage("crawl", [&] {
        auto s = crawler::crawl(ws, p.crawl);
        return fmt::format("{} enumerated, {} probed now, {} runnable now", s.enumerated, s.probed, s.runnable);
      });
      auto round = [&](long total, const std::string& mix, const std::string& tag) {
        return pipe.round(total, mix, tag);
      };
      if (o->kept > 0) {
        until_kept(ws, p.compose, o->kept, round);
      } else {
        round(p.compose.count, p.compose.mix, "");
      }
      pipe.stage("export", [&] {
        auto s = exporter::export_dataset(ws, p.exp);
        return fmt::format("{} records ({} train, {} test)", s.records, s.train, s.test);
      });
      pipe.print_times();
      std::cout << fs::absolute(p.exp.out).string() << "\n";
      return 0;
    };
  });
}

}  // namespace opforge::cli
