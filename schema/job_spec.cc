#include "schema/job_spec.h"

#include <algorithm>

namespace ddprun {

bool ConsoleFilter::Shows(int global_rank) const {
  switch (mode) {
    case Mode::kAll:
      return true;
    case Mode::kNone:
      return false;
    case Mode::kRanks:
      return std::binary_search(ranks.begin(), ranks.end(), global_rank);
  }
  return true;
}

SourceLoc JobSpec::LocationOf(const std::string& key_path) const {
  auto it = locations.find(key_path);
  return it == locations.end() ? SourceLoc{} : it->second;
}

}  // namespace ddprun
