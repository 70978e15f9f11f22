#include "opforge/core/shard.h"

#include <fmt/format.h>

#include <charconv>

#include "opforge/core/error.h"
#include "opforge/core/hash.h"

namespace opforge {

namespace {
// The whole of `s` as a non-negative int, or -1.
int whole_int(std::string_view s) {
  int v = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && v >= 0 ? v : -1;
}
}  // namespace

Shard parse_shard(const std::string& spec) {
  auto slash = spec.find('/');
  int index = slash == std::string::npos ? -1 : whole_int(std::string_view(spec).substr(0, slash));
  int count = slash == std::string::npos ? -1 : whole_int(std::string_view(spec).substr(slash + 1));
  OPFORGE_CHECK(index >= 0 && count >= 1 && index < count,
                "bad --shard '{}': write I/N, this shard's index I of N shards with 0 <= I < N (e.g. --shard 0/4 "
                "... --shard 3/4)",
                spec);
  return {index, count};
}

bool in_shard(const std::string& task_id, Shard shard) {
  return shard.count <= 1 || xxh3_64(task_id) % static_cast<std::uint64_t>(shard.count) == static_cast<std::uint64_t>(shard.index);
}

std::filesystem::path shard_marker(const std::filesystem::path& workspace, std::string_view stage, Shard shard) {
  return workspace / "done" / fmt::format("{}.shard-{}-of-{}.json", stage, shard.index, shard.count);
}

}  // namespace opforge
