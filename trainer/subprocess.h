// Child opforge processes of the trainer's stages (multi_turn.h's agent runs, recipe.h's stages):
// started with stdout and stderr in a log file, waited for, their failure told with the log's tail.
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace opforge::trainer {

// Starts `args` (args[0] an executable path) with stdin /dev/null and stdout + stderr in `log`; the
// child gets SIGTERM when the calling thread ends (the trainer killed), so no run outlives it.
pid_t spawn_logged(const std::vector<std::string>& args, const std::filesystem::path& log);

// Waits for pid; "" when it exited 0, else what went wrong with the last lines of its log.
std::string wait_logged(pid_t pid, const std::string& what, const std::filesystem::path& log);

// Runs `args` to the end (spawn_logged + wait_logged); throws opforge::Error when it failed.
void run_logged(const std::vector<std::string>& args, const std::string& what, const std::filesystem::path& log);

}  // namespace opforge::trainer
