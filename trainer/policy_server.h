// opforge's own policy behind an OpenAI-compatible endpoint (issue #14: the policy interface of
// multi-turn PPO), so that `opforge agent` and `compose --backend llm` run on a CausalLM of this
// process: POST /v1/chat/completions (messages with every role, tools, tool calls) and GET
// /v1/models, over cpp-httplib (built with OPFORGE_SERVE, which defines OPFORGE_POLICY_SERVER).
//
// A prompt is the model's own chat template applied by transformers (tools included, as vLLM
// renders them: python/opforge/chat_tools.py); the n samples of a request are one generate()
// batch; stop strings cut the decoded text; Hermes / Qwen2.5 `<tool_call>` blocks become OpenAI
// tool calls. Each choice carries, beside OpenAI's fields, the exact token ids of prompt and
// completion and each token's log-probability ("opforge": {prompt_ids, ids, logprobs}), so the
// trainer never re-tokenises its own rollouts.
//
// One model in memory and one request generated at a time (a mutex): simple and correct first;
// batching concurrent requests together is left for when rollouts need the throughput.
// Errors: a request that cannot be served as sent is HTTP 400 with an OpenAI-style error naming
// the field and what to send instead; a generation failure is HTTP 500; the server keeps serving.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "generate.h"

namespace opforge::trainer {

using ojson = nlohmann::ordered_json;  // keeps the key order a client sent (templates print it)

struct PolicyServerOptions {
  std::filesystem::path model;  // a Hugging Face folder (CausalLM::load)
  std::string device = "cpu", host = "127.0.0.1";
  int port = 0;             // 0: any free port (on_listening says which)
  int64_t max_batch = 8;    // most rows in one generate() call: n above it is drawn in chunks
  std::string served_name;  // the model's name in answers and /v1/models; empty: the folder's name
  // What a request leaves out: max_tokens (max_new_tokens), temperature, top_p (greedy: temperature 0).
  SampleOptions defaults;
  // Serve this model (its weights shared, not copied) instead of loading one; `model` then names
  // only the tokenizer's and chat template's folder. The caller must not change the weights while
  // the server generates: `train ppo --multi-turn` serves its actor between updates.
  const CausalLM* live = nullptr;
  bool bf16 = false;  // generate under bfloat16 autocast (autocast is per thread: the server opens its own)
};

// A request that cannot be served as sent: HTTP 400. `field` is the JSON path of the culprit
// ("messages[2].role"; empty for the body as a whole); what() says what to send instead.
struct BadRequest : std::runtime_error {
  BadRequest(std::string field, const std::string& message) : std::runtime_error(message), field(std::move(field)) {}
  std::string field;
};

// A validated /v1/chat/completions body.
struct ChatRequest {
  ojson messages;        // normalised: content always a string, "developer" as "system"
  ojson tools;           // null when no tool is offered (none given, an empty list, tool_choice "none")
  SampleOptions sample;  // greedy (temperature 0), temperature, top_p, max_new_tokens, seed
  bool seeded = false;   // false: the server draws a seed
  int64_t n = 1;
  std::vector<std::string> stop;
  bool logprobs = false;
};

// Validates an OpenAI chat-completions body; throws BadRequest. Fields OpenAI defines that change
// what is sampled but are not supported (stream, top_logprobs, penalties, logit_bias, a forced
// tool_choice) are refused rather than ignored; other unknown fields are ignored, as vLLM does.
ChatRequest parse_chat_request(const ojson& body, const SampleOptions& defaults);

// Tool calls as Qwen2.5 and Hermes models write them:
//   text <tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call> text
// Each block whose body is a JSON object with a string "name" is a call; its "arguments" (or
// Llama's "parameters") object becomes OpenAI's JSON text (a string there is kept as written).
// A final block without its closing tag counts when its JSON is whole (the model stopped right
// after it). Everything else, unparsable blocks included, stays in `content`, trimmed.
struct ParsedToolCalls {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // (name, arguments as JSON text)
};
ParsedToolCalls parse_tool_calls(const std::string& text);

// Where a completion's first stop string starts. `text` is the decoded completion; the kept tokens
// are the fewest whose decoded prefix (decode_prefix(k): the first k tokens' text) already holds
// that stop string, found by bisection, so the ids the trainer gets are the ones that produced the
// text, stop string included, as vLLM returns them. Without a match: everything, stopped false.
struct StopCut {
  std::string text;    // up to the stop string, which is left out
  std::size_t tokens;  // tokens kept
  bool stopped;
};
StopCut cut_at_stop(const std::string& text, std::size_t n_tokens, const std::vector<std::string>& stop,
                    const std::function<std::string(std::size_t)>& decode_prefix);

// One sampled completion after stop strings: what a choice is assembled from.
struct Completion {
  std::vector<int64_t> ids;
  std::vector<float> logprobs;      // one per id
  std::string text;                 // decoded, special tokens skipped, cut at a stop string
  std::vector<std::string> pieces;  // each id's text, for OpenAI's logprobs (empty: not asked)
  std::string finish;               // "stop" (a stop token or string) or "length"
};

// A response choice: message {role, content, tool_calls}, finish_reason ("tool_calls" when the
// text holds a call and tools were offered), logprobs (null unless pieces are given) and the
// "opforge" extension {prompt_ids, ids, logprobs}. Tool call ids are call_id_prefix + "_" + k.
ojson assemble_choice(int64_t index, const Completion& c, const std::vector<int64_t>& prompt_ids, bool parse_tools,
                      const std::string& call_id_prefix);

// OpenAI's error body: {"error": {message, type, param, code}}.
ojson error_body(const std::string& message, const std::string& type, const std::string& param = "");

class PolicyServer {
 public:
  // Loads the model and its tokenizer (the embedded interpreter starts here, on this thread).
  explicit PolicyServer(PolicyServerOptions options);
  ~PolicyServer();
  PolicyServer(const PolicyServer&) = delete;
  PolicyServer& operator=(const PolicyServer&) = delete;

  // The answer to one /v1/chat/completions body as (HTTP status, JSON). Never throws.
  std::pair<int, ojson> complete(const std::string& body);
  ojson models() const;  // GET /v1/models

  int bind();     // binds host:port (an error names it when that fails); returns the port
  void listen();  // serves until stop(); requests in flight are answered before it returns
  void stop();    // from any thread, before or during listen()

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `opforge generate --serve`: binds, prints "listening on http://HOST:PORT" on stdout, calls
// on_listening(port) and serves until SIGINT or SIGTERM. Returns 0; throws opforge::Error when
// the model cannot be loaded or the address cannot be bound.
int serve_policy(const PolicyServerOptions& options, const std::function<void(int port)>& on_listening = {});

}  // namespace opforge::trainer
