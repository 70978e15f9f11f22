#include "judge_reward.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "evaluator.h"
#include "opforge/core/paths.h"
#include "python_bridge.h"

namespace opforge::trainer {
using json = nlohmann::json;

std::vector<Prompt> task_prompts(const std::filesystem::path& src, const Tokenizer& tok) {
  return task_prompts(evaluator::load_tasks(src), tok);
}

std::vector<Prompt> task_prompts(const std::vector<evaluator::EvalTask>& tasks, const Tokenizer& tok) {
  std::vector<Prompt> out;
  for (auto& t : tasks) {
    json messages = call_python("opforge.prompts", "solve_messages_json",
                                {{"task_code", t.code}, {"data_dir", data_dir().string()}});
    out.push_back({t.name, tok.encode_chat(messages)});
  }
  return out;
}

// Why answers failed, said once a call (a rollout's rewards carry no reason): what tells a policy's
// wrong answers from an environment that fails them (docs/gpu.md, the twenty-third session).
static void log_reasons(const std::map<std::string, long>& reasons, std::size_t answers) {
  json counts(reasons);
  spdlog::info("judge: {} answers, verdicts by reason: {}", answers, counts.dump());
}

RewardFn judge_reward(const evaluator::JudgeClient& judge, int concurrency) {
  return [&judge, concurrency](const std::vector<std::string>& ids, const std::vector<std::string>& texts,
                               const std::vector<std::vector<int64_t>>&) {
    std::vector<std::optional<double>> out(ids.size());
    std::map<std::string, long> reasons;
    std::mutex m;
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      for (std::size_t i; (i = next++) < ids.size();) {
        json row = judge.evaluate_response(ids[i], texts[i]);
        bool scored = row.contains("reward") && row["reward"].is_number();
        std::string reason = row.contains("reason") && row["reason"].is_string() ? row["reason"].get<std::string>()
                             : scored                                             ? "correct"
                                                                                  : "no reason given";
        {
          std::lock_guard<std::mutex> l(m);
          ++reasons[reason];
        }
        if (row.value("retryable", json(false)) == true || !scored) {
          json detail = row.value("detail", json());  // a thread must not throw: any type is printed
          spdlog::warn("answer {} to {} not judged: {} {}", i, ids[i], reason,
                       (detail.is_string() ? detail.get<std::string>() : detail.dump()).substr(0, 200));
          continue;
        }
        out[i] = row["reward"].get<double>();
      }
    };
    std::vector<std::thread> pool;
    for (int k = 0; k < std::max(1, concurrency); ++k) pool.emplace_back(work);
    for (auto& t : pool) t.join();
    log_reasons(reasons, ids.size());
    return out;
  };
}

}  // namespace opforge::trainer
