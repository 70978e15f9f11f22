// `opforge eval --device cuda` on the GPU fixtures of tests/fixtures/eval_gpu (label gpu, not
// run in CI): the reference CUDA solutions are correct and earn a reward, and every GPU-only hack
// gets reward -1 with the reason its docstring names ("expect `reason`").
// Layout there: tasks/<task>.py, solutions/<task>.py or solutions/<task>/ (CUDA Agent layout),
// hacks/<hack>/<task>.py (each hack folder is one --solutions folder).
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "test_support.h"

using namespace opforge;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path gpu_fixtures() { return test::fixtures() / "eval_gpu"; }

bool have_gpu() { return fs::exists("/dev/nvidia0"); }

json run_eval(const fs::path& solutions, const fs::path& out, std::string* err = nullptr,
              const std::vector<std::string>& more = {}) {
  std::vector<std::string> args{"eval", "--tasks", (gpu_fixtures() / "tasks").string(), "--solutions",
                                solutions.string(), "--out", out.string(), "--cache-dir", test::eval_cache_dir().string(),
                                "--device", "cuda", "--no-plots"};
  args.insert(args.end(), more.begin(), more.end());
  auto r = test::run_opforge(args);
  std::cout << r.out;
  if (err) *err = r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? json::parse(test::read_file(out / "report.json")) : json();
}

std::string expected_reason(const fs::path& file) {
  std::smatch m;
  std::string text = test::read_file(file);
  std::regex re("expect[^`]*`([A-Za-z_]+)`");
  return std::regex_search(text, m, re) ? m[1].str() : "";
}

}  // namespace

TEST(EvalGpu, ReferenceSolutionsAreCorrectAndRewarded) {
  if (!have_gpu()) GTEST_SKIP() << "no NVIDIA GPU";
  test::TempDir dir;
  std::string err;
  json rep = run_eval(gpu_fixtures() / "solutions", dir / "out", &err);
  ASSERT_FALSE(rep.is_null()) << err;
  ASSERT_GE(rep["results"].size(), 1u);
  for (auto& r : rep["results"]) {
    EXPECT_TRUE(r["correct"].get<bool>()) << r.dump(2);
    EXPECT_GE(r["reward"].get<int>(), 1) << r.dump(2);
    EXPECT_TRUE(r["eager_ms"].is_number() && r["compile_ms"].is_number()) << r.dump(2);
    // Every row says its sandbox; on the GPU machine bubblewrap comes in .device (docs/gpu.md).
    EXPECT_EQ(r["sandbox"].get<std::string>().rfind("bwrap", 0), 0u) << r.dump(2);
    std::cout << r["solution"].get<std::string>() << ": sandbox " << r["sandbox"].get<std::string>() << "\n";
  }
}

TEST(EvalGpu, EveryGpuHackGetsItsReason) {
  if (!have_gpu()) GTEST_SKIP() << "no NVIDIA GPU";
  if (!fs::exists(gpu_fixtures() / "hacks")) GTEST_SKIP() << "no GPU hacks";
  for (auto& e : fs::directory_iterator(gpu_fixtures() / "hacks")) {
    if (!e.is_directory()) continue;
    test::TempDir dir;
    json rep = run_eval(e.path(), dir / "out");
    ASSERT_FALSE(rep.is_null()) << e.path();
    for (auto& r : rep["results"]) {
      fs::path file = e.path() / (r["solution"].get<std::string>() + ".py");
      std::string want = fs::exists(file) ? expected_reason(file) : "";
      std::string got = r["reason"].is_null() ? "(none)" : r["reason"].get<std::string>();
      EXPECT_EQ(r["reward"], -1) << e.path().filename() << ": " << r.dump(2);
      if (!want.empty()) EXPECT_EQ(got, want) << e.path().filename() << ": " << r.dump(2);
    }
  }
}

TEST(EvalGpu, CudaAgentReleasedLayoutIsBuiltAndCorrect) {
  // tests/fixtures/eval_gpu/released: the GEMM solution in the layout of CUDA Agent's released
  // agent_workdir (binding.cpp and binding_registry.h at the root), built unchanged.
  if (!have_gpu()) GTEST_SKIP() << "no NVIDIA GPU";
  test::TempDir dir;
  json rep = run_eval(gpu_fixtures() / "released", dir / "out");
  ASSERT_FALSE(rep.is_null());
  ASSERT_EQ(rep["results"].size(), 1u);
  const json& r = rep["results"][0];
  EXPECT_EQ(r["layout"], "folder");
  EXPECT_TRUE(r["correct"].get<bool>()) << r.dump(2);
  EXPECT_GE(r["reward"].get<int>(), 1) << r.dump(2);
  EXPECT_EQ(r["flags"], json::array()) << r.dump(2);
}

TEST(EvalGpu, TimedJudgesWarmTheProfilerInTheirSparesUntimedOnesDoNot) {
  // A spare of a timed judge pays the profiler's first session before its solution comes (its
  // profile pass runs under it, strict's checks too); torch-allowed's used to skip it, and each
  // timed row's profile pass paid 6.1-6.9 s on an H100. An untimed judge profiles nothing.
  if (!have_gpu()) GTEST_SKIP() << "no NVIDIA GPU";
  for (bool timed : {true, false}) {
    test::TempDir dir;
    std::vector<std::string> more{"--policy", "torch-allowed"};
    if (!timed) more.push_back("--untimed");
    std::string err;
    json rep = run_eval(gpu_fixtures() / "solutions", dir / "out", &err, more);
    ASSERT_FALSE(rep.is_null()) << err;
    for (auto& r : rep["results"]) {
      const json& parts = r["dispatch_parts"];
      EXPECT_EQ(parts.contains("profiler_warm_s") || parts.contains("profiler_warm_error"), timed) << r.dump(2);
      if (timed && parts.contains("profiler_warm_s"))
        EXPECT_LT(r["phase_s"]["profile"].get<double>(), 2.0) << "the profile pass paid the profiler's start: " << r.dump(2);
    }
  }
  // A solution that reads the warm-up as "timed calls now" and returns its first output from then
  // on is checked in that same warmed child: -1 under torch-allowed as under strict.
  test::TempDir dir;
  json rep = run_eval(gpu_fixtures() / "hacks" / "warm_profiler_cache", dir / "out", nullptr, {"--policy", "torch-allowed"});
  ASSERT_FALSE(rep.is_null());
  for (auto& r : rep["results"]) {
    EXPECT_EQ(r["reward"], -1) << r.dump(2);
    EXPECT_EQ(r["reason"], "incorrect") << r.dump(2);
  }
}
