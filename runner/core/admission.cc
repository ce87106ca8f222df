#include "runner/core/admission.h"

#include <fmt/format.h>

#include <optional>

#include "runner/core/auth.h"
#include "schema/canonical.h"
#include "schema/join_mismatch.h"

namespace ddprun::core {
namespace {

JoinVerdict Refusal(std::string reason, bool retry = false, std::string why = "") {
  JoinVerdict v;
  v.outcome = JoinVerdict::Outcome::kRefuse;
  v.reason = std::move(reason);
  v.retry = retry;
  v.why = std::move(why);
  return v;
}

// Authentication first: a peer without the secret learns nothing about the job. Empty: the
// join passed (or there is no secret); otherwise a Challenge or a refusal.
std::optional<JoinVerdict> JudgeSecret(const JoinFacts& facts, const wire::Join& join) {
  const std::string_view from = facts.from;
  // The agent speaks first (so the relay can tell it from a store client); with a secret its
  // first join is answered with a Challenge, and the second must carry the proof for it.
  if (facts.secret.empty() && !join.nonce.empty()) {
    // Said to the agent before it is counted: nobody mistakes it for a lost node.
    return Refusal(fmt::format("node {} (from {}) has a shared secret (DDPRUN_SECRET or "
                               "DDPRUN_SECRET_FILE) and node 0 has none\nhint: set the same secret on "
                               "every node, or on none",
                               join.node_rank, from),
                   false, "it has a shared secret and node 0 has none");
  }
  if (!facts.secret.empty() && facts.nonce.empty()) {
    if (join.nonce.empty()) {
      return Refusal(fmt::format("node {} (host {}, from {}) has no shared secret and node 0 requires "
                                 "one\nhint: set DDPRUN_SECRET or DDPRUN_SECRET_FILE to the same secret "
                                 "on every node",
                                 join.node_rank, join.host, from),
                     false, "it has no shared secret and node 0 requires one");
    }
    JoinVerdict v;
    v.outcome = JoinVerdict::Outcome::kChallenge;
    return v;
  }
  if (!facts.secret.empty() &&
      !ConstantTimeEqual(join.proof, JoinProof(std::string(facts.secret), std::string(facts.nonce),
                                               join.node_rank, join.fingerprint))) {
    return Refusal(
        join.proof.empty() ? fmt::format("a node from {} (claiming node rank {}) sent no proof of the shared "
                                         "secret\nhint: set DDPRUN_SECRET or DDPRUN_SECRET_FILE to the same "
                                         "secret on every node",
                                         from, join.node_rank)
                           : fmt::format("a node from {} (claiming node rank {}) failed the shared-secret "
                                         "challenge: its secret differs from node 0's",
                                         from, join.node_rank),
        false, fmt::format("a peer from {} claiming this rank failed the shared-secret challenge", from));
  }
  return std::nullopt;
}

}  // namespace

JoinVerdict JudgeJoin(const JoinFacts& facts, const wire::Join& join) {
  using Outcome = JoinVerdict::Outcome;
  const int nnodes = facts.nnodes;
  const int agents = facts.agents;
  const std::string_view from = facts.from;
  if (std::optional<JoinVerdict> verdict = JudgeSecret(facts, join)) return std::move(*verdict);
  if (join.node_rank < 0 || join.node_rank >= agents) {
    return Refusal(
        agents > nnodes
            ? fmt::format("node rank {} (host {}, from {}) is out of range: the job has {} node{} "
                          "(ranks 0..{}) and {} spare{} (ranks {}..{})",
                          join.node_rank, join.host, from, nnodes, nnodes == 1 ? "" : "s", nnodes - 1,
                          agents - nnodes, agents - nnodes == 1 ? "" : "s", nnodes, agents - 1)
            : fmt::format("node rank {} (host {}, from {}) is out of range: the job has {} node{} "
                          "(ranks 0..{})",
                          join.node_rank, join.host, from, nnodes, nnodes == 1 ? "" : "s", nnodes - 1));
  }
  const std::string canonical(facts.canonical);
  if (join.fingerprint != facts.fingerprint) {
    // Named as what differs: the job file, the code, the arguments after `--`, the libraries.
    JoinRefusal refusal = DescribeRefusedJoin(canonical, join.canonical,
                                              AgentLabel(join.node_rank, facts.nnodes), join.host, facts.us);
    JoinVerdict verdict = Refusal(std::move(refusal.message), false, std::move(refusal.why));
    verdict.other_file = true;
    return verdict;
  }
  const AgentSlot& slot = *facts.claimed;
  JoinVerdict verdict;
  if (slot.conn && !facts.done) {
    if (slot.instance != join.instance) {
      // Retryable: a host that rebooted faster than its old connection was declared dead
      // looks exactly like this, and its slot frees after 3 silent heartbeats. A real
      // duplicate keeps being refused until its rendezvous timeout.
      return Refusal(fmt::format("node rank {} is claimed twice: by host {} (already joined) and by host "
                                 "{} from {}\nhint: every node needs its own rank; check --node-rank, "
                                 "DDPRUN_NODE_RANK or cluster.nodes",
                                 join.node_rank, slot.host, join.host, from),
                     /*retry=*/true);
    }
    // The same agent reconnecting before we noticed its old connection died.
    verdict.replaces_connection = true;
  }
  if (facts.job_over) {
    // Only the agents that took part hear the verdict; one that arrives after the end (a
    // second agent for a rank, a node started too late) did not run this job. A coordinator
    // that took over cannot tell who took part (the earlier holder may have placed a spare,
    // or moved node 0's agent off rank 0 for its own): every agent of the job hears it.
    if (!facts.took_over && !(slot.ever_joined && slot.instance == join.instance)) {
      return Refusal(fmt::format("{} (host {}) joined after the job ended",
                                 AgentLabel(join.node_rank, facts.nnodes), join.host));
    }
    verdict.outcome = Outcome::kHearVerdict;
    return verdict;
  }
  verdict.outcome = Outcome::kAdmit;
  // Same fingerprint, other advisory lines (code_check or library_check = "warn").
  if (join.canonical != canonical) {
    verdict.differences = DescribeAdvisoryDifference(
        canonical, join.canonical, AgentLabel(join.node_rank, facts.nnodes), join.host, facts.us);
  }
  return verdict;
}

}  // namespace ddprun::core
