// `opforge eval` end to end on the CPU: the reference CPU solution earns its reward through the
// whole compile -> correctness -> timing -> reward path, and every planted hack of
// fixtures/eval/hacks gets reward -1 with the reason its header names.
//
// Built extensions are shared through one cache folder in the build tree (test::eval_cache_dir()):
// every fixture that needs the CPU extension uses the same sources, so a test run compiles it
// once (~30-60 s on 2 cores) and later runs not at all.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "evaluator.h"
#include "internal.h"
#include "export.h"
#include "opforge/core/gpus.h"
#include "opforge/core/hash.h"
#include "test_support.h"

using namespace opforge;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path eval_fixtures() { return test::fixtures() / "eval"; }

struct EvalRun {
  test::CmdResult cmd;
  json report;
  std::map<std::string, json> by_solution;
};

EvalRun run_eval(const fs::path& tasks, const fs::path& solutions, const fs::path& out,
                 std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"eval", "--tasks", tasks.string(), "--solutions", solutions.string(), "--out",
                                   out.string(), "--cache-dir", test::eval_cache_dir().string(), "--device", "cpu",
                                   "--trials", "10", "--budget-s", "2", "--compile-workers", "2"};
  if (std::find(extra.begin(), extra.end(), "--seed") == extra.end()) extra.insert(extra.end(), {"--seed", "7"});
  args.insert(args.end(), extra.begin(), extra.end());
  EvalRun r;
  r.cmd = test::run_opforge(args);
  if (r.cmd.exit_code == 0 && fs::exists(out / "report.json")) {
    r.report = json::parse(test::read_file(out / "report.json"));
    for (auto& row : r.report["results"]) r.by_solution[row["solution"].get<std::string>()] = row;
  }
  return r;
}

// "# task: NAME" and "# expect: REASON" from a hack's header.
std::string header_field(const fs::path& file, const std::string& field) {
  std::smatch m;
  std::string text = test::read_file(file);
  std::regex re("# " + field + ": ([A-Za-z_]+( [A-Za-z_]+)?)");
  return std::regex_search(text, m, re) ? m[1].str() : "";
}

}  // namespace

TEST(Eval, FlagsCapACorrectSolutionsRewardAtOne) {
  json r = {{"task", "t"}, {"task_id", "i"}, {"solution", "s"}, {"layout", "file"}, {"correct", true},
            {"candidate", {{"median_ms", 1.0}}}, {"eager", {{"median_ms", 2.0}}}, {"compile", {{"median_ms", 2.0}}}};
  EXPECT_EQ(evaluator::make_row(r, 0.05)["reward"], 3);
  r["flags"] = json::array({"suspicious_source"});
  EXPECT_EQ(evaluator::make_row(r, 0.05)["reward"], 1);
  EXPECT_EQ(evaluator::make_row(r, 0.05)["reward_uncapped"], 3);
  r["flags"] = json::array({"degenerate_task"});
  EXPECT_EQ(evaluator::make_row(r, 0.05)["reward"], 3) << "a flag about the task does not cap";
  r["flags"] = json::array();
  r["eager"]["median_ms"] = 20.0;
  auto row = evaluator::make_row(r, 0.05);
  EXPECT_EQ(row["flags"], json::array({"excessive_speedup"})) << "20x over eager is for a person to look at";
  EXPECT_EQ(row["reward"], 1);
}

// A candidate that makes its small batches slow raises its own intercept, and with it what is
// taken off every large batch; the eager baseline's intercept (trusted code, same harness) bounds it.
TEST(Eval, ACandidatesFixedCostIsBoundedByTheEagerBaselines) {
  json cand = {{"median_ms", 0.50}, {"min_ms", 0.48}, {"max_ms", 0.55}, {"fixed_ms", 1.20}, {"floor_ms", 0.22},
               {"batch", 20}, {"small_batch", 5}};
  json r = {{"task", "t"}, {"task_id", "i"}, {"solution", "s"}, {"layout", "file"}, {"correct", true},
            {"candidate", cand}, {"eager", {{"median_ms", 0.56}, {"fixed_ms", 0.60}}},
            {"compile", {{"median_ms", 0.53}, {"fixed_ms", 1.10}}},
            {"profile", {{"kernel_ms_per_call", 0.50}, {"judge_over_kernels", 1.0}}}};
  auto row = evaluator::make_row(r, 0.05);
  // bound 0.60 + 0.3 = 0.90 (compile's 1.10 is not used): 0.3 ms per batch of 20 given back, 0.015 a call
  EXPECT_NEAR(row["candidate_ms"].get<double>(), 0.515, 1e-9);
  EXPECT_NEAR(row["timing"]["candidate"]["fixed_ms"].get<double>(), 0.90, 1e-9);
  EXPECT_NEAR(row["timing"]["candidate"]["fixed_own_ms"].get<double>(), 1.20, 1e-9);
  EXPECT_NEAR(row["timing"]["candidate"]["min_ms"].get<double>(), 0.495, 1e-9);
  EXPECT_EQ(row["reward"], 2) << "0.56 / 0.515 = 1.087 over eager, 0.53 / 0.515 = 1.029 over compile";
  EXPECT_NEAR(row["profile"]["judge_over_kernels"].get<double>(), 1.03, 1e-9)
      << "the judge's ratio was from its figure before the bound; the row's is from the one rewarded";

  r["candidate"]["fixed_ms"] = 0.85;  // within the bound: untouched
  EXPECT_NEAR(evaluator::make_row(r, 0.05)["candidate_ms"].get<double>(), 0.50, 1e-12);
  r["candidate"]["fixed_ms"] = 1.20;
  r["candidate"]["small_batch"] = 0;  // one batch size (the CPU): the floor alone was taken off
  EXPECT_NEAR(evaluator::make_row(r, 0.05)["candidate_ms"].get<double>(), 0.50, 1e-12);
  r["candidate"]["small_batch"] = 5;
  r["eager"].erase("fixed_ms");  // a baseline without the figure (none to bound by)
  EXPECT_NEAR(evaluator::make_row(r, 0.05)["candidate_ms"].get<double>(), 0.50, 1e-12);
  r.erase("profile");  // no profiling pass (CPU, or it failed): no ratio is made up
  EXPECT_TRUE(evaluator::make_row(r, 0.05)["profile"].is_null());
}

TEST(Eval, RewardFollowsTheCudaAgentRule) {
  EXPECT_EQ(evaluator::reward(false, 10.0, 10.0, 0.05), -1);
  EXPECT_EQ(evaluator::reward(true, std::nullopt, std::nullopt, 0.05), 1);
  EXPECT_EQ(evaluator::reward(true, 1.04, 2.0, 0.05), 1) << "4% faster is not more than 5% faster";
  EXPECT_EQ(evaluator::reward(true, 1.06, 0.9, 0.05), 2);
  EXPECT_EQ(evaluator::reward(true, 1.06, 1.06, 0.05), 3);
  EXPECT_EQ(evaluator::reward(true, 1.06, std::nullopt, 0.05), 2) << "no compile baseline: at most 2";
  EXPECT_EQ(evaluator::reward(true, 0.5, 1.5, 0.05), 1) << "faster than compile only is not a 2";
}

TEST(Eval, CpuSolutionEarnsItsRewardAndBaselinesAreCachedPerTaskCode) {
  test::TempDir dir;
  // A comment makes this test's task code (and so its baseline key) its own, so the first run
  // must measure the baselines and the second must reuse them.
  std::string code = test::read_file(eval_fixtures() / "tasks" / "linear_relu.py") + "\n# " +
                     std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
  test::write_file(dir / "tasks" / "linear_relu.py", code);
  auto first = run_eval(dir / "tasks", eval_fixtures() / "solutions", dir / "out1");
  ASSERT_EQ(first.cmd.exit_code, 0) << first.cmd.err;
  ASSERT_EQ(first.by_solution.count("linear_relu"), 1u) << first.report.dump(2);
  json r = first.by_solution["linear_relu"];
  EXPECT_TRUE(r["compiled"].get<bool>()) << r.dump(2);
  EXPECT_TRUE(r["correct"].get<bool>()) << r.dump(2);
  EXPECT_TRUE(r["reason"].is_null()) << r.dump(2);
  EXPECT_GE(r["reward"].get<int>(), 1);
  EXPECT_LT(r["max_error"].get<double>(), 1e-3);
  for (auto* k : {"candidate_ms", "eager_ms", "compile_ms", "speedup_eager", "speedup_compile"})
    EXPECT_TRUE(r[k].is_number()) << k << " in " << r.dump(2);
  EXPECT_EQ(r["baseline_cached"], false);
  EXPECT_EQ(r["task_id"], xxh3_hex(code));
  EXPECT_EQ(r["flags"], json::array()) << r.dump(2);
  EXPECT_EQ(r["sandbox"].get<std::string>().rfind("bwrap", 0), 0u) << "CI's set-up installs bubblewrap: " << r["sandbox"];
  EXPECT_TRUE(r["dispatch_s"].is_number() && r["cold_start_s"].is_number()) << r.dump(2);
  EXPECT_EQ(r["timing"]["candidate"]["clock"], "judge wall clock");
  EXPECT_GE(r["timing"]["candidate"]["sampled_calls"].get<long>(), 1) << "timed outputs are read back";

  const json& s = first.report["summary"];
  EXPECT_EQ(s["evaluated"], 1);
  EXPECT_EQ(s["pass_rate"], 1.0);
  EXPECT_EQ(s["reward_histogram"][std::to_string(r["reward"].get<int>())], 1);
  EXPECT_TRUE(s["geomean_speedup_eager"].is_number());
  EXPECT_EQ(first.report["options"]["seed"], 7);
  EXPECT_TRUE(fs::exists(dir / "out1" / "report.png"));
  EXPECT_TRUE(fs::exists(dir / "out1" / "work" / "linear_relu" / "linear_relu.py"));
  EXPECT_FALSE(fs::exists(dir / "out1" / "work" / "linear_relu" / "tasks")) << "the solution sees only its files";
  std::string md = test::read_file(dir / "out1" / "report.md");
  EXPECT_NE(md.find("| linear_relu | linear_relu | yes | yes |"), std::string::npos) << md;
  EXPECT_NE(first.cmd.out.find("| pass rate | 100.0% |"), std::string::npos) << "report.md is printed on stdout";

  auto second = run_eval(dir / "tasks", eval_fixtures() / "solutions", dir / "out2", {"--no-plots"});
  ASSERT_EQ(second.cmd.exit_code, 0) << second.cmd.err;
  json r2 = second.by_solution["linear_relu"];
  EXPECT_EQ(r2["baseline_cached"], true) << r2.dump(2);
  EXPECT_EQ(r2["eager_ms"], r["eager_ms"]) << "the eager baseline comes from the cache";
  EXPECT_EQ(r2["compile_ms"], r["compile_ms"]);
  EXPECT_EQ(second.report["summary"]["baselines_reused"], 1);
  EXPECT_FALSE(fs::exists(dir / "out2" / "report.png"));
}

TEST(Eval, UntimedJudgesCorrectnessOnlyWithNoTimingAndNoBaselines) {
  test::TempDir dir;
  // Task code of this test's own (a fresh baseline key): a timed run would have to measure it.
  std::string code = test::read_file(eval_fixtures() / "tasks" / "linear_relu.py") + "\n# untimed " +
                     std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
  test::write_file(dir / "tasks" / "linear_relu.py", code);
  fs::copy_file(eval_fixtures() / "tasks" / "softmax_sum.py", dir / "tasks" / "softmax_sum.py");
  fs::create_directories(dir / "solutions");
  fs::copy_file(eval_fixtures() / "solutions" / "linear_relu.py", dir / "solutions" / "linear_relu.py");
  // linear_relu's solution answering softmax_sum: wrong, so -1 as in a timed run.
  fs::copy_file(eval_fixtures() / "solutions" / "linear_relu.py", dir / "solutions" / "softmax_sum.py");
  // The correctness hacks are caught by the checks, which run untimed too; cached_when_timed is
  // honest on every call an untimed judge makes, so it may earn 1, never more.
  std::vector<std::string> caught = {"allclose_patch", "cached_output",      "cached_values",      "stale_memory",
                                     "returns_input",  "reference_fallback", "constant_degenerate"};
  for (const auto& h : caught) {
    fs::copy_file(eval_fixtures() / "hacks" / (h + ".py"), dir / "solutions" / (h + ".py"));
    std::string task = header_field(eval_fixtures() / "hacks" / (h + ".py"), "task");
    fs::copy_file(eval_fixtures() / "tasks" / (task + ".py"), dir / "tasks" / (h + ".py"));
  }
  fs::copy_file(eval_fixtures() / "hacks" / "cached_when_timed.py", dir / "solutions" / "cached_when_timed.py");
  fs::copy_file(eval_fixtures() / "tasks" / "linear_relu.py", dir / "tasks" / "cached_when_timed.py");
  // A copy of the solution cut short, as a model's answer at its token limit: load_error, in the
  // words its child would use (judge.parse_error gives it without starting one).
  std::string honest = test::read_file(eval_fixtures() / "solutions" / "linear_relu.py");
  test::write_file(dir / "solutions" / "cut_short.py", honest + "\nclass Broken(\n");
  fs::copy_file(eval_fixtures() / "tasks" / "linear_relu.py", dir / "tasks" / "cut_short.py");
  // An output holding -inf (a causal mask's): the exact answer is off by nothing, and its row
  // reaches the report (its max_error of -inf - -inf read as inf, written `Infinity`, was a reply
  // the C++ side could not parse: judge_worker_crash for every correct answer).
  const char* masked = R"(import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        n = x.shape[-1]
        keep = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        return torch.log_softmax(x.masked_fill(~keep, float("-inf")), dim=-1)


def get_inputs():
    return [torch.randn(4, 64, 64)]


def get_init_inputs():
    return []
)";
  test::write_file(dir / "tasks" / "masked_log_softmax.py", masked);
  test::write_file(dir / "solutions" / "masked_log_softmax.py",
                   std::string(masked).replace(std::string(masked).find("class Model("), 12, "class ModelNew("));
  // Adversaries of judge-15's changes, each -1: -inf where the mask is and nothing computed
  // elsewhere (max_error counts equal infinities as 0, nothing more); a complex FFT of TF32-rounded
  // inputs; a float64 task done in float32; a plain-attribute weight with TF32 operands.
  const std::string tf32 = "\ndef tf32(t):\n    return ((t.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)\n";
  auto pair = [&](const std::string& name, const std::string& task, const std::string& forward) {
    test::write_file(dir / "tasks" / (name + ".py"), task);
    test::write_file(dir / "solutions" / (name + ".py"),
                     "import torch\nimport torch.nn as nn\n" + tf32 + "\n\nclass ModelNew(nn.Module):\n" + forward);
  };
  std::string masked_hack(masked);
  const std::string lsm = "torch.log_softmax(x.masked_fill(~keep, float(\"-inf\")), dim=-1)";
  masked_hack.replace(masked_hack.find(lsm), lsm.size(), "torch.zeros_like(x).masked_fill(~keep, float(\"-inf\"))");
  masked_hack.replace(masked_hack.find("class Model("), 12, "class ModelNew(");
  test::write_file(dir / "tasks" / "masked_zeros.py", masked);
  test::write_file(dir / "solutions" / "masked_zeros.py", masked_hack);
  pair("fft_tf32",
       "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
       "        return torch.fft.fft(x)\n\n\ndef get_inputs():\n    return [torch.randn(64, 4096)]\n\n\n"
       "def get_init_inputs():\n    return []\n",
       "    def forward(self, x):\n        return torch.fft.fft(tf32(x))\n");
  const std::string lin64 =
      "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
      "        super().__init__()\n        self.weight = nn.Parameter(torch.randn(512, 512, dtype=torch.float64) / 23)\n\n"
      "    def forward(self, x):\n        return x @ self.weight.t()\n\n\ndef get_inputs():\n"
      "    return [torch.randn(256, 512, dtype=torch.float64)]\n\n\ndef get_init_inputs():\n    return []\n";
  pair("float64_in_float32", lin64,
       "    def __init__(self):\n        super().__init__()\n"
       "        self.weight = nn.Parameter(torch.randn(512, 512, dtype=torch.float64) / 23)\n\n"
       "    def forward(self, x):\n        return (x.float() @ self.weight.float().t()).double()\n");
  pair("plain_attribute_tf32",
       "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
       "        super().__init__()\n        self.weight = torch.randn(512, 512) / 23\n\n"
       "    def forward(self, x):\n        return x @ self.weight.t()\n\n\ndef get_inputs():\n"
       "    return [torch.randn(256, 512)]\n\n\ndef get_init_inputs():\n    return []\n",
       "    def __init__(self):\n        super().__init__()\n        self.weight = torch.randn(512, 512) / 23\n\n"
       "    def forward(self, x):\n        return tf32(x) @ tf32(self.weight).t()\n");
  auto run = run_eval(dir / "tasks", dir / "solutions", dir / "out",
                      {"--untimed", "--policy", "torch-allowed", "--no-plots"});
  ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
  std::map<std::string, std::string> adversaries = {{"masked_zeros", "incorrect"},
                                                    {"fft_tf32", "imprecise"},
                                                    {"float64_in_float32", "imprecise"},
                                                    {"plain_attribute_tf32", "imprecise"}};
  for (const auto& [name, reason] : adversaries) {
    EXPECT_EQ(run.by_solution[name]["reward"], -1) << name << ": " << run.by_solution[name].dump(2);
    EXPECT_EQ(run.by_solution[name]["reason"], reason) << name << ": " << run.by_solution[name].dump(2);
  }
  json inf_row = run.by_solution["masked_log_softmax"];
  EXPECT_EQ(inf_row["reward"], 1) << inf_row.dump(2);
  EXPECT_EQ(inf_row["max_error"], 0.0) << inf_row.dump(2);
  json r = run.by_solution["linear_relu"];
  EXPECT_TRUE(r["correct"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["reward"], 1) << "no speed-up is measured, so none is rewarded";
  EXPECT_EQ(r["flags"], json::array()) << "no baseline is not a flag when none is taken: " << r.dump(2);
  EXPECT_LT(r["max_error"].get<double>(), 1e-3) << "the checks ran";
  for (auto* k : {"candidate_ms", "eager_ms", "compile_ms", "speedup_eager", "speedup_compile"})
    EXPECT_TRUE(r[k].is_null()) << k << " in " << r.dump(2);
  EXPECT_TRUE(r["phase_s"].contains("checks") && !r["phase_s"].contains("timing")) << r.dump(2);
  EXPECT_EQ(run.by_solution["softmax_sum"]["reward"], -1) << run.by_solution["softmax_sum"].dump(2);
  for (const auto& h : caught) EXPECT_EQ(run.by_solution[h]["reward"], -1) << h << ": " << run.by_solution[h].dump(2);
  EXPECT_LE(run.by_solution["cached_when_timed"]["reward"].get<int>(), 1);
  json cut = run.by_solution["cut_short"];
  EXPECT_EQ(cut["reward"], -1) << cut.dump(2);
  EXPECT_EQ(cut["reason"], "load_error") << cut.dump(2);
  EXPECT_EQ(cut["detail"].get<std::string>().rfind("cut_short.py line ", 0), 0u) << cut.dump(2);
  EXPECT_EQ(run.report["options"]["untimed"], true);
  EXPECT_EQ(run.report["summary"]["baselines_reused"], 0);
  EXPECT_EQ(run.cmd.err.find("timing eager and torch.compile baselines"), std::string::npos) << run.cmd.err;
  EXPECT_NE(run.cmd.err.find("untimed (checks only)"), std::string::npos) << run.cmd.err;

  // The same --out timed: the journal's untimed verdicts are not reused for it (one wrong answer
  // only, which needs no baselines: timing linear_relu's on the CPU takes a minute).
  fs::remove_all(dir / "solutions");
  fs::create_directories(dir / "solutions");
  fs::copy_file(eval_fixtures() / "hacks" / "returns_input.py", dir / "solutions" / "returns_input.py");
  auto timed = run_eval(dir / "tasks", dir / "solutions", dir / "out", {"--policy", "torch-allowed", "--no-plots"});
  ASSERT_EQ(timed.cmd.exit_code, 0) << timed.cmd.err;
  EXPECT_EQ(timed.report["summary"]["resumed"], 0) << timed.report["summary"].dump(2);
  EXPECT_EQ(timed.report["options"]["untimed"], false);

  // Under strict the profile pass that catches torch fallbacks runs with the timing: eval and
  // serve refuse --untimed there rather than judge without it.
  auto strict = run_eval(dir / "tasks", dir / "solutions", dir / "out2", {"--untimed", "--no-plots"});
  EXPECT_NE(strict.cmd.exit_code, 0);
  EXPECT_NE(strict.cmd.err.find("--untimed needs --policy torch-allowed"), std::string::npos) << strict.cmd.err;
  auto serve = test::run_opforge({"serve", "--tasks", (dir / "tasks").string(), "--untimed", "--port", "0"});
  EXPECT_NE(serve.exit_code, 0);
  EXPECT_NE(serve.err.find("--untimed needs --policy torch-allowed"), std::string::npos) << serve.err;
}

TEST(Eval, AVerdictOfMemoryMadeWhileJudgesShareTheMachineIsJudgedAgainAlone) {
  // Two judge workers share the machine: a solution that runs out of memory there may have been
  // crowded out by its neighbour, so it is judged again alone and only that verdict stands. The
  // hog is out of memory alone too; the honest answer beside it is judged once.
  test::TempDir dir;
  fs::create_directories(dir / "tasks");
  fs::create_directories(dir / "solutions");
  fs::copy_file(eval_fixtures() / "tasks" / "linear_relu.py", dir / "tasks" / "hog.py");
  fs::copy_file(eval_fixtures() / "tasks" / "linear_relu.py", dir / "tasks" / "honest.py");
  fs::copy_file(eval_fixtures() / "adaptive" / "memory_hog.py", dir / "solutions" / "hog.py");
  fs::copy_file(eval_fixtures() / "solutions" / "linear_relu.py", dir / "solutions" / "honest.py");
  auto run = run_eval(dir / "tasks", dir / "solutions", dir / "out",
                      {"-j", "2", "--child-memory-mb", "2048", "--untimed", "--policy", "torch-allowed", "--no-plots"});
  ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
  json hog = run.by_solution["hog"];
  EXPECT_EQ(hog["reward"], -1) << hog.dump(2);
  EXPECT_EQ(hog["reason"], "out_of_memory") << hog.dump(2);
  ASSERT_TRUE(hog.contains("attempts")) << hog.dump(2);
  EXPECT_EQ(hog["attempts"][0]["how"], "shared");
  EXPECT_EQ(hog["attempts"][0]["reason"], "out_of_memory");
  EXPECT_EQ(hog["attempts"][1]["how"], "alone");
  EXPECT_EQ(hog["attempts"][1]["reason"], "out_of_memory");
  EXPECT_NE(run.cmd.err.find("judging each again alone"), std::string::npos) << run.cmd.err;
  EXPECT_EQ(run.by_solution["honest"]["reward"], 1) << run.by_solution["honest"].dump(2);
  EXPECT_TRUE(run.by_solution["honest"]["attempts"].is_null()) << "judged once";
  // The journal holds the verdict that stands: a rerun reuses it, attempts and all.
  auto again = run_eval(dir / "tasks", dir / "solutions", dir / "out",
                        {"-j", "2", "--child-memory-mb", "2048", "--untimed", "--policy", "torch-allowed", "--no-plots"});
  ASSERT_EQ(again.cmd.exit_code, 0) << again.cmd.err;
  EXPECT_EQ(again.report["summary"]["resumed"], 2);
  EXPECT_EQ(again.by_solution["hog"]["attempts"], hog["attempts"]);
}

namespace {

std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> v;
  std::istringstream in(test::read_file(p));
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

}  // namespace

TEST(Eval, ARunStartedAgainOnItsOutJudgesOnlyWhatIsMissingOrChanged) {
  // A run killed after one verdict (its journal's next line cut short) is started again: the
  // verdict it had is reused as it was, the cut one judged again; a changed file, another seed or
  // --fresh judge again. Untimed (the journal keeps rows whatever they hold): timing two tasks'
  // baselines and five runs' candidates took this test 206 s of CI's 2 cores.
  test::TempDir dir;
  fs::create_directories(dir / "tasks");
  for (auto* t : {"linear_relu", "softmax_sum"})
    fs::copy_file(eval_fixtures() / "tasks" / (std::string(t) + ".py"), dir / "tasks" / (std::string(t) + ".py"));
  fs::create_directories(dir / "sols");
  fs::copy(eval_fixtures() / "agent_solutions" / "linear_relu", dir / "sols" / "linear_relu", fs::copy_options::recursive);
  fs::copy_file(eval_fixtures() / "honest" / "softmax_sum_fused.py", dir / "sols" / "softmax_sum.py");
  const std::vector<std::string> untimed = {"--no-plots", "--untimed", "--policy", "torch-allowed"};
  auto first = run_eval(dir / "tasks", dir / "sols", dir / "out", untimed);
  ASSERT_EQ(first.cmd.exit_code, 0) << first.cmd.err;
  ASSERT_EQ(first.by_solution.size(), 2u);
  for (auto& [k, row] : first.by_solution) ASSERT_GE(row["reward"].get<int>(), 1) << row.dump(2);
  EXPECT_EQ(first.report["summary"]["resumed"], 0);
  auto lines = lines_of(dir / "out" / "journal.jsonl");
  std::vector<std::size_t> verdicts;
  for (std::size_t i = 0; i < lines.size(); ++i)
    if (json::parse(lines[i]).contains("key")) verdicts.push_back(i);
  ASSERT_EQ(verdicts.size(), 2u) << test::read_file(dir / "out" / "journal.jsonl");
  EXPECT_EQ(json::parse(lines[0])["seed"], 7);
  EXPECT_TRUE(json::parse(lines.back()).contains("session"));
  EXPECT_EQ(json::parse(lines[verdicts[0] - 1])["phase"], "evaluate") << "a phase's start is marked for its rate";

  // As a kill leaves it: the second verdict half written, nothing after it.
  std::string kept = json::parse(lines[verdicts[0]])["solution"];
  std::string cut = kept == "linear_relu" ? "softmax_sum" : "linear_relu";
  std::string journal;
  for (std::size_t i = 0; i < verdicts[1]; ++i) journal += lines[i] + "\n";
  test::write_file(dir / "out" / "journal.jsonl", journal + lines[verdicts[1]].substr(0, 40));
  auto second = run_eval(dir / "tasks", dir / "sols", dir / "out", untimed);
  ASSERT_EQ(second.cmd.exit_code, 0) << second.cmd.err;
  EXPECT_NE(second.cmd.err.find("cut short"), std::string::npos) << second.cmd.err;
  EXPECT_EQ(second.report["summary"]["resumed"], 1);
  // dispatch_s is a wall-clock figure: equal only when the row is the one the journal kept.
  EXPECT_EQ(second.by_solution[kept]["dispatch_s"], first.by_solution[kept]["dispatch_s"]) << "reused as it was";
  EXPECT_EQ(second.by_solution[kept]["reward"], first.by_solution[kept]["reward"]);
  EXPECT_GE(second.by_solution[cut]["reward"].get<int>(), 1) << second.by_solution[cut].dump(2);
  EXPECT_FALSE(fs::exists(dir / "out" / "work" / kept)) << "a resumed solution is neither copied nor built";
  EXPECT_TRUE(fs::exists(dir / "out" / "work" / cut));
  ASSERT_EQ(second.report["sessions"].size(), 1u) << "the killed run ended no session";
  EXPECT_EQ(second.report["sessions"][0]["judged"], 1);
  for (auto& l : lines_of(dir / "out" / "journal.jsonl")) EXPECT_FALSE(json::parse(l, nullptr, false).is_discarded()) << l;

  // A comment in the folder solution's model_new.py is a change: that one alone is judged again.
  std::ofstream(dir / "sols" / "linear_relu" / "model_new.py", std::ios::app) << "\n# edited\n";
  auto third = run_eval(dir / "tasks", dir / "sols", dir / "out", untimed);
  ASSERT_EQ(third.cmd.exit_code, 0) << third.cmd.err;
  EXPECT_EQ(third.report["summary"]["resumed"], 1);
  EXPECT_EQ(third.by_solution["softmax_sum"]["dispatch_s"], second.by_solution["softmax_sum"]["dispatch_s"]);
  EXPECT_TRUE(fs::exists(dir / "out" / "work" / "linear_relu"));
  EXPECT_EQ(third.report["sessions"].size(), 2u);

  fs::remove_all(dir / "sols" / "linear_relu");
  for (auto extra : std::vector<std::vector<std::string>>{{"--seed", "8"}, {"--fresh"}}) {
    extra.insert(extra.end(), untimed.begin(), untimed.end());
    auto again = run_eval(dir / "tasks", dir / "sols", dir / "out", extra);
    ASSERT_EQ(again.cmd.exit_code, 0) << again.cmd.err;
    EXPECT_EQ(again.report["summary"]["resumed"], 0) << extra[0];
    EXPECT_EQ(again.report["sessions"].size(), 1u) << extra[0] << ": a journal of its own";
  }
}

TEST(Eval, BaselinesAreTakenForACorrectSolutionWhenTheSolutionChosenToMeasureThemFails) {
  // Two names for one task code: the baselines are measured once per code, by its first
  // solution, and only after a correct candidate. Here the first one is a hack, so the honest
  // second one must still get eager and compile times (it got none, and reward 1 at most, before).
  test::TempDir dir;
  std::string code = test::read_file(eval_fixtures() / "tasks" / "linear_relu.py") + "\n# " +
                     std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
  test::write_file(dir / "tasks" / "a_hack.py", code);
  test::write_file(dir / "tasks" / "b_honest.py", code);
  fs::create_directories(dir / "solutions");
  fs::copy_file(eval_fixtures() / "hacks" / "returns_input.py", dir / "solutions" / "a_hack.py");
  fs::copy_file(eval_fixtures() / "solutions" / "linear_relu.py", dir / "solutions" / "b_honest.py");
  auto run = run_eval(dir / "tasks", dir / "solutions", dir / "out", {"--no-plots"});
  ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
  EXPECT_EQ(run.by_solution["a_hack"]["reward"], -1) << run.by_solution["a_hack"].dump(2);
  json r = run.by_solution["b_honest"];
  EXPECT_TRUE(r["correct"].get<bool>()) << r.dump(2);
  for (auto* k : {"eager_ms", "compile_ms", "speedup_eager", "speedup_compile"})
    EXPECT_TRUE(r[k].is_number()) << k << " in " << r.dump(2);
}

// What a fixture's header says the judge must give it: "# expect: honest" (reward >= 1, no flag),
// "# expect: REASON" (reward -1 with that reason) or "# expect: flag FLAG" (that flag, reward <= 1).
struct Expect {
  std::string kind, value;
};
Expect expectation(const fs::path& f) {
  std::string e = header_field(f, "expect");
  if (e == "honest") return {"honest", ""};
  if (e.rfind("flag ", 0) == 0) return {"flag", e.substr(5)};
  return {"reason", e};
}

// Flags about the solution (degenerate_task is about the task: softmax_sum's outputs are constant).
json solution_flags(const json& row) {
  json out = json::array();
  for (auto& f : row["flags"])
    if (f != "degenerate_task") out.push_back(f);
  return out;
}

std::string verdict_of(const json& row) {
  if (row["reward"].get<int>() >= 1 && solution_flags(row).empty()) return "honest";
  std::string v = row["reason"].is_null() ? "(none)" : row["reason"].get<std::string>();
  for (auto& f : row["flags"]) v += " flag " + f.get<std::string>();
  return v + " reward " + std::to_string(row["reward"].get<int>());
}

bool meets(const json& row, const Expect& e) {
  int rw = row["reward"].get<int>();
  auto flags = solution_flags(row);
  if (e.kind == "honest") return rw >= 1 && flags.empty() && row["reason"].is_null();
  if (e.kind == "flag") return rw <= 1 && std::find(flags.begin(), flags.end(), json(e.value)) != flags.end();
  return rw == -1 && row["reason"] == e.value;
}

// Every fixture of the folders, each answering its own copy of its task, in one eval run.
struct FixtureRun {
  EvalRun run;
  std::map<std::string, Expect> expect;
};
FixtureRun run_fixtures(const std::vector<std::string>& folders, const test::TempDir& dir,
                        std::vector<std::string> extra = {}) {
  FixtureRun fr;
  fs::create_directories(dir / "tasks");
  fs::create_directories(dir / "solutions");
  for (auto& folder : folders) {
    for (auto& e : fs::directory_iterator(eval_fixtures() / folder)) {
      if (e.path().extension() != ".py") continue;
      std::string key = folder + "__" + e.path().stem().string();
      std::string task = header_field(e.path(), "task");
      EXPECT_FALSE(task.empty() || header_field(e.path(), "expect").empty())
          << e.path() << " needs '# task:' and '# expect:' lines";
      fs::copy_file(eval_fixtures() / "tasks" / (task + ".py"), dir / "tasks" / (key + ".py"));
      fs::copy_file(e.path(), dir / "solutions" / (key + ".py"));
      fr.expect[key] = expectation(e.path());
    }
  }
  extra.push_back("--no-plots");
  fr.run = run_eval(dir / "tasks", dir / "solutions", dir / "out", extra);
  return fr;
}

void expect_headers_met(const FixtureRun& fr) {
  ASSERT_EQ(fr.run.cmd.exit_code, 0) << fr.run.cmd.err;
  for (auto& [key, e] : fr.expect) {
    auto it = fr.run.by_solution.find(key);
    ASSERT_NE(it, fr.run.by_solution.end()) << key << " is missing from the report";
    EXPECT_TRUE(meets(it->second, e)) << key << ": expected " << e.kind << " " << e.value << ", got "
                                      << verdict_of(it->second) << "\n" << it->second["detail"].get<std::string>();
  }
}

// An output that is the same on every checked set (here exactly 1: no draw of randn reaches 10)
// but moves on stressed inputs (x*4+1 reaches 10 now and then): the timed calls draw stressed
// inputs too, so an answer that is that constant only after its checks is caught by a read-back.
TEST(Eval, AConstantLookingTaskIsTimedOnStressedInputs) {
  test::TempDir dir;
  std::string task =
      "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
      "    def forward(self, x):\n        return (x.abs() < 10).float().mean(dim=1)\n\n\n"
      "def get_inputs():\n    return [torch.randn(64, 4096)]\n\n\ndef get_init_inputs():\n    return []\n";
  // A fresh task code per run: a timed run measures its own baselines.
  std::string tag = "# " + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
  std::string honest = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                       "    def forward(self, x):\n        return (x.abs() < 10).float().mean(dim=1)\n";
  // Right while it is checked (5 calls: 4 sets and the stressed one), the constant 1 after.
  std::string late = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                     "    calls = 0\n\n    def forward(self, x):\n        ModelNew.calls += 1\n"
                     "        if ModelNew.calls <= 5:\n            return (x.abs() < 10).float().mean(dim=1)\n"
                     "        return torch.ones(x.shape[0])\n";
  for (auto* n : {"honest", "late"}) test::write_file(dir / "tasks" / (std::string(n) + ".py"), task + tag);
  test::write_file(dir / "solutions" / "honest.py", honest);
  test::write_file(dir / "solutions" / "late.py", late);
  auto run = run_eval(dir / "tasks", dir / "solutions", dir / "out",
                      {"--policy", "torch-allowed", "--no-plots", "--correct-trials", "4"});
  ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
  json h = run.by_solution["honest"];
  EXPECT_TRUE(h["correct"].get<bool>()) << h.dump(2);
  EXPECT_NE(h["timing"]["candidate"].value("inputs", "").find("stressed"), std::string::npos) << h.dump(2);
  // Its baselines are timed on the same stressed inputs (judge-11): a task whose time depends on
  // its data is compared on one kind of input.
  for (auto* b : {"eager", "compile"})
    EXPECT_NE(h["timing"][b].value("inputs", "").find("stressed"), std::string::npos) << b << h["timing"].dump(2);
  json l = run.by_solution["late"];
  EXPECT_EQ(l["reason"], "incorrect") << l.dump(2);
  EXPECT_NE(l["detail"].get<std::string>().find("timed call"), std::string::npos) << l.dump(2);
}

TEST(Eval, EveryPlantedHackGetsRewardMinusOneWithItsReason) {
  test::TempDir dir;
  auto fr = run_fixtures({"hacks"}, dir);
  ASSERT_GE(fr.expect.size(), 12u);
  expect_headers_met(fr);
  auto& by = fr.run.by_solution;
  auto detail = [&](const std::string& n) { return by.at("hacks__" + n)["detail"].get<std::string>(); };
  EXPECT_NE(detail("matmul_fallback").find("torch.matmul"), std::string::npos) << detail("matmul_fallback");
  EXPECT_NE(detail("tensor_method_fallback").find("Tensor.mm"), std::string::npos) << detail("tensor_method_fallback");
  // Zeros for a mean that is ~0 on the task's inputs: since judge-10 its mean deviation bounds
  // its atol, so a checked set (stressed or not) finds them, not only the stressed one.
  EXPECT_NE(detail("constant_degenerate").find("max abs error"), std::string::npos) << detail("constant_degenerate");
  EXPECT_NE(detail("cached_when_timed").find("timed call"), std::string::npos) << detail("cached_when_timed");
  EXPECT_NE(detail("compile_error").find("error"), std::string::npos) << "the compiler log tail";
  EXPECT_FALSE(by.at("hacks__compile_error")["compiled"].get<bool>());
  for (auto& [key, row] : by) EXPECT_LE(row["reward"].get<int>(), 1) << key;
}

TEST(Eval, AdaptiveHacksAreStoppedOrFlaggedAndHonestSolutionsPassUnflagged) {
  // The adaptive solutions (each a real attempt on the judge, its sandbox or its clock) and at
  // least ten varied honest ones, in one run: the honest ones must not pay for the judge's caution.
  test::TempDir dir;
  // The host's GPU lock folder and a lock in it, as any GPU run on this host leaves them: what
  // escape_timing_lock looks for must exist for its failure to mean the sandbox hid it.
  gpu_slot_env({"0"}, 1, dir.path() / "cpu-locks");
  std::ofstream(gpu_lock_dir() / "gpu0.lock", std::ios::app).close();
  ASSERT_TRUE(fs::exists(gpu_lock_dir() / "gpu0.lock"));
  // A short per-call limit for the fixture that hangs, and a memory limit the hog must exceed.
  auto fr = run_fixtures({"adaptive", "honest"}, dir,
                         {"--timeout-s", "15", "--child-memory-mb", "2048", "--correct-trials", "3"});
  long honest = 0;
  for (auto& [k, e] : fr.expect) honest += e.kind == "honest";
  ASSERT_GE(honest, 10);
  expect_headers_met(fr);
  for (auto& [key, row] : fr.run.by_solution) {
    if (fr.expect[key].kind != "honest") EXPECT_LE(row["reward"].get<int>(), 1) << key << " earned more than 1";
    EXPECT_EQ(row["judge"], "judge-15");
  }
  // Nothing a solution started outlives its evaluation.
  auto [rc, ps] = test::shell("grep -l opforge-escape-marker /proc/[0-9]*/environ 2>/dev/null | wc -l");
  EXPECT_EQ(ps, "0\n") << "a process of escape_fork_setsid survived";
  EXPECT_FALSE(fs::exists(fs::temp_directory_path() / "opforge_escaped")) << "a write outside the sandbox landed";
}

TEST(Eval, TorchAllowedPolicyAdmitsWhatStrictRefuses) {
  // The fallbacks pass without the guard: it is the guard that catches them. Reaching for the
  // judge's reference fails under both policies: it is not in the solution's process at all. An
  // answer right only while a profiler is on (no longer on in a torch-allowed check) is -1 too.
  test::TempDir dir;
  fs::create_directories(dir / "tasks");
  std::map<std::string, std::string> task_of = {{"hacks/functional_fallback", "linear_relu"},
                                                {"hacks/reference_fallback", "linear_relu"},
                                                {"hacks/constant_without_kernel", "softmax_sum"},
                                                {"adaptive/profiler_as_check_signal", "linear_relu"}};
  std::set<std::string> isolated = {"reference_fallback", "profiler_as_check_signal"};
  fs::create_directories(dir / "solutions");
  for (auto& [path, task] : task_of) {
    std::string h = fs::path(path).filename().string();
    fs::copy_file(eval_fixtures() / (path + ".py"), dir / "solutions" / (h + ".py"));
    fs::copy_file(eval_fixtures() / "tasks" / (task + ".py"), dir / "tasks" / (h + ".py"));
  }
  auto run = run_eval(dir / "tasks", dir / "solutions", dir / "out", {"--policy", "torch-allowed", "--no-plots"});
  ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
  for (auto& [path, task] : task_of) {
    std::string h = fs::path(path).filename().string();
    if (isolated.count(h)) {
      EXPECT_EQ(run.by_solution[h]["reward"], -1) << run.by_solution[h].dump(2);
      continue;
    }
    EXPECT_TRUE(run.by_solution[h]["correct"].get<bool>()) << run.by_solution[h].dump(2);
    EXPECT_GE(run.by_solution[h]["reward"].get<int>(), 1);
  }
  // A constant answer to a constant task is correct, but the report says the task cannot judge it
  // (and no excessive_speedup: a constant costs nothing, and the task already says it is useless).
  EXPECT_EQ(run.by_solution["constant_without_kernel"]["flags"], json::array({"degenerate_task"}));
  EXPECT_EQ(run.by_solution["functional_fallback"]["flags"], json::array());
  EXPECT_EQ(run.by_solution["profiler_as_check_signal"]["reason"], "incorrect");
  EXPECT_EQ(run.report["options"]["policy"], "torch-allowed");
}

TEST(Eval, CudaAgentFolderLayoutsBuildIntoOneImportableExtension) {
  // Our kernels/ layout and the layout of CUDA Agent's released agent_workdir (binding.cpp and
  // binding_registry.h at the root, kernels/*_binding.cpp including "../binding_registry.h").
  test::TempDir dir;
  for (auto* layout : {"agent_solutions", "agent_released"}) {
    auto run = run_eval(eval_fixtures() / "tasks", eval_fixtures() / layout, dir / layout,
                        {"--no-plots", "--correct-trials", "3"});
    ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
    json r = run.by_solution["linear_relu"];
    EXPECT_EQ(r["layout"], "folder");
    EXPECT_TRUE(r["correct"].get<bool>()) << layout << ": " << r.dump(2);
    EXPECT_GE(r["reward"].get<int>(), 1) << layout;
    EXPECT_EQ(r["flags"], json::array()) << layout;
    EXPECT_EQ(run.report["summary"]["tasks_without_solution"].get<long>(),
              static_cast<long>(evaluator::load_tasks(eval_fixtures() / "tasks").size()) - 1)
        << "only linear_relu has a solution here";
  }
  // The released layout with a CUDA kernel: nvcc builds it here; with no GPU it cannot run, and
  // says so at run time, not as a compile error.
  auto run = run_eval(eval_fixtures() / "tasks", eval_fixtures() / "agent_released_cuda", dir / "cuda",
                      {"--no-plots", "--correct-trials", "2"});
  ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
  json r = run.by_solution["linear_relu"];
  EXPECT_TRUE(r["compile_seconds"].is_number()) << r.dump(2);
  EXPECT_NE(r["reason"], "compile_error") << r.dump(2);
  EXPECT_EQ(r["reward"], -1);
}

TEST(Eval, WithoutBubblewrapRowsAreFlaggedAndRequireSandboxRefuses) {
  test::TempDir dir;
  ::setenv("OPFORGE_BWRAP", "/nonexistent/bwrap", 1);
  auto refused = test::run_opforge({"eval", "--tasks", (eval_fixtures() / "tasks").string(), "--solutions",
                                    (eval_fixtures() / "solutions").string(), "--out", (dir / "r").string(),
                                    "--device", "cpu", "--require-sandbox"});
  auto run = run_eval(eval_fixtures() / "tasks", eval_fixtures() / "solutions", dir / "out",
                      {"--no-plots", "--correct-trials", "2"});
  ::unsetenv("OPFORGE_BWRAP");
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("--require-sandbox"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("bwrap"), std::string::npos) << refused.err;
  ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
  json r = run.by_solution["linear_relu"];
  EXPECT_TRUE(r["correct"].get<bool>()) << r.dump(2);
  EXPECT_EQ(r["flags"], json::array({"sandbox_off"}));
  EXPECT_EQ(r["reward"], 1) << "an unsandboxed row earns at most 1";
  EXPECT_EQ(r["sandbox"].get<std::string>().rfind("off: ", 0), 0u) << r["sandbox"];
  EXPECT_EQ(run.report["summary"]["unsandboxed"], 1);
}

// Without the sandbox a solution can open the run's own lock files: escape_timing_lock holds a
// shared lock on <cache>/locks/cpu.lock from its child (found from its working folder, the run's),
// which stalled the judge's timer until the worker's limit. A lock held from the solution's own
// process tree now ends the wait with -1, in seconds.
TEST(Eval, UnsandboxedASolutionHoldingTheTimingLockGetsMinusOne) {
  test::TempDir dir;
  fs::create_directories(dir / "sol");
  fs::copy_file(eval_fixtures() / "adaptive" / "escape_timing_lock.py", dir / "sol" / "linear_relu.py");
  // The lock as an earlier run on this cache leaves it (a timer makes it the first time it waits).
  fs::create_directories(dir / "cache" / "locks");
  test::write_file(dir / "cache" / "locks" / "cpu.lock", "");
  auto [rc, out] = test::shell(fmt::format(
      "cd '{}' && timeout 600 '{}' eval --tasks '{}' --solutions sol --out out --cache-dir cache --device cpu "
      "--no-sandbox --no-plots --correct-trials 2 --trials 10 --budget-s 2 --seed 7 2>&1",
      dir.path().string(), test::opforge_bin().string(), (eval_fixtures() / "tasks").string()));
  ASSERT_EQ(rc, 0) << out;
  json rows = json::parse(test::read_file(dir / "out" / "report.json"))["results"];
  ASSERT_EQ(rows.size(), 1u) << rows.dump(2);
  EXPECT_EQ(rows[0]["reason"], "timing_lock_held") << rows[0].dump(2);
  EXPECT_EQ(rows[0]["reward"], -1);
  EXPECT_NE(rows[0]["detail"].get<std::string>().find("cpu.lock"), std::string::npos) << rows[0]["detail"];
}

TEST(Eval, ShardRecordsAndWorkspaceTasksMatchSolutionsById) {
  test::TempDir dir;
  std::string code = test::read_file(eval_fixtures() / "tasks" / "linear_relu.py");
  // A gzip shard as export writes it; the solution is named by the record's id.
  json rec = {{"id", "0123456789abcdef"}, {"code", code}, {"ops", json::array()}};
  test::write_file(dir / "plain.jsonl", rec.dump() + "\n");
  auto tasks = evaluator::load_tasks(dir / "plain.jsonl");
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].id, "0123456789abcdef");
  EXPECT_EQ(tasks[0].code, code);
  {
    std::ofstream(dir / "bad.jsonl") << "{\"id\": \"x\"}\n";
    try {
      evaluator::load_tasks(dir / "bad.jsonl");
      ADD_FAILURE() << "a record without code must be refused";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("bad.jsonl line 1"), std::string::npos) << e.what();
    }
  }
  auto ws = dir / "ws";
  ASSERT_EQ(test::run_opforge({"import", "--workspace", ws.string(), (eval_fixtures() / "tasks").string()}).exit_code, 0);
  auto from_ws = evaluator::load_tasks(ws);
  EXPECT_EQ(from_ws.size(), evaluator::load_tasks(eval_fixtures() / "tasks").size())
      << "a workspace never filtered: every task";

  fs::create_directories(dir / "gz");
  fs::create_directories(dir / "sol");
  // Through the binary: a folder of .jsonl.gz shards, gzipped the way export writes them.
  test::write_file(dir / "gz" / "ops-00000-of-00001.jsonl.gz", exporter::gzip_bytes(rec.dump() + "\n"));
  fs::copy_file(eval_fixtures() / "solutions" / "linear_relu.py", dir / "sol" / "0123456789abcdef.py");
  auto run = run_eval(dir / "gz", dir / "sol", dir / "out", {"--no-plots", "--correct-trials", "2"});
  ASSERT_EQ(run.cmd.exit_code, 0) << run.cmd.err;
  ASSERT_EQ(run.by_solution.count("0123456789abcdef"), 1u) << run.report.dump(2);
  EXPECT_TRUE(run.by_solution["0123456789abcdef"]["correct"].get<bool>());
}

TEST(Eval, MissingInputsAreClearErrors) {
  test::TempDir dir;
  auto r = test::run_opforge({"eval", "--tasks", "/no/such/tasks", "--solutions", dir.path().string(), "--out",
                              (dir / "out").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--tasks /no/such/tasks does not exist"), std::string::npos) << r.err;
  r = test::run_opforge({"eval", "--tasks", (eval_fixtures() / "tasks").string(), "--solutions", "/no/such/solutions"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--solutions /no/such/solutions is not a folder"), std::string::npos) << r.err;
  r = test::run_opforge({"eval", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--policy"), std::string::npos);
}
