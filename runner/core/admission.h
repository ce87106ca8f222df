#pragma once
// Whether an agent's Join is let in: a pure judgement over the join and what the coordinator
// knows (its secret and the challenge it sent on this connection, its job, the slot the join
// claims and where the job stands). The coordinator carries the verdict out.

#include <string>
#include <string_view>

#include "runner/core/roster.h"
#include "runner/core/wire.h"

namespace ddprun::core {

struct JoinFacts {
  std::string_view secret;       // the shared secret; "" none
  std::string_view nonce;        // the Challenge sent on this connection; "" none yet
  std::string_view from;         // the peer's address
  std::string_view fingerprint;  // node 0's job
  std::string_view canonical;
  int nnodes = 0;
  int agents = 0;                      // nodes and spares
  const AgentSlot* claimed = nullptr;  // the slot of the node rank the join claims, when in range
  bool job_over = false;               // the job is ending or done
  bool done = false;                   // the job is done
  bool took_over = false;              // this coordinator took the job over from an earlier holder
  std::string_view us = "node 0";      // the coordinator as refusals name it (etcd: any agent holds it)
};

struct JoinVerdict {
  enum class Outcome {
    kChallenge,  // a first join with a secret: answer with a Challenge, then judge the proof
    kRefuse,
    kAdmit,        // it takes part
    kHearVerdict,  // it took part and comes back after the end: tell it the outcome
  };
  Outcome outcome = Outcome::kRefuse;
  std::string reason;       // kRefuse: what the node and node 0's log are told
  bool retry = false;       // kRefuse: the node may try again (its slot may free)
  std::string why;          // kRefuse: the short form for the rendezvous summary; "" none
  bool other_file = false;  // kRefuse: the fingerprints differ (job file, code, arguments, libraries)
  /// The same agent on a new connection before its old one was seen to close: the old one
  /// is dropped first.
  bool replaces_connection = false;
  /// kAdmit: the warning node 0 logs when advisory lines differ (job.code_check or
  /// job.library_check = "warn"; schema/join_mismatch.h); "" none.
  std::string differences;
};

/// Authentication first (a peer without the secret learns nothing about the job), then the
/// rank's range, the job file, a rank claimed twice, and a join after the end.
JoinVerdict JudgeJoin(const JoinFacts& facts, const wire::Join& join);

}  // namespace ddprun::core
