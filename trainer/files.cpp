#include "files.h"

#include <dirent.h>
#include <ftw.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "opforge/core/error.h"
#include "opforge/core/files.h"

namespace opforge::trainer {
namespace fs = std::filesystem;

namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : errno;
}

}  // namespace

void remove_tree(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return;
  // Depth first (children before their folder), links not followed.
  int rc = nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  OPFORGE_CHECK(rc == 0, "cannot remove {}: {} (remove it by hand and run again)", path.string(),
                std::strerror(rc > 0 ? rc : errno));
}

std::vector<fs::path> list_dir(const fs::path& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  OPFORGE_CHECK(d != nullptr, "cannot list {}: {}", dir.string(), std::strerror(errno));
  std::vector<fs::path> out;
  while (dirent* e = readdir(d.get())) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(dir / name);
  }
  return out;
}

void copy_file_bytes(const fs::path& from, const fs::path& to) { write_text_atomic(to, read_text(from)); }

}  // namespace opforge::trainer
