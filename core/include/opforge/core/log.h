// One logger for the whole binary: diagnostics go to stderr (never stdout, which carries data)
// and, once a workspace is open, also to <workspace>/logs/opforge.log.
#pragma once
#include <spdlog/spdlog.h>

#include <filesystem>
#include <string>

namespace opforge {

// Sets up the stderr sink. level: trace|debug|info|warn|error. Call once from main.
void init_logging(const std::string& level);

// Adds a file sink (appending) to the default logger. Safe to call more than once per path.
void add_log_file(const std::filesystem::path& file);

}  // namespace opforge
