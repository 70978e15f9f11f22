#include "opforge/core/hash.h"

#include <fmt/format.h>
#include <xxhash.h>

namespace opforge {

std::uint64_t xxh3_64(std::string_view data, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data.data(), data.size(), seed);
}

std::string xxh3_hex(std::string_view data) { return fmt::format("{:016x}", xxh3_64(data)); }

}  // namespace opforge
