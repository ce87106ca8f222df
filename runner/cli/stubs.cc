// Temporary stand-ins for the subcommands other layers implement; each owner deletes its
// function here when the real one lands.
#include <cstdio>

#include "runner/cli/commands.h"

namespace ddprun::cli {

int PreflightCommand(const PreflightOptions&) {
  std::fputs("ddprun preflight: not implemented yet\n", stderr);
  return kExitInternal;
}

}  // namespace ddprun::cli
