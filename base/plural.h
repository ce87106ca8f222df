#pragma once
// Counts in messages: "1 node", "2 nodes", never "1 nodes".

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace ddprun {

/// "1 node", "2 nodes", "0 nodes": the noun takes an s unless the count is one.
inline std::string Counted(size_t count, std::string_view noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

/// "all 2 nodes", "the 1 node": for "... joined", "... exited 0".
inline std::string AllOf(size_t count, std::string_view noun) {
  return count == 1 ? fmt::format("the 1 {}", noun) : fmt::format("all {}", Counted(count, noun));
}

}  // namespace ddprun
