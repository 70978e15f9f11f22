#include "multi_turn.h"

#include <fstream>
#include <thread>

#include "files.h"
#include "agent.h"
#include "opforge/core/error.h"
#include "opforge/core/files.h"
#include "opforge/core/paths.h"
#include "policy_server.h"
#include "subprocess.h"

namespace opforge::trainer {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<std::string> agent_argv(const MultiTurnOptions& o, const fs::path& step_dir, int64_t k, int port) {
  std::vector<std::string> a = {opforge_executable().string(), "agent", "--tasks", (step_dir / "tasks.jsonl").string(),
                                "--out", (step_dir / fmt::format("r{}", k)).string(),
                                "--llm-url", fmt::format("http://127.0.0.1:{}/v1", port), "--llm-model", "opforge-actor",
                                "--llm-key-env", "OPFORGE_POLICY_NEEDS_NO_KEY",
                                "--temperature", fmt::format("{}", o.temperature),
                                "--max-tokens", std::to_string(o.max_new_tokens),
                                "--max-turns", std::to_string(o.max_turns),
                                "--concurrency", std::to_string(o.agent_concurrency), "--judge-url", o.judge_url};
  a.insert(a.end(), o.agent_args.begin(), o.agent_args.end());
  return a;
}

// The K agent runs of a step, all at once against one server; throws when one of them failed.
void run_agents(const MultiTurnOptions& o, const fs::path& step_dir, int port) {
  std::vector<pid_t> pids;
  for (int64_t k = 0; k < o.rollouts_per_task; ++k)
    pids.push_back(spawn_logged(agent_argv(o, step_dir, k, port), step_dir / fmt::format("r{}.log", k)));
  std::string failed;
  for (std::size_t k = 0; k < pids.size(); ++k) {
    std::string f = wait_logged(pids[k], fmt::format("opforge agent run r{}", k), step_dir / fmt::format("r{}.log", k));
    if (failed.empty()) failed = f;
  }
  OPFORGE_CHECK(failed.empty(), "{}", failed);
}

// The step's tasks as a shard, so the agent's task ids are the judge's.
void write_tasks(const MultiTurnOptions& o, const std::vector<Prompt>& tasks, const fs::path& file) {
  std::ofstream out(file);
  for (const auto& t : tasks) {
    auto c = o.code.find(t.task_id);
    OPFORGE_CHECK(c != o.code.end(), "train ppo --multi-turn: no code for task {}", t.task_id);
    out << json({{"id", t.task_id}, {"code", c->second}}).dump() << "\n";
  }
}

}  // namespace

std::vector<Sample> turn_samples(const std::vector<json>& records) {
  std::vector<Sample> out;
  for (const auto& rec : records) {
    OPFORGE_CHECK(rec.contains("policy_tokens") && rec["policy_tokens"].is_array(),
                  "episode of task {} has no policy_tokens: its turns were not sampled by opforge's policy server",
                  rec.value("task_id", std::string("?")));
    std::optional<double> reward;
    if (rec.contains("reward") && rec["reward"].is_number()) reward = rec["reward"].get<double>();
    for (const auto& t : rec["policy_tokens"]) {
      Sample s{rec["task_id"].get<std::string>(), t.at("prompt_ids").get<std::vector<int64_t>>(), {}, reward};
      s.answer.tokens = t.at("ids").get<std::vector<int64_t>>();
      s.answer.logprobs = t.at("logprobs").get<std::vector<float>>();
      OPFORGE_CHECK(!s.prompt.empty() && !s.answer.tokens.empty() && s.answer.tokens.size() == s.answer.logprobs.size(),
                    "episode of task {}: a turn's policy_tokens are malformed (empty, or ids and logprobs differ in length)",
                    s.task_id);
      out.push_back(std::move(s));
    }
  }
  return out;
}

EpisodeFn multi_turn_episodes(MultiTurnOptions o) {
  return [o](const CausalLM& actor, int64_t step, const std::vector<Prompt>& tasks, json& m) {
    const fs::path dir = o.out / fmt::format("step_{}", step);
    remove_tree(dir);  // a resumed step runs its episodes again, from its checkpoint's actor
    fs::create_directories(dir);
    write_tasks(o, tasks, dir / "tasks.jsonl");
    PolicyServerOptions po;
    po.model = o.tokenizer_dir;
    po.live = &actor;
    po.bf16 = o.bf16;
    po.served_name = "opforge-actor";
    po.max_batch = 1;
    po.defaults.max_new_tokens = o.max_new_tokens;
    po.defaults.temperature = o.temperature;
    PolicyServer server(po);
    int port = server.bind();
    std::thread serving([&] { server.listen(); });
    auto t0 = std::chrono::steady_clock::now();
    try {
      run_agents(o, dir, port);
    } catch (...) {
      server.stop();
      serving.join();
      throw;
    }
    server.stop();
    serving.join();
    std::vector<json> episodes;
    int64_t failed = 0;
    for (int64_t k = 0; k < o.rollouts_per_task; ++k) {
      for (auto& r : agent::read_records(dir / fmt::format("r{}", k) / "episodes.jsonl")) episodes.push_back(r);
      failed += static_cast<int64_t>(agent::read_records(dir / fmt::format("r{}", k) / "errors.jsonl").size());
    }
    double turns = 0, reward = 0;
    for (auto& e : episodes) {
      turns += e.value("turns", 0);
      reward += e["reward"].is_number() ? e["reward"].get<double>() : 0.0;
    }
    double n = static_cast<double>(std::max<std::size_t>(episodes.size(), 1));
    m.update({{"episodes", episodes.size()}, {"episodes_failed", failed}, {"turns_mean", turns / n},
              {"episode_reward_mean", reward / n},
              {"rollout_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}});
    return turn_samples(episodes);
  };
}

}  // namespace opforge::trainer
