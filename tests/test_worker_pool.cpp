// The supervisor against real workers: real CPython, real torch, real crashes.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>

#include "opforge/core/error.h"
#include "opforge/core/worker_pool.h"
#include "test_support.h"

using namespace opforge;
using nlohmann::json;

namespace {

WorkerPoolOptions options(int workers = 2) {
  WorkerPoolOptions o;
  o.workers = workers;
  o.worker_exe = test::opforge_bin();
  o.timeout_s = 60;
  return o;
}

json probe(const std::string& fixture, double timeout_s = 0) {
  json r = {{"op", "probe"},
            {"args", {{"candidates", {test::read_file(test::fixtures() / "planted" / fixture)}}, {"device", "cpu"}}}};
  if (timeout_s > 0) r["timeout_s"] = timeout_s;
  return r;
}

}  // namespace

TEST(WorkerPool, WorkersEmbedTheVenvAndAnswer) {
  WorkerPool pool(options(1));
  auto r = pool.call({{"op", "ping"}, {"args", {{"x", 3}}}});
  ASSERT_EQ(r.outcome, Outcome::ok) << r.reason;
  EXPECT_TRUE(r.reply["ok"].get<bool>());
  EXPECT_EQ(r.reply["result"]["x"], 3);
  const json& info = pool.worker_info();
  EXPECT_FALSE(info["torch"].get<std::string>().empty());
  // sys.executable must be a real python inside the venv (inductor spawns compile workers with it).
  std::string exe = info["executable"];
  EXPECT_TRUE(std::filesystem::exists(exe)) << exe;
  EXPECT_NE(exe.find("venv"), std::string::npos) << exe;
}

TEST(WorkerPool, HandlerErrorsAreAnswersNotCrashes) {
  WorkerPool pool(options(1));
  auto r = pool.call({{"op", "no_such_op"}});
  ASSERT_EQ(r.outcome, Outcome::ok);
  EXPECT_FALSE(r.reply["ok"].get<bool>());
  EXPECT_NE(r.reply["message"].get<std::string>().find("unknown op"), std::string::npos);
}

TEST(WorkerPool, CrashesHangsAndMemoryHogsAreRecordedAndThePoolGoesOn) {
  auto o = options(2);
  o.memory_limit_mb = 1500;
  WorkerPool pool(o);
  std::vector<json> reqs = {probe("segfault.py"), probe("hang.py", 5), probe("memory_hog.py"), probe("abort.py"),
                            probe("good_relu.py"), probe("noisy_stdout.py"), probe("good_relu.py")};
  std::vector<WorkerResult> results(reqs.size());
  std::vector<int> seen(reqs.size(), 0);
  pool.run(reqs, [&](WorkerResult&& r) {
    seen[r.index]++;
    results[r.index] = std::move(r);
  });
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(seen[i], 1) << "request " << i << " answered once";

  EXPECT_EQ(results[0].outcome, Outcome::worker_crash);
  EXPECT_NE(results[0].reason.find("signal 11"), std::string::npos) << results[0].reason;

  EXPECT_EQ(results[1].outcome, Outcome::timeout);
  EXPECT_NE(results[1].reason.find("within 5 s"), std::string::npos) << results[1].reason;

  EXPECT_EQ(results[2].outcome, Outcome::out_of_memory);
  EXPECT_NE(results[2].reason.find("limit of 1500 MiB"), std::string::npos) << results[2].reason;

  EXPECT_EQ(results[3].outcome, Outcome::worker_crash);
  EXPECT_NE(results[3].reason.find("signal 6"), std::string::npos) << results[3].reason;

  for (size_t i : {4, 5, 6}) {
    ASSERT_EQ(results[i].outcome, Outcome::ok) << i << ": " << results[i].reason;
    EXPECT_TRUE(results[i].reply["result"]["ok"].get<bool>()) << results[i].reply.dump();
  }
  // Junk printed on stdout by task code does not reach the protocol.
  EXPECT_EQ(results[5].reply["result"]["outputs"][0]["shape"], json({4, 4}));
}

// An adversary's endless stderr line (no newline): the pool answers the request, and what it
// buffers and logs of the line stays bounded.
TEST(WorkerPool, AnEndlessLogLineIsCutAndDoesNotStallThePool) {
  auto o = options(1);
  o.log_file = std::filesystem::temp_directory_path() / ("opforge_endless_line_" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(o.log_file);
  WorkerPool pool(o);
  json req = {{"op", "probe"},
              {"timeout_s", 60},
              {"args",
               {{"candidates", {test::read_file(test::fixtures() / "worker_pool" / "endless_stderr_line.py")}},
                {"device", "cpu"}}}};
  WorkerResult r = pool.call(req);
  ASSERT_EQ(r.outcome, Outcome::ok) << r.reason;
  EXPECT_TRUE(r.reply["result"]["ok"].get<bool>()) << r.reply.dump().substr(0, 500);
  // At least 128 MiB were written; the log keeps the line's first 64 KiB, marked as cut.
  auto size = std::filesystem::file_size(o.log_file);
  EXPECT_LT(size, 1u << 20) << "the log kept most of the endless line";
  EXPECT_NE(test::read_file(o.log_file).find("line cut at 65536 bytes"), std::string::npos);
  std::filesystem::remove(o.log_file);
}

TEST(WorkerPool, ABrokenPythonIsAClearErrorNotAHang) {
  auto o = options(1);
  o.env["OPFORGE_PYTHON"] = "/nonexistent/python3";
  o.startup_timeout_s = 60;
  WorkerPool pool(o);
  try {
    pool.call({{"op", "ping"}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("workers cannot start"), std::string::npos) << msg;
    EXPECT_NE(msg.find("OPFORGE_PYTHON"), std::string::npos) << msg;
  }
}

// Work handed out as it is claimed (run_fed: the filter's leases, and run() itself, which the
// judge uses) keeps each answer with its own request while workers crash, hang and are replaced
// between the handings: a request that kills its worker cannot take a neighbour's answer, nor
// leave its own to a later request.
TEST(WorkerPool, FedWorkKeepsEachAnswerWithItsRequestThroughCrashesAndHangs) {
  WorkerPool pool(options(2));
  std::vector<std::vector<json>> rounds = {{probe("segfault.py"), probe("good_relu.py")},
                                           {probe("hang.py", 5), probe("noisy_stdout.py")},
                                           {probe("abort.py"), probe("good_relu.py")}};
  std::size_t handed = 0;
  std::vector<int> seen(6, 0);
  std::vector<WorkerResult> results(6);
  pool.run_fed(
      [&] { return handed < rounds.size() ? rounds[handed++] : std::vector<json>{}; },
      [&](WorkerResult&& r) {
        ASSERT_LT(r.index, seen.size());
        seen[r.index]++;
        results[r.index] = std::move(r);
      });
  EXPECT_EQ(handed, rounds.size());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "request " << i << " answered once";
  EXPECT_EQ(results[0].outcome, Outcome::worker_crash) << results[0].reason;
  EXPECT_EQ(results[2].outcome, Outcome::timeout) << results[2].reason;
  EXPECT_EQ(results[4].outcome, Outcome::worker_crash) << results[4].reason;
  EXPECT_NE(results[4].reason.find("signal 6"), std::string::npos) << results[4].reason;
  for (size_t i : {1, 3, 5}) {
    ASSERT_EQ(results[i].outcome, Outcome::ok) << i << ": " << results[i].reason;
    EXPECT_TRUE(results[i].reply["result"]["ok"].get<bool>()) << results[i].reply.dump();
  }
  EXPECT_EQ(results[3].reply["result"]["outputs"][0]["shape"], json({4, 4}));
}

// With poll_more (opforge serve's judge thread) work that arrives while a request runs starts on
// the idle worker at once: the late request is answered while the hang is still in flight.
TEST(WorkerPool, FedWorkArrivingLaterStartsOnAnIdleWorker) {
  WorkerPool pool(options(2));
  auto t0 = std::chrono::steady_clock::now();
  int handed = 0;
  std::vector<std::size_t> order;
  pool.run_fed(
      [&]() -> std::vector<json> {
        if (handed == 0) return ++handed, std::vector<json>{probe("hang.py", 10)};
        // The second request "arrives" half a second later, from the caller's point of view.
        if (handed == 1 && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(500))
          return ++handed, std::vector<json>{probe("good_relu.py")};
        return {};
      },
      [&](WorkerResult&& r) { order.push_back(r.index); }, true);
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], 1u) << "the late request waited for the hang";
  EXPECT_EQ(order[1], 0u);
}
