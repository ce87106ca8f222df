// The agent's link to the coordinator: connecting (and saying why a connect failed), the join,
// the shared secret's proofs before anything the peer says is believed, retrying until
// timeouts.rendezvous, and losing the coordinator, which stops this node's workers within
// their lease. Methods of Agent (agent.h); the link's phases and the deadline table are in
// agent.cc.
#include <algorithm>

#include <fmt/format.h>

#include "runner/core/agent.h"
#include "runner/core/auth.h"
#include "runner/core/exit_code.h"
#include "schema/duration.h"

namespace ddprun::core {
namespace {

// Connect failures repeat every retry; the user needs to hear about them this often.
constexpr Duration kConnectLogInterval = Seconds(10);

}  // namespace

std::string Agent::ExplainConnectError(const MasterConnectFailed& failed) const {
  const std::string endpoint = MasterEndpoint();
  const uint16_t port = spec_.cluster.master_port;
  switch (failed.error) {
    case ConnectError::kRefused:
      return fmt::format(
          "connection to {} refused: {} is not listening yet, or "
          "master_port is wrong, or a firewall rejects TCP port {}",
          endpoint,
          spec_.rendezvous.Etcd() ? "the agent that holds the coordinator role in etcd" : "node 0's agent",
          port);
    case ConnectError::kTimedOut:
      return fmt::format(
          "connection to {} timed out: a firewall drops TCP port {} or the host is "
          "down; open TCP port {} on {} for the other nodes",
          endpoint, port, port,
          spec_.rendezvous.Etcd() ? "every host of the job" : spec_.cluster.master_addr);
    case ConnectError::kStore:
      return fmt::format("cannot find the coordinator in etcd ({}): {}",
                         fmt::join(spec_.rendezvous.endpoints, ", "), failed.detail);
    case ConnectError::kUnreachable:
      return fmt::format("{} is unreachable ({}): check cluster.master_addr and the routes",
                         spec_.cluster.master_addr, failed.detail);
    case ConnectError::kNameNotResolved:
      return fmt::format(
          "cannot resolve the host name \"{}\" ({}): check cluster.master_addr, DNS "
          "or /etc/hosts",
          spec_.cluster.master_addr, failed.detail);
    case ConnectError::kOther:
      break;
  }
  return fmt::format("cannot connect to {}: {}", endpoint, failed.detail);
}

void Agent::SendJoin(const std::string& nonce, std::vector<AgentEffect>& out) {
  wire::Join join;
  join.node_rank = config_.node_rank;
  join.ddprun_version = config_.ddprun_version;
  if (!config_.secret.empty() && nonce.empty()) {
    join.nonce = std::get<Joining>(link_).nonce;  // the hello: nothing about the job yet
    Send(std::move(join), out);
    return;
  }
  join.host = config_.host;
  join.nproc = spec_.cluster.nproc_per_node;
  join.fingerprint = config_.fingerprint;
  join.canonical = config_.canonical;
  join.instance = config_.instance;
  join.probe_endpoint = config_.probe_endpoint;
  if (round_ >= 0) {
    // What became of the last round here: a coordinator that took over a round nobody judged
    // learns from these whether it ended (every worker exited 0 before any stop).
    join.ran_round = round_;
    join.ran_as = node_rank_;
    join.ran_ok = told() == Told::kDone;
  }
  if (!config_.secret.empty()) {
    join.proof = JoinProof(config_.secret, nonce, config_.node_rank, config_.fingerprint);
  }
  Send(std::move(join), out);
}

void Agent::MaybeReconnect(TimePoint now, std::vector<AgentEffect>& out) {
  if (Due(Deadline::kRetry, now)) {
    Enter(Connecting{});
    out.push_back(ConnectToMaster{});
  }
}

void Agent::OnConnectFailed(TimePoint now, const MasterConnectFailed& failed, std::vector<AgentEffect>& out) {
  if (!std::holds_alternative<Connecting>(link_)) return;
  last_connect_error_ = ExplainConnectError(failed);
  if (!last_connect_log_ || now - *last_connect_log_ >= kConnectLogInterval) {
    last_connect_log_ = now;
    const Duration left = rendezvous_deadline_ - now;
    Log(LogLevel::kWarn,
        fmt::format("{}; retrying for {} more", last_connect_error_,
                    HumanDuration(left > Duration(0) ? left : Duration(0))),
        out);
  }
  Enter(RetryWait{now + retry_delay_});
  retry_delay_ = std::min(retry_delay_ * 2, kMaxRetry);
}

void Agent::OnMasterLost(TimePoint now, const std::string& why, bool was_joined,
                         std::vector<AgentEffect>& out) {
  // timeouts.rendezvous bounds each wait for the coordinator, whatever the peer does. The wait
  // starts when a joined agent loses the coordinator, and only a JoinAck ends it: losing a
  // connection that never got that far (a listener that accepts and never answers, a
  // coordinator that has finished) is part of the same wait, not a new one.
  if (was_joined) rendezvous_deadline_ = now + spec_.timeouts.rendezvous;
  last_connect_log_.reset();
  if (interrupted_by_ != 0) {
    Enter(Leaving{InterruptedExitCode(interrupted_by_), false});
    StopWorkers(now, out);
    MaybeStopped(out);
    return;
  }
  const Duration left = std::max(rendezvous_deadline_ - now, Duration(0));
  if (was_joined) {
    Log(LogLevel::kWarn,
        fmt::format("lost the coordinator at {} ({}); stopping this node's workers and rejoining "
                    "for up to {}",
                    MasterEndpoint(), why, FormatDuration(spec_.timeouts.rendezvous)),
        out);
  } else {
    Log(LogLevel::kWarn,
        fmt::format("the coordinator at {} did not answer the join ({}); retrying for {} more",
                    MasterEndpoint(), why, HumanDuration(left)),
        out);
  }
  StopWorkers(now, out);
  // The lease is anchored on the last word from the coordinator, not on when we noticed: an
  // agent that was itself stalled (SIGSTOP, a VM pause) notices late, and must still have its
  // workers gone by the time the coordinator may give their ranks to another agent.
  const TimePoint kill_by = KillBy();
  std::optional<TimePoint>& kill_at = std::get<Stopping>(work_).kill_at;  // StopWorkers began it
  if (kill_at && kill_by <= now) {
    KillWorkers(now,
                fmt::format("last heard from the coordinator {} ago (this agent did not run "
                            "meanwhile), past the loss bound + stop_grace",
                            HumanDuration(now - last_heard_)),
                out);
  } else if (kill_at && kill_by < *kill_at) {
    kill_at = kill_by;
  }
  retry_delay_ = kFirstRetry;
  Enter(RetryWait{now + retry_delay_});
  MaybeStopped(out);
}

bool Agent::Proven() const {
  const auto* joining = std::get_if<Joining>(&link_);
  return joining == nullptr || joining->proven;
}

void Agent::RetryLater(TimePoint now, std::string error, Duration retry, bool same_story,
                       std::vector<AgentEffect>& out) {
  last_connect_error_ = std::move(error);
  if (!same_story || !last_connect_log_ || now - *last_connect_log_ >= kConnectLogInterval) {
    last_connect_log_ = now;
    Log(LogLevel::kWarn,
        fmt::format("{}\nretrying every {} for {} more (until timeouts.rendezvous)", last_connect_error_,
                    HumanDuration(retry), HumanDuration(std::max(rendezvous_deadline_ - now, Duration(0)))),
        out);
  }
  out.push_back(DisconnectFromMaster{});
  Enter(RetryWait{now + retry});
}

void Agent::OnUnproven(TimePoint now, const wire::Message& message, std::vector<AgentEffect>& out) {
  // Whatever an unproven peer says is not believed: not a verdict, not a refusal, not a
  // round. Its text is never shown (it could say anything, escape codes included). The agent
  // leaves the connection and tries again until timeouts.rendezvous, so an impostor on the
  // port (or a node 0 without the secret) can delay this node but never end it or fool it.
  const std::string endpoint = MasterEndpoint();
  std::string error;
  if (const auto* challenge = std::get_if<wire::Challenge>(&message)) {
    if (ConstantTimeEqual(challenge->proof, CoordinatorProof(config_.secret, std::get<Joining>(link_).nonce,
                                                             challenge->nonce))) {
      std::get<Joining>(link_).proven = true;
      Heard(now, out);
      SendJoin(challenge->nonce, out);
      return;
    }
    error = fmt::format(
        "the process listening on {} did not prove that it knows this node's shared secret: "
        "either the secrets of this node and node 0 differ, or the listener is not this job's "
        "coordinator (another job, or an impostor); nothing about this job was sent to it\n"
        "hint: set the same DDPRUN_SECRET (or DDPRUN_SECRET_FILE) on every node, and check "
        "that nothing else listens on master_port",
        endpoint);
  } else if (std::holds_alternative<wire::JoinAck>(message)) {
    // Our secret means nothing to a coordinator that accepts anyone: never run open.
    error = fmt::format(
        "the coordinator at {} did not ask for the shared secret: node 0 runs without one, or "
        "the listener is not this job's coordinator; nothing about this job was sent to it\n"
        "hint: set the same DDPRUN_SECRET (or DDPRUN_SECRET_FILE) on every node, or on none",
        endpoint);
  } else {
    error = fmt::format(
        "the process listening on {} answered with a {} message before proving that it knows "
        "this node's shared secret; not believed (node 0 refuses a node with a secret when it "
        "has none, and then says why in its own log; otherwise the listener is not this job's "
        "coordinator); nothing about this job was sent to it\n"
        "hint: set the same DDPRUN_SECRET (or DDPRUN_SECRET_FILE) on every node, or on none, "
        "and check that nothing else listens on master_port",
        endpoint, wire::MessageName(message));
  }
  const bool same_story = error == last_connect_error_;
  RetryLater(now, std::move(error), std::max(spec_.timeouts.heartbeat, kMaxRetry), same_story, out);
  refused_retrying_ = true;  // the next connection is the same story: its line is quiet
}

}  // namespace ddprun::core
