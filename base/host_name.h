#pragma once
// This machine's host name, for messages and for matching cluster.nodes.

#include <unistd.h>

#include <string>

namespace ddprun {

/// gethostname(); "" if the system does not say.
inline std::string LocalHostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

}  // namespace ddprun
