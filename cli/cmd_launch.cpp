// opforge slurm and opforge ray: compose and filter as N shards on a cluster scheduler that exists
// already (a Slurm job array, tasks of a Ray cluster), then one merge, dedup and export. opforge
// schedules nothing itself: it writes the scripts (LAUNCH/shard.sh, LAUNCH/merge.sh from
// data/launchers/, plus the sbatch files) and hands them to sbatch or to the Ray driver
// (python/opforge/ray_launch.py). docs/scale-out.md describes the layout under --workspace-root.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <set>

#include "commands.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"
#include "opforge/core/shard.h"

namespace opforge::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Args = std::vector<std::string>;

struct LaunchOptions {
  std::string stages = "compose,filter";
  int shards = 0, gpus = 0, cpus = 2;
  std::string root, base, preset, opforge;
  long count = 0;
  long seed = -1;
  Args compose_args, filter_args, dedup_args, export_args;
};

// The options both launchers take.
void add_launch_options(CLI::App* cmd, LaunchOptions& o) {
  cmd->add_option("--stages", o.stages, "Stages each shard runs, in order: compose,filter (default), compose or filter")
      ->capture_default_str();
  cmd->add_option("--shards", o.shards, "Number of shards N (shard I runs `compose/filter --shard I/N`)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--gpus-per-shard", o.gpus, "GPUs each shard gets (Slurm --gres=gpu:G, Ray num_gpus=G); 0: CPU")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--cpus-per-shard", o.cpus, "CPUs each shard gets (Slurm --cpus-per-task, Ray num_cpus)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--workspace-root", o.root, "Folder on a filesystem every node sees: shards/I, merged/, logs/, launch/")
      ->required();
  cmd->add_option("--base", o.base, "The crawled workspace every shard starts from (default: WORKSPACE_ROOT/base)");
  cmd->add_option("-n,--count", o.count, "Candidates to compose over all shards (compose --count)");
  cmd->add_option("--seed", o.seed, "Composer RNG seed (compose --seed)");
  cmd->add_option("-p,--preset", o.preset, "Take compose, filter, dedup and export options from a preset "
                                           "(data/presets/NAME.json or a path; its crawl section is not used)");
  cmd->add_option("--compose-arg", o.compose_args, "An option passed to every compose, e.g. --compose-arg=--backend=graph; "
                                                   "repeatable, wins over the preset");
  cmd->add_option("--filter-arg", o.filter_args, "An option passed to every filter, e.g. --filter-arg=--device=cuda");
  cmd->add_option("--dedup-arg", o.dedup_args, "An option passed to the dedup after the merge");
  cmd->add_option("--export-arg", o.export_args, "An option passed to the export after the merge");
  cmd->add_option("--opforge", o.opforge, "The opforge binary the nodes run (default: this one)");
}

std::string sh_array(const Args& a) {
  std::string s = "(";
  for (std::size_t i = 0; i < a.size(); ++i) s += (i ? " " : "") + shell_quoted(a[i]);
  return s + ")";
}

Args split_stages(const std::string& spec) {
  Args out;
  std::string cur;
  for (char c : spec + ",") {
    if (c != ',') {
      cur += c;
      continue;
    }
    OPFORGE_CHECK(cur == "compose" || cur == "filter", "--stages: unknown stage '{}' (known: compose, filter)", cur);
    out.push_back(cur);
    cur.clear();
  }
  bool known = out == Args{"compose", "filter"} || out == Args{"compose"} || out == Args{"filter"};
  OPFORGE_CHECK(known, "--stages {}: give compose,filter, compose or filter", spec);
  return out;
}

std::string json_scalar(const json& v, const std::string& where) {
  OPFORGE_CHECK(v.is_string() || v.is_number(), "{}: expected a string or a number, got {}", where, v.dump());
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// A preset section as the stage's own flags: max_ops -> --max-ops VALUE, a list repeats the flag,
// false switches a default-on step off (calibrate -> --no-calibrate). The stage's parser checks
// names and values, so a typo fails in the shard with the stage's own message.
Args section_flags(const json& sec, const std::string& where) {
  static const std::set<std::string> on_flags = {"gzip"};
  static const std::set<std::string> off_flags = {"calibrate", "kernelbench_names", "plots", "realism"};
  static const std::map<std::string, std::string> renamed = {{"references", "reference"}};
  Args out;
  for (auto& [key, v] : sec.items()) {
    std::string name = renamed.count(key) ? renamed.at(key) : key;
    std::replace(name.begin(), name.end(), '_', '-');
    std::string at = where + "." + key;
    if (v.is_boolean()) {
      OPFORGE_CHECK(on_flags.count(key) || off_flags.count(key), "{}: no flag for a true/false value", at);
      if (on_flags.count(key) && v.get<bool>()) out.push_back("--" + name);
      if (off_flags.count(key) && !v.get<bool>()) out.push_back("--no-" + name);
    } else if (v.is_array()) {
      for (auto& x : v) out.insert(out.end(), {"--" + name, json_scalar(x, at)});
    } else {
      out.insert(out.end(), {"--" + name, json_scalar(v, at)});
    }
  }
  return out;
}

struct StageArgs {
  Args compose, filter, dedup, exp;
};

StageArgs preset_args(const std::string& name_or_path) {
  fs::path p(name_or_path);
  if (p.extension() != ".json" && !p.has_parent_path()) p = data_dir() / "presets" / (name_or_path + ".json");
  OPFORGE_CHECK(fs::exists(p), "preset '{}' not found at {}; `opforge run --list-presets` lists them", name_or_path,
                p.string());
  json j;
  try {
    j = json::parse(read_text(p));
  } catch (const json::exception& e) {
    throw Error(fmt::format("preset {} is not valid JSON: {}", p.string(), e.what()));
  }
  auto section = [&](const char* name) {
    return j.contains(name) ? section_flags(j.at(name), "preset " + p.string() + ": " + name) : Args{};
  };
  if (j.contains("crawl")) spdlog::info("launch: preset {}: its crawl section is not used (the base is crawled)", p.string());
  return {section("compose"), section("filter"), section("dedup"), section("export")};
}

// The flag a token sets: "--count" of "--count=5"; empty for a value.
std::string flag_of(const std::string& token) {
  if (token.rfind("-", 0) != 0) return "";
  return token.substr(0, token.find('='));
}

// `base` (flags with their values) less the flags `extra` sets, then `extra`: what a user passes
// wins over the preset without the stage seeing one option twice.
Args overridden(const Args& base, const Args& extra) {
  std::set<std::string> set;
  for (auto& t : extra)
    if (auto f = flag_of(t); !f.empty()) set.insert(f);
  Args out;
  bool skipping = false;
  for (auto& t : base) {
    if (auto f = flag_of(t); !f.empty()) skipping = set.count(f) > 0;
    if (!skipping) out.push_back(t);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

StageArgs stage_args(const LaunchOptions& o) {
  StageArgs p = o.preset.empty() ? StageArgs{} : preset_args(o.preset);
  Args compose = o.compose_args;
  if (o.count > 0) compose.insert(compose.begin(), {"--count", std::to_string(o.count)});
  if (o.seed >= 0) compose.insert(compose.begin(), {"--seed", std::to_string(o.seed)});
  return {overridden(p.compose, compose), overridden(p.filter, o.filter_args), overridden(p.dedup, o.dedup_args),
          overridden(p.exp, o.export_args)};
}

// What both launchers resolve before writing anything: absolute paths (the nodes run elsewhere).
struct Launch {
  std::string command;  // slurm or ray
  LaunchOptions o;
  Args stages;
  StageArgs args;
  fs::path root, base, bin;
  fs::path dir() const { return root / "launch"; }
  fs::path logs() const { return root / "logs"; }
  fs::path marker(int i) const { return shard_marker(root / "shards" / std::to_string(i), "launch", {i, o.shards}); }
  // What a shard's result depends on, written into its marker: a finished shard is reused only
  // by a run with the same stages and compose/filter options (dedup and export may change).
  std::string config() const {
    return xxh3_hex(json{{"stages", stages}, {"shards", o.shards}, {"compose", args.compose}, {"filter", args.filter}}
                        .dump());
  }
};

Launch resolve(const std::string& command, const LaunchOptions& o) {
  Launch l{command, o, split_stages(o.stages), stage_args(o), {}, {}, {}};
  l.root = fs::absolute(o.root).lexically_normal();
  l.base = o.base.empty() ? l.root / "base" : fs::absolute(o.base).lexically_normal();
  OPFORGE_CHECK(fs::exists(l.base / "opforge.db"),
                "the base workspace {} has no opforge.db: crawl it first (`opforge crawl --workspace {}`), or name a "
                "crawled workspace with --base",
                l.base.string(), l.base.string());
  l.bin = o.opforge.empty() ? opforge_executable() : fs::absolute(o.opforge);
  OPFORGE_CHECK(fs::exists(l.bin), "--opforge {}: no such file", l.bin.string());
  return l;
}

// Written beside and renamed over: bash reads a script as it runs, so a job of an earlier
// submission still running keeps the copy it started with.
void write_script(const fs::path& p, const std::string& text) { write_text_atomic(p, text, true); }

std::string script_header(const Launch& l, const std::string& body) {
  return fmt::format(
      "#!/usr/bin/env bash\n# Written by `opforge {}` from data/launchers/{} (the part below the variables).\n"
      "OPFORGE={}\nBASE={}\nROOT={}\nSHARDS={}\nSTAGES={}\nCONFIG={}\n",
      l.command, body, shell_quoted(l.bin.string()), shell_quoted(l.base.string()), shell_quoted(l.root.string()), l.o.shards,
      sh_array(l.stages), l.config());
}

// LAUNCH/shard.sh and LAUNCH/merge.sh: the launchers' common part, run by sbatch or by Ray tasks.
void write_stage_scripts(const Launch& l) {
  fs::create_directories(l.logs());
  fs::create_directories(l.root / "shards");
  write_script(l.dir() / "shard.sh", script_header(l, "shard.sh") + "COMPOSE_ARGS=" + sh_array(l.args.compose) +
                                         "\nFILTER_ARGS=" + sh_array(l.args.filter) + "\n\n" +
                                         read_text(data_dir() / "launchers" / "shard.sh"));
  write_script(l.dir() / "merge.sh", script_header(l, "merge.sh") + "DEDUP_ARGS=" + sh_array(l.args.dedup) +
                                         "\nEXPORT_ARGS=" + sh_array(l.args.exp) + "\n\n" +
                                         read_text(data_dir() / "launchers" / "merge.sh"));
}

// The shards without a completion marker: a resubmission launches only these. A shard finished
// under other options is an error: mixing it in would merge two different corpora.
std::vector<int> pending_shards(const Launch& l) {
  std::vector<int> out;
  const std::string config = l.config();
  for (int i = 0; i < l.o.shards; ++i) {
    fs::path m = l.marker(i);
    if (!fs::exists(m)) {
      out.push_back(i);
      continue;
    }
    std::string had = json::parse(read_text(m), nullptr, false).value("config", "");
    OPFORGE_CHECK(had == config,
                  "{} finished with other stages or compose/filter options (config {}, now {}): run with those "
                  "options, or use another --workspace-root (or remove {}) to start over",
                  (l.root / "shards" / std::to_string(i)).string(), had, config, (l.root / "shards").string());
  }
  spdlog::info("launch: {} of {} shards to run{}", out.size(), l.o.shards,
               out.size() < static_cast<std::size_t>(l.o.shards) ? " (the others have finished)" : "");
  return out;
}

// ---- opforge slurm ----

// Sorted indices as Slurm's array list: 0-3,5,7-9.
std::string ranges(const std::vector<int>& v) {
  std::vector<std::string> parts;
  for (std::size_t i = 0, j; i < v.size(); i = j) {
    for (j = i + 1; j < v.size() && v[j] == v[j - 1] + 1;) ++j;
    parts.push_back(j - i == 1 ? std::to_string(v[i]) : fmt::format("{}-{}", v[i], v[j - 1]));
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

// The array (one task per pending shard) and the merge job, each a complete sbatch file: the
// array lists its indices, so `sbatch LAUNCH/shards.sbatch` by hand does what --submit does.
std::pair<fs::path, fs::path> write_sbatch(const Launch& l, const std::vector<int>& pending, const Args& extra) {
  std::string common;
  for (auto& a : extra) common += "#SBATCH " + a + "\n";
  std::string shards = fmt::format(
      "#!/bin/bash\n#SBATCH --job-name=opforge-shards\n#SBATCH --array={}\n#SBATCH --cpus-per-task={}\n"
      "#SBATCH --output={}/shard-%a.out\n#SBATCH --open-mode=append\n",
      ranges(pending), l.o.cpus, l.logs().string());
  if (l.o.gpus > 0) shards += fmt::format("#SBATCH --gres=gpu:{}\n", l.o.gpus);
  shards += common + "exec bash " + shell_quoted((l.dir() / "shard.sh").string()) + " \"$SLURM_ARRAY_TASK_ID\"\n";
  // The merge waits for the array through --dependency=afterok:ARRAY_ID, given at submission;
  // when a shard fails Slurm cancels it (kill-on-invalid-dep) instead of leaving it pending
  // forever, so a resubmission starts clean.
  std::string merge = fmt::format(
      "#!/bin/bash\n#SBATCH --job-name=opforge-merge\n#SBATCH --cpus-per-task={}\n#SBATCH --output={}/merge.out\n"
      "#SBATCH --open-mode=append\n#SBATCH --kill-on-invalid-dep=yes\n{}exec bash {}\n",
      l.o.cpus, l.logs().string(), common, shell_quoted((l.dir() / "merge.sh").string()));
  fs::path a = l.dir() / "shards.sbatch", m = l.dir() / "merge.sbatch";
  if (!pending.empty()) write_script(a, shards);
  write_script(m, merge);
  return {a, m};
}

// PATH's `name`, or empty.
fs::path on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (std::size_t b = 0, e; b <= dirs.size(); b = e + 1) {
    e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    fs::path p = fs::path(dirs.substr(b, e - b)) / name;
    if (!dirs.substr(b, e - b).empty() && ::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

// `sbatch --parsable ARGS`; returns the job id. sbatch's own errors go to our stderr.
std::string sbatch(const fs::path& exe, const Args& args) {
  std::string cmd = shell_quoted(exe.string()) + " --parsable";
  for (auto& a : args) cmd += " " + shell_quoted(a);
  spdlog::info("launch: {}", cmd);
  FILE* p = ::popen(cmd.c_str(), "r");
  OPFORGE_CHECK(p, "cannot run {}: {}", exe.string(), std::strerror(errno));
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  int rc = ::pclose(p);
  OPFORGE_CHECK(rc == 0 && !out.empty(), "sbatch failed (status {}) for: {} (its message is above)",
                WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, cmd);
  return out.substr(0, out.find_first_of(";\n"));  // "ID" or "ID;CLUSTER"
}

int run_slurm(const LaunchOptions& o, const Args& sbatch_args, bool submit) {
  Launch l = resolve("slurm", o);
  write_stage_scripts(l);
  auto pending = pending_shards(l);
  auto [array, merge] = write_sbatch(l, pending, sbatch_args);
  if (!submit) {
    if (pending.empty()) {
      spdlog::info("launch: every shard has finished; submit the merge with: sbatch {}", merge.string());
    } else {
      spdlog::info("launch: submit with: id=$(sbatch --parsable {}) && sbatch --dependency=afterok:$id {}",
                   array.string(), merge.string());
      std::cout << array.string() << "\n";
    }
    std::cout << merge.string() << "\n";
    return 0;
  }
  fs::path exe = on_path("sbatch");
  OPFORGE_CHECK(!exe.empty(),
                "sbatch not found on PATH: run `opforge slurm --submit` on a host that submits to your Slurm cluster "
                "(Debian: apt install slurm-wlm; `make setup` installs it), or leave out --submit and submit {} "
                "yourself",
                (l.dir() / "*.sbatch").string());
  Args merge_args;
  if (!pending.empty()) {
    std::string id = sbatch(exe, {array.string()});
    std::cout << "shards\t" << id << "\n";
    merge_args.push_back("--dependency=afterok:" + id);
  }
  merge_args.push_back(merge.string());
  std::cout << "merge\t" << sbatch(exe, merge_args) << "\n";
  spdlog::info("launch: progress: squeue, the logs in {}, `opforge status {}/*` over the finished shards; the export "
               "will be in {}",
               l.logs().string(), (l.root / "shards").string(), (l.root / "merged" / "export").string());
  return 0;
}

// ---- opforge ray ----

// Replaces this process with the Ray driver (Ray's API is Python): the venv's interpreter with
// opforge's package first on PYTHONPATH, as the workers get it.
int run_ray(const LaunchOptions& o, const std::string& address) {
  Launch l = resolve("ray", o);
  write_stage_scripts(l);
  auto pending = pending_shards(l);
  std::string py = python_executable().string();
  std::string pythonpath = python_package_dir().string();
  if (const char* old = std::getenv("PYTHONPATH"); old && *old) pythonpath += std::string(":") + old;
  ::setenv("PYTHONPATH", pythonpath.c_str(), 1);
  Args args = {py, "-m", "opforge.ray_launch", "--address", address, "--root", l.root.string(),
               "--shards", std::to_string(o.shards), "--pending", ranges(pending),
               "--gpus-per-shard", std::to_string(o.gpus), "--cpus-per-shard", std::to_string(o.cpus)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  spdlog::default_logger()->flush();
  ::execv(py.c_str(), argv.data());
  throw Error(fmt::format("cannot run the Ray driver with {}: {}", py, std::strerror(errno)));
}

}  // namespace

void add_slurm(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "slurm",
      "Compose and filter as a Slurm job array, one task per shard (each on node-local disk, staged to "
      "WORKSPACE_ROOT/shards/I when finished), and a job after it (afterok) that merges the shards, dedups and "
      "exports. Writes WORKSPACE_ROOT/launch/*.sbatch and prints their paths; --submit submits them and prints the "
      "job ids. Run again after a failure: finished shards are skipped. docs/scale-out.md");
  auto o = std::make_shared<LaunchOptions>();
  auto extra = std::make_shared<Args>();
  auto submit = std::make_shared<bool>(false);
  add_launch_options(cmd, *o);
  cmd->add_option("--sbatch-arg", *extra, "A line for both sbatch files, e.g. --sbatch-arg=--partition=gpu or "
                                          "--sbatch-arg=--time=4:00:00; repeatable");
  cmd->add_flag("--submit", *submit, "Submit with sbatch (else only write the files)");
  cmd->callback([&run, o, extra, submit] { run = [o, extra, submit] { return run_slurm(*o, *extra, *submit); }; });
}

void add_ray(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand(
      "ray",
      "Compose and filter as N Ray tasks (num_gpus=--gpus-per-shard each) on a running Ray cluster, each on "
      "node-local disk and staged to WORKSPACE_ROOT/shards/I when finished, then one task that merges, dedups and "
      "exports. Waits for the end and prints the export folder. Run again after a failure: finished shards are "
      "skipped. docs/scale-out.md");
  auto o = std::make_shared<LaunchOptions>();
  auto address = std::make_shared<std::string>("auto");
  add_launch_options(cmd, *o);
  cmd->add_option("--address", *address, "The Ray cluster: auto (RAY_ADDRESS or the cluster started on this machine) "
                                         "or HOST:PORT")
      ->capture_default_str();
  cmd->callback([&run, o, address] { run = [o, address] { return run_ray(*o, *address); }; });
}

}  // namespace opforge::cli
