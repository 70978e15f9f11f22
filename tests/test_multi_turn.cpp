// train ppo --multi-turn (trainer/multi_turn.h): opforge agent episodes against the actor served
// in the training process, each turn a PPO sample with its exact tokens and the episode's reward.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "test_support.h"

#ifdef OPFORGE_POLICY_SERVER
#include "multi_turn.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace opforge::test;
using namespace opforge::trainer;

namespace {

std::vector<json> jsonl_rows(const fs::path& file) {
  std::vector<json> rows;
  std::string line;
  for (std::istringstream in(read_file(file)); std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

json turn(std::vector<int64_t> prompt, std::vector<int64_t> ids) {
  std::vector<float> lp(ids.size(), -0.5f);
  return {{"prompt_ids", prompt}, {"ids", ids}, {"logprobs", lp}};
}

}  // namespace

// Every turn of every episode is a sample: the conversation before it as its prompt, its answer's
// ids and log-probabilities as sampled, the episode's reward (null when the judge gave none).
TEST(MultiTurn, EachTurnOfAnEpisodeIsASampleWithTheEpisodesReward) {
  std::vector<json> recs = {
      {{"task_id", "a"}, {"reward", 2}, {"policy_tokens", {turn({1, 2}, {3, 4}), turn({1, 2, 3, 4, 9}, {5}), turn({1, 2, 3, 4, 9, 5, 9}, {6, 7})}}},
      {{"task_id", "b"}, {"reward", nullptr}, {"policy_tokens", {turn({8}, {9})}}}};
  auto s = turn_samples(recs);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[1].prompt, (std::vector<int64_t>{1, 2, 3, 4, 9}));
  EXPECT_EQ(s[2].answer.tokens, (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(s[2].answer.logprobs.size(), 2u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s[i].reward, std::optional<double>(2.0));
  EXPECT_EQ(s[3].task_id, "b");
  EXPECT_FALSE(s[3].reward.has_value());
}

TEST(MultiTurn, AnEpisodeNotSampledByThePolicyServerIsAnErrorNamingItsTask) {
  try {
    turn_samples({{{"task_id", "t7"}, {"reward", 1}}});
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("t7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("policy_tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(turn_samples({{{"task_id", "t8"}, {"reward", 1}, {"policy_tokens", {{{"prompt_ids", {1}}, {"ids", {2, 3}},
                                                                                    {"logprobs", {-0.1}}}}}}}),
               std::exception);
}

// End to end on the CPU: one step, two agent runs of one task against the tiny actor served by the
// training process, each episode judged by the real opforge serve the command starts. A random
// model calls no tool, so each episode is one turn judged -1; the point is the plumbing: the
// samples PPO trains on carry the exact tokens the server sampled (their log-probabilities agree
// with the trainer's recomputation to float rounding) and the update moves the actor.
TEST(MultiTurn, PpoTrainsOnAgentEpisodesOfTheServedActor) {
  TempDir d;
  fs::create_directories(d / "tasks");
  fs::copy_file(fixtures() / "eval" / "tasks" / "linear_relu.py", d / "tasks" / "linear_relu.py");
  CmdResult r = run_opforge({"train", "ppo", "--multi-turn", "--actor", tiny_model("qwen2").string(), "--tasks",
                             (d / "tasks").string(), "--out", (d / "out").string(), "--steps", "1", "--batch", "1",
                             "--rollouts-per-task", "2", "--max-new-tokens", "8", "--max-turns", "2", "--lr", "1e-3",
                             "--judge-arg=--trials", "--judge-arg=5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto m = jsonl_rows(d / "out" / "metrics.jsonl");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]["episodes"], 2) << m[0].dump();
  EXPECT_EQ(m[0]["episodes_failed"], 0) << read_file(d / "out" / "rollouts" / "step_1" / "r0.log");
  EXPECT_EQ(m[0]["answers"], 2);
  EXPECT_EQ(m[0]["reward_hist"], json({{"-1", 2}}));
  EXPECT_LT(m[0]["rollout_logp_gap"].get<double>(), 1e-4) << "the served tokens are not the ones scored";
  for (auto& [k, v] : m[0].items())
    if (v.is_number()) EXPECT_TRUE(std::isfinite(v.get<double>())) << k;
  auto eps = jsonl_rows(d / "out" / "rollouts" / "step_1" / "r1" / "episodes.jsonl");
  ASSERT_EQ(eps.size(), 1u);
  ASSERT_EQ(eps[0]["policy_tokens"].size(), 1u);
  auto traj = jsonl_rows(d / "out" / "trajectories.jsonl");
  ASSERT_EQ(traj.size(), 2u);
  std::vector<int64_t> seq = eps[0]["policy_tokens"][0]["prompt_ids"];
  for (auto id : eps[0]["policy_tokens"][0]["ids"]) seq.push_back(id);
  EXPECT_TRUE(traj[0]["ids"] == json(seq) || traj[1]["ids"] == json(seq)) << "the trajectory is not the served turn";
  EXPECT_NE(read_file(d / "out" / "actor" / "model.safetensors"), read_file(tiny_model("qwen2") / "model.safetensors"));
}

// opforge train recipe end to end on the CPU with the smoke preset: the four stages in order under
// one judge, each leaving stage.json; the tiny actor's episodes are all -1, so RFT keeps none and
// says so, and the agentic stage starts from the warmed-up actor with the pre-trained critic. A
// rerun finds every stage done and prints the same actor without running one again.
TEST(MultiTurn, TheRecipeRunsItsFourStagesInOrderAndARerunResumesDone) {
  TempDir d;
  fs::create_directories(d / "tasks");
  fs::copy_file(fixtures() / "eval" / "tasks" / "linear_relu.py", d / "tasks" / "linear_relu.py");
  std::vector<std::string> cmd = {"train", "recipe", "--model", tiny_model("qwen2").string(), "--tasks",
                                  (d / "tasks").string(), "--out", (d / "out").string(), "--preset", "smoke",
                                  "--judge-arg=--trials", "--judge-arg=5"};
  CmdResult r = run_opforge(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, (d / "out" / "4_ppo" / "actor").string() + "\n");
  json rft = json::parse(read_file(d / "out" / "2_rft" / "stage.json"));
  EXPECT_EQ(rft["kept"], 0);
  EXPECT_EQ(rft["actor"], (d / "out" / "1_warmup" / "actor").string()) << "no RFT data: the warmed-up actor goes on";
  EXPECT_NE(r.err.find("fine-tuning is skipped"), std::string::npos) << r.err;
  EXPECT_FALSE(jsonl_rows(d / "out" / "2_rft" / "trajectories.jsonl").empty());
  EXPECT_TRUE(fs::exists(d / "out" / "3_value" / "critic" / "value_head.safetensors"));
  auto ppo = jsonl_rows(d / "out" / "4_ppo" / "metrics.jsonl");
  ASSERT_EQ(ppo.size(), 1u);
  EXPECT_EQ(ppo[0]["episodes"], 1) << ppo[0].dump();
  auto before = fs::last_write_time(d / "out" / "4_ppo" / "stage.log");
  CmdResult again = run_opforge(cmd);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, r.out);
  EXPECT_EQ(fs::last_write_time(d / "out" / "4_ppo" / "stage.log"), before) << "a done stage ran again";
}

#endif

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <thread>

#include "opforge/core/error.h"
#include "subprocess.h"

// A child of a stage (an agent run, a recipe stage) dies with the trainer: a SIGKILLed trainer
// leaves no run behind talking to a policy server that is gone. The trainer here is a forked copy
// of this test that spawns `sleep 60` and is then killed.
TEST(Subprocess, AChildDiesWithTheTrainerThatStartedIt) {
  opforge::test::TempDir dir;
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  pid_t trainer = ::fork();
  ASSERT_GE(trainer, 0);
  if (trainer == 0) {
    pid_t child = opforge::trainer::spawn_logged({"/bin/sleep", "60"}, dir / "sleep.log");
    [[maybe_unused]] auto n = ::write(p[1], &child, sizeof child);
    ::pause();
    ::_exit(0);
  }
  pid_t child = -1;
  ASSERT_EQ(::read(p[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  ASSERT_EQ(::kill(child, 0), 0) << "the child should run while its trainer does";
  ::kill(trainer, SIGKILL);
  ::waitpid(trainer, nullptr, 0);
  bool gone = false;  // the child is re-parented (to init or a subreaper), which reaps it
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = ::kill(child, 0) != 0;
    std::ifstream in("/proc/" + std::to_string(child) + "/stat");  // gone in between reads as empty
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    gone = gone || stat.empty() || stat.find(") Z ") != std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(gone) << "sleep (pid " << child << ") outlived its killed trainer";
  if (!gone) ::kill(child, SIGKILL);
}

// A program that cannot be started is an error naming it, not a child that exits 127.
TEST(Subprocess, AMissingProgramIsAnErrorNamingIt) {
  opforge::test::TempDir dir;
  try {
    opforge::trainer::spawn_logged({"/nonexistent/opforge-agent"}, dir / "x.log");
    FAIL() << "spawn_logged should throw";
  } catch (const opforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/opforge-agent"), std::string::npos) << e.what();
  }
}
