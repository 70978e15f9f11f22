// The policy server (trainer/policy_server.h): opforge's own CausalLM behind an OpenAI-compatible
// chat-completions endpoint. The request checks, the tool-call parser, stop strings and the
// assembly of a choice are tested as pure functions (a random tiny model never writes a
// <tool_call> by itself); the server is tested over real HTTP with the tiny Qwen2 fixture of
// tests/python/tiny_lm.py, through opforge's own client (core/llm_client.h) and, for the fields
// that client does not send (n, seed, stop, logprobs), through libcurl.
#ifdef OPFORGE_POLICY_SERVER  // built with OPFORGE_SERVE only (cpp-httplib)
#include <curl/curl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <thread>

#include "generate.h"
#include "model.h"
#include "opforge/core/hash.h"
#include "opforge/core/llm_client.h"
#include "opforge/core/store.h"
#include "policy_server.h"
#include "test_support.h"
#include "tokenizer.h"

namespace opforge::test {
namespace {
using namespace opforge::trainer;
using json = nlohmann::json;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Pure functions

std::string field_of(const ojson& body) {
  try {
    parse_chat_request(body, SampleOptions{});
    return "(accepted)";
  } catch (const BadRequest& e) {
    // The message names the field it blames, so a person reading a log line knows what to fix.
    EXPECT_NE(std::string(e.what()).find(e.field), std::string::npos) << e.what();
    return e.field;
  }
}

ojson user_says(const std::string& text) { return ojson::array({{{"role", "user"}, {"content", text}}}); }

TEST(PolicyServerRequest, MalformedRequestsAre400sNamingTheField) {
  ojson ok = {{"model", "m"}, {"messages", user_says("hi")}};
  EXPECT_EQ(field_of(ok), "(accepted)");
  auto with = [&](const char* key, ojson v) {
    ojson b = ok;
    b[key] = std::move(v);
    return field_of(b);
  };
  EXPECT_EQ(field_of({{"model", "m"}}), "messages");
  EXPECT_EQ(with("messages", ojson::array()), "messages");
  EXPECT_EQ(with("temperature", 5), "temperature");
  EXPECT_EQ(with("temperature", "hot"), "temperature");
  EXPECT_EQ(with("temperature", -0.1), "temperature");
  EXPECT_EQ(with("top_p", 0), "top_p");
  EXPECT_EQ(with("n", 0), "n");
  EXPECT_EQ(with("max_tokens", 0), "max_tokens");
  EXPECT_EQ(with("seed", "seven"), "seed");
  EXPECT_EQ(with("stream", true), "stream");
  EXPECT_EQ(with("stop", ojson::array({"x", ""})), "stop[1]");
  EXPECT_EQ(with("logprobs", "yes"), "logprobs");
  EXPECT_EQ(with("top_logprobs", 5), "top_logprobs");
  EXPECT_EQ(with("tool_choice", "required"), "tool_choice");
  EXPECT_EQ(with("tools", ojson::array({{{"type", "function"}}})), "tools[0]");
  EXPECT_EQ(with("messages", ojson::array({{{"role", "robot"}, {"content", "hi"}}})), "messages[0].role");
  EXPECT_EQ(with("messages", ojson::array({{{"role", "user"}}})), "messages[0].content");
  ojson bad_call = {{"role", "assistant"},
                    {"content", nullptr},
                    {"tool_calls", ojson::array({{{"type", "function"}, {"function", {{"arguments", "{}"}}}}})}};
  EXPECT_EQ(with("messages", ojson::array({user_says("hi")[0], bad_call})), "messages[1].tool_calls[0].function.name");
  EXPECT_EQ(field_of(ojson::array()), "");
}

TEST(PolicyServerRequest, AcceptedRequestsAreNormalisedForTheTemplate) {
  ojson call = {
      {"id", "c1"}, {"type", "function"}, {"function", {{"name", "bash"}, {"arguments", "{\"command\": \"ls\"}"}}}};
  ojson tool = {{"type", "function"}, {"function", {{"name", "bash"}, {"parameters", {{"type", "object"}}}}}};
  ojson body = {{"messages", ojson::array({{{"role", "developer"}, {"content", "Be brief."}},
                                           {{"role", "user"},
                                            {"content", ojson::array({{{"type", "text"}, {"text", "a"}},
                                                                      {{"type", "text"}, {"text", "b"}}})}},
                                           {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}},
                                           {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "model.py"}}})},
                {"tools", {tool}},
                {"temperature", 0},
                {"stop", "END"},
                {"seed", 7},
                {"n", 3},
                {"logprobs", true},
                {"max_tokens", 9}};
  ChatRequest r = parse_chat_request(body, SampleOptions{});
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "ab");
  EXPECT_EQ(r.messages[2]["content"], "");  // templates want a string where OpenAI allows null
  EXPECT_EQ(r.messages[2]["tool_calls"][0], call);
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
  EXPECT_EQ(r.tools, ojson::array({tool}));
  EXPECT_TRUE(r.sample.greedy);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.sample.seed, 7u);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.sample.max_new_tokens, 9);
  EXPECT_TRUE(r.logprobs);
  body["tool_choice"] = "none";  // no tool offered: none rendered, none parsed
  EXPECT_TRUE(parse_chat_request(body, SampleOptions{}).tools.is_null());
}

TEST(PolicyServerToolCalls, HermesBlocksBecomeCallsAndTheRestStaysContent) {
  auto p = parse_tool_calls(
      "Let me look.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\", \"cwd\": \".\"}}\n"
      "</tool_call>\n<tool_call>{\"name\": \"read_file\", \"arguments\": \"{\\\"path\\\": "
      "\\\"model.py\\\"}\"}</tool_call>");
  EXPECT_EQ(p.content, "Let me look.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].first, "bash");
  EXPECT_EQ(p.calls[0].second, R"({"command":"ls -la","cwd":"."})");  // the model's key order kept
  EXPECT_EQ(p.calls[1].first, "read_file");
  EXPECT_EQ(p.calls[1].second, R"({"path": "model.py"})");  // arguments already JSON text: as written
  // Llama's "parameters"; no arguments at all; a final block whose closing tag never came.
  EXPECT_EQ(parse_tool_calls(R"(<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>)").calls[0].second,
            R"({"a":1})");
  auto open_end = parse_tool_calls("<tool_call>\n{\"name\": \"submit\"}\n");
  ASSERT_EQ(open_end.calls.size(), 1u);
  EXPECT_EQ(open_end.calls[0].second, "{}");
  EXPECT_EQ(open_end.content, "");
  // Not calls: stays text, whole.
  for (std::string text : {"a <tool_call>{not json}</tool_call> b", "x <tool_call>{\"name\": \"bash\", \"argu",
                           "<tool_call>{\"arguments\": {}}</tool_call>", "no call here"}) {
    auto q = parse_tool_calls(text);
    EXPECT_TRUE(q.calls.empty()) << text;
    EXPECT_EQ(q.content, text);
  }
}

TEST(PolicyServerToolCalls, StopStringsCutTheTextAndKeepTheTokensThatMadeIt) {
  const std::vector<std::string> pieces = {"He", "llo", " wor", "ld", "!"};
  auto prefix = [&](std::size_t k) {
    std::string s;
    for (std::size_t i = 0; i < k; ++i) s += pieces[i];
    return s;
  };
  const std::string text = prefix(pieces.size());
  auto cut = cut_at_stop(text, 5, {"o w"}, prefix);
  EXPECT_EQ(cut.text, "Hell");
  EXPECT_EQ(cut.tokens, 3u);  // "Hello wor" is the first prefix that holds "o w"
  EXPECT_TRUE(cut.stopped);
  // The stop string complete first wins ("lo" ends before "world" does), as a streaming check finds it.
  cut = cut_at_stop(text, 5, {"world", "lo"}, prefix);
  EXPECT_EQ(cut.text, "Hel");
  EXPECT_EQ(cut.tokens, 2u);
  cut = cut_at_stop(text, 5, {"llo wor", "o"}, prefix);
  EXPECT_EQ(cut.text, "Hell");
  EXPECT_EQ(cut.tokens, 2u);
  cut = cut_at_stop(text, 5, {"?"}, prefix);
  EXPECT_EQ(cut.text, text);
  EXPECT_EQ(cut.tokens, 5u);
  EXPECT_FALSE(cut.stopped);
}

TEST(PolicyServerToolCalls, AChoiceCarriesCallsLogprobsAndTheExactIds) {
  Completion c{{5, 6, 7},
               {-0.5f, -1.0f, -0.25f},
               "ok <tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}</tool_call>",
               {"a", "b", "c"},
               "stop"};
  ojson ch = assemble_choice(1, c, {1, 2}, true, "call_x");
  EXPECT_EQ(ch["index"], 1);
  EXPECT_EQ(ch["finish_reason"], "tool_calls");
  EXPECT_EQ(ch["message"]["role"], "assistant");
  EXPECT_EQ(ch["message"]["content"], "ok");
  ojson expected_call = {
      {"id", "call_x_0"}, {"type", "function"}, {"function", {{"name", "bash"}, {"arguments", R"({"command":"ls"})"}}}};
  EXPECT_EQ(ch["message"]["tool_calls"], ojson::array({expected_call}));
  EXPECT_EQ(ch["opforge"]["prompt_ids"], ojson({1, 2}));
  EXPECT_EQ(ch["opforge"]["ids"], ojson({5, 6, 7}));
  EXPECT_EQ(ch["opforge"]["logprobs"], ojson({-0.5, -1.0, -0.25}));
  ASSERT_EQ(ch["logprobs"]["content"].size(), 3u);
  EXPECT_EQ(ch["logprobs"]["content"][1]["token"], "b");
  EXPECT_EQ(ch["logprobs"]["content"][1]["logprob"], -1.0);
  EXPECT_EQ(ch["logprobs"]["content"][1]["bytes"], ojson::array({98}));
  // Tools not offered: the same text is content, the finish as generated, no logprobs unasked.
  c.pieces.clear();
  ojson plain = assemble_choice(0, c, {1, 2}, false, "call_x");
  EXPECT_EQ(plain["message"]["content"], c.text);
  EXPECT_FALSE(plain["message"].contains("tool_calls"));
  EXPECT_EQ(plain["finish_reason"], "stop");
  EXPECT_TRUE(plain["logprobs"].is_null());
  // A turn that is only calls has null content, as OpenAI sends it.
  c.text = "<tool_call>{\"name\": \"submit\"}</tool_call>";
  EXPECT_TRUE(assemble_choice(0, c, {1}, true, "p")["message"]["content"].is_null());
}

// ---------------------------------------------------------------------------------------------
// The server over HTTP, on the tiny Qwen2 fixture

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// A raw request (GET when body is empty): (HTTP status, body as JSON; null when not JSON).
std::pair<long, json> http(const std::string& url, const std::string& body = "") {
  CURL* c = curl_easy_init();
  std::string out;
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  if (!body.empty()) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  }
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  EXPECT_EQ(rc, CURLE_OK) << url;
  return {status, json::parse(out, nullptr, false)};
}

class PolicyServerHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    PolicyServerOptions o;
    o.model = tiny_model("qwen2");
    o.max_batch = 8;
    server_ = std::make_unique<PolicyServer>(o);
    url_ = fmt::format("http://127.0.0.1:{}", server_->bind());
    thread_ = std::thread([this] { server_->listen(); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }
  json post(const json& body, long expect = 200) {
    auto [status, answer] = http(url_ + "/v1/chat/completions", body.dump());
    EXPECT_EQ(status, expect) << answer.dump();
    return answer;
  }
  // What generate() gives for these prompt ids, with the server's stop and pad tokens.
  static SampleOptions direct(const Tokenizer& tok, SampleOptions o) {
    if (auto eos = tok.eos_id()) o.stop_ids.push_back(*eos);
    if (auto pad = tok.pad_id()) o.pad_id = *pad;
    return o;
  }
  std::unique_ptr<PolicyServer> server_;
  std::thread thread_;
  std::string url_;
};

const json kMessages = json::array({{{"role", "system"}, {"content", "You write kernels."}},
                                    {{"role", "user"}, {"content", "def forward(self, x):"}}});

TEST_F(PolicyServerHttp, GreedyAnswersThroughOpforgesClientAreGenerateTokenForToken) {
  TempDir tmp;
  Db cache(tmp / "llm.db");  // the client keeps each raw answer there: the "opforge" field read back
  llm::LlmOptions lo;
  lo.url = url_ + "/v1";
  lo.model = "any-name";
  lo.key_env = "OPFORGE_TEST_NO_SUCH_KEY";
  lo.temperature = 0;
  lo.max_tokens = 12;
  lo.max_retries = 0;
  llm::LlmClient client(lo, &cache);
  llm::LlmRequest req;
  req.messages = kMessages;
  llm::LlmResponse r = client.complete({req})[0];
  ASSERT_TRUE(r.ok) << r.reason << ": " << r.detail;

  auto row = cache.prepare("SELECT response FROM llm_cache");
  ASSERT_TRUE(row.step());
  json answer = json::parse(row.text(0));
  const json& ext = answer["choices"][0]["opforge"];
  Tokenizer tok(tiny_model("qwen2"));
  std::vector<int64_t> prompt = tok.encode_chat(kMessages);
  SampleOptions o;
  o.greedy = true;
  o.max_new_tokens = 12;
  CausalLM m = CausalLM::load(tiny_model("qwen2"), at::kCPU);
  Generation g = generate(m, {prompt}, direct(tok, o))[0];
  EXPECT_EQ(ext["prompt_ids"].get<std::vector<int64_t>>(), prompt);
  EXPECT_EQ(ext["ids"].get<std::vector<int64_t>>(), g.tokens);
  auto logprobs = ext["logprobs"].get<std::vector<float>>();
  ASSERT_EQ(logprobs.size(), g.logprobs.size());
  for (std::size_t i = 0; i < logprobs.size(); ++i) EXPECT_NEAR(logprobs[i], g.logprobs[i], 1e-5) << i;
  EXPECT_EQ(r.content, tok.decode(g.tokens));
  EXPECT_EQ(r.finish_reason, g.finish);
  EXPECT_EQ(r.tokens, ext);  // what a trainer reads from the client, no cache needed
  EXPECT_EQ(r.prompt_tokens, static_cast<long>(prompt.size()));
  EXPECT_EQ(r.completion_tokens, static_cast<long>(g.tokens.size()));
  EXPECT_EQ(answer["object"], "chat.completion");
  EXPECT_EQ(answer["model"], "qwen2");  // one model is served, whatever name the client asks for

  // Bad requests come back as 400s whose message names the field; the server goes on serving.
  lo.temperature = 5;
  llm::LlmClient hot(lo, nullptr);
  llm::LlmResponse e = hot.complete({req})[0];
  EXPECT_EQ(e.reason, "http_400");
  EXPECT_NE(e.detail.find("temperature"), std::string::npos) << e.detail;
  req.messages = json::array();
  lo.temperature = 0;
  e = llm::LlmClient(lo, nullptr).complete({req})[0];
  EXPECT_EQ(e.reason, "http_400");
  EXPECT_NE(e.detail.find("messages"), std::string::npos) << e.detail;
  auto [status, err] = http(url_ + "/v1/chat/completions", "{not json");
  EXPECT_EQ(status, 400);
  EXPECT_TRUE(err["error"]["message"].is_string());
  auto [missing, body] = http(url_ + "/v1/chat/completions", R"({"model": "m"})");
  EXPECT_EQ(missing, 400);
  EXPECT_EQ(body["error"]["param"], "messages");

  auto [ok, models] = http(url_ + "/v1/models");
  EXPECT_EQ(ok, 200);
  EXPECT_EQ(models["data"][0]["id"], "qwen2");
  EXPECT_EQ(http(url_ + "/v1/nothing").first, 404);
}

TEST_F(PolicyServerHttp, SamplesNChoicesBySeedCutsAtStopStringsAndRendersToolConversations) {
  Tokenizer tok(tiny_model("qwen2"));
  CausalLM m = CausalLM::load(tiny_model("qwen2"), at::kCPU);
  std::vector<int64_t> prompt = tok.encode_chat(kMessages);

  // n = 2 with a seed: one generate() batch of the prompt twice, the same again for the same seed.
  json body = {{"model", "m"},       {"messages", kMessages}, {"n", 2},           {"seed", 3},
               {"temperature", 0.9}, {"top_p", 0.95},         {"max_tokens", 10}, {"logprobs", true}};
  json a = post(body);
  ASSERT_EQ(a["choices"].size(), 2u);
  SampleOptions o;
  o.max_new_tokens = 10;
  o.temperature = 0.9;
  o.top_p = 0.95;
  o.seed = 3;
  auto gens = generate(m, {prompt, prompt}, direct(tok, o));
  for (std::size_t i = 0; i < 2; ++i) {
    const json& ch = a["choices"][i];
    EXPECT_EQ(ch["index"], i);
    EXPECT_EQ(ch["opforge"]["ids"].get<std::vector<int64_t>>(), gens[i].tokens) << i;
    ASSERT_EQ(ch["logprobs"]["content"].size(), gens[i].tokens.size());
    for (std::size_t k = 0; k < gens[i].tokens.size(); ++k)
      EXPECT_EQ(ch["logprobs"]["content"][k]["logprob"], ch["opforge"]["logprobs"][k]);
  }
  EXPECT_EQ(a["usage"]["completion_tokens"], gens[0].tokens.size() + gens[1].tokens.size());
  EXPECT_EQ(post(body)["choices"], a["choices"]);

  // A stop string taken from the middle of the greedy answer: the text ends before it, the ids
  // end with the token that completed it.
  json greedy = post({{"messages", kMessages}, {"temperature", 0}, {"max_tokens", 16}});
  std::string text = greedy["choices"][0]["message"]["content"];
  auto all_ids = greedy["choices"][0]["opforge"]["ids"].get<std::vector<int64_t>>();
  // Two ASCII bytes past the first (random weights write any bytes; a stop string is whole characters).
  std::size_t at = text.size() / 2;
  auto ascii = [&](std::size_t i) { return i + 1 < text.size() && (text[i] & 0x80) == 0 && (text[i + 1] & 0x80) == 0; };
  while (at > 1 && !ascii(at)) --at;
  ASSERT_TRUE(ascii(at)) << "no two ASCII characters to cut at in the tiny model's greedy answer: " << text;
  std::string stop = text.substr(at, 2);
  json cut = post({{"messages", kMessages}, {"temperature", 0}, {"max_tokens", 16}, {"stop", {stop}}});
  const json& ch = cut["choices"][0];
  EXPECT_EQ(ch["message"]["content"], text.substr(0, text.find(stop)));
  EXPECT_EQ(ch["finish_reason"], "stop");
  auto ids = ch["opforge"]["ids"].get<std::vector<int64_t>>();
  ASSERT_LE(ids.size(), all_ids.size());
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), all_ids.begin()));
  EXPECT_NE(tok.decode(ids).find(stop), std::string::npos);
  EXPECT_EQ(tok.decode(std::vector<int64_t>(ids.begin(), ids.end() - 1)).find(stop), std::string::npos);

  // A conversation with tools, a call and its answer renders as the model's chat template renders
  // it (the fixture's template prints the arguments as the JSON text they are).
  json tools =
      json::array({{{"type", "function"}, {"function", {{"name", "bash"}, {"parameters", {{"type", "object"}}}}}}});
  json convo = kMessages;
  convo.push_back(
      {{"role", "assistant"},
       {"content", ""},
       {"tool_calls", json::array({{{"id", "c1"},
                                    {"type", "function"},
                                    {"function", {{"name", "bash"}, {"arguments", "{\"command\": \"ls\"}"}}}}})}});
  convo.push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "model.py"}});
  json t = post({{"messages", convo}, {"tools", tools}, {"temperature", 0}, {"max_tokens", 4}});
  EXPECT_EQ(t["choices"][0]["opforge"]["prompt_ids"].get<std::vector<int64_t>>(), tok.encode_chat(convo, tools));
}

}  // namespace
}  // namespace opforge::test
#endif  // OPFORGE_POLICY_SERVER
