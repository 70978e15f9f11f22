#include "opforge/core/error.h"

namespace opforge {

namespace {
void append(const std::exception& e, std::string& out) {
  if (!out.empty()) out += ": ";
  out += e.what();
  try {
    std::rethrow_if_nested(e);
  } catch (const std::exception& inner) {
    append(inner, out);
  } catch (...) {
    out += ": unknown error";
  }
}
}  // namespace

std::string describe(const std::exception& e) {
  std::string out;
  append(e, out);
  return out;
}

}  // namespace opforge
