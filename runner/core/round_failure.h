#pragma once
// Why a round failed, as the coordinator judged it: the one line every summary leads with, the
// detail under it, and what it is known by.

#include <string>
#include <vector>

#include "runner/core/failure.h"

namespace ddprun::core {

struct RoundFailure {
  int round = 0;
  int node_rank = 0;     // the agent it happened on (or that was lost)
  int global_rank = -1;  // the failed (or first hung) rank; -1 for a lost node or a stall
  std::string what;      // one line: "rank 3 (node 1 (gpu-02), local rank 1) exited with code 1"
  std::string detail;    // error file / stderr tail, indented
  bool mentions_nccl = false;
  bool lost_peer = false;          // its error says it lost a peer: likely a consequence (failure.h)
  bool the_stop = false;           // its error is the stop's own signal (failure.h)
  bool explains_silence = false;   // a lost node or our own stall: ranks fall silent because of it
  std::vector<FailureKind> kinds;  // what it is known by (core::FailureKinds), for never_on
};

}  // namespace ddprun::core
