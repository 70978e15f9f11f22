// opforge serve on loopback (CPU): the real binary, real judge workers and sandboxed children,
// spoken to over HTTP with cpp-httplib's client.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace opforge;

namespace {

fs::path eval_fx() { return test::fixtures() / "eval"; }

// One `opforge serve` process over fixtures/eval/tasks, stopped (SIGTERM) at the end.
class Server {
 public:
  // own_cache: a cache of its own (no baseline measured before), not the one the tests share.
  explicit Server(std::vector<std::string> extra, bool own_cache = false) {
    std::string cache = own_cache ? (dir_ / "cache").string() : test::eval_cache_dir().string();
    std::vector<std::string> args = {"serve", "--tasks", (eval_fx() / "tasks").string(), "--port", "0", "--device",
                                     "cpu", "--cache-dir", cache, "--state-dir",
                                     (dir_ / "state").string(), "--trials", "5", "--budget-s", "1",
                                     "--correct-trials", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = test::spawn_opforge_to(args, dir_ / "out", dir_ / "err");
    std::smatch m;
    for (int i = 0; i < 1200 && port_ == 0; ++i) {  // warm workers import torch first
      std::string out = test::read_file(dir_ / "out");
      if (std::regex_search(out, m, std::regex("listening on http://127.0.0.1:(\\d+)"))) port_ = std::stoi(m[1]);
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (port_ == 0) ADD_FAILURE() << "serve did not start: " << test::read_file(dir_ / "err");
  }
  ~Server() {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(300, 0);
    return c;
  }
  std::pair<int, json> post(const std::string& path, const json& body) const {
    auto r = client().Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  json get(const std::string& path) const {
    auto r = client().Get(path.c_str());
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  std::string log() const { return test::read_file(dir_ / "err"); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  test::TempDir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

json solution(const std::string& task, const fs::path& file) {
  return {{"task_id", task}, {"solution_code", test::read_file(file)}};
}

}  // namespace

TEST(Serve, BadRequestsAre400AndAnUnknownTaskIsRetryable) {
  Server s({});
  auto c = s.client();
  auto r = c.Post("/v1/evaluate", "not json", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  auto [st1, b1] = s.post("/v1/evaluate", {{"task_id", 3}});
  EXPECT_EQ(st1, 400);
  EXPECT_EQ(b1["field"], "task_id");
  auto [st2, b2] = s.post("/v1/evaluate", {{"task_id", "linear_relu"}, {"files", {{"../model_new.py", "x"}}}});
  EXPECT_EQ(st2, 400);
  EXPECT_EQ(b2["field"], "files");
  auto [st3, b3] = s.post("/v1/evaluate", {{"task_id", "linear_relu"}, {"solution_code", "x"}, {"files", {{"a", "b"}}}});
  EXPECT_EQ(st3, 400);
  auto [st4, b4] = s.post("/v1/evaluate", {{"task_id", "no_such_task"}, {"solution_code", "x"}});
  EXPECT_EQ(st4, 404);
  EXPECT_TRUE(b4["reward"].is_null());
  EXPECT_TRUE(b4["retryable"].get<bool>());
  EXPECT_EQ(b4["reason"], "unknown_task");
  json m = s.get("/metrics");
  EXPECT_EQ(m["counts"]["bad_requests"], 4) << m.dump();
  EXPECT_EQ(s.get("/healthz")["judge"], "judge-15");
  // A file that is also another's folder cannot be written: refused, not a failure of the batch.
  auto [st5, b5] = s.post("/v1/evaluate", {{"task_id", "linear_relu"},
                                           {"files", {{"model_new.py", "x"}, {"kernels", "y"}, {"kernels/a.cu", "z"}}}});
  EXPECT_EQ(st5, 400);
  EXPECT_EQ(b5["field"], "files");
}

// A GRPO group: the same completion several times is judged once; a hack is -1 with its reason;
// the OpenRLHF contract answers from the same verdicts.
TEST(Serve, JudgesABatchOnceAndAnswersRepeatsFromTheCache) {
  Server s({});
  json honest = solution("linear_relu", eval_fx() / "solutions" / "linear_relu.py");
  json hack = solution("linear_relu", eval_fx() / "hacks" / "returns_input.py");
  auto [st, b] = s.post("/v1/evaluate_batch", {{"requests", {honest, hack, honest, {{"task_id", 1}}}}});
  ASSERT_EQ(st, 200) << s.log();
  auto& res = b["results"];
  ASSERT_EQ(res.size(), 4u);
  EXPECT_GE(res[0]["reward"].get<int>(), 1) << res[0].dump();
  EXPECT_FALSE(res[0]["retryable"].get<bool>());
  EXPECT_EQ(res[1]["reward"], -1);
  EXPECT_EQ(res[1]["reason"], "aliases_input");
  EXPECT_EQ(res[2]["reward"], res[0]["reward"]);
  EXPECT_EQ(res[3]["status"], 400);
  auto [st2, again] = s.post("/v1/evaluate", honest);
  EXPECT_EQ(st2, 200);
  EXPECT_TRUE(again.value("cached", false));
  std::string prompt = "Write ModelNew for linear_relu.\n";
  json q = {{"query", {prompt + "Here it is:\n```python\n" + honest["solution_code"].get<std::string>() + "```\n"}},
            {"prompts", {prompt}}, {"labels", {"linear_relu"}}};
  auto [st3, o] = s.post("/openrlhf", q);
  ASSERT_EQ(st3, 200) << o.dump();
  EXPECT_EQ(o["rewards"][0], res[0]["reward"]);
  EXPECT_DOUBLE_EQ(o["scores"][0].get<double>(), (res[0]["reward"].get<double>() + 1) / 4);
  json m = s.get("/metrics");
  EXPECT_EQ(m["counts"]["evaluated"], 2) << m.dump();  // honest and hack; the rest were repeats
  EXPECT_GE(m["counts"]["cache_hits"].get<int>() + m["counts"].value("joined_in_flight", 0), 3);
  // TRL's GRPOTrainer, two steps of a tiny random policy rewarded through opforge_rl.trl: its
  // completions hold no code, so the empty solution is judged once (no_model_new) and then cached.
  test::TempDir grpo;
  auto [grc, gout] = test::shell(test::python_bin().string() + " " +
                                 (test::fixtures().parent_path() / "python" / "grpo_two_steps.py").string() + " " +
                                 s.url() + " linear_relu " + grpo.path().string() + " 2>&1");
  ASSERT_EQ(grc, 0) << gout << s.log();
  EXPECT_NE(gout.find("{\"steps\": 2, \"rewards\": [-1.0, -1.0]}"), std::string::npos) << gout;
  json gm = s.get("/metrics");
  EXPECT_EQ(gm["counts"]["evaluated"], 3) << gm.dump();
  EXPECT_EQ(gm["reasons"].value("no_model_new", 0), 1) << gm.dump();
  EXPECT_GE(gm["counts"].value("requests_batch", 0), 2) << gm.dump();
  // The RL adapters (python/opforge_rl) on the same verdicts: all of them answered from the cache.
  auto [rc, out] = test::shell(test::python_bin().string() + " " +
                               (test::fixtures().parent_path() / "python" / "serve_adapters_check.py").string() + " " +
                               s.url() + " linear_relu " + (eval_fx() / "solutions" / "linear_relu.py").string() + " " +
                               (eval_fx() / "hacks" / "returns_input.py").string() + " 2>&1");
  EXPECT_EQ(rc, 0) << out << s.log();
  EXPECT_EQ(s.get("/metrics")["counts"]["evaluated"], 3);
}

// An honest answer to linear_relu in plain torch: correct under torch-allowed with no extension
// to build, so nothing of its own can outlast a hang's limit, whatever the build cache holds.
json plain_torch_linear_relu() {
  return {{"task_id", "linear_relu"},
          {"solution_code",
           "import torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass ModelNew(nn.Module):\n"
           "    def __init__(self, in_features, out_features):\n        super().__init__()\n"
           "        self.linear = nn.Linear(in_features, out_features)\n\n"
           "    def forward(self, x):\n        return F.relu(self.linear(x))\n"}};
}

// Answers leave one by one: an honest answer sent beside a hang (same moment, most likely the
// same batch) comes back while the hang still runs, and the hang is then `timeout`. (Batches that
// answered together made every answer wait for the slowest, up to --timeout-s.)
TEST(Serve, AnAnswerDoesNotWaitForASlowerOne) {
  // Untimed and torch-allowed, the honest answer plain torch: no build or baseline of its own
  // may take longer than the hang's limit, whatever the build cache holds.
  Server s({"-j", "2", "--timeout-s", "30", "--untimed", "--policy", "torch-allowed"});
  json hang = solution("linear_relu", test::fixtures() / "serve" / "hang.py");
  json honest = plain_torch_linear_relu();
  auto slow = std::async(std::launch::async, [&] { return s.post("/v1/evaluate", hang); });
  auto fast = std::async(std::launch::async, [&] { return s.post("/v1/evaluate", honest); });
  auto [st, a] = fast.get();
  ASSERT_EQ(st, 200) << s.log();
  EXPECT_EQ(a["reward"], 1) << a.dump();
  EXPECT_EQ(slow.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the honest answer waited for the hang: " << s.log();
  auto [st2, h] = slow.get();
  ASSERT_EQ(st2, 200) << s.log();
  EXPECT_EQ(h["reason"], "timeout") << h.dump();
  EXPECT_EQ(h["reward"], -1);
}

// A task's baselines are timed with no solution in flight, as when batches ran one at a time: a
// solution's child alive beside them (here one that never returns) could load the machine while
// eager and torch.compile are timed, and the inflated times, cached for the task code, would pay
// every later copy of the task 2 or 3. So the honest answer, whose baselines are new (the server
// has a cache of its own), waits for the hang to be over before they are timed.
TEST(Serve, BaselinesAreTimedWithNoSolutionInFlight) {
  Server s({"-j", "2", "--timeout-s", "20", "--policy", "torch-allowed"}, true);
  json hang = solution("linear_relu", test::fixtures() / "serve" / "hang.py");
  json honest = plain_torch_linear_relu();
  auto slow = std::async(std::launch::async, [&] { return s.post("/v1/evaluate", hang); });
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the hang's batch first, the honest one after
  auto [st, h] = s.post("/v1/evaluate", honest);
  ASSERT_EQ(st, 200) << s.log();
  EXPECT_GE(h["reward"].get<int>(), 1) << h.dump(2);
  EXPECT_FALSE(h["eager_ms"].is_null()) << "baselines measured: " << h.dump(2);
  EXPECT_EQ(slow.get().second["reason"], "timeout");
  std::string log = s.log();
  auto hang_left = log.find("b0s0 timeout"), timed = log.find("with no solution in flight");
  ASSERT_NE(hang_left, std::string::npos) << log;
  ASSERT_NE(timed, std::string::npos) << log;
  EXPECT_LT(hang_left, timed) << "the baselines were timed while the hang was in flight: " << log;
}

// As in eval: a verdict of memory made while the two judge workers shared the machine (the hog
// handed out while the honest answer was in flight) is judged again alone before it is answered.
TEST(Serve, AVerdictOfMemoryMadeBesideAnotherIsJudgedAgainAlone) {
  Server s({"-j", "2", "--child-memory-mb", "2048", "--untimed", "--policy", "torch-allowed"});
  json honest = solution("linear_relu", eval_fx() / "solutions" / "linear_relu.py");
  json hog = solution("linear_relu", eval_fx() / "adaptive" / "memory_hog.py");
  auto [st, b] = s.post("/v1/evaluate_batch", {{"requests", {honest, hog}}});
  ASSERT_EQ(st, 200) << s.log();
  json h = b["results"][1];
  EXPECT_EQ(h["reward"], -1) << h.dump(2);
  EXPECT_EQ(h["reason"], "out_of_memory") << h.dump(2);
  ASSERT_TRUE(h.contains("attempts")) << h.dump(2);
  EXPECT_EQ(h["attempts"][0]["how"], "shared");
  EXPECT_EQ(h["attempts"][1]["how"], "alone");
  EXPECT_EQ(b["results"][0]["reward"], 1) << b["results"][0].dump(2);
  EXPECT_NE(s.log().find("judging each again alone"), std::string::npos) << s.log();
}

// A bounded load (tests/python/serve_load.py): 200 requests from 16 clients, four distinct
// evaluations (honest, hack, two hangs) into a queue of 3, then bad requests, unknown tasks,
// repeats and health checks. No request is lost; each hang is `timeout`, answered within what the
// batch ahead of it and its own limit take; the full queue answers 429 with Retry-After; bad
// requests are 400 naming their field; an unknown task is retryable with no reward.
TEST(Serve, UnderLoadNoRequestIsLostAndHangsTimeOut) {
  Server s({"--queue", "3", "--timeout-s", "6"});
  auto [rc, out] = test::shell(test::python_bin().string() + " " +
                               (test::fixtures().parent_path() / "python" / "serve_load.py").string() + " " +
                               s.url() + " linear_relu " + (eval_fx() / "solutions" / "linear_relu.py").string() + " " +
                               (eval_fx() / "hacks" / "returns_input.py").string() + " " +
                               (test::fixtures() / "serve" / "hang.py").string() + " 6 2>&1");
  EXPECT_EQ(rc, 0) << out << s.log();
  json m = s.get("/metrics");
  EXPECT_EQ(m["counts"]["evaluated"], 4) << m.dump();  // the repeats were joined or cached
  EXPECT_EQ(m["reasons"].value("timeout", 0), 2) << m.dump();
  EXPECT_GT(m["counts"].value("rejected_queue_full", 0), 0) << m.dump();
}

// The agent's working folder (opforge env export): its utils/ scripts ask this service about the
// folder's files and print what the agent acts on; CUDA Agent's released layout, CPU build.
TEST(Serve, AnExportedWorkingFolderIsJudgedThroughItsUtilsScripts) {
  Server s({});
  test::TempDir d;
  auto r = test::run_opforge({"env", "export", "--tasks", (eval_fx() / "tasks").string(), "--out", d.path().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  fs::path w = d / "linear_relu", sol = eval_fx() / "agent_released" / "linear_relu";
  fs::copy_file(sol / "model_new.py", w / "model_new.py", fs::copy_options::overwrite_existing);
  fs::copy(sol / "kernels", w / "kernels", fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  auto in_folder = [&](const std::string& cmd, bool with_url = true) {
    return test::shell("cd " + w.string() + " && " + (with_url ? "OPFORGE_SERVE_URL=" + s.url() + " " : "") +
                       "PATH=" + test::python_bin().parent_path().string() + ":$PATH " + cmd + " 2>&1");
  };
  auto [vrc, verified] = in_folder("python3 utils/verification.py");
  EXPECT_EQ(vrc, 0) << verified << s.log();
  EXPECT_NE(verified.find("compiled: yes\ncorrect: yes (max error"), std::string::npos) << verified;
  auto [prc, profiled] = in_folder("python3 utils/profiling.py");
  EXPECT_EQ(prc, 0) << profiled;
  EXPECT_NE(profiled.find("ModelNew "), std::string::npos) << profiled;
  // Correct, so at least 1; how fast naive loops are against the baselines depends on the host's load.
  EXPECT_TRUE(std::regex_search(profiled, std::regex("\nreward [123] \\(-1 wrong"))) << profiled;
  test::write_file(w / "kernels" / "broken_binding.cpp", "int broken( { return 0; }\n");
  auto [crc, compiled] = in_folder("bash utils/compile.sh");
  EXPECT_EQ(crc, 1) << compiled;
  EXPECT_NE(compiled.find("compiled: no"), std::string::npos) << compiled;
  EXPECT_NE(compiled.find("broken_binding.cpp"), std::string::npos) << "the compiler's error names the file: " << compiled;
  auto [nrc, no_url] = in_folder("python3 utils/verification.py", false);
  EXPECT_NE(nrc, 0);
  EXPECT_NE(no_url.find("OPFORGE_SERVE_URL is not set"), std::string::npos) << no_url;
  json m = s.get("/metrics");
  EXPECT_EQ(m["counts"]["evaluated"], 2) << m.dump();  // the profile was the verification's verdict, cached
}
