// Finds the task code in an LLM answer: the fenced Python block that defines `class Model`.
#pragma once
#include <string>
#include <string_view>

namespace opforge::composer {

struct ExtractedCode {
  bool ok = false;
  std::string code;    // the block's text without its fences, ending with one newline
  std::string reason;  // when not ok: no_code_block (no Python fence at all), no_model_class
};

// Looks at the fenced blocks tagged python/py/python3 or untagged (blocks of other languages are
// ignored) and takes the last one that defines `class Model` at the start of a line: answers
// that first show a draft and then the fixed version end with the version meant. A block left
// open at the end of the answer counts up to the end (models often omit the closing fence).
ExtractedCode extract_model_code(std::string_view answer);

}  // namespace opforge::composer
