// Errors that end a command. Expected failures (a task that crashes, a seed that does not run)
// are values with reasons, never exceptions; see docs/architecture.md, "Conventions".
#pragma once
#include <fmt/format.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace opforge {

// A user-facing error: its message names the thing and says what to do.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Flattens a chain of nested exceptions into "outer: inner: innermost".
std::string describe(const std::exception& e);

// Runs f; if it throws, rethrows with `context` wrapped around it ("while filtering task 3f2a").
template <class F>
decltype(auto) with_context(std::string_view context, F&& f) {
  try {
    return f();
  } catch (...) {
    std::throw_with_nested(Error(std::string(context)));
  }
}

}  // namespace opforge

// Checks a condition that depends on user input or the environment; throws opforge::Error.
#define OPFORGE_CHECK(cond, ...)                                      \
  do {                                                                \
    if (!(cond)) throw ::opforge::Error(::fmt::format(__VA_ARGS__));  \
  } while (0)
