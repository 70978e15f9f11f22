// opforge-trainer: the commands that run libtorch in-process (generate, train). A binary of
// its own so that every other opforge process, the sandbox launcher of each judged solution among
// them, does not load libtorch at start (0.6 s and 470 MB a process; docs/decisions.md); `opforge
// generate` and `opforge train` exec it.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <execinfo.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <iostream>

#include "files.h"
#include "eval_stage.h"
#include "generate.h"
#include "judge_process.h"
#include "judge_reward.h"
#ifdef OPFORGE_POLICY_SERVER
#include "multi_turn.h"
#include "policy_server.h"
#endif
#include "recipe.h"
#include "sft.h"
#include "opforge/core/error.h"
#include "opforge/core/log.h"
#include "opforge/core/paths.h"
#include "tokenizer.h"
#include "value_stage.h"

namespace {
using json = nlohmann::json;
using namespace opforge::trainer;

struct GenerateArgs {
  std::string model, prompt, device = "cpu", host = "127.0.0.1";
  bool chat = false, as_json = false, serve = false;
  int port = 8000;
  int64_t max_batch = 8;
  SampleOptions sample;
};

// --serve: the model behind an OpenAI-compatible endpoint (policy_server.h), the policy
// interface of `opforge agent` on opforge's own model. The sampling options are the defaults of
// requests that leave them out.
int run_serve(const GenerateArgs& a) {
#ifdef OPFORGE_POLICY_SERVER
  PolicyServerOptions o;
  o.model = a.model;
  o.device = a.device;
  o.host = a.host;
  o.port = a.port;
  o.max_batch = a.max_batch;
  o.defaults = a.sample;
  return serve_policy(o);
#else
  (void)a;
  throw opforge::Error("generate --serve: this opforge-trainer was built without cpp-httplib (OPFORGE_SERVE=OFF); "
                       "install libcpp-httplib-dev and rebuild");
#endif
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_generate(GenerateArgs& a) {
  if (a.serve) return run_serve(a);
  OPFORGE_CHECK(!a.prompt.empty(), "generate: --prompt is required (or --serve)");
  // Each phase is timed (--log-level debug): what a process's start is made of, apart from tokens.
  auto t0 = std::chrono::steady_clock::now();
  CausalLM model = CausalLM::load(a.model, device_named(a.device));
  const double load_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  Tokenizer tok(a.model);  // starts the embedded Python, which imports transformers (and torch)
  std::vector<int64_t> prompt = a.chat ? tok.encode_chat(json::array({{{"role", "user"}, {"content", a.prompt}}}))
                                       : tok.encode(a.prompt);
  const double tokenizer_s = seconds_since(t0);
  if (auto eos = tok.eos_id()) a.sample.stop_ids.push_back(*eos);
  if (auto pad = tok.pad_id()) a.sample.pad_id = *pad;
  t0 = std::chrono::steady_clock::now();
  Generation g = generate(model, {prompt}, a.sample).front();
  double secs = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  std::string text = tok.decode(g.tokens);
  spdlog::debug("generate phases: model load {:.3f} s ({}), tokenizer start and encode {:.3f} s, {} tokens in "
                "{:.3f} s, decode {:.3f} s", load_s, a.device, tokenizer_s, g.tokens.size(), secs, seconds_since(t0));
  if (a.as_json) {
    std::cout << json{{"prompt_ids", prompt}, {"ids", g.tokens}, {"logprobs", g.logprobs}, {"text", text},
                      {"finish", g.finish}, {"seconds", secs}}.dump()
              << "\n";
  } else {
    std::cout << text << "\n";
  }
  return 0;
}

void add_generate(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* c = app.add_subcommand("generate", "Complete one prompt with a local Hugging Face model folder (Llama / "
                                               "Qwen2 family); prints the completion on stdout");
  c->add_option("--model", a->model, "Model folder: config.json, *.safetensors, tokenizer files")->required();
  CLI::Option* prompt = c->add_option("--prompt", a->prompt, "The prompt: raw text, or the user's message with --chat");
  c->add_flag("--chat", a->chat, "Apply the model's chat template to --prompt as one user message");
  c->add_option("--max-new-tokens", a->sample.max_new_tokens, "Most tokens to generate")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  c->add_flag("--greedy", a->sample.greedy, "Always take the most likely token (temperature and top-p ignored)");
  c->add_option("--temperature", a->sample.temperature, "Sampling temperature")->capture_default_str();
  c->add_option("--top-p", a->sample.top_p, "Nucleus sampling mass")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--seed", a->sample.seed, "Sampling seed")->capture_default_str();
  c->add_option("--device", a->device, "cpu (float32) or cuda (bfloat16)")->capture_default_str();
  c->add_flag("--json", a->as_json,
              "Print {prompt_ids, ids, logprobs, text, finish, seconds} as one JSON line instead (seconds: generation only)");
  CLI::Option* serve = c->add_flag("--serve", a->serve, "Serve the model as an OpenAI-compatible endpoint (POST "
                                   "/v1/chat/completions with tools, GET /v1/models) until SIGINT/SIGTERM; prints "
                                   "`listening on http://HOST:PORT`");
  serve->excludes(prompt);
  c->add_option("--host", a->host, "Address to listen on (--serve)")->capture_default_str()->needs(serve);
  c->add_option("--port", a->port, "Port (--serve; 0: any free one, printed)")->capture_default_str()->needs(serve);
  c->add_option("--max-batch", a->max_batch, "Most samples of one request generated at once (--serve)")
      ->capture_default_str()->check(CLI::PositiveNumber)->needs(serve);
  c->callback([a, &run] { run = [a] { return run_generate(*a); }; });
}

void add_ppo(CLI::App* train, std::function<int()>& run);
void add_value(CLI::App* train, std::function<int()>& run);

// The precision options every training stage takes.
void add_precision_options(CLI::App* c, Precision& p) {
  c->add_flag("--bf16", p.bf16, "bfloat16 autocast of matmuls and attention over float32 master weights (for CUDA)");
  c->add_flag("--grad-checkpoint", p.checkpointing,
              "Recompute each layer in backward instead of keeping its activations (less memory, ~1/3 more compute)");
}

// The optimizer, checkpoint and device options sft and value share (their structs name them alike).
template <class Options>
void add_step_options(CLI::App* c, Options& o) {
  c->add_option("--micro-batch", o.micro_batch, "Records per forward/backward, their gradients added up to the "
                                                "batch's (0: the whole batch at once; less memory, same step)")
      ->capture_default_str();
  c->add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->capture_default_str();
  c->add_option("--max-grad-norm", o.max_grad_norm, "Gradient clipping")->capture_default_str();
  c->add_option("--save-every", o.save_every, "Steps between checkpoints")->capture_default_str();
  c->add_option("--seed", o.seed, "Data order")->capture_default_str();
  c->add_option("--device", o.device, "cpu or cuda (float32 master weights on both)")->capture_default_str();
  add_precision_options(c, o.precision);
}
void add_eval(CLI::App* train, std::function<int()>& run);
void add_recipe(CLI::App* train, std::function<int()>& run);

void add_train(CLI::App& app, std::function<int()>& run) {
  CLI::App* train = app.add_subcommand("train", "The paper's training stages on a local Hugging Face model (libtorch): "
                                                "sft, value, ppo, eval, and recipe (all four in order)");
  train->require_subcommand(1);
  auto o = std::make_shared<SftOptions>();
  CLI::App* c = train->add_subcommand("sft", "Supervised fine-tuning on chat records, loss on assistant tokens only "
                                             "(the RFT stage on `opforge agent sft` output); resumes from OUT/checkpoint; "
                                             "prints the trained model's folder (OUT/model)");
  c->add_option("--model", o->model, "Model folder to start from")->required();
  c->add_option("--data", o->data, "JSONL of chat records ({messages, tools?} or {prompt, completion})")->required();
  c->add_option("--out", o->out, "Output folder: model/, checkpoint/, metrics.jsonl, metrics.png")->required();
  c->add_option("--val", o->val, "JSONL of validation records: loss at every checkpoint");
  c->add_option("--epochs", o->epochs, "Passes over the data")->capture_default_str();
  c->add_option("--steps", o->steps, "Optimizer steps (overrides --epochs when > 0)")->capture_default_str();
  c->add_option("--batch", o->batch, "Records per optimizer step")->capture_default_str();
  c->add_option("--lr", o->lr, "AdamW learning rate")->capture_default_str();
  c->add_option("--max-len", o->max_len, "Tokens kept of a record")->capture_default_str();
  add_step_options(c, *o);
  c->callback([o, &run] {
    run = [o] {
      std::cout << train_sft(*o).model_dir.string() << "\n";
      return 0;
    };
  });
  add_value(train, run);
  add_ppo(train, run);
  add_eval(train, run);
  add_recipe(train, run);
}

// The judge of train ppo and train eval: --judge-url's service, or an opforge serve of --tasks
// that the command starts (and stops).
struct JudgeArgs {
  std::filesystem::path tasks;
  std::string url;
  std::vector<std::string> args;
  // serve builds and judges what is queued in batches (--max-batch, 16): 4 in flight kept its
  // batches at 1-3 answers, ~5 s of sandboxed start each (100 answers: 350 s on the H200).
  int concurrency = 32;
};

void add_judge_options(CLI::App* c, JudgeArgs& j) {
  c->add_option("--tasks", j.tasks, "Tasks: a shard, a workspace or a folder of KernelBench files")->required();
  c->add_option("--judge-url", j.url, "A running opforge serve (http://host:port); default: one started here");
  c->add_option("--judge-arg", j.args, "An argument for the started opforge serve (repeat), e.g. --policy");
  c->add_option("--judge-concurrency", j.concurrency, "Answers in flight at the judge")->capture_default_str();
}

struct Judge {
  std::unique_ptr<opforge::evaluator::JudgeProcess> own;
  opforge::evaluator::JudgeClient client;
};

// `dir` holds the started judge's state and serve.log. A unique_ptr: judge_reward holds the client by reference.
std::unique_ptr<Judge> start_judge(const JudgeArgs& a, const std::string& device, const std::filesystem::path& dir) {
  auto j = std::make_unique<Judge>();
  j->client.url = a.url;
  if (j->client.url.empty()) {
    j->own = std::make_unique<opforge::evaluator::JudgeProcess>(a.tasks, device, a.args, dir);
    j->client.url = j->own->url();
  }
  return j;
}

struct PpoArgs {
  PpoOptions o;
  JudgeArgs judge;
  bool multi_turn = false;
  int64_t max_turns = 8, agent_concurrency = 4;
  std::vector<std::string> agent_args;
};

// --multi-turn: the step's episodes are opforge agent runs against the actor (multi_turn.h).
EpisodeFn multi_turn_of(const PpoArgs& a, const std::vector<opforge::evaluator::EvalTask>& tasks,
                        const std::string& judge_url) {
  if (!a.multi_turn) return {};
#ifdef OPFORGE_POLICY_SERVER
  MultiTurnOptions m;
  m.tokenizer_dir = a.o.actor;
  m.out = a.o.out / "rollouts";
  m.judge_url = judge_url;
  for (const auto& t : tasks) m.code[t.name] = t.code;  // prompts are named as the judge knows them (by name)
  m.rollouts_per_task = a.o.rollouts_per_task;
  m.max_turns = a.max_turns;
  m.max_new_tokens = a.o.max_new_tokens;
  m.agent_concurrency = a.agent_concurrency;
  m.temperature = a.o.temperature;
  m.bf16 = a.o.precision.bf16;
  m.agent_args = a.agent_args;
  return multi_turn_episodes(m);
#else
  (void)tasks, (void)judge_url;
  throw opforge::Error("train ppo --multi-turn: this opforge-trainer was built without cpp-httplib (OPFORGE_SERVE=OFF), "
                       "so it cannot serve its actor to opforge agent; rebuild with -DOPFORGE_SERVE=ON");
#endif
}

int run_ppo(const PpoArgs& a) {
  check_ppo_options(a.o, a.multi_turn);
  Tokenizer tok(a.o.actor);
  auto tasks = opforge::evaluator::load_tasks(a.judge.tasks);
  std::vector<Prompt> prompts = task_prompts(tasks, tok);
  auto judge = start_judge(a.judge, a.o.device, a.o.out / "judge");
  PpoResult r = train_ppo(a.o, prompts, tok, judge_reward(judge->client, a.judge.concurrency),
                          multi_turn_of(a, tasks, judge->client.url));
  std::cout << r.actor_dir.string() << "\n";
  return 0;
}

void add_ppo(CLI::App* train, std::function<int()>& run) {
  auto a = std::make_shared<PpoArgs>();
  PpoOptions& o = a->o;
  CLI::App* c = train->add_subcommand("ppo", "PPO with the judge's reward: B task prompts a step, K answers (or, with "
                                             "--multi-turn, K agent episodes) each, actor and critic updated; every answer logged to "
                                             "OUT/trajectories.jsonl (train value's input); resumes from OUT/checkpoint; "
                                             "prints OUT/actor");
  c->add_option("--actor", o.actor, "Model folder of the policy")->required();
  c->add_option("--critic", o.critic, "Critic folder (opforge train value's); default: the actor's trunk, value head 0");
  c->add_option("--out", o.out, "Output folder: actor/, critic/, checkpoint/, trajectories.jsonl, metrics.jsonl, "
                                "metrics.png")->required();
  c->add_option("--steps", o.steps, "PPO iterations (rollouts + update)")->capture_default_str();
  c->add_option("--batch", o.batch, "Task prompts per iteration")->capture_default_str();
  c->add_option("--rollouts-per-task", o.rollouts_per_task, "Answers sampled per prompt")->capture_default_str();
  c->add_option("--ppo-epochs", o.ppo_epochs, "Passes over an iteration's answers")->capture_default_str();
  c->add_option("--mini-batch", o.mini_batch, "Answers per optimizer step (0: all)")->capture_default_str();
  c->add_option("--micro-batch", o.micro_batch, "Answers per forward/backward of a mini-batch, their gradients added "
                                                "up to its own (0: the mini-batch at once; less memory, same step)")
      ->capture_default_str();
  c->add_option("--max-new-tokens", o.max_new_tokens, "Longest answer")->capture_default_str();
  c->add_option("--lr", o.lr, "Actor learning rate")->capture_default_str();
  c->add_option("--critic-lr", o.critic_lr, "Critic learning rate")->capture_default_str();
  c->add_option("--temperature", o.temperature, "Sampling temperature")->capture_default_str();
  c->add_option("--top-p", o.top_p, "Nucleus mass")->capture_default_str();
  c->add_option("--clip-low", o.clip_low, "Ratio clip below 1")->capture_default_str();
  c->add_option("--clip-high", o.clip_high, "Ratio clip above 1")->capture_default_str();
  c->add_option("--dual-clip", o.dual_clip, "Dual-clip bound c (> 1) for negative advantages")->capture_default_str();
  c->add_option("--value-clip", o.value_clip, "Value clip range (<= 0: none)")->capture_default_str();
  c->add_option("--kl-coef", o.kl_coef, "KL penalty to the starting actor (0: none, no reference model)")->capture_default_str();
  c->add_option("--gamma", o.gamma, "GAE discount")->capture_default_str();
  c->add_option("--lam", o.lam, "GAE lambda")->capture_default_str();
  c->add_option("--advantage", o.advantage, "gae (a critic, as the paper), rloo or grpo (no critic: each answer's "
                                            "reward against the other answers to its prompt; single-turn only)")
      ->check(CLI::IsMember({"gae", "rloo", "grpo"}))
      ->capture_default_str();
  c->add_option("--seed", o.seed, "Task order and sampling")->capture_default_str();
  c->add_option("--device", o.device, "cpu or cuda (also the judge's device)")->capture_default_str();
  c->add_flag("--multi-turn", a->multi_turn, "Each rollout is an opforge agent episode (tools, up to --max-turns "
                                            "turns) against the actor served here; every turn is a sample with the "
                                            "episode's reward (OUT/rollouts/step_N holds the runs)");
  c->add_option("--max-turns", a->max_turns, "--multi-turn: model turns per episode")->capture_default_str();
  c->add_option("--agent-concurrency", a->agent_concurrency, "--multi-turn: episodes in flight per agent run")
      ->capture_default_str();
  c->add_option("--agent-arg", a->agent_args, "--multi-turn: an option for every opforge agent run (repeat), "
                                              "e.g. --agent-arg=--no-sandbox");
  add_precision_options(c, o.precision);
  add_judge_options(c, a->judge);
  c->callback([a, &run] { run = [a] { return run_ppo(*a); }; });
}

void add_value(CLI::App* train, std::function<int()>& run) {
  auto o = std::make_shared<ValueOptions>();
  CLI::App* c = train->add_subcommand("value", "Value pre-training: the critic (trunk + scalar head) regressed on the "
                                               "returns of judged trajectories (train ppo's trajectories.jsonl, or chat "
                                               "records with a reward); resumes from OUT/checkpoint; prints OUT/critic, "
                                               "which train ppo --critic takes");
  c->add_option("--model", o->model, "The actor's folder: its tokenizer renders chat records")->required();
  c->add_option("--critic-init", o->critic_init, "Folder the critic starts from (a model: value head 0; or a critic); "
                                                 "default: --model");
  c->add_option("--trajectories", o->trajectories, "JSONL of trajectories, or a folder of them (format: "
                                                   "trainer/README.md); null rewards are skipped")->required();
  c->add_option("--out", o->out, "Output folder: critic/, checkpoint/, metrics.jsonl, metrics.png")->required();
  c->add_option("--epochs", o->epochs, "Passes over the trajectories")->capture_default_str();
  c->add_option("--steps", o->steps, "Optimizer steps (overrides --epochs when > 0)")->capture_default_str();
  c->add_option("--batch", o->batch, "Trajectories per optimizer step")->capture_default_str();
  c->add_option("--lr", o->lr, "AdamW learning rate (train ppo's critic's)")->capture_default_str();
  c->add_option("--gamma", o->gamma, "Discount per response token")->capture_default_str();
  c->add_option("--lam", o->lam, "GAE lambda of the returns (1: Monte-Carlo returns of the final reward)")
      ->capture_default_str();
  c->add_option("--max-len", o->max_len, "Longest trajectory kept (longer ones are skipped, not cut)")->capture_default_str();
  add_step_options(c, *o);
  c->callback([o, &run] {
    run = [o] {
      std::cout << train_value(*o).critic_dir.string() << "\n";
      return 0;
    };
  });
}

struct EvalArgs {
  ModelEvalOptions o;
  JudgeArgs judge;
};

struct JudgeDir {
  std::filesystem::path path;
  bool keep;
  ~JudgeDir() {
    // A leftover temporary folder is no reason to fail a finished evaluation.
    if (!keep) try { opforge::trainer::remove_tree(path); } catch (const std::exception&) {}
  }
};

int run_eval(EvalArgs& a) {
  a.o.tasks = a.judge.tasks;
  Tokenizer tok(a.o.model);
  std::vector<Prompt> prompts = eval_prompts(a.o, tok);
  // Beside --out the judge's submissions and log stay to explain each row; without it they go.
  JudgeDir dir{a.o.out.empty() ? std::filesystem::temp_directory_path() / fmt::format("opforge-eval-{}", ::getpid())
                               : std::filesystem::path(a.o.out.string() + ".judge"),
               !a.o.out.empty()};
  auto judge = start_judge(a.judge, a.o.device, dir.path);
  std::cout << eval_model(a.o, prompts, tok, judge_reward(judge->client, a.judge.concurrency)).dump() << "\n";
  return 0;
}

void add_eval(CLI::App* train, std::function<int()>& run) {
  auto a = std::make_shared<EvalArgs>();
  ModelEvalOptions& o = a->o;
  CLI::App* c = train->add_subcommand("eval", "Greedy answers to the tasks' solving prompts (train ppo's), judged; "
                                              "prints {tasks, judged, null, pass_at_1, mean_reward, reward_hist} as "
                                              "one JSON object");
  c->add_option("--model", o.model, "Model folder to evaluate")->required();
  c->add_option("--split", o.split, "Only the tasks of this split (train or test): shards only, whose records "
                                    "carry one");
  c->add_option("--limit", o.limit, "The first N tasks (0: all)")->capture_default_str();
  c->add_option("--max-new-tokens", o.max_new_tokens, "Longest answer")->capture_default_str();
  c->add_option("--batch", o.batch, "Prompts generated at once")->capture_default_str();
  c->add_option("--device", o.device, "cpu or cuda (also the judge's device)")->capture_default_str();
  c->add_option("--out", o.out, "JSONL of per-task rows {task_id, reward, finish, response_tokens, response}; "
                                "the judge's folder goes beside it (OUT.judge)");
  add_judge_options(c, a->judge);
  c->callback([a, &run] { run = [a] { return run_eval(*a); }; });
}

// opforge train recipe (recipe.h): a preset names data/recipes/NAME.json, or is a path.
void add_recipe(CLI::App* train, std::function<int()>& run) {
  auto o = std::make_shared<RecipeOptions>();
  auto preset = std::make_shared<std::string>("paper");
  CLI::App* c = train->add_subcommand("recipe", "CUDA Agent's four stages in order: single-turn PPO warm-up, RFT (agent "
                                                "episodes of the warmed-up actor kept by `agent sft`, then sft), value "
                                                "pre-training, multi-turn PPO; one judge; a rerun resumes; prints the "
                                                "final actor's folder");
  c->add_option("--model", o->model, "Model folder to start from")->required();
  c->add_option("--tasks", o->tasks, "Tasks: a shard, a workspace or a folder of KernelBench files")->required();
  c->add_option("--out", o->out, "Output folder: 1_warmup/ 2_rft/ 3_value/ 4_ppo/ judge/")->required();
  c->add_option("--preset", *preset, "Stage sizes: a name in data/recipes/ (paper, smoke) or a .json path")
      ->capture_default_str();
  c->add_option("--device", o->device, "cpu or cuda (every stage's, and the judge's)")->capture_default_str();
  c->add_option("--judge-url", o->judge_url, "A running opforge serve (http://host:port); default: one started here");
  c->add_option("--judge-arg", o->judge_args, "An argument for the started opforge serve (repeat)");
  c->callback([o, preset, &run] {
    run = [o, preset] {
#ifdef OPFORGE_POLICY_SERVER
      bool named = preset->find('/') == std::string::npos && !preset->ends_with(".json");
      o->preset = named ? opforge::data_dir() / "recipes" / (*preset + ".json") : std::filesystem::path(*preset);
      std::cout << run_recipe(*o).string() << "\n";
      return 0;
#else
      throw opforge::Error("train recipe: this opforge-trainer was built without cpp-httplib (OPFORGE_SERVE=OFF), so "
                           "its RFT and agentic stages cannot serve the actor; rebuild with -DOPFORGE_SERVE=ON");
#endif
    };
  });
}

}  // namespace

// A crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) writes the frames of the crashing thread to
// stderr before the process dies with the same signal: a GPU run's log is often all that comes back
// of it. backtrace_symbols_fd allocates nothing, so it is safe enough in a handler; frames inside
// opforge-trainer print as binary(+0xOFFSET), which `addr2line -f -C -e opforge-trainer` resolves.
void print_stack_and_die(int sig) {
  static const char head[] = "opforge-trainer: crashed; the stack (addr2line -f -C -e opforge-trainer resolves +0x...):\n";
  (void)!write(2, head, sizeof head - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

int main(int argc, char** argv) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now: its first use allocates, not safe in a handler
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, print_stack_and_die);
  CLI::App app{"opforge-trainer: generation and training in libtorch (run as `opforge generate` / `opforge train`)"};
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error (logs go to stderr)")->capture_default_str();
  app.require_subcommand(1);
  std::function<int()> run;
  add_generate(app, run);
  add_train(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    opforge::init_logging(log_level);
    return run ? run() : 0;
  } catch (const std::exception& e) {
    std::cerr << "opforge: error: " << opforge::describe(e) << "\n";
    return 1;
  }
}
