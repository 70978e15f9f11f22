// dedup's search at scale: 100k tasks x 10k references (the target), exact vs the
// inverted file dedup switches to above kExactUpTo tasks (dedup/index.h).
//
//   build/bench/opforge_bench_dedup [TASKS] [REFS] [DIMS] [--no-exact]
//
// Vectors are made the way dedup makes them (dedup::hashed_vector) from synthetic token bags:
// ~60 AST n-gram tokens drawn Zipf-like from 3,000 and 1-5 op tokens from 800. Planted: 1% of
// the tasks are near duplicates of another task (one AST token and nothing else changed) and
// 200 tasks are disguised copies of a reference (two AST tokens changed). Printed: seconds for
// the search of each task's 16 nearest tasks (as dedup does it) and of its nearest reference,
// and the planted pairs each index finds above dedup's thresholds.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "dedup.h"
#include "index.h"

using nlohmann::json;
using idx_t = faiss::Index::idx_t;

namespace {

json random_bag(std::mt19937_64& rng) {
  // Zipf-like: token k drawn with weight 1/(k+1).
  static std::discrete_distribution<int> ast = [] {
    std::vector<double> w(3000);
    for (std::size_t k = 0; k < w.size(); ++k) w[k] = 1.0 / static_cast<double>(k + 1);
    return std::discrete_distribution<int>(w.begin(), w.end());
  }();
  std::uniform_int_distribution<int> op(0, 799), nops(1, 5);
  json bag = json::object();
  for (int i = 0; i < 60; ++i) {
    std::string t = "ast:" + std::to_string(ast(rng));
    bag[t] = bag.value(t, 0) + 1;
  }
  int k = nops(rng);
  for (int i = 0; i < k; ++i) bag["op:" + std::to_string(op(rng))] = 1;
  return bag;
}

json perturb(json bag, std::mt19937_64& rng, int changes) {
  std::uniform_int_distribution<int> tok(100000, 200000);
  for (int c = 0; c < changes; ++c) {
    auto it = bag.begin();
    std::advance(it, static_cast<long>(rng() % bag.size()));
    if (it.key().rfind("op:", 0) == 0) continue;  // ops stay: a near duplicate computes the same
    bag.erase(it.key());
    bag["ast:" + std::to_string(tok(rng))] = 1;
  }
  return bag;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 100000;
  const long m = argc > 2 ? std::atol(argv[2]) : 10000;
  const int d = argc > 3 ? std::atoi(argv[3]) : 1024;
  std::mt19937_64 rng(7);
  std::vector<json> refs(static_cast<std::size_t>(m)), tasks(static_cast<std::size_t>(n));
  for (auto& r : refs) r = random_bag(rng);
  std::vector<std::pair<long, long>> near_pairs, ref_pairs;  // (task, task) and (task, ref)
  for (long i = 0; i < n; ++i) {
    if (i > 0 && i % 100 == 0) {
      long j = static_cast<long>(rng() % static_cast<std::uint64_t>(i));
      tasks[i] = perturb(tasks[j], rng, 1);
      near_pairs.push_back({i, j});
    } else if (i % 500 == 1 && static_cast<long>(ref_pairs.size()) < 200) {
      long r = static_cast<long>(rng() % static_cast<std::uint64_t>(m));
      tasks[i] = perturb(refs[r], rng, 2);
      ref_pairs.push_back({i, r});
    } else {
      tasks[i] = random_bag(rng);
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> tx(static_cast<std::size_t>(n) * d), rx(static_cast<std::size_t>(m) * d);
  for (long i = 0; i < n; ++i) {
    auto v = opforge::dedup::hashed_vector(tasks[i], d, 0.5);
    std::copy(v.begin(), v.end(), tx.begin() + i * d);
  }
  for (long i = 0; i < m; ++i) {
    auto v = opforge::dedup::hashed_vector(refs[i], d, 0.5);
    std::copy(v.begin(), v.end(), rx.begin() + i * d);
  }
  std::fprintf(stderr, "%ld tasks, %ld references, %d dims: vectors in %.1f s; %zu planted near-duplicate pairs, "
               "%zu planted reference copies\n", n, m, d, seconds_since(t0), near_pairs.size(), ref_pairs.size());

  std::printf("| index | build s | 16 nearest tasks s | nearest reference s | near pairs found (>= 0.98) | "
              "reference copies found (>= 0.95) |\n| --- | --- | --- | --- | --- | --- |\n");
  const bool with_exact = !(argc > 4 && std::string(argv[4]) == "--no-exact");
  for (bool exact : {false, true}) {
    if (exact && !with_exact) break;
    long up_to = exact ? n + m : opforge::dedup::kExactUpTo;
    auto tb = std::chrono::steady_clock::now();
    auto tindex = opforge::dedup::make_index(d, n, tx.data(), up_to);
    auto rindex = opforge::dedup::make_index(d, m, rx.data(), up_to);
    double build = seconds_since(tb);

    // As dedup searches: the 16 nearest distinct tasks of every task, near duplicates >= 0.98.
    auto t1 = std::chrono::steady_clock::now();
    const int k = 16;
    std::vector<float> nd(static_cast<std::size_t>(n) * k);
    std::vector<idx_t> nl(static_cast<std::size_t>(n) * k);
    tindex->search(n, tx.data(), k, nd.data(), nl.data());
    double nn_s = seconds_since(t1);
    long found = 0;
    for (auto [i, j] : near_pairs)
      for (int e = 0; e < k; ++e)
        if (nl[i * k + e] == j && nd[i * k + e] >= 0.98f - 1e-5f) {
          ++found;
          break;
        }

    auto t3 = std::chrono::steady_clock::now();
    std::vector<float> rd(static_cast<std::size_t>(n));
    std::vector<idx_t> rl(static_cast<std::size_t>(n));
    rindex->search(n, tx.data(), 1, rd.data(), rl.data());
    double ref_s = seconds_since(t3);
    long ref_found = 0;
    for (auto [i, r] : ref_pairs) ref_found += rl[i] == r && rd[i] >= 0.95f - 1e-5f;

    std::printf("| %s | %.1f | %.1f | %.1f | %ld/%zu | %ld/%zu |\n",
                exact ? "exact (IndexFlatIP)" : (n > opforge::dedup::kExactUpTo ? "dedup's choice (IndexIVFFlat)" : "dedup's choice (exact)"),
                build, nn_s, ref_s, found, near_pairs.size(), ref_found, ref_pairs.size());
    std::fflush(stdout);
  }
  return 0;
}
