#include "opforge/core/files.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "opforge/core/error.h"

namespace opforge {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  OPFORGE_CHECK(in, "cannot read {}: check that it exists and is readable", p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::filesystem::path> python_files_under(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".py") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace opforge
