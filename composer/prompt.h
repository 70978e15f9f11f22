// Prompts of the `llm` backend: templates kept as data in data/prompts/, filled here.
//
// A template is a Markdown file with {{name}} placeholders; `<name>.md` is the user message and
// the optional `<name>.system.md` the system message. Errors: a missing template file or a
// placeholder without a value throws opforge::Error (a typo must not reach the LLM silently).
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace opforge::composer {

// The user template data/prompts/<name>.md.
std::filesystem::path prompt_template_path(std::string_view name);
// Reads the template text.
std::string load_prompt_template(std::string_view name);
// Replaces every {{key}} (spaces inside the braces allowed) with vars.at(key). Values are
// inserted verbatim: braces inside them (Python dicts, f-strings) are never expanded again.
std::string fill_prompt(std::string_view tmpl, const std::map<std::string, std::string>& vars);

struct PromptSeed {
  std::string name;  // the operator: torch.nn.Conv2d, torch.relu, …
  std::string code;  // its runnable seed task
};

struct ComposePrompt {
  std::string system;  // empty when the template has no .system.md
  std::string prompt;
  std::string hash;  // xxh3 hex of system + "\n\n" + prompt: recorded as provenance
};

// The compose prompt for 1 to 5 seeds, in the order they are to run. Fills {{num_ops}},
// {{max_ops}} (5), {{op_names}} (comma separated) and {{seed_classes}} (each seed's code in a
// fence under a heading with its position and name).
ComposePrompt build_compose_prompt(const std::vector<PromptSeed>& seeds, std::string_view template_name = "compose_llm");

}  // namespace opforge::composer
