// opforge agent (agent.h): working folders, a judge, K episodes in flight, records that make a
// killed run resumable, and the summary.

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "agent.h"
#include "env.h"
#include "episode.h"
#include "judge_process.h"
#include "evaluator.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge::agent {

using evaluator::JudgeProcess;

std::vector<json> read_records(const fs::path& p) {
  std::vector<json> out;
  if (!fs::exists(p)) return out;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("task_id")) out.push_back(std::move(j));  // a torn last line is dropped
  }
  return out;
}

namespace {

// The folders of work/: exported once, then kept (a resumed run's finished folders are its results).
std::vector<EpisodeTask> prepare(const AgentOptions& o, const fs::path& work) {
  if (!fs::exists(work / "manifest.json")) export_envs({o.tasks, work, o.data_dir});
  json m = json::parse(read_text(work / "manifest.json"));
  std::map<std::string, std::string> code;
  for (auto& t : evaluator::load_tasks(o.tasks)) code[t.id] = t.code;
  std::vector<EpisodeTask> tasks;
  for (auto& t : m["tasks"]) {
    auto c = code.find(t["task_id"].get<std::string>());
    OPFORGE_CHECK(c != code.end(), "{} holds a folder of task {} that --tasks does not have: use a new --out for other "
                  "tasks", work.string(), t["task_id"].get<std::string>());
    tasks.push_back({t["task_id"], t["name"], t["folder"], c->second, work});
  }
  OPFORGE_CHECK(code.size() == tasks.size(), "{} holds the folders of {} task(s), --tasks has {}: use a new --out "
                "for other tasks", work.string(), tasks.size(), code.size());
  return tasks;
}

// The venv, read-only in the bash sandbox, first on its PATH (python3 with torch, as the judge's).
// Not opforge's own package: the folder's scripts need only the standard library. A path under
// /work would be bound inside the folder itself (the sandbox's /work), and sent with the solution.
ToolContext tool_context(const AgentOptions& o) {
  ToolContext c;
  fs::path py = python_executable();
  fs::path venv = fs::weakly_canonical(py.parent_path().parent_path());
  if (venv.lexically_relative("/work").empty() || *venv.lexically_relative("/work").begin() == "..")
    c.ro = {venv.string()};
  else
    spdlog::warn("the venv {} is under /work: the bash sandbox runs without it", venv.string());
  c.env = {{"PATH", (venv / "bin").string() + ":/usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin"}};
  c.bash_timeout_s = o.bash_timeout_s;
  c.output_chars = o.tool_output_chars;
  c.no_sandbox = o.no_sandbox;
  return c;
}

// The relay of a folder's utils/judge.py: its task, whatever task id the request names.
std::function<std::string(const std::string&)> relay(const JudgeClient& judge, const std::string& task_id,
                                                     std::shared_ptr<std::vector<json>> judged) {
  return [&judge, task_id, judged](const std::string& line) {
    json req = json::parse(line, nullptr, false);
    if (!req.is_object() || !req.contains("files") || !req["files"].is_object())
      return json{{"error", "a request to the judge is one JSON object with \"files\" (path -> text)"}}.dump();
    json row = judge.evaluate(task_id, req["files"]);
    json brief = json::object();
    for (auto k : {"solution_hash", "reward", "reason", "flags", "cached", "retryable"})
      if (row.contains(k)) brief[k] = row[k];
    judged->push_back(brief);
    return row.dump();
  };
}

struct Pool {
  const AgentOptions& o;
  const JudgeClient& judge;
  const fs::path& out;
  std::mutex mu;
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::exception_ptr fatal;

  void record(const fs::path& file, const json& j) {
    std::lock_guard<std::mutex> lock(mu);
    std::ofstream f(out / file, std::ios::app);
    f << j.dump() << "\n";
    f.flush();
  }

  void episode(const EpisodeTask& t, llm::LlmClient& llm, Progress& bar) {
    reset_folder(t.work, t.folder, t.task_id, t.name, t.code, o.data_dir);
    ToolContext tools = tool_context(o);
    tools.folder = t.work / t.folder;
    tools.judge = relay(judge, t.task_id, tools.judged);
    std::string system = read_text(o.data_dir / "agent" / "system.md") + "\n\n" + read_text(tools.folder / "SKILL.md");
    try {
      json rec = run_episode(o, t, llm, judge, tools, system);
      record("episodes.jsonl", rec);
      bar.tick(1, fmt::format("{}: reward {}", t.name, rec["reward"].dump()));
    } catch (const EpisodeAborted& e) {
      spdlog::warn("episode {} not finished ({}): {}; the next run takes it again", t.name, e.reason, e.what());
      record("errors.jsonl", {{"task_id", t.task_id}, {"task", t.name}, {"reason", e.reason}, {"detail", e.what()}});
      bar.tick(1, t.name + ": " + e.reason);
    }
  }

  void worker(const std::vector<EpisodeTask>& todo, Progress& bar) {
    llm::LlmOptions lo = o.llm;
    lo.concurrency = 1;
    try {
      llm::LlmClient llm(lo, nullptr);
      for (std::size_t i; !stop && (i = next++) < todo.size();) episode(todo[i], llm, bar);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!fatal) fatal = std::current_exception();
      stop = true;
    }
  }
};

void write_summary(const AgentOptions& o) {
  json s = summarize_episodes(read_records(o.out / "episodes.jsonl"));
  s["errors_pending"] = read_records(o.out / "errors.jsonl").size();
  std::ofstream(o.out / "summary.json") << s.dump(2) << "\n";
  std::ofstream(o.out / "summary.md") << summary_markdown(s);
  if (run_python_module("opforge.agent_plots", {(o.out / "summary.json").string(), (o.out / "summary.png").string()}) != 0)
    spdlog::warn("the plot was not drawn (matplotlib missing?)");
}

}  // namespace

json run_agent(const AgentOptions& o) {
  OPFORGE_CHECK(o.max_turns >= 1 && o.concurrency >= 1, "--max-turns and --concurrency must be at least 1");
  fs::create_directories(o.out);
  auto tasks = prepare(o, o.out / "work");
  std::set<std::string> done;
  for (auto& r : read_records(o.out / "episodes.jsonl")) done.insert(r["task_id"].get<std::string>());
  fs::remove(o.out / "errors.jsonl");  // what failed last time is taken again now
  std::vector<EpisodeTask> todo;
  for (auto& t : tasks)
    if (!done.count(t.task_id)) todo.push_back(t);
  spdlog::info("agent: {} task(s), {} finished before, {} to run", tasks.size(), done.size(), todo.size());
  if (!todo.empty()) {
    std::unique_ptr<JudgeProcess> own;
    JudgeClient judge;
    judge.url = o.judge_url;
    if (!o.judge_token_env.empty() && std::getenv(o.judge_token_env.c_str())) judge.token = std::getenv(o.judge_token_env.c_str());
    if (judge.url.empty()) {
      own = std::make_unique<JudgeProcess>(o.tasks, o.device, o.judge_args, o.out / "judge");
      judge.url = own->url();
    }
    Progress bar("episodes", todo.size());
    Pool pool{o, judge, o.out};
    std::vector<std::thread> threads;
    for (int k = 0; k < std::min<int>(o.concurrency, static_cast<int>(todo.size())); ++k)
      threads.emplace_back([&] { pool.worker(todo, bar); });
    for (auto& th : threads) th.join();
    bar.finish();
    if (pool.fatal) std::rethrow_exception(pool.fatal);
  }
  write_summary(o);
  return json::parse(read_text(o.out / "summary.json"));
}

}  // namespace opforge::agent
