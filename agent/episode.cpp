// One ReAct episode (episode.h): ask the model, run the tools it calls, tell it what they said,
// until it submits, stops calling tools, or runs out of turns or context.
#include "episode.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "env.h"
#include "opforge/core/files.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace opforge::agent {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Tokens {
  long prompt = 0, completion = 0, context = 0;
  bool estimated = false;
  json to_json() const {
    return {{"prompt", prompt}, {"completion", completion}, {"context", context}, {"estimated", estimated}};
  }
};

// The context the next request carries: the endpoint's usage when it reports one, else ~4
// characters a token over the whole conversation (and the record says it is an estimate).
void count(Tokens& tk, const llm::LlmResponse& r, const json& messages) {
  if (r.prompt_tokens > 0) {
    tk.prompt += r.prompt_tokens;
    tk.completion += r.completion_tokens;
    tk.context = r.prompt_tokens + r.completion_tokens;
    return;
  }
  tk.estimated = true;
  tk.context = static_cast<long>(messages.dump().size() / 4);
}

std::string user_prompt(const EpisodeTask& t) {
  return fmt::format(
      "Task `{}` (id {}). Your working folder holds model.py (the task), SKILL.md (how you are judged: read it), "
      "a starting model_new.py, binding.cpp, binding_registry.h, kernels/ and utils/. Write a faster ModelNew with "
      "your own kernels, check it with the utils scripts, and call submit when you are done.",
      t.name, t.task_id);
}

// The assistant's message as it goes back into the conversation: role, text, tool calls.
json assistant_message(const llm::LlmResponse& r) {
  json m = {{"role", "assistant"}, {"content", r.content}};
  if (r.message.contains("tool_calls") && r.message["tool_calls"].is_array()) m["tool_calls"] = r.message["tool_calls"];
  return m;
}

struct Call {
  std::string id, name, arguments;
};

std::vector<Call> tool_calls(const json& message) {
  std::vector<Call> calls;
  for (auto& c : message.value("tool_calls", json::array())) {
    json fn = c.is_object() ? c.value("function", json::object()) : json::object();
    std::string args = fn.contains("arguments") && fn["arguments"].is_string() ? fn["arguments"].get<std::string>()
                       : fn.contains("arguments")                            ? fn["arguments"].dump()
                                                                               : "";
    calls.push_back({c.is_object() ? c.value("id", "") : "", fn.value("name", ""), args});
  }
  return calls;
}

struct State {
  json messages, log = json::array();
  json policy = json::array();  // each turn's exact tokens, when the endpoint is opforge's policy server
  Tokens tokens;
  int turns = 0;
  std::string ended;
};

// Runs the turn's tool calls, appending their answers; true when one was submit.
bool run_calls(const ToolContext& tools, const std::vector<Call>& calls, State& s) {
  bool submitted = false;
  for (auto& c : calls) {
    auto t0 = Clock::now();
    ToolOutcome out = submitted ? ToolOutcome{"error: the episode was submitted; this call was not run", false}
                                : call_tool(tools, c.name, c.arguments);
    double secs = since(t0);
    // A command's output or a file read is whatever bytes the folder holds: made JSON-safe here,
    // or one byte of a binary would stop the whole run at the next request.
    out.content = valid_utf8(out.content);
    submitted = submitted || out.submit;
    s.messages.push_back({{"role", "tool"}, {"tool_call_id", c.id}, {"content", out.content}});
    s.log.push_back({{"turn", s.turns}, {"id", c.id}, {"name", c.name}, {"arguments", c.arguments}, {"ok", out.ok},
                     {"seconds", secs}, {"result_chars", out.content.size()}, {"detail", out.detail}});
  }
  return submitted;
}

// Asks the model once; an answer that never came is the endpoint's failure, not the episode's.
llm::LlmResponse ask(llm::LlmClient& llm, const State& s) {
  llm::LlmRequest req;
  req.messages = s.messages;
  req.tools = tool_definitions();
  auto r = llm.complete({req})[0];
  if (!r.ok) throw EpisodeAborted("llm_" + r.reason, r.detail);
  return r;
}

}  // namespace

json final_row(const EpisodeTask& t, const JudgeClient& judge, const SolutionFiles& sol) {
  if (!sol.problem.empty()) return {{"reward", -1}, {"correct", false}, {"reason", "bad_submission"}, {"detail", sol.problem}};
  const json& files = sol.files;
  auto changed = changed_protected(t.work, t.folder);
  if (!changed.empty())
    return {{"reward", -1}, {"correct", false}, {"reason", "protected_files_changed"},
            {"detail", fmt::format("changed: {}; a folder whose protected files changed is not judged",
                                   fmt::join(changed, ", "))}};
  json row = judge.evaluate_settled(t.task_id, files);
  if (!row.value("retryable", false)) return row;
  throw EpisodeAborted("judge_" + row.value("reason", std::string("failed")), row.value("detail", std::string()));
}

json run_episode(const AgentOptions& o, const EpisodeTask& t, llm::LlmClient& llm, const JudgeClient& judge,
                 const ToolContext& tools, const std::string& system_prompt) {
  auto t0 = Clock::now();
  State s;
  s.messages = json::array({{{"role", "system"}, {"content", system_prompt}}, {{"role", "user"}, {"content", user_prompt(t)}}});
  while (s.ended.empty()) {
    if (s.turns >= o.max_turns) { s.ended = "max_turns"; break; }
    llm::LlmResponse r = ask(llm, s);
    ++s.turns;
    if (r.tokens.is_object()) s.policy.push_back(r.tokens);
    s.messages.push_back(assistant_message(r));
    count(s.tokens, r, s.messages);
    auto calls = tool_calls(r.message);
    if (calls.empty()) { s.ended = "no_tool_call"; break; }
    if (run_calls(tools, calls, s)) { s.ended = "submitted"; break; }
    if (s.tokens.context > o.max_context_tokens) s.ended = "context_budget";
  }
  spdlog::info("episode {}: {} after {} turn(s); judging the folder", t.name, s.ended, s.turns);
  SolutionFiles files = solution_files(t.work / t.folder);
  json row = final_row(t, judge, files);
  json rec = {{"task_id", t.task_id}, {"task", t.name}, {"folder", t.folder}, {"ended", s.ended}, {"turns", s.turns},
              {"tokens", s.tokens.to_json()}, {"reward", row.value("reward", json(nullptr))},
              {"reason", row.value("reason", json(nullptr))}, {"final", row}, {"seconds", since(t0)},
              {"tool_calls", s.log}, {"messages", s.messages}, {"files", files.files}};
  // What multi-turn PPO learns from (trainer/README.md): every turn's prompt and answer ids and
  // the answer's log-probabilities, as the policy server sampled them.
  if (!s.policy.empty()) rec["policy_tokens"] = s.policy;
  return rec;
}

}  // namespace opforge::agent
