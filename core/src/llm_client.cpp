#include "opforge/core/llm_client.h"

#include <curl/curl.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "opforge/core/error.h"
#include "opforge/core/hash.h"

namespace opforge::llm {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// A server that streams without end must not exhaust memory: chat answers are far smaller.
constexpr std::size_t kMaxBodyBytes = 32u << 20;
// Retry-After beyond this is treated as this: a compose run should not sleep for hours silently.
constexpr double kMaxRetryAfterS = 600;
constexpr double kMaxBackoffS = 120;

void global_init() {
  // curl_global_init is not thread-safe in every libcurl build; once per process is enough.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string redact(std::string text, const std::string& key) {
  if (key.empty()) return text;
  for (std::size_t p; (p = text.find(key)) != std::string::npos;) text.replace(p, key.size(), "***");
  return text;
}

// The most useful short text of an error body: OpenAI's {"error": {"message": …}}, else its start.
std::string body_excerpt(const std::string& body) {
  auto j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"];
    if (e.is_string()) return e;
  }
  if (body.empty()) return "(empty body)";
  return body.size() > 300 ? body.substr(0, 300) + "…" : body;
}

struct Transfer {
  std::size_t index = 0;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string payload;  // must outlive the transfer: libcurl does not copy POSTFIELDS
  std::string body;
  std::optional<double> retry_after_s;
  bool too_large = false;
  char errbuf[CURL_ERROR_SIZE] = {};

  ~Transfer() {
    if (easy) curl_easy_cleanup(easy);
    curl_slist_free_all(headers);
  }
};

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  if (t->body.size() + size * n > kMaxBodyBytes) {
    t->too_large = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  t->body.append(data, size * n);
  return size * n;
}

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  constexpr std::string_view name = "retry-after:";
  if (line.size() > name.size() &&
      std::equal(name.begin(), name.end(), line.begin(),
                 [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); })) {
    // Only the delta-seconds form; the HTTP-date form falls back to our own back-off.
    std::string value(line.substr(name.size()));
    char* end = nullptr;
    double s = std::strtod(value.c_str(), &end);
    if (end != value.c_str() && std::isfinite(s) && s >= 0) t->retry_after_s = std::min(s, kMaxRetryAfterS);
  }
  return size * n;
}

// Owns the multi handle and every transfer in flight, so an exception leaves nothing behind.
struct Multi {
  CURLM* handle = curl_multi_init();
  std::vector<std::unique_ptr<Transfer>> active;

  ~Multi() {
    for (auto& t : active) curl_multi_remove_handle(handle, t->easy);
    active.clear();
    curl_multi_cleanup(handle);
  }

  std::unique_ptr<Transfer> take(CURL* easy) {
    auto it = std::find_if(active.begin(), active.end(), [&](auto& t) { return t->easy == easy; });
    if (it == active.end()) return nullptr;
    curl_multi_remove_handle(handle, easy);
    auto t = std::move(*it);
    active.erase(it);
    return t;
  }
};

enum class Verdict { done, retry };

struct Outcome {
  Verdict verdict = Verdict::done;
  LlmResponse response;
  std::optional<double> retry_after_s;
};

// Reads a 2xx body into a response.
void parse_answer(const std::string& body, LlmResponse& r) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
      j["choices"].empty() || !j["choices"][0].is_object()) {
    r.reason = "bad_json";
    r.detail = body.size() > 300 ? body.substr(0, 300) + "…" : body;
    return;
  }
  const json& choice = j["choices"][0];
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) r.finish_reason = choice["finish_reason"];
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer()) r.prompt_tokens = u["prompt_tokens"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      r.completion_tokens = u["completion_tokens"];
  }
  const json* msg = choice.contains("message") && choice["message"].is_object() ? &choice["message"] : nullptr;
  bool text = msg && msg->contains("content") && (*msg)["content"].is_string() &&
              !(*msg)["content"].get_ref<const std::string&>().empty();
  bool calls = msg && msg->contains("tool_calls") && (*msg)["tool_calls"].is_array() && !(*msg)["tool_calls"].empty();
  if (!text && !calls) {
    r.reason = "no_content";
    r.detail = fmt::format("the answer has no message text and no tool call (finish_reason {})",
                           r.finish_reason.empty() ? "absent" : r.finish_reason);
    return;
  }
  if (text) r.content = (*msg)["content"];
  r.message = *msg;
  if (choice.contains("opforge") && choice["opforge"].is_object()) r.tokens = choice["opforge"];
  r.ok = true;
}

void cache_put(Db& db, const std::string& key, const LlmOptions& opts, const LlmRequest& req, const std::string& body,
               const LlmResponse& r) {
  db.transaction([&] {
    db.prepare(
          "INSERT INTO llm_cache(key, model, prompt_hash, response, content, finish_reason, prompt_tokens, "
          "completion_tokens) VALUES(?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO NOTHING")
        .bind(1, key)
        .bind(2, opts.model)
        .bind(3, xxh3_hex(req.system + "\n\n" + req.prompt))
        .bind(4, body)
        .bind(5, r.content)
        .bind(6, r.finish_reason)
        .bind(7, static_cast<std::int64_t>(r.prompt_tokens))
        .bind(8, static_cast<std::int64_t>(r.completion_tokens))
        .run();
  });
}

std::optional<LlmResponse> cache_get(Db& db, const std::string& key) {
  auto st = db.prepare("SELECT response FROM llm_cache WHERE key = ?");
  st.bind(1, key);
  if (!st.step()) return std::nullopt;
  LlmResponse r;
  parse_answer(st.text(0), r);  // only usable answers were stored
  r.from_cache = true;
  return r;
}

// The request body: the conversation (or system + prompt), the sampling options, the tools.
std::string payload(const LlmOptions& opts, const LlmRequest& req) {
  json messages = req.messages;
  if (!messages.is_array()) {
    messages = json::array();
    if (!req.system.empty()) messages.push_back({{"role", "system"}, {"content", req.system}});
    messages.push_back({{"role", "user"}, {"content", req.prompt}});
  }
  json body = {{"model", opts.model}, {"messages", messages}, {"temperature", opts.temperature},
               {"max_tokens", opts.max_tokens}};
  if (req.tools.is_array() && !req.tools.empty()) body["tools"] = req.tools;
  return body.dump();
}

// One request's easy handle, set up but not yet added to the multi handle.
std::unique_ptr<Transfer> make_transfer(std::size_t i, const LlmOptions& opts, const std::string& endpoint,
                                        const LlmRequest& req, const std::string& key) {
  auto t = std::make_unique<Transfer>();
  t->index = i;
  t->easy = curl_easy_init();
  OPFORGE_CHECK(t->easy, "cannot initialise libcurl (curl_easy_init failed)");
  t->payload = payload(opts, req);
  t->headers = curl_slist_append(t->headers, "Content-Type: application/json");
  t->headers = curl_slist_append(t->headers, "Accept: application/json");
  // libcurl sends `Expect: 100-continue` for large bodies (over 1 KiB before 7.87, 1 MiB since)
  // and then waits up to a second for a 100 that many inference servers never send.
  t->headers = curl_slist_append(t->headers, "Expect:");
  if (!key.empty()) t->headers = curl_slist_append(t->headers, ("Authorization: Bearer " + key).c_str());
  CURL* e = t->easy;
  curl_easy_setopt(e, CURLOPT_URL, endpoint.c_str());
  curl_easy_setopt(e, CURLOPT_POST, 1L);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->payload.c_str());
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->payload.size()));
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get());
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(opts.timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min(opts.timeout_s, 30.0) * 1000));
  // No signals: SIGALRM-based DNS timeouts are unsafe with threads elsewhere in the process.
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");  // whatever this libcurl can decode
  curl_easy_setopt(e, CURLOPT_USERAGENT, "opforge");
  // Never let libcurl's verbose output print our headers (the key) anywhere.
  curl_easy_setopt(e, CURLOPT_VERBOSE, 0L);
  return t;
}

// A finished transfer's answer, or why it failed and whether asking again may help. A rejected
// key ends the run: every other request would be rejected too.
Outcome classify(Transfer& t, CURLcode cc, int attempts, const LlmOptions& opts, const std::string& endpoint,
                 const std::string& key) {
  Outcome o;
  LlmResponse& r = o.response;
  r.attempts = attempts;
  long code = 0;
  curl_easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &code);
  if (cc != CURLE_OK) {
    std::string err = t.errbuf[0] ? t.errbuf : curl_easy_strerror(cc);
    if (t.too_large) {
      r.reason = "network";
      r.detail = fmt::format("answer larger than {} MiB", kMaxBodyBytes >> 20);
      return o;  // the same prompt would produce the same runaway answer: not retried
    }
    if (cc == CURLE_OPERATION_TIMEDOUT) {
      r.reason = "timeout";
      r.detail = fmt::format("no complete answer within {} s ({})", opts.timeout_s, err);
    } else if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_COULDNT_RESOLVE_PROXY) {
      r.reason = "unreachable";
      r.detail = err;
    } else {
      r.reason = "network";
      r.detail = err;
    }
    o.verdict = Verdict::retry;
    return o;
  }
  if (code == 401 || code == 403) {
    throw Error(redact(fmt::format("the LLM endpoint {} rejected the API key (HTTP {}: {}): check the environment "
                                   "variable {} (named by --llm-key-env){}",
                                   endpoint, code, body_excerpt(t.body), opts.key_env,
                                   key.empty() ? ", which is not set, so no key was sent" : ""),
                       key));
  }
  if (code == 429 || code >= 500) {
    r.reason = fmt::format("http_{}", code);
    r.detail = redact(body_excerpt(t.body), key);
    o.verdict = Verdict::retry;
    o.retry_after_s = t.retry_after_s;
    return o;
  }
  if (code < 200 || code >= 300) {
    r.reason = fmt::format("http_{}", code);
    r.detail = redact(body_excerpt(t.body), key);
    return o;
  }
  parse_answer(t.body, r);
  return o;
}

// Requests not yet started, by the time they may start: (not before, index), FIFO among the ready.
using Waiting = std::set<std::pair<Clock::time_point, std::size_t>>;

// Waits for network activity, or until the next waiting request may start (at most 200 ms).
void wait_for_activity(Multi& multi, const Waiting& waiting, Clock::time_point hold_until, int concurrency) {
  long wait_ms = 200;
  if (!waiting.empty() && static_cast<int>(multi.active.size()) < concurrency) {
    auto next = std::max(waiting.begin()->first, hold_until);
    wait_ms = std::clamp<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count(), 0, 200);
  }
  if (multi.active.empty()) {
    if (wait_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  } else {
    curl_multi_poll(multi.handle, nullptr, 0, static_cast<int>(wait_ms), nullptr);
  }
}

}  // namespace

std::string chat_completions_url(std::string_view base) {
  std::string url(base);
  if (ends_with(url, "/chat/completions")) return url;
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (ends_with(url, "/v1")) return url + "/chat/completions";
  return url + "/v1/chat/completions";
}

std::string cache_key(const LlmOptions& opts, const LlmRequest& req) {
  json k = {{"model", opts.model},           {"system", req.system},         {"prompt", req.prompt},
            {"temperature", opts.temperature}, {"max_tokens", opts.max_tokens}, {"sample", req.sample}};
  // Only when set, so the keys of single-prompt requests are those of earlier caches.
  if (req.messages.is_array()) k["messages"] = req.messages;
  if (req.tools.is_array() && !req.tools.empty()) k["tools"] = req.tools;
  return xxh3_hex(k.dump());
}

void migrate_cache(Db& db) {
  db.migrate("llm_cache", {R"sql(
CREATE TABLE llm_cache (
  key               TEXT PRIMARY KEY,  -- cache_key(): xxh3 of {model, system, prompt, temperature, max_tokens, sample}
  model             TEXT NOT NULL,
  prompt_hash       TEXT NOT NULL,     -- xxh3 of system + "\n\n" + prompt
  response          TEXT NOT NULL,     -- the raw HTTP body, kept for audits and re-parsing
  content           TEXT NOT NULL,     -- the assistant message
  finish_reason     TEXT,
  prompt_tokens     INTEGER,
  completion_tokens INTEGER,
  created_at        TEXT NOT NULL DEFAULT (datetime('now'))
);
)sql"});
}

LlmClient::LlmClient(LlmOptions opts, Db* cache) : opts_(std::move(opts)), cache_(cache) {
  OPFORGE_CHECK(!opts_.url.empty(), "no LLM endpoint given: pass --llm-url (e.g. http://localhost:8000/v1)");
  OPFORGE_CHECK(!opts_.model.empty(), "no LLM model given: pass --llm-model (the name the endpoint serves)");
  OPFORGE_CHECK(opts_.concurrency >= 1, "LLM concurrency must be at least 1, got {}", opts_.concurrency);
  OPFORGE_CHECK(opts_.timeout_s > 0, "LLM timeout must be positive, got {} s", opts_.timeout_s);
  OPFORGE_CHECK(opts_.max_retries >= 0, "LLM max retries must be 0 or more, got {}", opts_.max_retries);
  OPFORGE_CHECK(opts_.max_tokens >= 1, "LLM max tokens must be at least 1, got {}", opts_.max_tokens);
  endpoint_ = chat_completions_url(opts_.url);
  global_init();
  if (cache_) migrate_cache(*cache_);
}

LlmClient::~LlmClient() = default;

std::vector<LlmResponse> LlmClient::complete(const std::vector<LlmRequest>& requests,
                                             const std::function<void(std::size_t, const LlmResponse&)>& on_done) {
  std::vector<LlmResponse> results(requests.size());
  auto finish = [&](std::size_t i, LlmResponse r) {
    results[i] = std::move(r);
    if (on_done) on_done(i, results[i]);
  };

  // 1. Cache hits cost no request.
  std::vector<std::string> keys(requests.size());
  Waiting waiting;
  const auto start = Clock::now();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    keys[i] = cache_key(opts_, requests[i]);
    if (cache_) {
      if (auto hit = cache_get(*cache_, keys[i])) {
        finish(i, std::move(*hit));
        continue;
      }
    }
    waiting.emplace(start, i);
  }
  if (waiting.empty()) return results;

  const char* key_value = std::getenv(opts_.key_env.c_str());
  const std::string key = key_value ? key_value : "";
  // Once per client (an agent's episode asks one request a turn), then at debug level.
  spdlog::log(requests_sent_ == 0 ? spdlog::level::info : spdlog::level::debug,
              "LLM: {} requests to {} (model {}, {} in flight, {} cached){}", waiting.size(), endpoint_, opts_.model,
              opts_.concurrency, requests.size() - waiting.size(),
              key.empty() ? fmt::format(", no API key ({} is not set)", opts_.key_env) : "");

  std::vector<int> attempts(requests.size(), 0);
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  // After a 429 with Retry-After the server asked the whole client to wait, not one request.
  Clock::time_point hold_until = start;

  Multi multi;
  OPFORGE_CHECK(multi.handle, "cannot initialise libcurl (curl_multi_init failed)");

  auto launch = [&](std::size_t i) {
    auto t = make_transfer(i, opts_, endpoint_, requests[i], key);
    CURLMcode mc = curl_multi_add_handle(multi.handle, t->easy);
    OPFORGE_CHECK(mc == CURLM_OK, "cannot start an LLM request: {}", curl_multi_strerror(mc));
    ++attempts[i];
    ++requests_sent_;
    multi.active.push_back(std::move(t));
  };

  auto backoff = [&](int attempt) {
    double d = opts_.backoff_base_s * std::pow(2.0, attempt - 1) * jitter(rng);
    return std::min(d, kMaxBackoffS);
  };

  while (!waiting.empty() || !multi.active.empty()) {
    auto now = Clock::now();
    while (static_cast<int>(multi.active.size()) < opts_.concurrency && !waiting.empty() &&
           waiting.begin()->first <= now && hold_until <= now) {
      std::size_t i = waiting.begin()->second;
      waiting.erase(waiting.begin());
      launch(i);
    }

    int running = 0;
    CURLMcode mc = curl_multi_perform(multi.handle, &running);
    OPFORGE_CHECK(mc == CURLM_OK, "libcurl failed while talking to {}: {}", endpoint_, curl_multi_strerror(mc));

    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi.handle, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURLcode cc = msg->data.result;
      std::unique_ptr<Transfer> t = multi.take(msg->easy_handle);
      if (!t) continue;
      const std::size_t i = t->index;
      Outcome o = classify(*t, cc, attempts[i], opts_, endpoint_, key);
      if (o.verdict == Verdict::retry && attempts[i] <= opts_.max_retries) {
        double delay = backoff(attempts[i]);
        if (o.retry_after_s) {
          delay = std::max(delay, *o.retry_after_s);
          hold_until = std::max(hold_until, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                               std::chrono::duration<double>(*o.retry_after_s)));
        }
        spdlog::debug("LLM request {}: {} ({}), retry {}/{} in {:.2f} s", i, o.response.reason, o.response.detail,
                      attempts[i], opts_.max_retries, delay);
        waiting.emplace(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay)),
                        i);
        continue;
      }
      if (o.response.reason == "unreachable") {
        throw Error(fmt::format("cannot reach the LLM endpoint {} after {} attempts: {}: check --llm-url and that the "
                                "server is running",
                                endpoint_, attempts[i], o.response.detail));
      }
      if (o.response.ok) {
        if (cache_) cache_put(*cache_, keys[i], opts_, requests[i], t->body, o.response);
      } else {
        spdlog::warn("LLM request {} failed after {} attempt(s): {}: {}", i, attempts[i], o.response.reason,
                     o.response.detail);
      }
      finish(i, std::move(o.response));
    }

    if (waiting.empty() && multi.active.empty()) break;
    wait_for_activity(multi, waiting, hold_until, opts_.concurrency);
  }
  return results;
}

}  // namespace opforge::llm
