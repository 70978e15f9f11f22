// The llm backend against a loopback OpenAI-compatible server (cpp-httplib) that each test
// scripts: good answers, rate limits, server errors, hangs, garbage, a rejected key.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "code_extract.h"
#include "opforge/core/llm_client.h"
#include "opforge/core/error.h"
#include "opforge/core/store.h"
#include "prompt.h"
#include "test_support.h"

using namespace opforge;
using namespace opforge::llm;
using namespace opforge::composer;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kGoodCode =
    "import torch\nimport torch.nn as nn\n\nbatch_size = 8\n\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return torch.relu(x)\n\n\ndef get_inputs():\n"
    "    return [torch.randn(batch_size, 16)]\n\n\ndef get_init_inputs():\n    return []\n";

std::string chat_body(const std::string& content, long prompt_tokens = 11, long completion_tokens = 22) {
  return json{{"id", "chatcmpl-1"},
              {"object", "chat.completion"},
              {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", content}}}, {"finish_reason", "stop"}}}},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens}}}}
      .dump();
}

// What the fake server saw of one request.
struct Seen {
  json body;
  std::string authorization;
  std::string expect;
};

// An OpenAI-compatible server on 127.0.0.1, free port, answering POST /v1/chat/completions with
// `script(request body, n-th request for this prompt (1-based), response)`.
class FakeLlm {
 public:
  using Script = std::function<void(const json& body, int nth, httplib::Response& res)>;

  explicit FakeLlm(Script script) : script_(std::move(script)) {
    // A proxy configured on the machine must not swallow requests to loopback.
    setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    setenv("no_proxy", "127.0.0.1,localhost", 1);
    server_.set_keep_alive_timeout(1);
    server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      int now = ++in_flight_;
      for (int m = max_in_flight_; now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
      }
      ++hits_;
      json body = json::parse(req.body, nullptr, false);
      int nth;
      {
        std::lock_guard lock(mu_);
        std::string prompt = body.is_object() ? body["messages"].back().value("content", "") : "";
        nth = ++per_prompt_[prompt];
        seen_.push_back({body, req.get_header_value("Authorization"), req.get_header_value("Expect")});
      }
      script_(body, nth, res);
      --in_flight_;
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    EXPECT_GT(port_, 0);
    // The socket already listens after bind_to_any_port: requests queue until the loop accepts.
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeLlm() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int hits() const { return hits_; }
  int max_in_flight() const { return max_in_flight_; }
  std::vector<Seen> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  Script script_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> hits_{0}, in_flight_{0}, max_in_flight_{0};
  std::mutex mu_;
  std::map<std::string, int> per_prompt_;
  std::vector<Seen> seen_;
};

std::string prompt_of(const json& body) { return body["messages"].back()["content"]; }

// Options for a test: a key variable nobody sets, short delays.
LlmOptions options(const std::string& url) {
  LlmOptions o;
  o.url = url;
  o.model = "test-model";
  o.key_env = "OPFORGE_TEST_LLM_KEY_UNSET";
  o.concurrency = 4;
  o.timeout_s = 5;
  o.max_retries = 3;
  o.backoff_base_s = 0.05;
  return o;
}

std::vector<LlmRequest> requests(int n, const std::string& prefix = "p") {
  std::vector<LlmRequest> r;
  for (int i = 0; i < n; ++i) r.push_back({prefix + std::to_string(i), "be brief", 0});
  return r;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sets an environment variable for the scope of a test.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

}  // namespace

TEST(LlmClient, AnswersManyRequestsInParallelWithTheirUsage) {
  FakeLlm server([](const json& body, int, httplib::Response& res) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // long enough to overlap
    res.set_content(chat_body("answer to " + prompt_of(body), 10, 20 + prompt_of(body).size()), "application/json");
  });
  auto opts = options(server.url());
  opts.concurrency = 3;
  LlmClient client(opts, nullptr);
  auto reqs = requests(7);
  std::vector<std::size_t> done;
  auto results = client.complete(reqs, [&](std::size_t i, const LlmResponse& r) {
    EXPECT_TRUE(r.ok);
    done.push_back(i);
  });
  ASSERT_EQ(results.size(), 7u);
  EXPECT_EQ(done.size(), 7u);
  for (std::size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].ok) << results[i].reason << " " << results[i].detail;
    EXPECT_EQ(results[i].content, "answer to p" + std::to_string(i));
    EXPECT_EQ(results[i].prompt_tokens, 10);
    EXPECT_EQ(results[i].completion_tokens, 22);
    EXPECT_EQ(results[i].finish_reason, "stop");
    EXPECT_EQ(results[i].attempts, 1);
    EXPECT_FALSE(results[i].from_cache);
  }
  EXPECT_EQ(server.hits(), 7);
  EXPECT_EQ(client.requests_sent(), 7);
  EXPECT_GE(server.max_in_flight(), 2) << "requests should overlap";
  EXPECT_LE(server.max_in_flight(), 3) << "no more than --concurrency in flight";

  // The request is OpenAI's chat-completions shape, and without a key no Authorization is sent.
  auto seen = server.seen();
  ASSERT_FALSE(seen.empty());
  const json& b = seen[0].body;
  EXPECT_EQ(b["model"], "test-model");
  EXPECT_EQ(b["max_tokens"], 4096);
  EXPECT_DOUBLE_EQ(b["temperature"].get<double>(), 0.8);
  ASSERT_EQ(b["messages"].size(), 2u);
  EXPECT_EQ(b["messages"][0]["role"], "system");
  EXPECT_EQ(b["messages"][0]["content"], "be brief");
  EXPECT_EQ(b["messages"][1]["role"], "user");
  EXPECT_TRUE(seen[0].authorization.empty());
}

TEST(LlmClient, SendsTheKeyFromTheNamedVariableAsBearer) {
  ScopedEnv key("OPFORGE_TEST_LLM_KEY", "sk-test-good");
  FakeLlm server([](const json&, int, httplib::Response& res) { res.set_content(chat_body("hi"), "application/json"); });
  auto opts = options(server.url() + "/v1/");  // a base ending in /v1 must not become /v1/v1
  opts.key_env = "OPFORGE_TEST_LLM_KEY";
  LlmClient client(opts, nullptr);
  auto r = client.complete(requests(1));
  ASSERT_TRUE(r[0].ok) << r[0].reason << " " << r[0].detail;
  EXPECT_EQ(server.seen().at(0).authorization, "Bearer sk-test-good");
}

TEST(LlmClient, ALongPromptIsSentWithoutWaitingForA100Continue) {
  FakeLlm server([](const json&, int, httplib::Response& res) { res.set_content(chat_body("ok"), "application/json"); });
  LlmClient client(options(server.url()), nullptr);
  // Over every libcurl's threshold for sending `Expect: 100-continue`.
  std::vector<LlmRequest> reqs = {{std::string(1200000, 'x'), "", 0}};
  auto r = client.complete(reqs);
  ASSERT_TRUE(r[0].ok) << r[0].reason << " " << r[0].detail;
  auto seen = server.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].expect, "");
  EXPECT_EQ(prompt_of(seen[0].body).size(), 1200000u);
  EXPECT_EQ(seen[0].body["messages"].size(), 1u) << "an empty system message is not sent";
}

TEST(LlmClient, RetriesA429HonouringRetryAfter) {
  FakeLlm server([](const json&, int nth, httplib::Response& res) {
    if (nth == 1) {
      res.status = 429;
      res.set_header("Retry-After", "1");
      res.set_content(R"({"error": {"message": "slow down"}})", "application/json");
      return;
    }
    res.set_content(chat_body("ok"), "application/json");
  });
  LlmClient client(options(server.url()), nullptr);
  auto t0 = Clock::now();
  auto r = client.complete(requests(1));
  double took = seconds_since(t0);
  ASSERT_TRUE(r[0].ok) << r[0].reason << " " << r[0].detail;
  EXPECT_EQ(r[0].attempts, 2);
  EXPECT_GE(took, 0.95) << "Retry-After: 1 was not honoured";
  EXPECT_LT(took, 4.0);
}

TEST(LlmClient, RetriesA429WithoutRetryAfterAndA500ThenSucceeds) {
  FakeLlm server([](const json&, int nth, httplib::Response& res) {
    if (nth == 1) {
      res.status = 429;
      res.set_content("rate limited", "text/plain");
    } else if (nth == 2) {
      res.status = 500;
      res.set_content("oops", "text/plain");
    } else {
      res.set_content(chat_body("third time"), "application/json");
    }
  });
  LlmClient client(options(server.url()), nullptr);
  auto t0 = Clock::now();
  auto r = client.complete(requests(3));
  EXPECT_LT(seconds_since(t0), 2.0) << "back-off should follow backoff_base_s, not a fixed second";
  for (auto& x : r) {
    ASSERT_TRUE(x.ok) << x.reason << " " << x.detail;
    EXPECT_EQ(x.content, "third time");
    EXPECT_EQ(x.attempts, 3);
  }
  EXPECT_EQ(server.hits(), 9);
}

TEST(LlmClient, GivesUpOnServerErrorsAfterMaxRetriesWithTheReason) {
  FakeLlm server([](const json&, int, httplib::Response& res) {
    res.status = 503;
    res.set_content(R"({"error": {"message": "model is loading"}})", "application/json");
  });
  auto opts = options(server.url());
  opts.max_retries = 2;
  LlmClient client(opts, nullptr);
  auto r = client.complete(requests(2));
  for (auto& x : r) {
    EXPECT_FALSE(x.ok);
    EXPECT_EQ(x.reason, "http_503");
    EXPECT_EQ(x.detail, "model is loading");
    EXPECT_EQ(x.attempts, 3);
  }
  EXPECT_EQ(server.hits(), 6);
}

TEST(LlmClient, ABadRequestIsNotRetried) {
  FakeLlm server([](const json&, int, httplib::Response& res) {
    res.status = 400;
    res.set_content(R"({"error": {"message": "max_tokens is too large"}})", "application/json");
  });
  LlmClient client(options(server.url()), nullptr);
  auto r = client.complete(requests(1));
  EXPECT_EQ(r[0].reason, "http_400");
  EXPECT_EQ(r[0].detail, "max_tokens is too large");
  EXPECT_EQ(server.hits(), 1);
}

TEST(LlmClient, GivesUpOnAHangingServerWithReasonTimeout) {
  FakeLlm server([](const json&, int, httplib::Response& res) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    res.set_content(chat_body("too late"), "application/json");
  });
  auto opts = options(server.url());
  opts.timeout_s = 1;
  opts.max_retries = 1;
  LlmClient client(opts, nullptr);
  auto t0 = Clock::now();
  auto r = client.complete(requests(1));
  double took = seconds_since(t0);
  EXPECT_FALSE(r[0].ok);
  EXPECT_EQ(r[0].reason, "timeout");
  EXPECT_EQ(r[0].attempts, 2);
  EXPECT_GE(took, 1.9);
  EXPECT_LT(took, 3.5);
}

TEST(LlmClient, AMalformedBodyIsBadJsonAndNotCached) {
  test::TempDir dir;
  Db db(dir / "ws.db");
  FakeLlm server([](const json&, int, httplib::Response& res) {
    res.set_content(R"({"choices": [{"message": {"content": "trunc)", "application/json");
  });
  for (int run = 0; run < 2; ++run) {
    LlmClient client(options(server.url()), &db);
    auto r = client.complete(requests(1));
    EXPECT_FALSE(r[0].ok);
    EXPECT_EQ(r[0].reason, "bad_json");
    EXPECT_NE(r[0].detail.find("trunc"), std::string::npos) << r[0].detail;
    EXPECT_EQ(r[0].attempts, 1);
  }
  EXPECT_EQ(server.hits(), 2) << "a failed answer must not be cached";
}

TEST(LlmClient, AnAnswerWithoutMessageTextIsNoContent) {
  FakeLlm server([](const json&, int, httplib::Response& res) {
    res.set_content(R"({"choices": [{"message": {"role": "assistant", "content": null}, "finish_reason": "length"}]})",
                    "application/json");
  });
  LlmClient client(options(server.url()), nullptr);
  auto r = client.complete(requests(1));
  EXPECT_EQ(r[0].reason, "no_content");
  EXPECT_EQ(r[0].finish_reason, "length");
}

TEST(LlmClient, AnAnswerWithoutCodeIsReportedWithItsReasonNotDropped) {
  FakeLlm server([](const json& body, int, httplib::Response& res) {
    std::string p = prompt_of(body);
    res.set_content(chat_body(p == "p1" ? "I cannot help with that." : "```python\n" + std::string(kGoodCode) + "```"),
                    "application/json");
  });
  LlmClient client(options(server.url()), nullptr);
  std::map<std::size_t, ExtractedCode> extracted;
  auto r = client.complete(requests(3), [&](std::size_t i, const LlmResponse& resp) {
    ASSERT_TRUE(resp.ok);
    extracted[i] = extract_model_code(resp.content);
  });
  ASSERT_EQ(extracted.size(), 3u);
  EXPECT_TRUE(extracted[0].ok);
  EXPECT_EQ(extracted[0].code, kGoodCode);
  EXPECT_FALSE(extracted[1].ok);
  EXPECT_EQ(extracted[1].reason, "no_code_block");
  EXPECT_TRUE(extracted[2].ok);
}

TEST(LlmClient, ARejectedKeyStopsAtOnceNamingTheVariableNotTheKey) {
  const std::string secret = "sk-live-SECRET-0123456789";
  ScopedEnv key("OPFORGE_TEST_LLM_KEY", secret);
  FakeLlm server([&](const json&, int, httplib::Response& res) {
    res.status = 401;
    // Real servers echo (part of) the key back; it must not reach the message.
    res.set_content(json{{"error", {{"message", "Incorrect API key provided: " + secret}}}}.dump(), "application/json");
  });
  auto opts = options(server.url());
  opts.key_env = "OPFORGE_TEST_LLM_KEY";
  opts.concurrency = 1;
  LlmClient client(opts, nullptr);
  try {
    client.complete(requests(5));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("OPFORGE_TEST_LLM_KEY"), std::string::npos) << msg;
    EXPECT_NE(msg.find("401"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(secret), std::string::npos) << msg;
    EXPECT_EQ(msg.find("SECRET"), std::string::npos) << msg;
  }
  EXPECT_EQ(server.hits(), 1) << "a rejected key must not be retried nor the other requests sent";
}

TEST(LlmClient, AnUnreachableEndpointIsAClearError) {
  // A socket bound but not listening: connecting to its port is refused, and no one can take it.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  auto opts = options(url);
  opts.max_retries = 2;
  LlmClient client(opts, nullptr);
  try {
    client.complete(requests(2));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cannot reach the LLM endpoint " + url + "/v1/chat/completions"), std::string::npos) << msg;
    EXPECT_NE(msg.find("after 3 attempts"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--llm-url"), std::string::npos) << msg;
  }
  close(fd);
}

TEST(LlmClient, ASecondRunIsServedFromTheCacheWithoutRequests) {
  test::TempDir dir;
  Db db(dir / "ws.db");
  FakeLlm server([](const json& body, int, httplib::Response& res) {
    if (prompt_of(body) == "p2") {
      res.status = 500;
      return;
    }
    res.set_content(chat_body("answer to " + prompt_of(body), 5, 7), "application/json");
  });
  auto opts = options(server.url());
  opts.max_retries = 0;
  auto reqs = requests(4);
  std::vector<LlmResponse> first;
  {
    LlmClient client(opts, &db);
    first = client.complete(reqs);
  }
  EXPECT_EQ(server.hits(), 4);
  EXPECT_EQ(first[2].reason, "http_500");

  LlmClient again(opts, &db);
  int callbacks = 0;
  auto second = again.complete(reqs, [&](std::size_t, const LlmResponse&) { ++callbacks; });
  EXPECT_EQ(callbacks, 4);
  EXPECT_EQ(server.hits(), 5) << "only the failed request is sent again";
  EXPECT_EQ(again.requests_sent(), 1);
  for (std::size_t i : {0u, 1u, 3u}) {
    EXPECT_TRUE(second[i].from_cache);
    EXPECT_EQ(second[i].attempts, 0);
    EXPECT_EQ(second[i].content, first[i].content);
    EXPECT_EQ(second[i].prompt_tokens, 5);
    EXPECT_EQ(second[i].completion_tokens, 7);
  }
  EXPECT_FALSE(second[2].from_cache);

  // The row keeps the raw body; another sample of the same prompt or another model is a miss.
  auto st = db.prepare("SELECT count(*), min(response), min(model) FROM llm_cache");
  ASSERT_TRUE(st.step());
  EXPECT_EQ(st.int64(0), 3);
  EXPECT_NE(st.text(1).find("\"usage\""), std::string::npos);
  EXPECT_EQ(st.text(2), "test-model");
  LlmRequest other_sample = reqs[0];
  other_sample.sample = 1;
  EXPECT_NE(cache_key(opts, other_sample), cache_key(opts, reqs[0]));
  auto other_model = opts;
  other_model.model = "other";
  EXPECT_NE(cache_key(other_model, reqs[0]), cache_key(opts, reqs[0]));
  auto other_temp = opts;
  other_temp.temperature = 0.2;
  EXPECT_NE(cache_key(other_temp, reqs[0]), cache_key(opts, reqs[0]));
  EXPECT_EQ(cache_key(opts, reqs[0]), cache_key(options(server.url()), reqs[0]));
  EXPECT_EQ(db.schema_version("llm_cache"), 1);
}

TEST(LlmClient, RejectsUnusableOptions) {
  LlmOptions o;
  o.model = "m";
  EXPECT_THROW(LlmClient(o, nullptr), Error);  // no url
  o.url = "http://127.0.0.1:1";
  o.model.clear();
  EXPECT_THROW(LlmClient(o, nullptr), Error);
  o.model = "m";
  o.concurrency = 0;
  EXPECT_THROW(LlmClient(o, nullptr), Error);
}

TEST(LlmClient, ChatCompletionsUrlFromABase) {
  EXPECT_EQ(chat_completions_url("http://h:8000"), "http://h:8000/v1/chat/completions");
  EXPECT_EQ(chat_completions_url("http://h:8000/"), "http://h:8000/v1/chat/completions");
  EXPECT_EQ(chat_completions_url("https://api.openai.com/v1"), "https://api.openai.com/v1/chat/completions");
  EXPECT_EQ(chat_completions_url("https://x.org/openai/v1/"), "https://x.org/openai/v1/chat/completions");
  EXPECT_EQ(chat_completions_url("http://h/api/chat/completions"), "http://h/api/chat/completions");
}

TEST(CodeExtract, TakesThePythonBlockDefiningModel) {
  auto r = extract_model_code("Here you go:\n\n```python\n" + std::string(kGoodCode) + "```\n\nThis fuses relu.");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.code, kGoodCode);
}

TEST(CodeExtract, AcceptsUntaggedAndPyFencesAndCrlf) {
  auto r = extract_model_code("```\nclass Model(nn.Module):\n    pass\n```");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.code, "class Model(nn.Module):\n    pass\n");
  r = extract_model_code("```py\r\nclass Model(nn.Module):\r\n    pass\r\n```\r\n");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.code, "class Model(nn.Module):\n    pass\n");
}

TEST(CodeExtract, TakesTheLastBlockThatDefinesModel) {
  std::string answer =
      "Draft:\n```python\nclass Model(nn.Module):\n    v = 1\n```\n"
      "Fixed:\n```python\nclass Model(nn.Module):\n    v = 2\n```\n"
      "Usage:\n```python\nm = Model()\nprint(m)\n```\n"
      "Run it:\n```bash\npython model.py\n```\n";
  auto r = extract_model_code(answer);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.code, "class Model(nn.Module):\n    v = 2\n");
}

TEST(CodeExtract, IgnoresOtherLanguagesAndOtherClassNames) {
  auto r = extract_model_code("```bash\nclass Model(nn.Module):\n```");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, "no_code_block");
  r = extract_model_code("```python\nclass ModelNew(nn.Module):\n    pass\n\nclass MyModel(nn.Module):\n    pass\n```");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.reason, "no_model_class");
  r = extract_model_code("```python\n# class Model(nn.Module) is below\nx = 1\n```");
  EXPECT_EQ(r.reason, "no_model_class");
}

TEST(CodeExtract, NoFenceIsNoCodeBlock) {
  EXPECT_EQ(extract_model_code("").reason, "no_code_block");
  EXPECT_EQ(extract_model_code("class Model(nn.Module):\n    pass\n").reason, "no_code_block");
}

TEST(CodeExtract, AnUnclosedLastBlockCountsToTheEnd) {
  auto r = extract_model_code("```python\nclass Model(nn.Module):\n    pass\n");
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.code, "class Model(nn.Module):\n    pass\n");
}

TEST(ComposePrompt, FillsEveryPlaceholderFromTheTemplateInData) {
  std::vector<PromptSeed> seeds = {{"torch.nn.Conv2d", "class Model(nn.Module):\n    conv = 1\n"},
                                   {"torch.relu", "d = {'a': '{{not_a_placeholder}}'}\nclass Model(nn.Module):\n    pass"}};
  ComposePrompt p = build_compose_prompt(seeds);
  EXPECT_NE(p.prompt.find("torch.nn.Conv2d, torch.relu"), std::string::npos);
  EXPECT_NE(p.prompt.find("### Operator 1: torch.nn.Conv2d\n\n```python\nclass Model(nn.Module):\n    conv = 1\n```"),
            std::string::npos)
      << p.prompt;
  EXPECT_NE(p.prompt.find("{{not_a_placeholder}}"), std::string::npos) << "seed code is inserted verbatim";
  std::string without_seed = p.prompt;
  without_seed.erase(without_seed.find("{{not_a_placeholder}}"), 21);
  EXPECT_EQ(without_seed.find("{{"), std::string::npos) << "unfilled placeholder";
  EXPECT_NE(p.prompt.find("at most 5"), std::string::npos);
  EXPECT_NE(p.prompt.find("get_init_inputs"), std::string::npos);
  EXPECT_FALSE(p.system.empty());
  EXPECT_EQ(p.hash.size(), 16u);
  EXPECT_EQ(build_compose_prompt(seeds).hash, p.hash);
  std::swap(seeds[0], seeds[1]);
  EXPECT_NE(build_compose_prompt(seeds).hash, p.hash) << "order matters";
}

TEST(ComposePrompt, RejectsTooManySeedsAndUnknownPlaceholders) {
  EXPECT_THROW(build_compose_prompt({}), Error);
  EXPECT_THROW(build_compose_prompt(std::vector<PromptSeed>(6, {"torch.relu", "x"})), Error);
  EXPECT_EQ(fill_prompt("a {{ x }} b {{y}}", {{"x", "1"}, {"y", "{{x}}"}}), "a 1 b {{x}}");
  try {
    fill_prompt("a {{typo}}", {{"x", "1"}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("{{typo}}"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build_compose_prompt({{"torch.relu", "x"}}, "no_such_template"), Error);
}
