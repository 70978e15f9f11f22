// Reading task files: the one place that walks folders of KernelBench files and reads text.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace opforge {

// The whole file as bytes; throws opforge::Error naming the file when it cannot be read.
std::string read_text(const std::filesystem::path& p);
// Writes `text` beside `file` and renames it over (creating the folder): a reader, or a kill, never
// sees half a file (markers other processes read, data files a rerun trusts, scripts a running job
// still reads). `executable`: mode 755, set before the rename. Throws naming the file.
void write_text_atomic(const std::filesystem::path& file, std::string_view text, bool executable = false);
// `s` with every byte sequence that is not UTF-8 replaced by U+FFFD: text from a process or a
// file we do not control (a command's output, cut at a byte count too) becomes JSON-safe.
std::string valid_utf8(std::string_view s);
// Whether `s` is UTF-8 throughout.
bool is_utf8(std::string_view s);
// Every regular *.py file under dir (recursive), sorted.
std::vector<std::filesystem::path> python_files_under(const std::filesystem::path& dir);

}  // namespace opforge
