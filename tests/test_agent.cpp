// opforge agent against a loopback OpenAI-compatible server that scripts each episode's turns
// (tool calls included), with the real judge (opforge serve, started by the agent) on the CPU.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <regex>
#include <thread>

#include "episode.h"
#include "opforge/core/files.h"
#include "test_support.h"
#include "tools.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace opforge;

namespace {

fs::path released() { return test::fixtures() / "eval" / "agent_released" / "linear_relu"; }

json call(const std::string& id, const std::string& name, const std::string& arguments) {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

json args(const json& a) { return a.dump(); }

json write_call(const std::string& id, const std::string& rel, const fs::path& from) {
  return call(id, "write_file", args({{"path", rel}, {"content", test::read_file(from)}}));
}

// The scripted turns of an episode: the n-th answer (0-based) to the task's conversation.
json linear_relu_turn(int n) {
  switch (n) {
    case 0:
      return json::array({call("a0", "read_file", args({{"path", "model.py"}})),
                          call("a4", "bash", args({{"command", "echo cwd=$(pwd) uid=$(id -u); ls model.py"}}))});
    case 1:  // three faults in one turn: each answered with an error, the episode goes on
      return json::array({call("a1", "compile_it", "{}"), call("a2", "write_file", "{not json"),
                          call("a3", "write_file", args({{"path", "model.py"}, {"content", "x = 1\n"}}))});
    case 2:
      return json::array({write_call("b0", "model_new.py", released() / "model_new.py"),
                          write_call("b1", "kernels/linear_relu.cpp", released() / "kernels" / "linear_relu.cpp"),
                          write_call("b2", "kernels/linear_relu.h", released() / "kernels" / "linear_relu.h"),
                          write_call("b3", "kernels/linear_relu_binding.cpp",
                                     released() / "kernels" / "linear_relu_binding.cpp"),
                          call("b4", "read_file", args({{"path", "../../etc/passwd"}}))});
    case 3: return json::array({call("c0", "bash", args({{"command", "echo started; sleep 60"}}))});
    case 4: return json::array({call("d0", "bash", args({{"command", "python3 utils/verification.py"}}))});
    default: return json::array({call("e0", "submit", "{}")});
  }
}

std::string chat(const json& calls, long prompt_tokens) {
  json msg = {{"role", "assistant"}, {"content", ""}, {"tool_calls", calls}};
  json body = {{"id", "x"}, {"object", "chat.completion"},
               {"choices", {{{"index", 0}, {"message", msg}, {"finish_reason", "tool_calls"}}}}};
  if (prompt_tokens > 0) body["usage"] = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", 10}};
  return body.dump();
}

// Answers by the conversation's task and its number of assistant turns so far; the first request
// of linear_relu's turn 4 is a 500 (the client retries it); softmax_sum reports a context past
// the budget at once; mean_degenerate waits while `hold` is set (the run is killed meanwhile).
class ScriptedLlm {
 public:
  ScriptedLlm() {
    setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    server_.set_keep_alive_timeout(1);
    server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      json body = json::parse(req.body);
      std::string user = body["messages"][1]["content"];
      int turn = 0;
      for (auto& m : body["messages"]) turn += m["role"] == "assistant";
      std::string task = user.find("`linear_relu`") != std::string::npos   ? "linear_relu"
                         : user.find("`softmax_sum`") != std::string::npos ? "softmax_sum"
                                                                           : "mean_degenerate";
      {
        std::lock_guard lock(mu_);
        ++requests_[task];
        if (task == "linear_relu" && turn == 4 && !failed_once_) {
          failed_once_ = true;
          res.status = 500;
          res.set_content("{\"error\": {\"message\": \"scripted overload\"}}", "application/json");
          return;
        }
        tools_seen_ = body.contains("tools") ? body["tools"].size() : 0;
      }
      while (task == "mean_degenerate" && hold) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (task == "softmax_sum") return res.set_content(chat(json::array({call("s0", "bash", args({{"command", "ls"}}))}), 500000), "application/json");
      if (task == "mean_degenerate") return res.set_content(chat(json::array({call("m0", "submit", "{}")}), 0), "application/json");
      res.set_content(chat(linear_relu_turn(turn), 1000 + 100 * turn), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~ScriptedLlm() {
    hold = false;
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  int requests(const std::string& task) {
    std::lock_guard lock(mu_);
    return requests_[task];
  }
  std::atomic<bool> hold{false};
  std::size_t tools_seen_ = 0;

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::map<std::string, int> requests_;
  bool failed_once_ = false;
};

std::vector<std::string> agent_args(const ScriptedLlm& llm, const fs::path& tasks, const fs::path& out) {
  return {"agent", "--tasks", tasks.string(), "--out", out.string(), "--llm-url", llm.url(), "--llm-model", "scripted",
          "--device", "cpu", "--bash-timeout-s", "2", "--max-context-tokens", "100000", "--concurrency", "2",
          "--judge-arg=--cache-dir", "--judge-arg=" + test::eval_cache_dir().string(), "--judge-arg=--trials",
          "--judge-arg=5", "--judge-arg=--budget-s", "--judge-arg=1", "--judge-arg=--correct-trials", "--judge-arg=2"};
}

std::map<std::string, json> episodes(const fs::path& out) {
  std::map<std::string, json> by_task;
  std::istringstream lines(test::read_file(out / "episodes.jsonl"));
  for (std::string l; std::getline(lines, l);) {
    json j = json::parse(l);
    by_task[j["task"]] = j;
  }
  return by_task;
}

json tool_log(const json& ep, const std::string& id) {
  for (auto& c : ep["tool_calls"])
    if (c["id"] == id) return c;
  return json();
}

std::vector<std::string> sft_args(const fs::path& run, const fs::path& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"agent", "sft", "--trajectories", run.string(), "--out", out.string(), "--device", "cpu",
                                "--judge-arg=--cache-dir", "--judge-arg=" + test::eval_cache_dir().string(),
                                "--judge-arg=--trials", "--judge-arg=5", "--judge-arg=--budget-s", "--judge-arg=1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The SFT set of a finished run: the honest episode is kept after a judgement of its own; the
// two at -1 are not; a record whose files were swapped for a hack afterwards (its reward still
// claiming 2) is judged again and dropped. TRL's SFTTrainer reads the parquet and trains a step.
void check_sft(const fs::path& d, const json& honest) {
  json forged = honest;
  forged["reward"] = 2;
  forged["files"] = {{"model_new.py", test::read_file(test::fixtures() / "eval" / "hacks" / "returns_input.py")}};
  json astray = honest;  // a folder outside the run's: neither read nor written, not judged
  astray["folder"] = "../../elsewhere";
  std::ofstream(d / "out" / "episodes.jsonl", std::ios::app) << forged.dump() << "\n" << astray.dump() << "\n";
  auto r = test::run_opforge(sft_args(d / "out", d / "sft" / "rft.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json tally = json::parse(r.out);
  EXPECT_EQ(tally["episodes"], 5);
  EXPECT_EQ(tally["dropped"]["not_this_runs_task"], 1) << tally.dump();
  EXPECT_FALSE(fs::exists(d.parent_path() / "elsewhere.py"));
  EXPECT_EQ(tally["kept"], 1) << tally.dump();
  EXPECT_EQ(tally["dropped"]["below_min_reward"], 2) << tally.dump();
  long rejudged = 0;  // the hack's file in a folder's model_new.py does not build there: compile_error
  for (auto& [why, n] : tally["dropped"].items()) rejudged += why.rfind("rejudged_", 0) == 0 ? n.get<long>() : 0;
  EXPECT_EQ(rejudged, 1) << "the swapped files were judged, not the claim: " << tally.dump();
  json rec = json::parse(test::read_file(d / "sft" / "rft.jsonl"));
  EXPECT_EQ(rec["task"], "linear_relu");
  EXPECT_GE(rec["rejudged_reward"].get<int>(), 1);
  EXPECT_EQ(rec["tools"].size(), 4u);
  EXPECT_EQ(rec["messages"].back()["role"], "assistant") << "the record ends on the model's turn";
  EXPECT_EQ(rec["messages"].size() + 1, honest["messages"].size()) << "only the answer to submit is cut";
  ASSERT_TRUE(fs::exists(d / "sft" / "rft.parquet"));
  auto [rc, out] = test::shell(test::python_bin().string() + " " +
                               (test::fixtures().parent_path() / "python" / "sft_check.py").string() + " " +
                               (d / "sft" / "rft.parquet").string() + " " + (d / "sft" / "trl").string() + " 2>&1");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("{\"rows\": 1, \"steps\": 1, \"rendered\": true"), std::string::npos) << out;
  // The episode's refused calls (unknown tool, bad arguments, a hung command) can rule it out.
  auto strict = test::run_opforge(sft_args(d / "out", d / "sft" / "strict.jsonl", {"--max-failed-calls", "0"}));
  ASSERT_EQ(strict.exit_code, 0) << strict.err;
  EXPECT_EQ(json::parse(strict.out)["dropped"]["failed_calls"], 2) << strict.out;
}

}  // namespace

TEST(Agent, ScriptedEpisodesEarnTheJudgesRewardThroughFaultsAKilledRunResumesAndTheSftSetIsJudgedAgain) {
  test::TempDir d;
  fs::create_directories(d / "tasks");
  for (auto t : {"linear_relu", "softmax_sum", "mean_degenerate"})
    fs::copy_file(test::fixtures() / "eval" / "tasks" / (std::string(t) + ".py"), d / "tasks" / (std::string(t) + ".py"));
  ScriptedLlm llm;
  llm.hold = true;
  // First run: killed while mean_degenerate waits for its answer, after the other two finished.
  pid_t pid = test::spawn_opforge_to(agent_args(llm, d / "tasks", d / "out"), d / "out1.txt", d / "err1.txt");
  bool two = false;
  for (int i = 0; i < 6000 && !two; ++i) {
    if (fs::exists(d / "out" / "episodes.jsonl")) two = episodes(d / "out").size() == 2;
    if (waitpid(pid, nullptr, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  ASSERT_TRUE(two) << test::read_file(d / "err1.txt");
  auto eps = episodes(d / "out");
  const json& a = eps["linear_relu"];
  EXPECT_EQ(a["ended"], "submitted");
  EXPECT_GE(a["reward"].get<int>(), 1) << a["final"].dump();
  EXPECT_EQ(a["turns"], 6);
  EXPECT_EQ(llm.tools_seen_, 4u) << "bash, read_file, write_file, submit in every request";
  EXPECT_NE(tool_log(a, "a0")["ok"], false);
  std::string shell0;
  for (auto& m : a["messages"])
    if (m["role"] == "tool" && m["tool_call_id"] == "a4") shell0 = m["content"];
  EXPECT_NE(shell0.find("cwd=/work uid=65534\nmodel.py\n[exit 0]"), std::string::npos)
      << "bash runs in the sandbox, in the folder, as nobody: " << shell0;
  for (auto id : {"a1", "a2", "a3", "b4"}) EXPECT_EQ(tool_log(a, id)["ok"], false) << id << " is a faulty call";
  EXPECT_TRUE(tool_log(a, "c0")["detail"]["timed_out"].get<bool>()) << "a hung command is killed at its limit";
  EXPECT_EQ(tool_log(a, "d0")["detail"]["judge_requests"], 1) << "the verification script reached the judge";
  std::string verify;
  for (auto& m : a["messages"])
    if (m["role"] == "tool" && m["tool_call_id"] == "d0") verify = m["content"];
  EXPECT_NE(verify.find("correct: yes"), std::string::npos) << verify;
  // What the folder's script sent is what the final evaluation judged: nothing of the host (a
  // read-only path under /work once appeared inside the folder) came along.
  EXPECT_EQ(tool_log(a, "d0")["detail"]["judged"][0]["solution_hash"], a["final"]["solution_hash"]);
  EXPECT_EQ(a["final"]["flags"], json::array()) << a["final"].dump();
  EXPECT_EQ(a["tokens"]["estimated"], false);
  const json& s = eps["softmax_sum"];
  EXPECT_EQ(s["ended"], "context_budget");
  EXPECT_EQ(s["turns"], 1);
  EXPECT_EQ(s["reward"], -1) << "the starting folder has no kernel: " << s["final"].dump();
  int before = llm.requests("linear_relu") + llm.requests("softmax_sum");

  // Second run, same --out: only the killed episode runs; the finished ones are not asked again.
  llm.hold = false;
  auto r = test::run_opforge(agent_args(llm, d / "tasks", d / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(llm.requests("linear_relu") + llm.requests("softmax_sum"), before);
  eps = episodes(d / "out");
  ASSERT_EQ(eps.size(), 3u);
  EXPECT_EQ(eps["mean_degenerate"]["ended"], "submitted");
  json sum = json::parse(test::read_file(d / "out" / "summary.json"));
  EXPECT_EQ(sum["episodes"], 3);
  EXPECT_NE(r.out.find("| episodes | 3 |"), std::string::npos) << r.out;
  check_sft(d.path(), eps["linear_relu"]);
}

TEST(Agent, TheFolderIsReadWithinTheJudgesLimitsAndPastThemTheEpisodeGetsMinusOne) {
  // The agent owns its folder: a huge file or a flood of files must end as the episode's -1
  // (bad_submission, not judged), never as a run that reads gigabytes or crashes.
  test::TempDir d;
  for (auto* f : {"model.py", "SKILL.md", "utils/verification.py", ".hidden", "__pycache__/m.pyc", "kernels/k.o"})
    test::write_file(d / f, "skipped");
  test::write_file(d / "model_new.py", "class ModelNew: pass\n");
  test::write_file(d / "kernels" / "k.cu", "// kernel\n");
  auto ok = agent::solution_files(d.path());
  EXPECT_EQ(ok.problem, "");
  EXPECT_EQ(ok.files, (json{{"model_new.py", "class ModelNew: pass\n"}, {"kernels/k.cu", "// kernel\n"}}));

  test::write_file(d / "kernels" / "big.cu", std::string(2 << 20, 'x'));
  auto big = agent::solution_files(d.path());
  EXPECT_NE(big.problem.find("bytes"), std::string::npos) << big.problem;
  fs::remove(d / "kernels" / "big.cu");
  for (int i = 0; i < 12; ++i) test::write_file(d / "kernels" / ("k" + std::to_string(i) + ".h"), "//\n");
  auto many = agent::solution_files(d.path(), 1 << 20, 10);
  EXPECT_NE(many.problem.find("10 files"), std::string::npos) << many.problem;
  for (int i = 0; i < 12; ++i) fs::remove(d / "kernels" / ("k" + std::to_string(i) + ".h"));
  test::write_file(d / "kernels" / "blob.bin", std::string("ok\xff\xfe", 4));
  EXPECT_NE(agent::solution_files(d.path()).problem.find("not UTF-8"), std::string::npos);
  EXPECT_EQ(valid_utf8(std::string("a\xff\xe2\x82", 4) + "\xe2\x82\xac"), "a\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xe2\x82\xac")
      << "each stray byte one U+FFFD, a whole sequence kept";

  agent::EpisodeTask t{"id", "task", "folder", "code", d.path()};
  evaluator::JudgeClient nowhere{"http://127.0.0.1:9", "", 1, 1};
  json row = agent::final_row(t, nowhere, many);
  EXPECT_EQ(row["reward"], -1);
  EXPECT_EQ(row["reason"], "bad_submission") << row.dump();
}
