#pragma once
// The job's shared secret (docs/running.md): every agent proves it knows the same one before the
// coordinator believes its join, and the coordinator proves it back. It comes from the agent's
// environment and never reaches the workers, which run user code.

#include <map>
#include <string>

#include "base/result.h"

namespace ddprun::io {

struct SharedSecret {
  std::string secret;   // "" when neither variable is set
  std::string warning;  // e.g. a file other users can read; "" if none
};
/// The shared secret from DDPRUN_SECRET or the file named by DDPRUN_SECRET_FILE. An unreadable
/// or empty file is a failure.
Result<SharedSecret> ReadSharedSecret();

/// Removes DDPRUN_SECRET and DDPRUN_SECRET_FILE from `env`, the environment workers inherit.
void RemoveSharedSecret(std::map<std::string, std::string>& env);

}  // namespace ddprun::io
