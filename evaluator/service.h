// opforge serve: the judge as a long-lived reward service for RL trainers (evaluator/README.md,
// "opforge serve"). HTTP on loopback by default (cpp-httplib); every solution is judged exactly
// as `opforge eval` judges it (its own sandboxed child, the judge's clock, the same reward), by
// judge and compiler workers kept warm between requests. Requests queue up to a bound (then 429
// with Retry-After), and a dispatcher thread runs what is queued in batches. A failure of the
// environment (a judge worker that crashed or hung, an unknown task, the service stopping) is
// answered `reward: null, retryable: true` with its reason, never as the solution's −1.
//
// Errors: bad options (no task, a port in use, an unset --token-env variable) throw
// opforge::Error before anything is served. Thread safety: one serve() per process.
#pragma once
#include <cstddef>
#include <filesystem>
#include <string>

#include "evaluator.h"

namespace opforge::evaluator {

struct ServeOptions {
  EvalOptions eval;                  // tasks, device, policy, trials, limits, cache_dir, sandbox
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: any free port (the one chosen is printed)
  std::string token;                 // when set, requests other than /healthz need "Bearer <token>"
  std::size_t queue_max = 256;       // evaluations queued or running; beyond it 429
  std::size_t max_batch = 16;        // evaluations one dispatch builds and judges together
  std::size_t max_files_bytes = 1 << 20;  // a submission's files, in all
  std::size_t result_cache = 20000;  // verdicts kept by (task, solution hash, judge, policy, trials)
  std::filesystem::path state_dir;   // submissions and logs; empty: <cache>/serve
  int http_threads = 64;             // connections served at once (each waits for its verdict); at least 2 x max_batch
};

// Serves until SIGINT or SIGTERM. Prints "listening on http://HOST:PORT" on stdout once the
// workers are warm and the port is bound. Returns the exit code.
int serve(const ServeOptions& o);

// The last complete fenced code block of a model's response ("```python ... ```"), or "".
std::string last_code_block(const std::string& text);

}  // namespace opforge::evaluator
