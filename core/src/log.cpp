#include "opforge/core/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <set>

#include "opforge/core/error.h"

namespace opforge {

void init_logging(const std::string& level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("opforge", sink);
  auto lvl = spdlog::level::from_str(level);
  OPFORGE_CHECK(level == "off" || lvl != spdlog::level::off,
                "unknown log level '{}': use trace, debug, info, warn or error", level);
  logger->set_level(lvl);
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
}

void add_log_file(const std::filesystem::path& file) {
  static std::set<std::string> added;
  if (!added.insert(file.string()).second) return;
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file.string(), /*truncate=*/false);
  sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%P] [%l] %v");
  sink->set_level(spdlog::level::debug);
  spdlog::default_logger()->sinks().push_back(sink);
  // A killed run must leave its log behind.
  spdlog::default_logger()->flush_on(spdlog::level::info);
}

}  // namespace opforge
