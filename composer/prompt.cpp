#include "prompt.h"

#include "opforge/core/files.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "opforge/core/error.h"
#include "opforge/core/hash.h"
#include "opforge/core/paths.h"

namespace opforge::composer {

namespace {

constexpr int kMaxOps = 5;  // Ops-6K fuses at most five operators per task

std::string read_template(const std::filesystem::path& p) {
  OPFORGE_CHECK(std::filesystem::exists(p), "cannot read prompt template {}: restore it from the opforge source "
                "tree, or set OPFORGE_HOME to a tree that has data/prompts/", p.string());
  return opforge::read_text(p);
}

std::string_view trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

std::filesystem::path prompt_template_path(std::string_view name) {
  return data_dir() / "prompts" / (std::string(name) + ".md");
}

std::string load_prompt_template(std::string_view name) { return read_template(prompt_template_path(name)); }

std::string fill_prompt(std::string_view tmpl, const std::map<std::string, std::string>& vars) {
  std::string out;
  out.reserve(tmpl.size());
  std::size_t pos = 0;
  while (true) {
    std::size_t open = tmpl.find("{{", pos);
    if (open == std::string_view::npos) break;
    std::size_t close = tmpl.find("}}", open + 2);
    OPFORGE_CHECK(close != std::string_view::npos, "prompt template has an unclosed '{{{{' at offset {}", open);
    std::string key(trim(tmpl.substr(open + 2, close - open - 2)));
    auto it = vars.find(key);
    if (it == vars.end()) {
      std::vector<std::string> known;
      for (const auto& [name, value] : vars) known.push_back(name);
      throw Error(fmt::format("prompt template uses {{{{{}}}}}, which has no value (known: {})", key,
                              fmt::join(known, ", ")));
    }
    out.append(tmpl.substr(pos, open - pos)).append(it->second);
    pos = close + 2;
  }
  out.append(tmpl.substr(pos));
  return out;
}

ComposePrompt build_compose_prompt(const std::vector<PromptSeed>& seeds, std::string_view template_name) {
  OPFORGE_CHECK(!seeds.empty() && static_cast<int>(seeds.size()) <= kMaxOps,
                "a composed task fuses 1 to {} operators, got {}", kMaxOps, seeds.size());
  std::vector<std::string> names;
  std::string classes;
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    names.push_back(seeds[i].name);
    std::string code = seeds[i].code;
    if (code.empty() || code.back() != '\n') code.push_back('\n');
    classes += fmt::format("{}### Operator {}: {}\n\n```python\n{}```\n", i ? "\n" : "", i + 1, seeds[i].name, code);
  }
  std::map<std::string, std::string> vars = {{"num_ops", std::to_string(seeds.size())},
                                             {"max_ops", std::to_string(kMaxOps)},
                                             {"op_names", fmt::format("{}", fmt::join(names, ", "))},
                                             {"seed_classes", classes}};
  ComposePrompt p;
  p.prompt = fill_prompt(load_prompt_template(template_name), vars);
  auto system_path = data_dir() / "prompts" / (std::string(template_name) + ".system.md");
  if (std::filesystem::exists(system_path)) {
    p.system = fill_prompt(read_template(system_path), vars);
    while (!p.system.empty() && (p.system.back() == '\n' || p.system.back() == ' ')) p.system.pop_back();
  }
  p.hash = xxh3_hex(p.system + "\n\n" + p.prompt);
  return p;
}

}  // namespace opforge::composer
