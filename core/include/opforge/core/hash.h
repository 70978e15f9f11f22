// xxHash (XXH3-64) helpers. Ids of seeds and tasks are the 16-hex-digit XXH3 of normalised code.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace opforge {

std::uint64_t xxh3_64(std::string_view data, std::uint64_t seed = 0);
// Lower-case, zero-padded, 16 characters.
std::string xxh3_hex(std::string_view data);

}  // namespace opforge
