#include "code_extract.h"

#include <regex>
#include <vector>

namespace opforge::composer {

namespace {

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r";
  auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

bool is_python_tag(std::string_view tag) {
  // The tag may carry attributes after a space (```python title="model.py").
  tag = tag.substr(0, tag.find_first_of(" \t{"));
  return tag.empty() || tag == "python" || tag == "py" || tag == "python3" || tag == "Python";
}

}  // namespace

ExtractedCode extract_model_code(std::string_view answer) {
  std::vector<std::string> blocks;
  bool inside = false, wanted = false;
  std::string current;
  std::size_t pos = 0;
  while (pos <= answer.size()) {
    std::size_t nl = answer.find('\n', pos);
    std::string_view line = answer.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? answer.size() + 1 : nl + 1;
    std::string_view t = trim(line);
    if (!inside) {
      if (t.starts_with("```")) {
        inside = true;
        wanted = is_python_tag(trim(t.substr(3)));
        current.clear();
      }
    } else if (t == "```") {
      inside = false;
      if (wanted) blocks.push_back(current);
    } else if (wanted) {
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      current.append(line).push_back('\n');
    }
  }
  if (inside && wanted) blocks.push_back(current);  // unterminated last block

  if (blocks.empty()) return {false, "", "no_code_block"};
  static const std::regex model_class(R"((^|\n)class\s+Model\s*[(:])");
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    if (std::regex_search(*it, model_class)) {
      std::string code = std::move(*it);
      while (code.size() > 1 && code.ends_with("\n\n")) code.pop_back();
      if (code.empty() || code.back() != '\n') code.push_back('\n');
      return {true, std::move(code), ""};
    }
  }
  return {false, "", "no_model_class"};
}

}  // namespace opforge::composer
