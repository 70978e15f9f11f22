// The policy server (policy_server.h): request validation and the assembly of an answer are pure
// functions (tested without a model); PolicyServer holds the model, renders, samples and serves.
#include "policy_server.h"

#include <httplib.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "opforge/core/error.h"
#include "opforge/core/stop_signals.h"
#include "python_bridge.h"
#include "tokenizer.h"

namespace opforge::trainer {

namespace {

constexpr int64_t kMaxN = 64;  // choices per request: more is a client's mistake, not a batch
constexpr std::size_t kMaxStops = 16;
constexpr std::size_t kMaxBodyBytes = 64u << 20;  // a long agent conversation is a few MB

[[noreturn]] void bad(const std::string& field, const std::string& message) { throw BadRequest(field, message); }

// o[key] when it is a string; "" when absent or not a string (value() would throw on the latter).
std::string str_field(const ojson& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : "";
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  std::size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

// ---------------------------------------------------------------------------------------------
// Request validation

// OpenAI's content: a string, or a list of {type: "text", text} parts (joined); null where allowed.
std::string content_text(const ojson& m, const std::string& f, bool null_ok) {
  const ojson c = m.contains("content") ? m["content"] : ojson();
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) {
    if (null_ok) return "";
    bad(f, fmt::format("{} is missing: send the message's text as a string", f));
  }
  if (!c.is_array()) bad(f, fmt::format("{} must be a string or a list of text parts, got {}", f, c.type_name()));
  std::string text;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    if (str_field(p, "type") != "text" || !p.contains("text") || !p["text"].is_string())
      bad(fmt::format("{}[{}]", f, i),
          fmt::format("{}[{}] must be a text part {{\"type\": \"text\", \"text\": ...}}: this model reads text only", f,
                      i));
    text += p["text"].get<std::string>();
  }
  return text;
}

// An assistant message's tool call as the template expects it: {id?, type, function {name, arguments}}.
ojson tool_call_in(const ojson& c, const std::string& f) {
  if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
    bad(f, fmt::format("{} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}", f));
  const ojson& fn = c["function"];
  if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
    bad(f + ".function.name", fmt::format("{}.function.name must be the called tool's name (a non-empty string)", f));
  ojson args = fn.contains("arguments") ? fn["arguments"] : ojson("{}");
  if (!args.is_string() && !args.is_object())
    bad(f + ".function.arguments", fmt::format("{}.function.arguments must be JSON text or an object", f));
  ojson out = ojson::object();
  if (c.contains("id") && c["id"].is_string()) out["id"] = c["id"];
  out["type"] = "function";
  out["function"] = {{"name", fn["name"]}, {"arguments", args}};
  return out;
}

ojson message_in(const ojson& m, const std::string& f) {
  if (!m.is_object()) bad(f, fmt::format("{} must be an object {{\"role\", \"content\"}}", f));
  if (!m.contains("role") || !m["role"].is_string())
    bad(f + ".role", fmt::format("{}.role must be system, user, assistant or tool", f));
  std::string role = m["role"];
  if (role == "developer") role = "system";  // OpenAI's newer name for the system role
  static const std::set<std::string> roles = {"system", "user", "assistant", "tool"};
  if (!roles.count(role))
    bad(f + ".role", fmt::format("{}.role must be system, user, assistant or tool, got \"{}\"", f, role));
  // An assistant turn that only calls tools has null content; templates want a string.
  ojson out = {{"role", role}, {"content", content_text(m, f + ".content", role == "assistant")}};
  if (m.contains("name") && m["name"].is_string()) out["name"] = m["name"];
  if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    if (!m["tool_calls"].is_array()) bad(f + ".tool_calls", fmt::format("{}.tool_calls must be a list", f));
    ojson calls = ojson::array();
    for (std::size_t i = 0; i < m["tool_calls"].size(); ++i)
      calls.push_back(tool_call_in(m["tool_calls"][i], fmt::format("{}.tool_calls[{}]", f, i)));
    if (!calls.empty()) out["tool_calls"] = calls;
  }
  if (role == "tool" && m.contains("tool_call_id")) {
    if (!m["tool_call_id"].is_string()) bad(f + ".tool_call_id", fmt::format("{}.tool_call_id must be a string", f));
    out["tool_call_id"] = m["tool_call_id"];
  }
  return out;
}

ojson messages_in(const ojson& body) {
  if (!body.contains("messages")) bad("messages", "messages is missing: send the conversation as a list of messages");
  const ojson& ms = body["messages"];
  if (!ms.is_array() || ms.empty())
    bad("messages", "messages must be a non-empty list of {\"role\", \"content\"} objects");
  ojson out = ojson::array();
  for (std::size_t i = 0; i < ms.size(); ++i) out.push_back(message_in(ms[i], fmt::format("messages[{}]", i)));
  return out;
}

// The offered tools as the client wrote them (the template prints them), checked for shape.
ojson tools_in(const ojson& body) {
  const ojson tools = body.contains("tools") ? body["tools"] : ojson();
  const ojson choice = body.contains("tool_choice") ? body["tool_choice"] : ojson();
  if (!choice.is_null() && choice != "auto" && choice != "none")
    bad("tool_choice",
        "tool_choice must be \"auto\" or \"none\": forcing a call (\"required\" or a named "
        "function) is not supported");
  if (tools.is_null()) return ojson();
  if (!tools.is_array()) bad("tools", "tools must be a list of {\"type\": \"function\", \"function\": {...}}");
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    std::string f = fmt::format("tools[{}]", i);
    if (!t.is_object() || (t.contains("type") && str_field(t, "type") != "function") || !t.contains("function") ||
        !t["function"].is_object())
      bad(f, fmt::format("{} must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}", f));
    const ojson& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
      bad(f + ".function.name", fmt::format("{}.function.name must be the tool's name (a non-empty string)", f));
    if (fn.contains("parameters") && !fn["parameters"].is_object())
      bad(f + ".function.parameters", fmt::format("{}.function.parameters must be a JSON schema object", f));
  }
  return tools.empty() || choice == "none" ? ojson() : tools;
}

// A number field in [lo, hi] (lo excluded when lo_open); absent or null: nullopt.
std::optional<double> number_in(const ojson& body, const std::string& key, double lo, double hi, bool lo_open,
                                const std::string& hint) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const ojson& v = body[key];
  double x = v.is_number() ? v.get<double>() : std::nan("");
  if (!v.is_number() || x > hi || x < lo || (lo_open && x == lo))
    bad(key,
        fmt::format("{} must be a number in {}{}, {}]{}, got {}", key, lo_open ? "(" : "[", lo, hi, hint, v.dump()));
  return x;
}

std::optional<int64_t> integer_in(const ojson& body, const std::string& key, int64_t lo, int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const ojson& v = body[key];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
      v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    bad(key, fmt::format("{} must be an integer in [{}, {}], got {}", key, lo, hi, v.dump()));
  return v.get<int64_t>();
}

std::vector<std::string> stops_in(const ojson& body) {
  if (!body.contains("stop") || body["stop"].is_null()) return {};
  const ojson& s = body["stop"];
  ojson list = s.is_string() ? ojson::array({s}) : s;
  if (!list.is_array() || list.size() > kMaxStops)
    bad("stop", fmt::format("stop must be a string or a list of at most {} strings", kMaxStops));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string() || list[i].get<std::string>().empty())
      bad(fmt::format("stop[{}]", i), fmt::format("stop[{}] must be a non-empty string", i));
    out.push_back(list[i]);
  }
  return out;
}

// Fields that would change what is sampled but are not implemented: refused, never ignored.
void refuse_unsupported(const ojson& body) {
  auto set = [&](const char* k) { return body.contains(k) && !body[k].is_null(); };
  if (set("stream") && body["stream"] != false)
    bad("stream", "stream is not supported: send \"stream\": false (or leave it out) and read the whole answer");
  if (set("top_logprobs") && body["top_logprobs"] != 0)
    bad("top_logprobs", "top_logprobs is not supported: \"logprobs\": true gives each sampled token's log-probability");
  for (const char* k : {"presence_penalty", "frequency_penalty"})
    if (set(k) && body[k] != 0) bad(k, fmt::format("{} is not supported: leave it out or send 0", k));
  if (set("logit_bias") && !body["logit_bias"].empty()) bad("logit_bias", "logit_bias is not supported: leave it out");
  if (set("model") && !body["model"].is_string())
    bad("model", "model must be a string (one model is served: any name)");
  if (set("logprobs") && !body["logprobs"].is_boolean()) bad("logprobs", "logprobs must be true or false");
}

}  // namespace

ChatRequest parse_chat_request(const ojson& body, const SampleOptions& defaults) {
  if (!body.is_object()) bad("", "the body must be a JSON object (an OpenAI chat-completions request)");
  refuse_unsupported(body);
  ChatRequest r;
  r.messages = messages_in(body);
  r.tools = tools_in(body);
  r.sample = defaults;
  if (auto t = number_in(body, "temperature", 0, 2, false, " (0 is greedy)")) {
    r.sample.greedy = *t == 0;
    r.sample.temperature = *t == 0 ? 1.0 : *t;
  }
  if (auto p = number_in(body, "top_p", 0, 1, true, "")) r.sample.top_p = *p;
  const char* max_key =
      body.contains("max_tokens") && !body["max_tokens"].is_null() ? "max_tokens" : "max_completion_tokens";
  if (auto m = integer_in(body, max_key, 1, 1 << 20)) r.sample.max_new_tokens = *m;
  if (auto s = integer_in(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    r.sample.seed = static_cast<uint64_t>(*s);
    r.seeded = true;
  }
  if (auto n = integer_in(body, "n", 1, kMaxN)) r.n = *n;
  r.stop = stops_in(body);
  r.logprobs = body.contains("logprobs") && body["logprobs"] == true;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Answer assembly

namespace {

// One <tool_call> body: a call when it is an object with a non-empty string "name".
std::optional<std::pair<std::string, std::string>> one_call(const std::string& inner) {
  ojson j = ojson::parse(inner, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() ||
      j["name"].get<std::string>().empty())
    return std::nullopt;
  ojson args = j.contains("arguments") ? j["arguments"] : j.contains("parameters") ? j["parameters"] : ojson::object();
  return std::make_pair(j["name"].get<std::string>(), args.is_string() ? args.get<std::string>() : args.dump());
}

}  // namespace

ParsedToolCalls parse_tool_calls(const std::string& text) {
  static const std::string open = "<tool_call>", close = "</tool_call>";
  ParsedToolCalls out;
  std::string rest;
  std::size_t pos = 0;
  while (true) {
    std::size_t a = text.find(open, pos);
    if (a == std::string::npos) {
      rest += text.substr(pos);
      break;
    }
    std::size_t body = a + open.size(), b = text.find(close, body);
    std::size_t end = b == std::string::npos ? text.size() : b + close.size();
    auto call = one_call(text.substr(body, b == std::string::npos ? std::string::npos : b - body));
    rest += text.substr(pos, (call ? a : end) - pos);  // an unparsable block stays text
    if (call) out.calls.push_back(std::move(*call));
    pos = end;
    if (b == std::string::npos) break;
  }
  out.content = trim(rest);
  return out;
}

StopCut cut_at_stop(const std::string& text, std::size_t n_tokens, const std::vector<std::string>& stop,
                    const std::function<std::string(std::size_t)>& decode_prefix) {
  // The stop string that is complete first, as a streaming check would find it: the earliest end.
  std::size_t at = std::string::npos, end = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stop) {
    std::size_t p = text.find(s);
    if (p != std::string::npos && (p + s.size() < end || (p + s.size() == end && p < at))) {
      at = p;
      end = p + s.size();
      which = &s;
    }
  }
  if (!which) return {text, n_tokens, false};
  std::size_t lo = 1, hi = n_tokens;  // decode_prefix(n_tokens) is `text`, which holds it
  while (lo < hi) {
    std::size_t mid = lo + (hi - lo) / 2;
    if (decode_prefix(mid).find(*which) != std::string::npos)
      hi = mid;
    else
      lo = mid + 1;
  }
  return {text.substr(0, at), lo, true};
}

ojson error_body(const std::string& message, const std::string& type, const std::string& param) {
  return {
      {"error",
       {{"message", message}, {"type", type}, {"param", param.empty() ? ojson() : ojson(param)}, {"code", ojson()}}}};
}

namespace {

ojson logprobs_out(const Completion& c) {
  if (c.pieces.empty()) return ojson();
  ojson content = ojson::array();
  for (std::size_t i = 0; i < c.ids.size(); ++i) {
    const std::string& piece = i < c.pieces.size() ? c.pieces[i] : std::string();
    ojson bytes = ojson::array();
    for (unsigned char b : piece) bytes.push_back(b);
    content.push_back(
        {{"token", piece}, {"logprob", c.logprobs[i]}, {"bytes", bytes}, {"top_logprobs", ojson::array()}});
  }
  return {{"content", content}};
}

}  // namespace

ojson assemble_choice(int64_t index, const Completion& c, const std::vector<int64_t>& prompt_ids, bool parse_tools,
                      const std::string& call_id_prefix) {
  ojson message = {{"role", "assistant"}, {"content", c.text}};
  std::string finish = c.finish;
  ParsedToolCalls parsed = parse_tools ? parse_tool_calls(c.text) : ParsedToolCalls{};
  if (!parsed.calls.empty()) {
    // OpenAI's shape: content null when the turn is only calls.
    message["content"] = parsed.content.empty() ? ojson() : ojson(parsed.content);
    ojson calls = ojson::array();
    for (std::size_t k = 0; k < parsed.calls.size(); ++k)
      calls.push_back({{"id", fmt::format("{}_{}", call_id_prefix, k)},
                       {"type", "function"},
                       {"function", {{"name", parsed.calls[k].first}, {"arguments", parsed.calls[k].second}}}});
    message["tool_calls"] = calls;
    finish = "tool_calls";
  }
  return {{"index", index},
          {"message", message},
          {"logprobs", logprobs_out(c)},
          {"finish_reason", finish},
          {"opforge", {{"prompt_ids", prompt_ids}, {"ids", c.ids}, {"logprobs", c.logprobs}}}};
}

// ---------------------------------------------------------------------------------------------
// The server

struct PolicyServer::Impl {
  explicit Impl(PolicyServerOptions opts)
      : o(std::move(opts)),
        model_dir(std::filesystem::absolute(o.model).string()),
        model(o.live ? *o.live : CausalLM::load(o.model, device_named(o.device))),
        tok(o.model),
        rng(std::random_device{}()) {
    OPFORGE_CHECK(o.max_batch >= 1, "--max-batch must be at least 1, got {}", o.max_batch);
    name = o.served_name;
    if (name.empty()) {
      auto p = std::filesystem::path(model_dir).lexically_normal();
      name = (p.has_filename() ? p : p.parent_path()).filename().string();
    }
    context = model.config().raw.value("max_position_embeddings", int64_t{0});
  }

  std::vector<int64_t> render(const ChatRequest& r);
  SampleOptions sampling(const ChatRequest& r, std::size_t prompt_len);
  std::vector<Generation> sample_n(const std::vector<int64_t>& prompt, const SampleOptions& s, int64_t n);
  Completion finish_completion(const Generation& g, const ChatRequest& r);
  ojson answer(const ChatRequest& r);

  PolicyServerOptions o;
  std::string model_dir, name;
  CausalLM model;
  Tokenizer tok;
  int64_t context = 0;  // max_position_embeddings; 0: unknown, no cap
  // One request generated at a time: one model, one KV cache's worth of memory, the embedded
  // interpreter's calls in order. Guards rng too.
  std::mutex mu;
  std::mt19937_64 rng;  // seeds of unseeded requests, answer and call ids
  httplib::Server svr;
  std::atomic<bool> stopping{false}, listening{false};
};

std::vector<int64_t> PolicyServer::Impl::render(const ChatRequest& r) {
  nlohmann::json req = {{"model", model_dir},
                        {"messages", r.messages.dump()},
                        {"tools", r.tools.is_null() ? nlohmann::json() : nlohmann::json(r.tools.dump())}};
  nlohmann::json got = call_python("opforge.chat_tools", "encode", req);
  if (got.contains("error")) bad("messages", got["error"].get<std::string>());
  auto ids = got["ids"].get<std::vector<int64_t>>();
  if (ids.empty()) bad("messages", "the messages render to no token: send at least one message with text");
  return ids;
}

SampleOptions PolicyServer::Impl::sampling(const ChatRequest& r, std::size_t prompt_len) {
  SampleOptions s = r.sample;
  if (context > 0) {
    int64_t room = context - static_cast<int64_t>(prompt_len);
    if (room < 1)
      bad("messages", fmt::format("the prompt is {} tokens and the model's context {} (max_position_embeddings): "
                                  "shorten the conversation",
                                  prompt_len, context));
    s.max_new_tokens = std::min(s.max_new_tokens, room);  // as much as fits, finish_reason "length" after
  }
  if (auto eos = tok.eos_id()) s.stop_ids.push_back(*eos);
  if (auto pad = tok.pad_id()) s.pad_id = *pad;
  if (!r.seeded) s.seed = rng();
  return s;
}

// n rows of the same prompt, max_batch at a time; chunk c is seeded with seed + c, so one
// request's answers depend on its seed, n and max_batch only.
std::vector<Generation> PolicyServer::Impl::sample_n(const std::vector<int64_t>& prompt, const SampleOptions& s,
                                                     int64_t n) {
  std::vector<Generation> out;
  for (int64_t done = 0, c = 0; done < n; done += o.max_batch, ++c) {
    SampleOptions sc = s;
    sc.seed = s.seed + static_cast<uint64_t>(c);
    auto rows = std::vector<std::vector<int64_t>>(static_cast<std::size_t>(std::min(o.max_batch, n - done)), prompt);
    Autocast cast(model.device(), o.bf16);
    for (auto& g : generate(model, rows, sc)) out.push_back(std::move(g));
  }
  return out;
}

Completion PolicyServer::Impl::finish_completion(const Generation& g, const ChatRequest& r) {
  std::string text = tok.decode(g.tokens);
  StopCut cut =
      r.stop.empty()
          ? StopCut{text, g.tokens.size(), false}
          : cut_at_stop(text, g.tokens.size(), r.stop, [&](std::size_t k) {
              return tok.decode(std::vector<int64_t>(g.tokens.begin(), g.tokens.begin() + static_cast<long>(k)));
            });
  Completion c;
  c.ids.assign(g.tokens.begin(), g.tokens.begin() + static_cast<long>(cut.tokens));
  c.logprobs.assign(g.logprobs.begin(), g.logprobs.begin() + static_cast<long>(cut.tokens));
  c.text = cut.text;
  c.finish = cut.stopped ? "stop" : g.finish;
  if (r.logprobs && !c.ids.empty())
    c.pieces = call_python("opforge.chat_tools", "pieces", {{"model", model_dir}, {"ids", c.ids}})["pieces"]
                   .get<std::vector<std::string>>();
  return c;
}

ojson PolicyServer::Impl::answer(const ChatRequest& r) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> prompt = render(r);
  SampleOptions s = sampling(r, prompt.size());
  std::string id = fmt::format("chatcmpl-{:016x}", rng());
  ojson choices = ojson::array();
  int64_t completion_tokens = 0;
  auto gens = sample_n(prompt, s, r.n);
  for (std::size_t i = 0; i < gens.size(); ++i) {
    Completion c = finish_completion(gens[i], r);
    completion_tokens += static_cast<int64_t>(c.ids.size());
    choices.push_back(assemble_choice(static_cast<int64_t>(i), c, prompt, !r.tools.is_null(),
                                      fmt::format("call_{:012x}_{}", rng() >> 16, i)));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("{}: {} prompt tokens, {} choice(s), {} completion tokens in {:.2f} s", id, prompt.size(), r.n,
               completion_tokens, secs);
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", static_cast<int64_t>(std::time(nullptr))},
          {"model", name},
          {"choices", choices},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
}

PolicyServer::PolicyServer(PolicyServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
PolicyServer::~PolicyServer() { stop(); }

std::pair<int, ojson> PolicyServer::complete(const std::string& body) {
  ojson j = ojson::parse(body, nullptr, false);
  if (j.is_discarded())
    return {400, error_body("the body is not JSON: send an OpenAI chat-completions request", "invalid_request_error")};
  try {
    ChatRequest r = parse_chat_request(j, impl_->o.defaults);
    std::lock_guard lock(impl_->mu);
    return {200, impl_->answer(r)};
  } catch (const BadRequest& e) {
    return {400, error_body(e.what(), "invalid_request_error", e.field)};
  } catch (const std::exception& e) {
    spdlog::error("a chat completion failed: {}", describe(e));
    return {500, error_body("generation failed: " + describe(e), "server_error")};
  }
}

ojson PolicyServer::models() const {
  return {{"object", "list"},
          {"data", ojson::array({{{"id", impl_->name},
                                  {"object", "model"},
                                  {"created", 0},
                                  {"owned_by", "opforge"},
                                  {"root", impl_->model_dir},
                                  {"max_model_len", impl_->context}}})}};
}

namespace {

void reply(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
}

}  // namespace

int PolicyServer::bind() {
  auto& svr = impl_->svr;
  svr.set_payload_max_length(kMaxBodyBytes);
  svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& res) {
    auto [status, body] = complete(q.body);
    reply(res, status, body);
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { reply(res, 200, models()); });
  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { reply(res, 200, ojson::object()); });
  // Never crash the server: whatever escapes a handler is a 500 in OpenAI's shape.
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = describe(e);
    } catch (...) {
    }
    reply(res, 500, error_body("internal error: " + what, "server_error"));
  });
  svr.set_error_handler([](const httplib::Request& q, httplib::Response& res) {
    if (res.status == 404)
      reply(res, 404,
            error_body(fmt::format("no route {} {}: POST /v1/chat/completions or GET /v1/models", q.method, q.path),
                       "not_found_error"));
  });
  const auto& o = impl_->o;
  int port = o.port == 0 ? svr.bind_to_any_port(o.host) : (svr.bind_to_port(o.host, o.port) ? o.port : -1);
  OPFORGE_CHECK(port > 0, "cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port);
  return port;
}

void PolicyServer::listen() {
  impl_->listening = true;
  if (!impl_->stopping) impl_->svr.listen_after_bind();
  impl_->listening = false;
}

void PolicyServer::stop() {
  impl_->stopping = true;
  // httplib's stop() does nothing until listen_after_bind() runs: wait for it to run or to end.
  while (impl_->listening && !impl_->svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->svr.stop();
}

int serve_policy(const PolicyServerOptions& options, const std::function<void(int)>& on_listening) {
  StopOnSignals stop_signals;  // before libtorch's, the interpreter's and the HTTP pool's threads start
  PolicyServer server(options);
  int port = server.bind();
  stop_signals.start([&server] { server.stop(); });
  std::cout << "listening on http://" << options.host << ":" << port << std::endl;
  spdlog::info("serving {} on http://{}:{}/v1 (device {}, one request at a time, up to {} rows a batch)",
               options.model.string(), options.host, port, options.device, options.max_batch);
  if (on_listening) on_listening(port);
  server.listen();
  return 0;
}

}  // namespace opforge::trainer
