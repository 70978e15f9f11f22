// The evaluator's client of `opforge serve`: its POST /v1/evaluate over libcurl, used by the agent
// (the scripts of a working folder, relayed from its sandbox, and the final evaluation) and the trainer.
//
// Errors: none thrown. A judge that cannot be reached, refuses, or answers what is not a row comes
// back as a row with `retryable: true` and its reason: a failure of the environment is never the
// solution's -1 (a 400, a malformed submission, is: reason bad_submission). Thread safety: evaluate() may run on several threads at once.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace opforge::evaluator {

struct JudgeClient {
  std::string url;    // http://host:port of opforge serve
  std::string token;  // its bearer token, when it has one
  double timeout_s = 7200;  // one evaluation, queueing included
  int attempts = 6;         // on 429 (queue full) and network errors, with back-off

  nlohmann::json evaluate(const std::string& task_id, const nlohmann::json& files) const;
  // A model's whole answer: the service takes its last fenced code block as the solution file.
  nlohmann::json evaluate_response(const std::string& task_id, const std::string& response) const;
  // evaluate() again, after 2, 4, 8 s, while the row is `retryable` (up to `rounds` in all); the
  // last row, retryable or not.
  nlohmann::json evaluate_settled(const std::string& task_id, const nlohmann::json& files, int rounds = 3) const;

 private:
  nlohmann::json submit(const std::string& payload) const;
};

}  // namespace opforge::evaluator
