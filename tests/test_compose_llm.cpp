// `opforge compose --backend llm` end to end: the real binary against a loopback OpenAI-compatible
// server (cpp-httplib) in the test process that answers with tasks, prose, a block without
// `class Model`, a duplicate, one HTTP 500, or a 401 for a wrong key.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "opforge/core/store.h"
#include "test_support.h"

using namespace opforge;
using nlohmann::json;

namespace {

// A few torch ops of several layouts: enough to build prompts from, and fast to crawl.
const char* kMatch = "^torch\\.(nn\\.(ReLU|GELU|Conv2d|BatchNorm2d)|abs|exp|tanh)$";
const char* kKeyEnv = "OPFORGE_TEST_COMPOSE_LLM_KEY";
const char* kGoodKey = "sk-compose-test-good";
constexpr int kCount = 12;
constexpr long kPromptTokens = 100, kCompletionTokens = 50;

// A valid KernelBench task; `n` makes each one distinct after normalisation.
std::string task_code(int n) {
  return "import torch\nimport torch.nn as nn\n\nbatch_size = 16\nfeatures = 64\nscale = " + std::to_string(n) +
         "\n\n\nclass Model(nn.Module):\n    def __init__(self, features, scale):\n        super().__init__()\n"
         "        self.linear = nn.Linear(features, features)\n        self.scale = scale\n\n"
         "    def forward(self, x):\n        return torch.relu(self.linear(x)) * self.scale\n\n\n"
         "def get_inputs():\n    return [torch.randn(batch_size, features)]\n\n\n"
         "def get_init_inputs():\n    return [features, scale]\n";
}

std::string chat_body(const std::string& content) {
  return json{{"id", "chatcmpl-test"},
              {"object", "chat.completion"},
              {"model", "test-model"},
              {"choices",
               {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", content}}}, {"finish_reason", "stop"}}}},
              {"usage", {{"prompt_tokens", kPromptTokens}, {"completion_tokens", kCompletionTokens}}}}
      .dump();
}

// The scripted endpoint. The very first request gets a 500 (the client retries it); the n-th
// answer after that (1-based) is: prose without a code block when n % 4 == 0, a Python block
// without `class Model` when n == 6, the same task as answer 9 when n == 10, else task_code(n).
// For kCount requests that is 3 no_code_block, 1 no_model_class, 1 duplicate and 7 tasks,
// whichever request gets which answer. A wrong or missing key gets OpenAI's 401.
class ScriptedLlm {
 public:
  ScriptedLlm() {
    // A proxy configured on the machine must not swallow requests to loopback (children inherit).
    setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    setenv("no_proxy", "127.0.0.1,localhost", 1);
    server_.set_keep_alive_timeout(1);
    server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      int hit = ++hits_;
      {
        std::lock_guard lock(mu_);
        bodies_.push_back(json::parse(req.body, nullptr, false));
      }
      if (req.get_header_value("Authorization") != std::string("Bearer ") + kGoodKey) {
        res.status = 401;
        res.set_content(R"({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})",
                        "application/json");
        return;
      }
      if (hit == 1) {
        res.status = 500;
        res.set_content(R"({"error": {"message": "the model is loading"}})", "application/json");
        return;
      }
      int n = ++answered_;
      std::string content;
      if (n % 4 == 0)
        content = "I am sorry, I cannot fuse these operators into one module.";
      else if (n == 6)
        content = "```python\nimport torch\n\nprint(torch.__version__)\n```\n";
      else
        content = "Here is the fused task:\n\n```python\n" + task_code(n == 10 ? 9 : n) + "```\n";
      res.set_content(chat_body(content), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    EXPECT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~ScriptedLlm() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  int hits() const { return hits_; }
  std::vector<json> bodies() {
    std::lock_guard lock(mu_);
    return bodies_;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> hits_{0}, answered_{0};
  std::mutex mu_;
  std::vector<json> bodies_;
};

// Sets (or, with nullptr, unsets) an environment variable for the scope of a test.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (value)
      setenv(name.c_str(), value, 1);
    else
      unsetenv(name.c_str());
  }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

class ComposeLlm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    auto r = test::run_opforge(
        {"crawl", "--workspace", (*dir_ / "seeded").string(), "--sources", "torch", "--match", kMatch});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  // A fresh workspace holding the crawled seeds.
  static std::filesystem::path fresh(const std::string& name) {
    auto ws = *dir_ / name;
    std::filesystem::create_directories(ws);
    std::filesystem::copy_file(*dir_ / "seeded" / "opforge.db", ws / "opforge.db");
    return ws;
  }
  static std::vector<std::string> compose_args(const std::filesystem::path& ws, const std::string& url) {
    return {"compose",     "--workspace",  ws.string(), "--backend",         "llm",     "--llm-url", url,
            "--llm-model", "test-model",   "--count",   std::to_string(kCount), "--seed", "5",
            "--llm-key-env", kKeyEnv,      "--llm-concurrency", "4",     "--llm-timeout-s", "20"};
  }
  // (index, id, code) of the llm tasks, by index.
  static std::vector<std::tuple<long, std::string, std::string>> llm_tasks(const std::filesystem::path& ws) {
    Db db(ws / "opforge.db");
    std::vector<std::tuple<long, std::string, std::string>> out;
    auto st = db.prepare(
        "SELECT json_extract(provenance, '$.index'), id, code FROM tasks WHERE backend = 'llm' "
        "ORDER BY json_extract(provenance, '$.index')");
    while (st.step()) out.emplace_back(st.int64(0), st.text(1), st.text(2));
    return out;
  }
  static std::map<std::string, long> failures(const std::filesystem::path& ws) {
    Db db(ws / "opforge.db");
    std::map<std::string, long> out;
    auto st = db.prepare("SELECT reason, count(*) FROM compose_failures WHERE backend = 'llm' GROUP BY reason");
    while (st.step()) out[st.text(0)] = st.int64(1);
    return out;
  }
  static test::TempDir* dir_;
};
test::TempDir* ComposeLlm::dir_ = nullptr;

}  // namespace

TEST_F(ComposeLlm, ComposesFromAnswersRecordsFailuresAndAResumedRunUsesTheCache) {
  ScriptedLlm server;
  ScopedEnv key(kKeyEnv, kGoodKey);
  auto ws = fresh("llm");

  auto r = test::run_opforge(compose_args(ws, server.url()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(server.hits(), kCount + 1) << "one request per index, plus the retry of the 500";

  // The requests: the named model, the system prompt, and a user prompt built from crawled seeds.
  for (const json& b : server.bodies()) {
    ASSERT_TRUE(b.is_object());
    EXPECT_EQ(b["model"], "test-model");
    ASSERT_EQ(b["messages"].size(), 2u);
    EXPECT_EQ(b["messages"][0]["role"], "system");
    std::string prompt = b["messages"][1]["content"];
    EXPECT_NE(prompt.find("### Operator 1: torch."), std::string::npos) << prompt;
    EXPECT_NE(prompt.find("class Model"), std::string::npos) << prompt;
    EXPECT_EQ(prompt.find("{{"), std::string::npos) << "an unfilled placeholder:\n" << prompt;
  }

  // Good answers are tasks with their provenance; the rest are failures with their reason.
  auto tasks = llm_tasks(ws);
  EXPECT_EQ(tasks.size(), 7u);
  {
    Db db(ws / "opforge.db");
    auto st = db.prepare("SELECT source, num_ops, ops, seed_ids, provenance, code FROM tasks WHERE backend = 'llm'");
    int rows = 0;
    while (st.step()) {
      ++rows;
      EXPECT_EQ(st.text(0), "torch");
      json ops = json::parse(st.text(2)), seed_ids = json::parse(st.text(3)), prov = json::parse(st.text(4));
      EXPECT_EQ(static_cast<std::size_t>(st.int64(1)), ops.size());
      EXPECT_EQ(ops.size(), seed_ids.size());
      EXPECT_EQ(prov.value("model", ""), "test-model") << prov.dump();
      EXPECT_EQ(prov.value("rng_seed", -1), 5) << prov.dump();
      EXPECT_EQ(prov.value("bucket", ""), std::to_string(st.int64(1))) << prov.dump();
      ASSERT_TRUE(prov.contains("prompt_hash") && prov["prompt_hash"].is_string()) << prov.dump();
      EXPECT_FALSE(prov["prompt_hash"].get<std::string>().empty());
      EXPECT_EQ(prov.value("prompt_tokens", 0L), kPromptTokens) << prov.dump();
      EXPECT_EQ(prov.value("completion_tokens", 0L), kCompletionTokens) << prov.dump();
      EXPECT_EQ(prov.value("finish_reason", ""), "stop");
      std::string code = st.text(5);
      EXPECT_EQ(code.find("```"), std::string::npos) << "the fences are stripped:\n" << code;
      EXPECT_EQ(code.find("Here is"), std::string::npos) << "the prose around the block is dropped:\n" << code;
      EXPECT_NE(code.find("class Model(nn.Module):"), std::string::npos) << code;
    }
    EXPECT_EQ(rows, 7);
  }
  const auto failed = failures(ws);
  auto reasons = failed;  // operator[] below must not add keys to `failed`
  EXPECT_EQ(reasons["no_code_block"], 3) << json(failed).dump();
  EXPECT_EQ(reasons["no_model_class"], 1) << json(failed).dump();
  EXPECT_EQ(reasons["duplicate"], 1) << json(failed).dump();
  EXPECT_EQ(failed.count("http_500"), 0u) << "a 500 is retried, not a failure";
  {
    // Every index 0..kCount-1 is either a task or a failure, exactly once.
    Db db(ws / "opforge.db");
    std::set<long> seen;
    for (auto& [idx, id, code] : tasks) EXPECT_TRUE(seen.insert(idx).second);
    auto st = db.prepare("SELECT idx, detail FROM compose_failures WHERE backend = 'llm'");
    while (st.step()) EXPECT_TRUE(seen.insert(st.int64(0)).second);
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(kCount));
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), kCount - 1);
    auto d = db.prepare("SELECT detail FROM compose_failures WHERE reason = 'no_code_block'");
    ASSERT_TRUE(d.step());
    EXPECT_NE(d.text(0).find("I am sorry"), std::string::npos) << "the answer is kept as the detail";
  }

  // What the user sees: failures by reason and the token totals.
  EXPECT_NE(r.err.find("tokens: 1200 prompt, 600 completion spent by this run; 0 answers from the cache"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no_code_block"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("7 added"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(kGoodKey), std::string::npos) << "the key is never logged";

  json st = json::parse(test::run_opforge({"status", "--workspace", ws.string(), "--json"}).out);
  EXPECT_EQ(st["candidates"]["by_backend"]["llm"], 7);
  EXPECT_EQ(st["candidates"]["failures"]["llm"]["no_code_block"], 3);

  // The answers are cached per (prompt, index): with the committed results forgotten, the same
  // command starts again at index 0, sends no request, and makes the same tasks.
  {
    Db db(ws / "opforge.db");
    db.exec("DELETE FROM tasks WHERE backend = 'llm'; DELETE FROM compose_failures WHERE backend = 'llm';");
  }
  int hits_before = server.hits();
  auto again = test::run_opforge(compose_args(ws, server.url()));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(server.hits(), hits_before) << "every answer came from the llm_cache table";
  EXPECT_EQ(llm_tasks(ws), tasks);
  EXPECT_EQ(failures(ws), failed);
  EXPECT_NE(again.err.find("answers from the cache"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("12 answers from the cache"), std::string::npos) << again.err;
}

TEST_F(ComposeLlm, ARejectedKeyStopsTheRunAndNamesTheVariable) {
  ScriptedLlm server;
  auto ws = fresh("bad_key");
  {
    ScopedEnv key(kKeyEnv, "sk-compose-test-wrong");
    auto r = test::run_opforge(compose_args(ws, server.url()));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(kKeyEnv), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("401"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("sk-compose-test-wrong"), std::string::npos) << "the key is never logged:\n" << r.err;
  }
  EXPECT_GE(server.hits(), 1);
  EXPECT_LE(server.hits(), 4) << "a 401 is not retried: at most the requests already in flight";
  EXPECT_TRUE(llm_tasks(ws).empty());
  EXPECT_TRUE(failures(ws).empty()) << "a rejected key fails the run, not the candidates";
  {
    ScopedEnv key(kKeyEnv, nullptr);
    auto r = test::run_opforge(compose_args(ws, server.url()));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(kKeyEnv), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("not set"), std::string::npos) << r.err;
  }
}

TEST_F(ComposeLlm, MissingEndpointOrModelIsAClearError) {
  auto ws = fresh("no_url");
  auto r = test::run_opforge({"compose", "--workspace", ws.string(), "--backend", "llm", "--llm-model", "test-model",
                              "--count", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--llm-url"), std::string::npos) << r.err;
  r = test::run_opforge({"compose", "--workspace", ws.string(), "--backend", "llm", "--llm-url",
                         "http://127.0.0.1:9/v1", "--count", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--llm-model"), std::string::npos) << r.err;
  EXPECT_TRUE(llm_tasks(ws).empty());
}
