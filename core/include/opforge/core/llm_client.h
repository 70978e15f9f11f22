// The `llm` backend's transport: an OpenAI-compatible chat-completions client over libcurl.
//
// Many requests are in flight at once (libcurl's multi interface, one thread). Transient failures
// (HTTP 429, 5xx, timeouts, network errors) are retried with exponential back-off and jitter,
// honouring `Retry-After`. Answers are cached in the workspace database (table `llm_cache`), so a
// re-run of a killed compose sends no request it already has an answer for.
//
// Errors: a request that still fails after its retries, or whose answer cannot be used, is a value
// (LlmResponse::reason). Only failures that doom every request end the command with opforge::Error:
// the endpoint rejects the key (HTTP 401/403; stops at once) or cannot be reached at all
// (connection refused / unknown host after the retries). The API key is never logged nor put in
// an error message.
// Thread safety: an LlmClient and its cache Db are used from one thread at a time; complete() runs
// everything, callbacks included, on the calling thread.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "opforge/core/store.h"

namespace opforge::llm {

struct LlmOptions {
  // Base URL (`http://host:8000`, `https://api.openai.com/v1`) or the full
  // `…/chat/completions` URL; see chat_completions_url().
  std::string url;
  std::string model;
  // Name of the environment variable holding the API key. Unset or empty: no Authorization
  // header is sent (local servers such as vLLM or llama.cpp need none).
  std::string key_env = "OPENAI_API_KEY";
  int concurrency = 8;        // requests in flight at once
  double timeout_s = 120;     // per attempt, connection included
  int max_retries = 4;        // extra attempts after the first, for transient failures only
  double backoff_base_s = 1.0;  // delay before retry k is base * 2^(k-1), jittered by ×[0.5, 1.5)
  double temperature = 0.8;
  int max_tokens = 4096;
};

struct LlmRequest {
  std::string prompt;  // the user message
  std::string system;  // the system message; empty: none is sent
  // Distinguishes several answers wanted for the same prompt: part of the cache key, not sent.
  int sample = 0;
  // A whole conversation (OpenAI `messages`), sent instead of system + prompt when it is an array:
  // the agent's multi-turn episodes, with assistant `tool_calls` and `tool` messages.
  nlohmann::json messages;
  // OpenAI `tools` (function definitions), sent when a non-empty array.
  nlohmann::json tools;
};

struct LlmResponse {
  bool ok = false;
  std::string content;  // the assistant message's text, when ok (may be empty when it calls tools)
  nlohmann::json message;  // the assistant message as the server sent it (`tool_calls` included), when ok
  // Why not ok: http_<code> (429 and 5xx after the retries; other codes at once), timeout,
  // network, bad_json (the body is not a chat-completions answer), no_content (no message text
  // and no tool call).
  std::string reason;
  std::string detail;         // the error text or the start of the body, for the log and the db
  std::string finish_reason;  // as the server said: stop, length (truncated at max_tokens), …
  long prompt_tokens = 0, completion_tokens = 0;  // from `usage`; 0 when the server gives none
  bool from_cache = false;
  int attempts = 0;  // HTTP requests sent for it (0 when from the cache)
  // The choice's `opforge` field when the server is opforge's own policy (`opforge generate
  // --serve`): {prompt_ids, ids, logprobs}, the exact tokens a trainer learns from without
  // tokenising the text again. null from any other server.
  nlohmann::json tokens;
};

// The chat-completions URL for a base: kept when it already ends with /chat/completions, else
// /chat/completions is appended to a base ending with /v1 and /v1/chat/completions to any other.
std::string chat_completions_url(std::string_view base);

// The cache key of a request under these options: xxh3 hex of the JSON
// {model, system, prompt, temperature, max_tokens, sample}, plus messages and tools when set.
std::string cache_key(const LlmOptions& opts, const LlmRequest& req);

// Creates or upgrades the llm_cache table.
void migrate_cache(Db& db);

class LlmClient {
 public:
  // cache may be null (no caching); when given it must outlive the client. Throws opforge::Error
  // when the options are unusable (no url or model, concurrency < 1, …).
  LlmClient(LlmOptions opts, Db* cache);
  ~LlmClient();
  LlmClient(const LlmClient&) = delete;
  LlmClient& operator=(const LlmClient&) = delete;

  // Answers every request; result i belongs to request i. on_done (may be empty) is called once
  // per request as soon as its outcome is final, cache hits first, in completion order. A
  // successful answer is committed to the cache before on_done sees it. Throws opforge::Error on
  // a rejected key or an unreachable endpoint; answers already delivered stay delivered.
  std::vector<LlmResponse> complete(const std::vector<LlmRequest>& requests,
                                    const std::function<void(std::size_t index, const LlmResponse&)>& on_done = {});

  // HTTP requests sent by this client so far, retries included.
  long requests_sent() const { return requests_sent_; }
  const LlmOptions& options() const { return opts_; }

 private:
  LlmOptions opts_;
  std::string endpoint_;
  Db* cache_;
  long requests_sent_ = 0;
};

}  // namespace opforge::llm
