// Reading task files: the one place that walks folders of KernelBench files and reads text.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace opforge {

// The whole file as bytes; throws opforge::Error naming the file when it cannot be read.
std::string read_text(const std::filesystem::path& p);
// Every regular *.py file under dir (recursive), sorted.
std::vector<std::filesystem::path> python_files_under(const std::filesystem::path& dir);

}  // namespace opforge
