// The report: rows from the judge's figures, the CUDA Agent reward, the summary and the Markdown.
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "evaluator.h"
#include "internal.h"

namespace opforge::evaluator {

using nlohmann::json;

int reward(bool correct, std::optional<double> se, std::optional<double> sc, double margin) {
  if (!correct) return -1;
  bool eager = se && *se > 1.0 + margin;
  bool comp = sc && *sc > 1.0 + margin;
  if (eager && comp) return 3;
  if (eager) return 2;
  return 1;
}

std::optional<double> number(const json& j, const char* k) {
  if (j.is_object() && j.contains(k) && j[k].is_number()) return j[k].get<double>();
  return std::nullopt;
}

bool caps_reward(const std::string& flag) {
  // degenerate_task says something of the task, not of the solution.
  return flag != "degenerate_task";
}

namespace {

json opt(std::optional<double> v) { return v ? json(*v) : json(nullptr); }

std::string tail(const std::string& s, std::size_t n) { return s.size() <= n ? s : "…" + s.substr(s.size() - n); }

// Figures that a correct solution must also pass: outputs that appear only when read back, and
// speed-ups too large to be believed, are flags (reward at most 1) for a person to look at.
void timing_flags(const json& r, std::optional<double> se, json& flags) {
  // Not on a degenerate task: there the right answer is a constant, which any solution may return
  // at no cost, and the row already says the task cannot judge it.
  bool degenerate = std::find(flags.begin(), flags.end(), "degenerate_task") != flags.end();
  if (se && *se > 10 && !degenerate) flags.push_back("excessive_speedup");
  // Only on a GPU, where a read-back is one device copy: on a busy CPU an honest read-back's
  // time varies by milliseconds (seen on the 2-core CI machine). A late output is caught on both
  // by the sampled read-backs after the inputs are overwritten.
  if (r.value("device_name", std::string("cpu")).rfind("cpu", 0) == 0) return;
  auto cand = number(r.value("candidate", json()), "median_ms");
  auto cf = number(r.value("candidate", json()), "fetch_median_ms");
  auto ef = number(r.value("eager", json()), "fetch_median_ms");
  // An honest read-back costs what the reference's does (a copy and a round trip, noisy on a busy
  // host); one that also computes costs a whole call more.
  if (cand && cf && ef && *cf > 3 * *ef + 2.0 && *cf > *cand) flags.push_back("slow_readback");
}

// The fixed cost taken off a candidate's batches is its own intercept (timing.fixed_cost_ms), which
// the candidate can raise by making its small batches slow on purpose (it knows how many calls it
// was asked for). The eager baseline's intercept is the same harness's fixed cost measured on
// trusted code of the same task, so the candidate's is held to it plus a slack for what a
// solution's own first launch may add (honest rows on the H200: 0.02-0.16 ms above eager's). Not
// torch.compile's: its batches carry a fixed cost of their own (1.16 ms against eager's 0.62 on
// the elementwise task), which would leave the shaping most of its gain. What is given back moves
// every batch's per-call time by (own - bound) / batch (evaluator/README.md, "What the judge does
// not stop").
constexpr double kFixedSlackMs = 0.3;

json bounded_by_baseline(json cand, const json& eager) {
  auto fixed = number(cand, "fixed_ms"), batch = number(cand, "batch"), floor = number(cand, "floor_ms");
  auto ef = number(eager, "fixed_ms");
  if (!fixed || !batch || *batch < 1 || !ef || number(cand, "small_batch").value_or(0) <= 0) return cand;
  double bound = std::max(floor.value_or(0.0), *ef + kFixedSlackMs);
  if (*fixed <= bound) return cand;
  double shift = (*fixed - bound) / *batch;
  for (const char* k : {"median_ms", "min_ms", "max_ms"})
    if (auto v = number(cand, k)) cand[k] = *v + shift;
  cand["fixed_ms"] = bound;
  cand["fixed_own_ms"] = *fixed;  // what the candidate's own batches implied, before the bound
  return cand;
}

// judge_over_kernels: the judge's clock against the profiler's kernel time a call, from the figure
// the reward is made from (after the bound above), so it is made here and not in the judge.
json profile_of(const json& r, std::optional<double> cand) {
  json prof = r.value("profile", json(nullptr));
  auto kernel = number(prof, "kernel_ms_per_call");
  if (cand && kernel && *kernel > 0) prof["judge_over_kernels"] = *cand / *kernel;
  return prof;
}

}  // namespace

json make_row(const json& r, double margin) {
  json timed = r.value("candidate", json());
  if (timed.is_object()) timed = bounded_by_baseline(timed, r.value("eager", json()));
  auto cand = number(timed, "median_ms");
  auto eager = number(r.value("eager", json()), "median_ms");
  auto comp = number(r.value("compile", json()), "median_ms");
  std::optional<double> se, sc;
  if (cand && *cand > 0 && eager) se = *eager / *cand;
  if (cand && *cand > 0 && comp) sc = *comp / *cand;
  bool ok = r.value("correct", false);
  json flags = r.value("flags", json::array());
  if (ok) timing_flags(r, se, flags);
  bool capped = false;
  for (auto& f : flags) capped = capped || caps_reward(f.get<std::string>());
  int rw = reward(ok, se, sc, margin);
  return {{"task", r["task"]},
          {"task_id", r["task_id"]},
          {"solution", r["solution"]},
          {"layout", r["layout"]},
          {"compiled", r.value("compiled", false)},
          {"correct", ok},
          {"reason", r.value("reason", json(nullptr))},
          {"detail", tail(r.value("detail", std::string()), 4000)},
          {"max_error", r.value("max_error", json(nullptr))},
          // the answer's distance from float64 in units of float32 eager's (evaluator/README.md)
          {"precision", r.value("precision", json(nullptr))},
          {"flags", flags},
          {"findings", r.value("findings", json::array())},
          {"candidate_ms", opt(ok ? cand : std::nullopt)},
          {"eager_ms", opt(eager)},
          {"compile_ms", opt(comp)},
          {"speedup_eager", opt(ok ? se : std::nullopt)},
          {"speedup_compile", opt(ok ? sc : std::nullopt)},
          {"reward", capped ? std::min(rw, 1) : rw},
          {"reward_uncapped", rw},
          {"timing", {{"candidate", timed.is_object() ? timed : json(nullptr)}, {"eager", r.value("eager", json(nullptr))},
                      {"compile", r.value("compile", json(nullptr))}}},
          {"baseline_cached", r.value("baseline_cached", json(nullptr))},
          {"compile_seconds", r.value("compile_seconds", json(nullptr))},
          {"dispatch_s", r.value("dispatch_s", json(nullptr))},
          {"dispatch_parts", r.value("dispatch_parts", json(nullptr))},
          {"phase_s", r.value("phase_s", json(nullptr))},  // checks, timing, profile: where an evaluation's time goes
          {"profile", profile_of(r, cand)},
          {"cold_start_s", r.value("cold_start_s", json(nullptr))},
          // [shared, alone] when a verdict of memory made beside other judges was judged again alone
          {"attempts", r.value("attempts", json(nullptr))},
          {"judge", kJudgeVersion},
          {"sandbox", r.value("sandbox", json(nullptr))}};
}

json summarize(const json& results, double margin) {
  long flagged = 0;
  long n = 0, compiled = 0, correct = 0, faster_eager = 0, faster_compile = 0;
  double log_se = 0, log_sc = 0;
  long n_se = 0, n_sc = 0;
  json hist = {{"-1", 0}, {"1", 0}, {"2", 0}, {"3", 0}};
  std::map<std::string, long> reasons, flags;
  long unsandboxed = 0;
  double reward_sum = 0;
  for (auto& r : results) {
    ++n;
    flagged += !r["flags"].empty();
    compiled += r["compiled"].get<bool>();
    bool ok = r["correct"].get<bool>();
    correct += ok;
    int rw = r["reward"].get<int>();
    reward_sum += rw;
    hist[std::to_string(rw)] = hist[std::to_string(rw)].get<long>() + 1;
    if (!r["reason"].is_null()) ++reasons[r["reason"].get<std::string>()];
    for (auto& f : r["flags"]) ++flags[f.get<std::string>()];
    unsandboxed += r["sandbox"].is_string() && r["sandbox"].get<std::string>().rfind("off", 0) == 0;
    auto se = number(r, "speedup_eager"), sc = number(r, "speedup_compile");
    if (ok && se) {
      faster_eager += *se > 1.0 + margin;
      log_se += std::log(*se);
      ++n_se;
    }
    if (ok && sc) {
      faster_compile += *sc > 1.0 + margin;
      log_sc += std::log(*sc);
      ++n_sc;
    }
  }
  auto rate = [&](long k) { return n ? json(static_cast<double>(k) / n) : json(nullptr); };
  return {{"evaluated", n},
          {"compiled", compiled},
          {"correct", correct},
          {"pass_rate", rate(correct)},
          {"faster_than_eager_rate", rate(faster_eager)},
          {"faster_than_compile_rate", rate(faster_compile)},
          {"geomean_speedup_eager", n_se ? json(std::exp(log_se / n_se)) : json(nullptr)},
          {"geomean_speedup_compile", n_sc ? json(std::exp(log_sc / n_sc)) : json(nullptr)},
          {"mean_reward", n ? json(reward_sum / n) : json(nullptr)},
          {"reward_histogram", hist},
          {"reasons", reasons},
          {"flags", flags},
          {"unsandboxed", unsandboxed},
          {"flagged", flagged}};
}

std::string report_markdown(const json& report) {
  const json& s = report["summary"];
  auto pct = [](const json& v) { return v.is_number() ? fmt::format("{:.1f}%", 100 * v.get<double>()) : std::string("-"); };
  auto x = [](const json& v) { return v.is_number() ? fmt::format("{:.3f}x", v.get<double>()) : std::string("-"); };
  auto ms = [](const json& v) { return v.is_number() ? fmt::format("{:.4g}", v.get<double>()) : std::string("-"); };
  std::string md = "# opforge eval report\n\n";
  const json& o = report["options"];
  md += fmt::format("Judge {}, sandbox: {}.\n", o["judge"].get<std::string>(), o["sandbox_profile"].get<std::string>());
  md += fmt::format("Device `{}` ({}), torch {}, policy `{}`, {} correctness sets, atol=rtol={:g}/{:g}, margin {:g}, "
                    "seed {}.\n\n",
                    o["device"].get<std::string>(), o["device_name"].get<std::string>(), o["torch"].get<std::string>(),
                    o["policy"].get<std::string>(), o["correct_trials"].get<int>(), o["atol"].get<double>(),
                    o["rtol"].get<double>(), o["speedup_margin"].get<double>(), o["seed"].get<std::uint64_t>());
  md += "| metric | value |\n| --- | --- |\n";
  md += fmt::format("| solutions evaluated | {} |\n", s["evaluated"].get<long>());
  md += fmt::format("| compiled | {} |\n", s["compiled"].get<long>());
  md += fmt::format("| pass rate | {} |\n", pct(s["pass_rate"]));
  md += fmt::format("| faster than eager | {} |\n", pct(s["faster_than_eager_rate"]));
  md += fmt::format("| faster than torch.compile | {} |\n", pct(s["faster_than_compile_rate"]));
  md += fmt::format("| geomean speed-up vs eager (correct) | {} |\n", x(s["geomean_speedup_eager"]));
  md += fmt::format("| geomean speed-up vs compile (correct) | {} |\n", x(s["geomean_speedup_compile"]));
  md += fmt::format("| mean reward | {} |\n", s["mean_reward"].is_number() ? fmt::format("{:.3f}", s["mean_reward"].get<double>()) : "-");
  const json& h = s["reward_histogram"];
  md += fmt::format("| reward histogram (-1 / 1 / 2 / 3) | {} / {} / {} / {} |\n", h["-1"].get<long>(), h["1"].get<long>(),
                    h["2"].get<long>(), h["3"].get<long>());
  md += fmt::format("| tasks without a solution | {} |\n", s["tasks_without_solution"].get<long>());
  md += fmt::format("| rows with flags / run unsandboxed | {} / {} |\n", s["flagged"].get<long>(), s["unsandboxed"].get<long>());
  md += "\n| task | solution | compiled | correct | max error | candidate ms | eager ms | compile ms | vs eager | vs compile | reward | reason |\n";
  md += "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (auto& r : report["results"]) {
    std::string reason = r["reason"].is_null() ? "" : "`" + r["reason"].get<std::string>() + "`";
    for (auto& f : r["flags"]) reason += (reason.empty() ? "" : " ") + std::string("flag `") + f.get<std::string>() + "`";
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", r["task"].get<std::string>(),
                      r["solution"].get<std::string>(), r["compiled"].get<bool>() ? "yes" : "no",
                      r["correct"].get<bool>() ? "yes" : "no",
                      r["max_error"].is_number() ? fmt::format("{:.2g}", r["max_error"].get<double>()) : "-",
                      ms(r["candidate_ms"]), ms(r["eager_ms"]), ms(r["compile_ms"]), x(r["speedup_eager"]),
                      x(r["speedup_compile"]), r["reward"].get<int>(), reason);
  }
  return md;
}

}  // namespace opforge::evaluator
