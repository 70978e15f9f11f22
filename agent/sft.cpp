// opforge agent sft (agent.h): the rejection-sampling fine-tuning set of CUDA Agent. An episode's
// first reward is the policy's claim; its final files are judged again by a judge of our own
// before the conversation is taught to anyone (a lucky timing, a flaky kernel or an edited record
// must not become a lesson).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "agent.h"
#include "judge_client.h"
#include "judge_process.h"
#include "tools.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/paths.h"
#include "opforge/core/progress.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge::agent {

using evaluator::JudgeClient;
using evaluator::JudgeProcess;

namespace {

// Folder -> task id, from the run's manifest (written by export, out of the agent's reach): a
// record's folder must be one of them, for the task the record names.
std::map<std::string, std::string> run_folders(const fs::path& run) {
  fs::path m = run / "work" / "manifest.json";
  OPFORGE_CHECK(fs::exists(m), "{} is missing: --trajectories must be the --out of an opforge agent run", m.string());
  std::map<std::string, std::string> out;
  json manifest = json::parse(read_text(m));  // kept alive: a range-for over parse(...)["tasks"] dangles
  for (auto& t : manifest["tasks"]) out[t["folder"].get<std::string>()] = t["task_id"].get<std::string>();
  return out;
}

bool well_formed(const json& r) {
  auto str = [&](const char* k) { return r.contains(k) && r[k].is_string(); };
  if (!r.is_object() || !str("folder") || !str("task_id") || !str("task") || !r.contains("messages") ||
      !r["messages"].is_array() || !r.contains("files") || !r["files"].is_object() || !r.contains("reward") ||
      !r["reward"].is_number_integer())
    return false;
  for (auto& m : r["messages"])
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return false;
  return true;
}

// Why a record is not a candidate, or "" when it is (before the second judgement).
std::string first_verdict(const json& r, const SftOptions& o, const std::map<std::string, std::string>& folders) {
  if (!well_formed(r)) return "incomplete_record";
  auto f = folders.find(r["folder"].get<std::string>());
  if (f == folders.end() || f->second != r["task_id"].get<std::string>()) return "not_this_runs_task";
  if (r["reward"].get<int>() < o.min_reward) return "below_min_reward";
  const json& final = r.contains("final") && r["final"].is_object() ? r["final"] : json::object();
  if (!final.value("flags", json::array()).empty()) return "flagged";
  if (o.max_failed_calls >= 0) {
    long failed = 0;
    for (auto& c : r.value("tool_calls", json::array())) failed += c.is_object() && !c.value("ok", true) ? 1 : 0;
    if (failed > o.max_failed_calls) return "failed_calls";
  }
  return "";
}

// The tasks of the candidates as the judge's --tasks: <folder>.py from the run's protected copies
// (what export wrote, out of the agent's reach), so a task is asked for by its folder's name.
fs::path write_tasks(const SftOptions& o, const std::vector<json>& cands) {
  fs::path dir = o.trajectories / "sft" / "tasks";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (auto& r : cands) {
    std::string folder = r["folder"];
    fs::path model = o.trajectories / "work" / ".protected" / folder / "model.py";
    OPFORGE_CHECK(fs::exists(model), "{} is missing: --trajectories must be the --out of an opforge agent run",
                  model.string());
    fs::copy_file(model, dir / (folder + ".py"), fs::copy_options::overwrite_existing);
  }
  return dir;
}

// The conversation as a chat record: up to the last assistant message (what follows it, the
// answer to submit, teaches nothing), with the tools it was offered.
json sft_record(const json& r, const json& row) {
  json msgs = r["messages"];
  while (!msgs.empty() && msgs.back().value("role", "") != "assistant") msgs.erase(msgs.size() - 1);
  return {{"messages", msgs}, {"tools", tool_definitions()}, {"task_id", r["task_id"]}, {"task", r["task"]},
          {"reward", r["reward"]}, {"rejudged_reward", row.value("reward", json())}, {"turns", r.value("turns", 0)},
          {"solution_hash", row.value("solution_hash", "")}};
}

// Each candidate's files judged again, K at a time (serve batches what arrives together).
std::vector<json> rejudge(const SftOptions& o, const std::vector<json>& cands) {
  JudgeProcess proc(write_tasks(o, cands), o.device, o.judge_args, o.trajectories / "sft" / "judge");
  JudgeClient judge;
  judge.url = proc.url();
  std::vector<json> rows(cands.size());
  std::atomic<std::size_t> next{0};
  Progress bar("rejudge", cands.size());
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < std::min<std::size_t>(8, cands.size()); ++k)
    threads.emplace_back([&] {
      for (std::size_t i; (i = next++) < cands.size();) {
        rows[i] = judge.evaluate_settled(cands[i]["folder"], cands[i]["files"]);
        bar.tick(1, fmt::format("{}: {}", cands[i]["task"].get<std::string>(), rows[i].value("reward", json()).dump()));
      }
    });
  for (auto& t : threads) t.join();
  bar.finish();
  for (std::size_t i = 0; i < rows.size(); ++i)
    OPFORGE_CHECK(!rows[i].value("retryable", false), "the judge failed while judging {} again ({}: {}): not the "
                  "solution's verdict; nothing was written, run again", cands[i]["task"].get<std::string>(),
                  rows[i].value("reason", ""), rows[i].value("detail", ""));
  return rows;
}

void write_outputs(const SftOptions& o, const std::vector<json>& kept) {
  fs::path parquet = o.parquet.empty() ? fs::path(o.out).replace_extension(".parquet") : o.parquet;
  with_context(fmt::format("while writing {}", o.out.string()), [&] {
    if (o.out.has_parent_path()) fs::create_directories(o.out.parent_path());
    std::ofstream f(o.out, std::ios::trunc);
    for (auto& r : kept) f << r.dump() << "\n";
    OPFORGE_CHECK(f.good(), "cannot write {}", o.out.string());
  });
  OPFORGE_CHECK(run_python_module("opforge.sft_parquet", {o.out.string(), parquet.string()}) == 0, "the parquet {} was not written (pyarrow in the venv? its error is "
                "above); the JSONL {} was", parquet.string(), o.out.string());
}

}  // namespace

json build_sft(const SftOptions& o) {
  auto records = read_records(o.trajectories / "episodes.jsonl");
  OPFORGE_CHECK(!records.empty(), "{} holds no episode: --trajectories must be the --out of an opforge agent run",
                (o.trajectories / "episodes.jsonl").string());
  std::map<std::string, long> dropped;
  std::vector<json> cands, kept;
  auto folders = run_folders(o.trajectories);
  for (auto& r : records) {
    std::string why = first_verdict(r, o, folders);
    if (why.empty()) cands.push_back(r); else ++dropped[why];
  }
  spdlog::info("agent sft: {} episode(s), {} with reward >= {} and no flag, judged again", records.size(), cands.size(),
               o.min_reward);
  std::vector<json> rows = cands.empty() ? std::vector<json>{} : rejudge(o, cands);
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const json& row = rows[i];
    json reason = row.value("reason", json("incorrect"));
    if (!row.value("correct", false)) ++dropped["rejudged_" + (reason.is_string() ? reason.get<std::string>() : "incorrect")];
    else if (!row.value("flags", json::array()).empty()) ++dropped["rejudged_flagged"];
    else if (json rw = row.value("reward", json()); !rw.is_number_integer() || rw.get<int>() < o.min_reward)
      ++dropped["rejudged_below_min_reward"];
    else kept.push_back(sft_record(cands[i], row));
  }
  write_outputs(o, kept);
  return {{"episodes", records.size()}, {"candidates", cands.size()}, {"kept", kept.size()}, {"dropped", dropped},
          {"min_reward", o.min_reward}, {"out", o.out.string()}};
}

}  // namespace opforge::agent
