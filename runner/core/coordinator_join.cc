// Who joins: the coordinator's side of admission (JudgeJoin, admission.h, decides; this carries
// the verdict out), and under etcd what a holder whose job file is the odd one out does.
#include <fmt/format.h>

#include "runner/core/admission.h"
#include "runner/core/auth.h"
#include "runner/core/coordinator.h"
#include "runner/core/coordinator_text.h"

namespace ddprun::core {

void Coordinator::OnJoin(TimePoint now, ConnId conn_id, const wire::Join& join,
                         std::vector<CoordinatorEffect>& out) {
  const bool in_range = join.node_rank >= 0 && join.node_rank < roster_.agents();
  auto judge = [&] {
    const Links::Conn& conn = *links_.Find(conn_id);
    return JudgeJoin(
        JoinFacts{secret_, conn.nonce, conn.peer_addr, fingerprint_, canonical_, spec_.cluster.nnodes,
                  roster_.agents(), in_range ? &roster_.at(join.node_rank) : nullptr,
                  phase() == Phase::kEnding || phase() == Phase::kDone, phase() == Phase::kDone, took_over_,
                  us_},
        join);
  };
  JoinVerdict verdict = judge();
  if (verdict.replaces_connection) {
    // The same agent reconnecting before we noticed its old connection died. It stopped its
    // workers when it lost us, so a round it plays in has lost this node. Otherwise the
    // connection was only replaced (an agent that gave up on a join we were too slow to
    // answer): no loss, nothing to blame it for. Then it is judged again as a fresh join.
    const AgentSlot& slot = roster_.at(join.node_rank);
    const bool round_lost = slot.plays >= 0 && (phase() == Phase::kStarting || phase() == Phase::kRunning ||
                                                phase() == Phase::kStopping);
    Drop(now, *slot.conn, LossReason::kReconnected, "it joined again on a new connection", out);
    if (round_lost) OnNodeLost(now, join.node_rank, "its connection dropped and it reconnected", out);
    verdict = judge();
  }
  switch (verdict.outcome) {
    case JoinVerdict::Outcome::kRefuse: {
      if (verdict.other_file && in_range && WeighOtherFile(now, conn_id, join, verdict, out)) return;
      if (!verdict.why.empty() && in_range && roster_.at(join.node_rank).refused != verdict.why) {
        roster_.at(join.node_rank).refused = std::move(verdict.why);
        ProgressChanged(now);
      }
      // A refused agent retries every few seconds from a new source port, for the whole
      // rendezvous (issue 40: a rank started twice printed the refusal about 450 times): the
      // same story for the same rank is said once, then only at debug level.
      std::string story = verdict.reason;
      if (const Links::Conn* from = links_.Find(conn_id);
          from && from->peer_addr.rfind(':') != std::string::npos) {
        const size_t at = story.find(from->peer_addr);
        if (at != std::string::npos) {
          story.replace(at, from->peer_addr.size(), from->peer_addr.substr(0, from->peer_addr.rfind(':')));
        }
      }
      const bool told = in_range && roster_.at(join.node_rank).refusal_said == story;
      if (in_range) roster_.at(join.node_rank).refusal_said = std::move(story);
      out.push_back(LogLine{told ? LogLevel::kDebug : LogLevel::kError, "refused a node: " + verdict.reason});
      out.push_back(Observed{observed::NodeRefused{join.node_rank, verdict.reason}});
      out.push_back(SendTo{conn_id, wire::Reject{verdict.reason, verdict.retry}});
      Drop(now, conn_id, LossReason::kClosed, "", out);
      return;
    }
    case JoinVerdict::Outcome::kChallenge: {
      Links::Conn& conn = *links_.Find(conn_id);
      conn.nonce = Sha256Hex(fmt::format("{}:{}", nonce_seed_, conn_id)).substr(0, 32);
      conn.hello_rank = join.node_rank;
      out.push_back(
          SendTo{conn_id, wire::Challenge{conn.nonce, CoordinatorProof(secret_, join.nonce, conn.nonce)}});
      return;
    }
    case JoinVerdict::Outcome::kHearVerdict: {
      // An agent that lost us before the end (a pause, a partition) rejoins to hear the
      // verdict; it exits with the job's code once it has acknowledged.
      AgentSlot& slot = roster_.at(join.node_rank);
      SetSlotConn(join.node_rank, conn_id, now);
      links_.Find(conn_id)->node_rank = join.node_rank;
      out.push_back(
          LogLine{LogLevel::kInfo, fmt::format("{} rejoined after the end of the job; telling it the outcome",
                                               roster_.NodeName(join.node_rank))});
      const auto* ending = std::get_if<Ending>(&state_);
      if (ending && ending->awaiting_record)
        return;  // it hears the verdict with the others, once it is recorded
      out.push_back(SendTo{conn_id, wire::JobEnd{*exit_code_, end_summary_}});
      if (slot.end == AgentSlot::EndState::kAway) slot.end = AgentSlot::EndState::kTold;
      return;
    }
    case JoinVerdict::Outcome::kAdmit:
      Admit(now, conn_id, join, verdict.differences, out);
      return;
  }
}

void Coordinator::Admit(TimePoint now, ConnId conn_id, const wire::Join& join, const std::string& differences,
                        std::vector<CoordinatorEffect>& out) {
  const int agent = join.node_rank;
  const int nnodes = spec_.cluster.nnodes;
  AgentSlot& slot = roster_.at(agent);
  // The fence is the fenced agent's: only that agent rejoining lifts it (agents rejoin only
  // once their workers are gone). Any other agent that takes the rank (a rebooted host, a
  // second agent started for it), however often it joins and leaves, waits until the fenced
  // agent's lease has run out.
  if (slot.fence && slot.fence->holder == join.instance) slot.fence.reset();
  slot.instance = join.instance;
  if (!differences.empty()) out.push_back(LogLine{LogLevel::kWarn, differences});
  slot.host = join.host;
  slot.probe_endpoint = join.probe_endpoint;
  slot.done = slot.stopped = false;
  slot.ever_joined = true;
  slot.refused.clear();
  SetSlotConn(agent, conn_id, now);
  links_.Find(conn_id)->node_rank = agent;
  // Standby: a joined agent may wait as long as the job runs (a spare, a node that sits out
  // a smaller round), so its own rendezvous backstop is off.
  out.push_back(SendTo{conn_id, wire::JoinAck{nnodes, spec_.cluster.CanReplace()}});
  out.push_back(Observed{observed::NodeJoined{agent, join.host, agent >= nnodes}});
  const std::string& from = links_.Find(conn_id)->peer_addr;
  const int agents = roster_.agents();
  std::string line =
      slot.position < 0
          ? fmt::format("{} joined from {}; it waits to take the node rank of a node that is lost",
                        roster_.NodeName(agent), from)
      : slot.position != agent && agent < nnodes
          // etcd: the coordinator's agent plays node rank 0, and node 0's agent its place.
          ? fmt::format("{} joined from {} ({}/{}); it plays node rank {}{}", roster_.AgentName(agent), from,
                        joined_count(), agents, slot.position,
                        slot.position == 0 ? ", the coordinator's" : "")
          : fmt::format("{} joined from {} ({}/{})", roster_.NodeName(agent), from, joined_count(), agents);
  if (slot.position >= 0 && (phase() == Phase::kStarting || phase() == Phase::kRunning)) {
    line += fmt::format("; round {} runs without it, it takes part from the next round", round_);
  }
  if (placement_.Quarantined(agent, now)) {
    line += fmt::format("; its host is quarantined for {} more",
                        HumanDuration(*placement_.book().Until(slot.host) - now));
  }
  out.push_back(LogLine{LogLevel::kInfo, std::move(line)});
  if (phase() == Phase::kStopping || (phase() != Phase::kRendezvous && slot.plays < 0)) {
    // Agents join only without running workers, so this node has nothing left to stop; a
    // spare has nothing to stop in any round.
    MarkStopped(slot, 0);
    MaybeFinishStop(now, out);
  }
  OnRoundReport(now, join, out);
  MaybeStartRound(now, out);
}

void Coordinator::OnChallengeUnanswered(const Links::Conn& conn, std::vector<CoordinatorEffect>& out) {
  // An agent closes the connection after our Challenge when our proof does not match its
  // secret. Its hello is unproven, so the rank it claimed is only named, never acted on.
  if (conn.hello_rank >= roster_.agents()) return;
  AgentSlot& slot = roster_.at(conn.hello_rank);
  if (slot.conn) return;
  // Each retry comes from a new source port: the story is told per address, not per port.
  const std::string_view addr = std::string_view(conn.peer_addr).substr(0, conn.peer_addr.rfind(':'));
  std::string why = fmt::format(
      "a peer from {} claiming this rank left without answering the "
      "shared-secret challenge: its secret differs from node 0's",
      addr);
  if (slot.refused == why) return;  // said once; its retries tell the same story
  out.push_back(
      LogLine{LogLevel::kError,
              fmt::format("a peer from {} claiming node rank {} closed the connection without answering "
                          "the shared-secret challenge: its DDPRUN_SECRET (or DDPRUN_SECRET_FILE) differs "
                          "from node 0's, or it is not this job's agent\nhint: set the same secret on "
                          "every node",
                          addr, conn.hello_rank)});
  slot.refused = std::move(why);
}

// Under etcd the role goes to whichever agent campaigns first, and that may be the one host
// whose job file differs (issue 37: an etcd job of 5 hosts exited 3 on every correct node,
// with min_nodes = 3). Before any round, a holder counts the agents it refused for each other
// file against those that joined with its own (itself included): outnumbered, it gives the
// role up, so that the others elect one of theirs; at a tie the refused agent retries rather
// than gives up, since either file may be the job's. A job that has begun keeps its file.
bool Coordinator::WeighOtherFile(TimePoint now, ConnId conn, const wire::Join& join, JoinVerdict& verdict,
                                 std::vector<CoordinatorEffect>& out) {
  if (!elected_ || took_over_ || round_ != 0 || phase() != Phase::kRendezvous) return false;
  std::set<int>& theirs = refused_files_[join.fingerprint];
  theirs.insert(join.node_rank);
  size_t ours = roster_.at(own_agent_).ever_joined ? 0 : 1;  // this agent, before its own join
  for (int agent = 0; agent < roster_.agents(); ++agent) {
    if (roster_.at(agent).ever_joined && !theirs.contains(agent)) ++ours;
  }
  if (theirs.size() < ours) return false;
  if (theirs.size() == ours) {
    verdict.retry = true;
    verdict.reason +=
        "\n(it tries again: as many nodes have come with its job file as with the "
        "coordinator's, and a coordinator whose file is outnumbered gives the role up)";
    return false;
  }
  std::vector<std::string> names;
  for (int agent : theirs) names.push_back(roster_.NodeName(agent));
  const std::string why = fmt::format(
      "this host holds the coordinator role, but {} other node{} run a different job file ({}) and "
      "only {} run{} this one: it gives the role up so that they can run the job\n{}",
      theirs.size(), theirs.size() == 1 ? "" : "s", fmt::join(names, ", "), ours, ours == 1 ? "s" : "",
      verdict.reason);
  out.push_back(LogLine{LogLevel::kError, why});
  out.push_back(Observed{observed::NodeRefused{own_agent_, why}});
  verdict.retry = true;  // the joiner looks the new holder up
  out.push_back(SendTo{conn, wire::Reject{verdict.reason, true}});
  Drop(now, conn, LossReason::kClosed, "", out);
  if (const auto& own = roster_.at(own_agent_).conn) out.push_back(SendTo{*own, wire::Reject{why, false}});
  out.push_back(GiveUpRole{});
  return true;
}

}  // namespace ddprun::core
