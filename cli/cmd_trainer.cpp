// `opforge generate` and `opforge train`: run by opforge-trainer, the binary that links libtorch
// (trainer/main.cpp says why it is apart), exec'd from beside this one with the same arguments.
// Its own --help is the subcommand's.
#include <unistd.h>

#include <cstring>
#include <memory>

#include "commands.h"
#include "opforge/core/error.h"
#include "opforge/core/paths.h"

namespace opforge::cli {

namespace {
int exec_trainer(const std::string& sub, const std::vector<std::string>& rest) {
  std::filesystem::path exe = self_executable().parent_path() / "opforge-trainer";
  OPFORGE_CHECK(std::filesystem::exists(exe), "{} is missing: it is built with opforge (`make setup`, or "
                "`cmake --build build --target opforge-trainer`)", exe.string());
  std::vector<std::string> args = {exe.string(), sub};
  args.insert(args.end(), rest.begin(), rest.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(exe.c_str(), argv.data());
  throw Error(fmt::format("cannot run {}: {}", exe.string(), std::strerror(errno)));
}

void forward(CLI::App& app, Runner& run, const std::string& name, const std::string& what) {
  CLI::App* c = app.add_subcommand(name, what + " (opforge " + name + " --help for its options)");
  c->prefix_command();
  c->set_help_flag();  // --help goes to opforge-trainer, which owns the options
  c->callback([c, name, &run] { run = [rest = c->remaining(), name] { return exec_trainer(name, rest); }; });
}
}  // namespace

void add_trainer(CLI::App& app, Runner& run) {
  forward(app, run, "generate",
          "Complete a prompt with a local Hugging Face model (libtorch, KV cache), or --serve it as an "
          "OpenAI-compatible endpoint");
  forward(app, run, "train",
          "Train a local Hugging Face model: sft (the RFT stage), value (critic pre-training), ppo (single-turn, "
          "the judge's reward), eval (pass@1 of greedy answers)");
}

}  // namespace opforge::cli
