// Folder removal, listing and file copies for the trainer, done with libc calls instead of
// std::filesystem's remove_all, directory_iterator and copy_file. The torch wheel's libraries carry
// copies of std::filesystem's functions; on the GPU machine (Ubuntu 24.04, torch 2.11.0+cu130)
// opforge-trainer jumped to address 0 inside the removal of a non-empty folder (every run's second
// checkpoint: the old one is removed), although libstdc++ comes first in its link order
// (trainer/CMakeLists.txt). The simple calls (exists, rename, create_directories) worked there.
#pragma once
#include <filesystem>
#include <vector>

namespace opforge::trainer {

// Removes `path` and everything under it (links are removed, never followed); a missing path is
// fine. Throws opforge::Error naming the entry it could not remove.
void remove_tree(const std::filesystem::path& path);
// The entries of folder `dir` (not recursive), in no particular order.
std::vector<std::filesystem::path> list_dir(const std::filesystem::path& dir);
// `from`'s bytes into `to`, replacing it (core's read_text and write_text_atomic: a rename, which
// worked there).
void copy_file_bytes(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace opforge::trainer
