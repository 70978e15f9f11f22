#include "opforge/core/files.h"

#include <unistd.h>

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

void write_text_atomic(const std::filesystem::path& file, std::string_view text, bool executable) {
  std::filesystem::create_directories(file.parent_path());
  // The PID in the name: two processes writing one marker do not write into each other's copy.
  std::filesystem::path tmp = file.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    OPFORGE_CHECK(out.good(), "cannot write {}: check that its folder is writable and the disk not full", tmp.string());
  }
  if (executable) {
    using std::filesystem::perms;
    std::filesystem::permissions(tmp, perms::owner_all | perms::group_read | perms::group_exec | perms::others_read |
                                          perms::others_exec);
  }
  std::filesystem::rename(tmp, file);
}

std::vector<std::filesystem::path> python_files_under(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".py") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

// Length of the UTF-8 sequence at s[i], or 0 when it is not one (overlong forms, surrogates and
// code points past U+10FFFF included).
std::size_t utf8_at(std::string_view s, std::size_t i) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  unsigned char c = b(0);
  std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((b(k) >> 6) != 0x2) return 0;
  if (n == 2 && c < 0xC2) return 0;
  if (n == 3 && ((c == 0xE0 && b(1) < 0xA0) || (c == 0xED && b(1) >= 0xA0))) return 0;
  if (n == 4 && ((c == 0xF0 && b(1) < 0x90) || c > 0xF4 || (c == 0xF4 && b(1) >= 0x90))) return 0;
  return n;
}

}  // namespace

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = utf8_at(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

bool is_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = utf8_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace opforge
