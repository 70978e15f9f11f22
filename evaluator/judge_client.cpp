// POST /v1/evaluate (judge_client.h).
#include "judge_client.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <chrono>
#include <mutex>
#include <thread>

namespace opforge::evaluator {

using nlohmann::json;

namespace {

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

json environment_failure(const std::string& reason, const std::string& detail) {
  return {{"reward", nullptr}, {"retryable", true}, {"reason", reason}, {"detail", detail}};
}

struct Answer {
  long status = 0;
  std::string body, error;
};

Answer post(const JudgeClient& c, const std::string& payload) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  Answer a;
  CURL* h = curl_easy_init();
  if (!h) return {0, "", "curl_easy_init failed"};
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue wait on large submissions
  if (!c.token.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + c.token).c_str());
  std::string url = c.url + "/v1/evaluate";
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload.c_str());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(payload.size()));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(c.timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &a.body);
  CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) a.error = curl_easy_strerror(rc);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  return a;
}

}  // namespace

json JudgeClient::evaluate(const std::string& task_id, const json& files) const {
  return submit(json{{"task_id", task_id}, {"files", files}}.dump());
}

json JudgeClient::evaluate_response(const std::string& task_id, const std::string& response) const {
  return submit(json{{"task_id", task_id}, {"response", response}}.dump());
}

json JudgeClient::submit(const std::string& payload) const {
  Answer a;
  for (int k = 0; k < attempts; ++k) {
    if (k > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500 << std::min(k, 5)));
    a = post(*this, payload);
    if (!a.error.empty() || a.status == 429 || a.status == 503) continue;  // busy or not reached: again
    json row = json::parse(a.body, nullptr, false);
    if (a.status == 200 && row.is_object()) return row;
    // The submission itself is malformed (a bad file name; 413: past the service's payload limit):
    // the submitter's doing, not the environment's.
    if (a.status == 400 || a.status == 413)
      return {{"reward", -1}, {"correct", false}, {"reason", "bad_submission"}, {"detail", a.body.substr(0, 2000)}};
    return environment_failure(fmt::format("judge_http_{}", a.status), a.body.substr(0, 2000));
  }
  if (!a.error.empty()) return environment_failure("judge_unreachable", fmt::format("{}: {}", url, a.error));
  return environment_failure(fmt::format("judge_http_{}", a.status), a.body.substr(0, 2000));
}

json JudgeClient::evaluate_settled(const std::string& task_id, const json& files, int rounds) const {
  json row;
  for (int k = 0; k < rounds; ++k) {
    if (k > 0) std::this_thread::sleep_for(std::chrono::seconds(1 << k));
    row = evaluate(task_id, files);
    if (!row.value("retryable", false)) break;
  }
  return row;
}

}  // namespace opforge::evaluator
