// The trainer's causal LM against transformers itself: tiny random Qwen2 and Llama checkpoints
// made offline by tests/python/tiny_lm.py, whose logits and greedy tokens transformers computed.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "eval_stage.h"
#include "files.h"
#include "generate.h"
#include "model.h"
#include "checkpoint.h"
#include "ppo_stage.h"
#include "opforge/core/error.h"
#include "opforge/core/hash.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "test_support.h"
#include "value.h"
#include "value_stage.h"

namespace opforge::test {
namespace {
using namespace opforge::trainer;
using json = nlohmann::json;
namespace fs = std::filesystem;

// The checkpoints are made once per version of tiny_lm.py and kept in the build tree: every test
// runs in a process of its own, and making them costs ~5 s of transformers each time.
class Trainer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fs::path script = fixtures().parent_path() / "python" / "tiny_lm.py";
    dir_ = eval_cache_dir().parent_path() / ("tiny_lm-" + xxh3_hex(read_file(script)));
    if (fs::exists(dir_ / "llama" / "reference.json")) return;
    fs::path tmp = dir_.string() + ".tmp" + std::to_string(::getpid());
    auto [rc, out] = shell(fmt::format("{} {} make {} 2>&1", python_bin().string(), script.string(), tmp.string()));
    ASSERT_EQ(rc, 0) << out;
    std::error_code ec;
    fs::rename(tmp, dir_, ec);  // a test in another process may have made them first: keep its copy
    if (ec) fs::remove_all(tmp);
  }
  static fs::path model(const std::string& name) { return dir_ / name; }
  static std::map<std::string, at::Tensor> reference(const std::string& name) {
    return read_safetensors(model(name) / "reference.safetensors");
  }
  static fs::path dir_;
};
fs::path Trainer::dir_;

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::vector<json> jsonl(const fs::path& file) {
  std::vector<json> rows;
  std::string line;
  for (std::istringstream in(read_file(file)); std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

TEST_F(Trainer, LogitsMatchTransformersOnABatchInFloat32) {
  for (std::string name : {"qwen2", "llama"}) {
    CausalLM m = CausalLM::load(model(name), at::kCPU);
    auto ref = reference(name);
    at::InferenceMode guard;
    at::Tensor ids = ref["ids"];
    at::Tensor logits = m.forward(ids, at::ones_like(ids));
    EXPECT_EQ(logits.sizes(), ref["logits"].sizes()) << name;
    EXPECT_LT(max_diff(logits, ref["logits"]), 1e-4) << name;
    // Left padding: the real tokens' logits are what transformers gives with the same positions.
    at::Tensor mask = ref["padded_mask"];
    at::Tensor padded = m.forward(ids.narrow(0, 0, 2), mask);
    at::Tensor real = mask.to(at::kBool);
    EXPECT_LT(max_diff(padded.index({real}), ref["padded_logits"].index({real})), 1e-4) << name;
    EXPECT_FALSE(padded.isnan().any().item<bool>()) << name << ": a padding row must not be NaN";
  }
}

// Gradient checkpointing recomputes each layer in backward: the same gradients as keeping the
// activations (float32 on the CPU: the same operations twice), under autocast too; and the
// autocast scope leaves the process's autocast state as it found it.
std::map<std::string, at::Tensor> lm_grads(CausalLM& m, bool checkpoint, bool bf16) {
  m.set_requires_grad(true);
  m.set_checkpointing(checkpoint);
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  at::Tensor ids = at::randint(0, 200, {2, 9}, at::TensorOptions().dtype(at::kLong).device(m.device()));
  ids = ids.clone();  // fixed by the caller's seed
  at::Tensor mask = at::ones_like(ids);
  mask[0].narrow(0, 0, 3).zero_();
  {
    Autocast cast(m.device(), bf16);
    at::Tensor logits = m.forward(ids, mask);
    (logits.to(at::kFloat).log_softmax(-1).select(-1, 7) * mask).sum().backward();
  }
  std::map<std::string, at::Tensor> g;
  auto ps = m.parameters();
  for (std::size_t k = 0; k < ps.size(); ++k) g[std::to_string(k)] = ps[k].grad().clone();
  return g;
}

TEST_F(Trainer, GradientCheckpointingGivesTheGradientsOfAPlainBackward) {
  CausalLM m = CausalLM::load(model("qwen2"), at::kCPU, at::kFloat);
  for (bool bf16 : {false, true}) {
    at::manual_seed(3);
    auto plain = lm_grads(m, false, bf16);
    at::manual_seed(3);
    auto recomputed = lm_grads(m, true, bf16);
    ASSERT_EQ(plain.size(), recomputed.size());
    for (auto& [k, g] : plain) {
      ASSERT_TRUE(g.defined() && recomputed[k].defined()) << "parameter " << k << " has no gradient";
      EXPECT_LE(max_diff(g, recomputed[k]), 1e-6) << "parameter " << k << (bf16 ? " under autocast" : "");
    }
    EXPECT_GT(plain.begin()->second.abs().sum().item<double>(), 0.0);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

TEST_F(Trainer, TheKvCacheGivesTheLogitsOfTheWholeSequence) {
  CausalLM m = CausalLM::load(model("qwen2"), at::kCPU);
  at::InferenceMode guard;
  at::Tensor ids = reference("qwen2")["ids"];
  at::Tensor whole = m.forward(ids, at::ones_like(ids));
  KvCache cache = m.make_cache(ids.size(0), ids.size(1));
  at::Tensor first = m.forward(ids.narrow(1, 0, 6), at::ones({ids.size(0), 6}, at::kLong), &cache);
  at::Tensor rest = m.forward(ids.narrow(1, 6, 5), at::ones_like(ids), &cache);
  EXPECT_LT(max_diff(at::cat({first, rest}, 1), whole), 1e-4);
  EXPECT_EQ(cache.length, ids.size(1));
}

TEST_F(Trainer, GreedyGenerateMatchesTransformersTokenForToken) {
  for (std::string name : {"qwen2", "llama"}) {
    json ref = json::parse(read_file(model(name) / "reference.json"));
    CmdResult r = run_opforge({"generate", "--model", model(name).string(), "--prompt", ref["prompt"], "--greedy",
                               "--max-new-tokens", "16", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json got = json::parse(r.out);
    EXPECT_EQ(got["prompt_ids"], ref["prompt_ids"]) << name << ": tokenized differently";
    EXPECT_EQ(got["ids"], ref["greedy_ids"]) << name;
    EXPECT_EQ(got["logprobs"].size(), got["ids"].size());
  }
  // The library batched: two prompts of different lengths give what each gives alone.
  CausalLM m = CausalLM::load(model("llama"), at::kCPU);
  SampleOptions o;
  o.greedy = true;
  o.max_new_tokens = 8;
  std::vector<int64_t> a = {5, 9, 30, 41, 7, 2, 8}, b = {17, 3};
  auto both = generate(m, {a, b}, o);
  EXPECT_EQ(both[0].tokens, generate(m, {a}, o)[0].tokens);
  EXPECT_EQ(both[1].tokens, generate(m, {b}, o)[0].tokens);
}

// No mask (every token real, what generate passes for prompts of one length) is the all-ones mask:
// a causal prefill, a cached decode step and a chunk after cached tokens.
TEST_F(Trainer, AForwardWithoutAMaskIsOneWithAnAllOnesMask) {
  CausalLM m = CausalLM::load(model("qwen2"), at::kCPU);
  at::InferenceMode guard;
  at::Tensor ids = reference("qwen2")["ids"];
  const int64_t B = ids.size(0);
  EXPECT_LT(max_diff(m.forward(ids, at::Tensor()), m.forward(ids, at::ones_like(ids))), 1e-5);
  KvCache with = m.make_cache(B, 11), without = m.make_cache(B, 11);
  for (auto [from, n] : {std::pair<int64_t, int64_t>{0, 6}, {6, 1}, {7, 4}}) {
    at::Tensor a = m.forward(ids.narrow(1, from, n), at::ones({B, from + n}, at::kLong), &with);
    at::Tensor b = m.forward(ids.narrow(1, from, n), at::Tensor(), &without);
    EXPECT_LT(max_diff(a, b), 1e-5) << "tokens " << from << ".." << from + n;
  }
}

// A row that stops keeps being fed its own tokens while the others go on: they get what they get
// alone, with and without left padding; generation leaves cuDNN's attention setting as it was.
TEST_F(Trainer, ARowThatStopsEarlyLeavesTheOthersAsTheyAreAlone) {
  CausalLM m = CausalLM::load(model("llama"), at::kCPU);
  SampleOptions o;
  o.greedy = true;
  o.max_new_tokens = 10;
  std::vector<int64_t> a = {5, 9, 30, 41, 7, 2, 8}, same = {4, 12, 6, 19, 33, 1, 3}, shorter = {17, 3};
  const bool cudnn = at::globalContext().userEnabledCuDNNSDP();
  for (const auto& other : {same, shorter}) {
    auto alone = generate(m, {a}, o)[0].tokens;
    SampleOptions stop = o;
    stop.stop_ids = {generate(m, {other}, o)[0].tokens.at(2)};  // the other row stops at its third token
    auto both = generate(m, {a, other}, stop);
    ASSERT_LE(both[1].tokens.size(), 3u);
    EXPECT_EQ(both[1].finish, "stop");
    auto cut = std::find(alone.begin(), alone.end(), stop.stop_ids[0]);
    EXPECT_EQ(both[0].tokens, std::vector<int64_t>(alone.begin(), cut == alone.end() ? cut : cut + 1))
        << (other.size() == a.size() ? "no padding" : "left padding");
  }
  EXPECT_EQ(at::globalContext().userEnabledCuDNNSDP(), cudnn);
}

TEST_F(Trainer, SamplingIsSeededAndRecordsTheLogprobOfEachToken) {
  CausalLM m = CausalLM::load(model("qwen2"), at::kCPU);
  SampleOptions o;
  o.max_new_tokens = 12;
  o.temperature = 0.8;
  o.top_p = 0.9;
  o.seed = 7;
  std::vector<int64_t> p = {11, 12, 13};
  auto g1 = generate(m, {p, p}, o), g2 = generate(m, {p, p}, o);
  EXPECT_EQ(g1[0].tokens, g2[0].tokens);
  EXPECT_EQ(g1[0].logprobs, g2[0].logprobs);
  // Each recorded logprob is the token's under logits / temperature (the nucleus cut only decides
  // what is drawn), as a forward pass over the whole sequence recomputes it.
  std::vector<int64_t> seq = p;
  seq.insert(seq.end(), g1[0].tokens.begin(), g1[0].tokens.end());
  at::InferenceMode guard;
  at::Tensor ids = at::tensor(seq, at::kLong).unsqueeze(0);
  at::Tensor lp = (m.forward(ids, at::ones_like(ids)) / o.temperature).log_softmax(-1)[0];
  for (std::size_t t = 0; t < g1[0].tokens.size(); ++t) {
    double want = lp[static_cast<int64_t>(p.size() + t - 1)][g1[0].tokens[t]].item<double>();
    EXPECT_NEAR(g1[0].logprobs[t], want, 1e-4) << "token " << t;
  }
}

TEST_F(Trainer, ACheckpointSavedByOpforgeLoadsInTransformersWithIdenticalLogits) {
  for (std::string name : {"qwen2", "llama"}) {
    TempDir out;
    CausalLM::load(model(name), at::kCPU).save(out.path() / name);
    EXPECT_TRUE(fs::exists(out.path() / name / "tokenizer.json"));
    auto [rc, text] = shell(fmt::format("{} {}/python/tiny_lm.py check {} {} 2>&1", python_bin().string(),
                                        fixtures().parent_path().string(), model(name).string(),
                                        (out.path() / name).string()));
    EXPECT_EQ(rc, 0) << name << ": " << text;
  }
}

TEST_F(Trainer, AnUnsupportedOrIncompleteConfigIsAnErrorNamingTheField) {
  TempDir d;
  json cfg = json::parse(read_file(model("qwen2") / "config.json"));
  auto fails_with = [&](const json& c, const std::string& needle) {
    fs::create_directories(d.path() / "m");
    std::ofstream(d.path() / "m" / "config.json") << c.dump();
    fs::copy_file(model("qwen2") / "model.safetensors", d.path() / "m" / "model.safetensors",
                  fs::copy_options::overwrite_existing);
    try {
      CausalLM::load(d.path() / "m", at::kCPU);
      ADD_FAILURE() << "loaded a config that should fail with " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  json c = cfg;
  c.erase("hidden_size");
  fails_with(c, "hidden_size");
  c = cfg;
  c["model_type"] = "mamba";
  fails_with(c, "model_type mamba is not supported");
  c = cfg;
  c["rope_parameters"]["rope_type"] = "yarn";
  fails_with(c, "rope_type yarn");
  c = cfg;
  c["num_hidden_layers"] = 5;  // more layers than the checkpoint holds
  fails_with(c, "model.layers.2");
}


// SFT data: each record's loss mask is exactly its assistant turns (their text and end marker),
// tool calls included; a record with no assistant turn is refused with its reason.
TEST_F(Trainer, TheSftLossMaskCoversTheAssistantTurnsOnly) {
  Tokenizer tok(model("qwen2"));
  json call = {{"type", "function"}, {"function", {{"name", "bash"}, {"arguments", "{\"cmd\": \"ls\"}"}}}};
  json rec = {{"messages", json::array({{{"role", "user"}, {"content", "write relu"}},
                                        {{"role", "assistant"}, {"content", "def f(x): return x"}},
                                        {{"role", "tool"}, {"content", "ok"}},
                                        {{"role", "assistant"}, {"content", "done"}, {"tool_calls", {call}}}})}};
  auto rows = tok.chat_rows(json::array({rec, {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}}), 0);
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_TRUE(rows[0].error.empty()) << rows[0].error;
  std::vector<int64_t> trained, rest;
  for (std::size_t i = 0; i < rows[0].ids.size(); ++i) (rows[0].mask[i] ? trained : rest).push_back(rows[0].ids[i]);
  EXPECT_EQ(tok.decode(trained, false), "def f(x): return x<|end|>\ndone<|call|>bash {\"cmd\": \"ls\"}<|end|>\n");
  EXPECT_EQ(tok.decode(rest, false), "<|user|>write relu<|end|>\n<|assistant|><|tool|>ok<|end|>\n<|assistant|>");
  EXPECT_NE(rows[1].error.find("no assistant token"), std::string::npos) << rows[1].error;
}

// The trainer's own folder removal, listing and copy (files.h; std::filesystem's crashed on the GPU
// machine): nested folders go, a link inside is removed without touching what it points to, a
// missing path is no error; list_dir names each entry once; copy_file_bytes replaces the target and
// copies an empty file.
TEST(TrainerFiles, RemoveTreeTakesNestedFoldersAndNeverFollowsALink) {
  TempDir d;
  write_file(d / "outside" / "precious.txt", "keep me");
  write_file(d / "tree" / "a.txt", "a");
  write_file(d / "tree" / "sub" / "deeper" / "b.txt", "b");
  fs::create_directory_symlink(d / "outside", d / "tree" / "sub" / "link");
  std::vector<std::string> names;
  for (auto& p : list_dir(d / "tree")) names.push_back(p.filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"a.txt", "sub"}));
  remove_tree(d / "tree");
  EXPECT_FALSE(fs::exists(d / "tree"));
  EXPECT_EQ(read_file(d / "outside" / "precious.txt"), "keep me");
  EXPECT_NO_THROW(remove_tree(d / "tree"));
  write_file(d / "empty", "");
  write_file(d / "target", "old contents");
  copy_file_bytes(d / "outside" / "precious.txt", d / "target");
  EXPECT_EQ(read_file(d / "target"), "keep me");
  copy_file_bytes(d / "empty", d / "target");
  EXPECT_EQ(read_file(d / "target"), "");
  EXPECT_THROW(list_dir(d / "missing"), opforge::Error);
}

// opforge train sft: the loss falls, the weights change, a malformed line is skipped and counted,
// and a run stopped after 2 steps and resumed to 4 (its rows from the tokenising cache) ends with
// the very bytes of a run of 4.
TEST_F(Trainer, SftLowersTheLossAndAResumedRunEndsBitwiseIdentical) {
  TempDir d;
  std::string data;
  for (int i = 0; i < 10; ++i)
    data += json{{"messages", json::array({{{"role", "user"}, {"content", "write op " + std::to_string(i % 3)}},
                                           {{"role", "assistant"}, {"content", "def forward(self, x): return x"}}})}}
                .dump() + "\n";
  data += "not a record\n";
  write_file(d / "sft.jsonl", data);
  auto sft = [&](const std::string& out, const std::string& steps) {
    return run_opforge({"train", "sft", "--model", model("qwen2").string(), "--data", (d / "sft.jsonl").string(),
                        "--out", (d / out).string(), "--steps", steps, "--batch", "4", "--micro-batch", "3",
                        "--lr", "1e-3", "--save-every", "2", "--val", (d / "sft.jsonl").string()});
  };
  CmdResult whole = sft("whole", "4");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  EXPECT_EQ(whole.out, (d / "whole" / "model").string() + "\n");
  EXPECT_NE(whole.err.find("10 training rows (1 skipped: line 11"), std::string::npos) << whole.err;
  std::vector<json> m;
  for (std::istringstream in(read_file(d / "whole" / "metrics.jsonl")); std::getline(in, data);) m.push_back(json::parse(data));
  ASSERT_EQ(m.size(), 4u);
  EXPECT_LT(m[3]["loss"].get<double>(), m[0]["loss"].get<double>());
  EXPECT_TRUE(m[1].contains("val_loss") && m[3].contains("val_loss"));
  EXPECT_TRUE(fs::exists(d / "whole" / "metrics.png"));
  EXPECT_NE(read_file(d / "whole" / "model" / "model.safetensors"), read_file(model("qwen2") / "model.safetensors"));
  ASSERT_EQ(sft("split", "2").exit_code, 0);
  CmdResult resumed = sft("split", "4");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming"), std::string::npos);
  EXPECT_NE(resumed.err.find("tokenised rows from"), std::string::npos) << "a resumed run reads its rows from the cache";
  EXPECT_TRUE(read_file(d / "whole" / "model" / "model.safetensors") ==
              read_file(d / "split" / "model" / "model.safetensors"))
      << "a resumed run must end with the weights of an uninterrupted one";
}


// A reward whose rise is certain: the share of an answer's tokens in a chosen tenth of the
// vocabulary. Task "d"'s answers are never judged: a null reward drops them, it does not score them.
RewardFn token_share_reward() {
  return [](const std::vector<std::string>& ids, const std::vector<std::string>&,
            const std::vector<std::vector<int64_t>>& tokens) {
    std::vector<std::optional<double>> out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      double hit = 0;
      for (auto t : tokens[i]) hit += t % 10 == 3;
      out.push_back(ids[i] == "d" ? std::nullopt : std::optional<double>(hit / static_cast<double>(tokens[i].size())));
    }
    return out;
  };
}

std::vector<Prompt> synthetic_prompts() { return {{"a", {5, 9, 30}}, {"b", {17, 3}}, {"c", {40, 41, 42, 43}}, {"d", {8}}}; }

// Small, fast PPO options on the tiny Qwen2 fixture: 4 prompts x 6 answers of 8 tokens a step.
PpoOptions synthetic_ppo(const fs::path& actor, const fs::path& out, int64_t steps) {
  PpoOptions o;
  o.actor = actor;
  o.out = out;
  o.steps = steps;
  o.batch = 4;
  o.rollouts_per_task = 6;
  o.max_new_tokens = 8;
  o.lr = 2e-3;
  o.critic_lr = 2e-3;
  o.ppo_epochs = 2;
  o.mini_batch = 9;
  o.kl_coef = 0.01;
  return o;
}

// PPO on the synthetic reward. Its mean over the last two steps must beat the first step's, a step
// in micro-batches is the whole mini-batches' step, and a run stopped after 2 steps and resumed to 4
// ends with the bytes of a run of 4 (actor and critic).
TEST_F(Trainer, PpoRaisesASyntheticRewardAndAResumedRunEndsBitwiseIdentical) {
  TempDir d;
  Tokenizer tok(model("qwen2"));
  std::vector<Prompt> prompts = synthetic_prompts();
  RewardFn share = token_share_reward();
  auto run = [&](const std::string& out, int64_t steps, int64_t micro = 0, double temperature = 1.0) {
    PpoOptions o = synthetic_ppo(model("qwen2"), d / out, steps);
    o.temperature = temperature;
    o.micro_batch = micro;
    return train_ppo(o, prompts, tok, share);
  };
  PpoResult whole = run("whole", 6);
  ASSERT_EQ(whole.reward_mean.size(), 6u);
  double last = (whole.reward_mean[4] + whole.reward_mean[5]) / 2;
  EXPECT_GT(last, whole.reward_mean[0] + 0.1) << "first " << whole.reward_mean[0] << ", last two " << last;
  json first = json::parse(read_file(d / "whole" / "metrics.jsonl").substr(0, read_file(d / "whole" / "metrics.jsonl").find('\n')));
  EXPECT_EQ(first["dropped"], 6);
  EXPECT_LT(first["rollout_logp_gap"].get<double>(), 1e-4) << "the rollout's logprobs are the trainer's";
  for (const char* k : {"approx_kl", "entropy", "value_loss", "clip_fraction", "explained_variance", "kl_ref"})
    EXPECT_TRUE(first.contains(k) && std::isfinite(first[k].get<double>())) << k;
  // Every answer is logged in train value's trajectory format, d's with their null reward.
  std::vector<json> traj = jsonl(d / "whole" / "trajectories.jsonl");
  ASSERT_EQ(traj.size(), 6u * 24u);
  for (auto& t : traj) {
    ASSERT_TRUE(t.contains("ids") && t.contains("prompt_len") && t.contains("logprobs") && t.contains("step")) << t;
    EXPECT_EQ(t["ids"].size(), t["prompt_len"].get<std::size_t>() + t["logprobs"].size()) << t;
    EXPECT_EQ(t["reward"].is_null(), t["task_id"] == "d") << t;
  }
  // PPO's OUT is train value's input as it is: metrics.jsonl beside it is no trajectory.
  Trajectories read = read_trajectories(d / "whole", model("qwen2"), 0);
  EXPECT_EQ(read.rows.ids.size(), 6u * 18u);
  EXPECT_EQ(read.null_reward, 6 * 6);
  EXPECT_EQ(read.rows.skipped, 0);
  // A step in micro-batches of 4 (a mini-batch of 9 in parts of 4, 4 and 1) is the step of the
  // whole mini-batches: the same update metrics and, to float32 rounding, the same weights.
  run("one", 1);
  run("micro", 1, 4);
  json a = jsonl(d / "one" / "metrics.jsonl")[0], b = jsonl(d / "micro" / "metrics.jsonl")[0];
  for (const char* k : {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "actor_grad_norm",
                        "critic_grad_norm"})
    EXPECT_NEAR(b[k].get<double>(), a[k].get<double>(), 1e-5 * (1 + std::abs(a[k].get<double>()))) << k;
  for (const char* f : {"actor/model.safetensors", "critic/value_head.safetensors"}) {
    auto x = read_safetensors(d / "one" / f), y = read_safetensors(d / "micro" / f);
    for (auto& [name, w] : x) EXPECT_LT((w - y.at(name)).abs().max().item<double>(), 1e-5) << f << " " << name;
  }
  // At a temperature other than 1 the update scores the tempered policy that drew the answers: its
  // recomputed logprobs are the rollout's (raw logits left a gap of 0.92 nats a token at 1.7).
  run("hot", 1, 0, 1.7);
  json hot = jsonl(d / "hot" / "metrics.jsonl")[0];
  EXPECT_LT(hot["rollout_logp_gap"].get<double>(), 1e-4);
  EXPECT_LT(std::abs(hot["kl_ref"].get<double>()), 1e-6) << "before its first update the actor is the reference";
  try {
    run("cold", 1, 0, 0.0);
    ADD_FAILURE() << "--temperature 0 must be an error (the update divides by it)";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--temperature must be > 0"), std::string::npos) << e.what();
  }
  run("split", 2);
  PpoResult resumed = run("split", 6);
  EXPECT_EQ(resumed.reward_mean.size(), 4u);
  EXPECT_TRUE(read_file(d / "whole" / "trajectories.jsonl") == read_file(d / "split" / "trajectories.jsonl"));
  EXPECT_TRUE(read_file(d / "whole" / "actor" / "model.safetensors") == read_file(d / "split" / "actor" / "model.safetensors"));
  EXPECT_TRUE(read_file(d / "whole" / "critic" / "value_head.safetensors") ==
              read_file(d / "split" / "critic" / "value_head.safetensors"));
}


// --advantage rloo: no critic is loaded, trained or written; the synthetic reward still rises; a
// resumed run ends bitwise identical; a checkpoint of one estimator is not resumed with another.
TEST_F(Trainer, PpoWithGroupAdvantagesRaisesTheRewardWithoutACritic) {
  TempDir d;
  Tokenizer tok(model("qwen2"));
  auto run = [&](const std::string& out, int64_t steps, const std::string& advantage = "rloo") {
    PpoOptions o = synthetic_ppo(model("qwen2"), d / out, steps);
    o.advantage = advantage;
    return train_ppo(o, synthetic_prompts(), tok, token_share_reward());
  };
  PpoResult whole = run("whole", 6);
  ASSERT_EQ(whole.reward_mean.size(), 6u);
  double last = (whole.reward_mean[4] + whole.reward_mean[5]) / 2;
  EXPECT_GT(last, whole.reward_mean[0] + 0.1) << "first " << whole.reward_mean[0] << ", last two " << last;
  EXPECT_TRUE(whole.critic_dir.empty());
  EXPECT_FALSE(fs::exists(d / "whole" / "critic"));
  EXPECT_FALSE(fs::exists(checkpoint_dir(d / "whole", "critic")));
  json first = jsonl(d / "whole" / "metrics.jsonl")[0];
  EXPECT_FALSE(first.contains("value_loss") || first.contains("explained_variance")) << first;
  // The share of 8 sampled tokens differs between a prompt's 6 answers: every judged group is mixed.
  EXPECT_EQ(first["mixed_groups"].get<double>(), 1.0) << first;
  for (const char* k : {"approx_kl", "entropy", "policy_loss", "clip_fraction", "kl_ref"})
    EXPECT_TRUE(first.contains(k) && std::isfinite(first[k].get<double>())) << k;
  run("split", 2);
  PpoResult resumed = run("split", 6);
  EXPECT_EQ(resumed.reward_mean.size(), 4u);
  EXPECT_TRUE(read_file(d / "whole" / "actor" / "model.safetensors") == read_file(d / "split" / "actor" / "model.safetensors"));
  try {
    run("split", 8, "gae");
    ADD_FAILURE() << "a checkpoint of --advantage rloo must not be resumed with gae (it has no critic)";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with --advantage rloo, not gae"), std::string::npos) << e.what();
  }
}

// When every answer earns the same reward there is nothing to learn: with --advantage rloo or grpo
// (no KL) steps leave the actor's weights as they were, while GAE's whitened advantages move them
// once the critic has been trained (its first step's values are all 0, so its advantages are all
// equal and whiten to 0; later ones are the critic's error, brought to unit scale). This is why
// the learning run uses rloo.
TEST_F(Trainer, PpoGroupAdvantagesLeaveTheActorAloneWhenEveryAnswerScoresAlike) {
  TempDir d;
  Tokenizer tok(model("qwen2"));
  RewardFn constant = [](const std::vector<std::string>& ids, const std::vector<std::string>&,
                         const std::vector<std::vector<int64_t>>&) {
    return std::vector<std::optional<double>>(ids.size(), 1.0);
  };
  const auto before = read_safetensors(model("qwen2") / "model.safetensors");
  auto moved = [&](const std::string& advantage) {
    PpoOptions o = synthetic_ppo(model("qwen2"), d / advantage, 3);
    o.advantage = advantage;
    o.kl_coef = 0;
    train_ppo(o, synthetic_prompts(), tok, constant);
    double most = 0;
    for (auto& [name, w] : read_safetensors(d / advantage / "actor" / "model.safetensors"))
      most = std::max(most, max_diff(w, before.at(name)));
    return most;
  };
  EXPECT_EQ(moved("rloo"), 0.0);
  EXPECT_EQ(moved("grpo"), 0.0);
  EXPECT_GT(moved("gae"), 1e-4);
}

// opforge train ppo end to end: two steps on the CPU fixtures' tasks, every answer judged by a real
// opforge serve that the command starts (a random model's answers are all -1), the actor's
// weights moved by the second step, every metric finite, actor and critic written.
TEST_F(Trainer, PpoRunsTwoStepsEndToEndWithTheRealJudge) {
  TempDir d;
  fs::create_directories(d / "tasks");
  for (const char* t : {"linear_relu.py", "softmax_sum.py"})
    fs::copy_file(fixtures() / "eval" / "tasks" / t, d / "tasks" / t);
  CmdResult r = run_opforge({"train", "ppo", "--actor", model("qwen2").string(), "--tasks", (d / "tasks").string(),
                             "--out", (d / "out").string(), "--steps", "2", "--batch", "2", "--rollouts-per-task", "2",
                             "--max-new-tokens", "12", "--lr", "1e-3", "--judge-arg=--trials", "--judge-arg=5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, (d / "out" / "actor").string() + "\n");
  std::vector<json> m;
  std::string line;
  for (std::istringstream in(read_file(d / "out" / "metrics.jsonl")); std::getline(in, line);) m.push_back(json::parse(line));
  ASSERT_EQ(m.size(), 2u);
  for (auto& row : m) {
    EXPECT_EQ(row["answers"], 4);
    EXPECT_EQ(row["dropped"], 0) << "the judge failed: " << read_file(d / "out" / "judge" / "serve.log");
    EXPECT_EQ(row["reward_hist"], json({{"-1", 4}}));
    for (auto& [k, v] : row.items())
      if (v.is_number()) EXPECT_TRUE(std::isfinite(v.get<double>())) << k;
  }
  EXPECT_NE(read_file(d / "out" / "actor" / "model.safetensors"), read_file(model("qwen2") / "model.safetensors"));
  EXPECT_TRUE(fs::exists(d / "out" / "critic" / "value_head.safetensors"));
  EXPECT_TRUE(fs::exists(d / "out" / "metrics.png"));
}


// A trajectory of train value's format: `prompt` then `response`, with its final reward.
json trajectory(std::vector<int64_t> prompt, const std::vector<int64_t>& response, const json& reward) {
  json t = {{"prompt_len", prompt.size()}, {"reward", reward}};
  prompt.insert(prompt.end(), response.begin(), response.end());
  t["ids"] = prompt;
  return t;
}

// opforge train value: two steps on PPO-format records (one with a loss_mask), a chat record with
// a reward; a null reward and a malformed line are skipped and counted. The value head moves from
// zero, every metric is finite, the critic loads as train ppo loads it, and a run stopped after a
// step and resumed ends with the bytes of an uninterrupted one.
TEST_F(Trainer, ValuePretrainingRunsEndToEndAndAResumedRunEndsBitwiseIdentical) {
  TempDir d;
  std::string data;
  for (int i = 0; i < 6; ++i)
    data += trajectory({5, 9, static_cast<int64_t>(30 + i)}, {40, 41, 42, static_cast<int64_t>(50 + i)}, i % 2 ? 1 : -1)
                .dump() + "\n";
  data += json{{"ids", {5, 9, 30, 41, 7, 8, 2}}, {"loss_mask", {0, 0, 0, 1, 0, 1, 1}}, {"reward", 2}}.dump() + "\n";
  data += json{{"messages", json::array({{{"role", "user"}, {"content", "write relu"}},
                                         {{"role", "assistant"}, {"content", "def f(x): return x"}}})},
               {"reward", 3}}.dump() + "\n";
  data += trajectory({5, 9}, {40}, nullptr).dump() + "\nnot a record\n";
  write_file(d / "traj.jsonl", data);
  auto value = [&](const std::string& out, const std::string& steps) {
    return run_opforge({"train", "value", "--model", model("qwen2").string(), "--trajectories",
                        (d / "traj.jsonl").string(), "--out", (d / out).string(), "--steps", steps, "--batch", "4",
                        "--lr", "1e-3", "--save-every", "1"});
  };
  CmdResult whole = value("whole", "2");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  EXPECT_EQ(whole.out, (d / "whole" / "critic").string() + "\n");
  EXPECT_NE(whole.err.find("8 trajectories (1 with a null reward skipped, 1 skipped: traj.jsonl line 10"),
            std::string::npos) << whole.err;
  std::vector<json> m = jsonl(d / "whole" / "metrics.jsonl");
  ASSERT_EQ(m.size(), 2u);
  for (auto& row : m) {
    for (const char* k : {"value_loss", "explained_variance", "value_mean", "return_mean", "seconds", "tokens_per_s"})
      EXPECT_TRUE(row.contains(k) && std::isfinite(row[k].get<double>())) << k << " in " << row;
    EXPECT_FALSE(row.contains("peak_mem_gib")) << "the CPU has no allocator peak to report";
  }
  EXPECT_EQ(m[0]["value_mean"], 0.0) << "a model folder's critic starts with a zero head";
  auto head = read_safetensors(d / "whole" / "critic" / "value_head.safetensors");
  EXPECT_GT(head["weight"].abs().sum().item<double>(), 0) << "the value head did not move";
  ValueModel critic = ValueModel::load(d / "whole" / "critic", at::kCPU);  // as train ppo --critic loads it
  at::Tensor ids = at::tensor(std::vector<int64_t>{5, 9, 30, 40}, at::kLong).unsqueeze(0);
  EXPECT_GT(critic.values(ids, at::ones_like(ids)).abs().sum().item<double>(), 0);
  ASSERT_EQ(value("split", "1").exit_code, 0);
  CmdResult resumed = value("split", "2");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming"), std::string::npos);
  for (const char* f : {"value_head.safetensors", "model.safetensors"})
    EXPECT_TRUE(read_file(d / "whole" / "critic" / f) == read_file(d / "split" / "critic" / f))
        << f << ": a resumed run must end with the weights of an uninterrupted one";
  EXPECT_EQ(jsonl(d / "split" / "metrics.jsonl")[1]["value_loss"], m[1]["value_loss"]);
}

// Value pre-training learns a target it can: the reward is +1 when the trajectory is made of token
// 40, -1 when of token 41 (visible at every response position), so a critic that learns nothing
// stays at a loss of 0.5; in micro-batches it takes the same steps. And its returns are Monte-Carlo returns discounted per response token:
// the tool output between two turns neither discounts nor cuts the chain.
TEST_F(Trainer, ValuePretrainingLowersTheLossOnALearnableTargetWithDiscountedReturns) {
  TempDir d;
  std::string data;
  for (int i = 0; i < 8; ++i) {
    int64_t x = i % 2 ? 40 : 41;
    data += trajectory({5, static_cast<int64_t>(9 + i), x}, {x, x, x, x, x}, x == 40 ? 1 : -1).dump() + "\n";
  }
  write_file(d / "learn.jsonl", data);
  ValueOptions o;
  o.model = model("qwen2");
  o.trajectories = d / "learn.jsonl";
  o.out = d / "learn";
  o.steps = 8;
  o.batch = 8;
  o.lr = 3e-3;
  std::vector<double> loss = train_value(o).value_loss;
  ASSERT_EQ(loss.size(), 8u);
  EXPECT_NEAR(loss[0], 0.5, 1e-6) << "a zero head against returns of +-1";
  EXPECT_LT(loss.back(), 0.05) << "first " << loss[0] << ", last " << loss.back();  // 0.01 when written
  EXPECT_GT(jsonl(d / "learn" / "metrics.jsonl").back()["explained_variance"].get<double>(), 0.8);  // 0.98
  // In micro-batches of 3 (3 + 3 + 2 rows a step) the gradients add up to the whole batch's: the
  // same losses and metrics, step by step, to float32 rounding.
  o.out = d / "micro";
  o.micro_batch = 3;
  std::vector<double> micro = train_value(o).value_loss;
  ASSERT_EQ(micro.size(), loss.size());
  for (std::size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(micro[i], loss[i], 1e-5 * (1 + loss[i])) << "step " << i + 1;
  json a = jsonl(d / "learn" / "metrics.jsonl").back(), b = jsonl(d / "micro" / "metrics.jsonl").back();
  for (const char* k : {"explained_variance", "value_mean", "return_mean"})
    EXPECT_NEAR(b[k].get<double>(), a[k].get<double>(), 1e-4) << k;
  o.micro_batch = 0;
  // Actions at positions 1, 2 and 5 (a value precedes its token): returns 0.25, 0.5, 1.
  write_file(d / "gap.jsonl", json{{"ids", {5, 9, 30, 41, 7, 8, 2}}, {"loss_mask", {0, 0, 1, 1, 0, 0, 1}},
                                   {"reward", 1}}.dump() + "\n");
  o.trajectories = d / "gap.jsonl";
  o.out = d / "gap";
  o.steps = 1;
  o.gamma = 0.5;
  train_value(o);
  EXPECT_NEAR(jsonl(d / "gap" / "metrics.jsonl")[0]["return_mean"].get<double>(), (0.25 + 0.5 + 1) / 3, 1e-6);
}

// Which tasks train eval takes: a shard's test split, the first N, and an error that says why
// when the tasks (a folder of .py files) carry no split.
TEST_F(Trainer, EvalTakesTheSplitOfShardsAndRefusesASplitOfPyTasks) {
  TempDir d;
  std::string code = read_file(fixtures() / "eval" / "tasks" / "linear_relu.py");
  std::string shard;
  for (auto [id, split] : {std::pair{"t1", "test"}, {"t2", "train"}, {"t3", "test"}})
    shard += json{{"id", id}, {"code", code}, {"split", split}}.dump() + "\n";
  write_file(d / "ops-all.jsonl", shard);
  Tokenizer tok(model("qwen2"));
  ModelEvalOptions o;
  o.tasks = d / "ops-all.jsonl";
  o.split = "test";
  std::vector<std::string> ids;
  for (auto& p : eval_prompts(o, tok)) ids.push_back(p.task_id);
  EXPECT_EQ(ids, (std::vector<std::string>{"t1", "t3"}));
  o.limit = 1;
  EXPECT_EQ(eval_prompts(o, tok).size(), 1u);
  fs::create_directories(d / "py");
  fs::copy_file(fixtures() / "eval" / "tasks" / "linear_relu.py", d / "py" / "linear_relu.py");
  o.tasks = d / "py";
  try {
    eval_prompts(o, tok);
    ADD_FAILURE() << "--split on .py tasks must be an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a folder of .py tasks, whose tasks have no split"), std::string::npos)
        << e.what();
  }
}

// opforge train eval end to end: greedy answers to two fixture tasks judged by a real opforge serve
// (a random model's answers are -1), the summary on stdout and a row per task in --out.
TEST_F(Trainer, EvalJudgesGreedyAnswersEndToEndWithTheRealJudge) {
  TempDir d;
  fs::create_directories(d / "tasks");
  for (const char* t : {"linear_relu.py", "softmax_sum.py"})
    fs::copy_file(fixtures() / "eval" / "tasks" / t, d / "tasks" / t);
  CmdResult r = run_opforge({"train", "eval", "--model", model("qwen2").string(), "--tasks", (d / "tasks").string(),
                             "--max-new-tokens", "12", "--out", (d / "rows.jsonl").string(), "--judge-arg=--trials",
                             "--judge-arg=5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json s = json::parse(r.out);
  EXPECT_EQ(s["tasks"], 2);
  EXPECT_EQ(s["judged"], 2) << "the judge failed: " << read_file(d / "rows.jsonl.judge" / "serve.log");
  EXPECT_EQ(s["null"], 0);
  EXPECT_EQ(s["pass_at_1"], 0.0);
  EXPECT_EQ(s["mean_reward"], -1.0);
  EXPECT_EQ(s["reward_hist"], json({{"-1", 2}, {"1", 0}, {"2", 0}, {"3", 0}}));
  std::vector<json> rows = jsonl(d / "rows.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  std::set<std::string> tasks;
  for (auto& row : rows) {
    tasks.insert(row["task_id"].get<std::string>());
    EXPECT_EQ(row["reward"], -1);
    EXPECT_LE(row["response_tokens"].get<int>(), 12);
  }
  EXPECT_EQ(tasks, (std::set<std::string>{"linear_relu", "softmax_sum"}));
}

}  // namespace
}  // namespace opforge::test
