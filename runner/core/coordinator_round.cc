// The coordinator's round lifecycle: a round starts once every node rank is placed and no
// fence holds it back (after the reachability probe before the first one), runs until every
// node is done or one fails, stops on every node, and then spends a restart or ends the job
// behind the exit barrier.
#include <algorithm>

#include <fmt/format.h>

#include "base/assert.h"
#include "base/plural.h"
#include "runner/core/coordinator.h"
#include "runner/core/coordinator_text.h"
#include "runner/core/exit_code.h"
#include "schema/duration.h"

namespace ddprun::core {
namespace {

// Progress names at most this many missing nodes; the count says the rest.
constexpr size_t kMaxMissingNamed = 16;
// How often waiting agents hear who is missing: first, and the longest it backs off to. Per
// node these are fixed rates, so the coordinator's traffic stays linear in the node count.
constexpr Duration kFirstProgressInterval = Seconds(5);
constexpr Duration kLastProgressInterval = Seconds(60);
constexpr Duration kProgressGather = Millis(100);

int64_t ToMillis(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

}  // namespace

std::optional<TimePoint> Coordinator::RoundGate(TimePoint now, std::vector<int>& fenced) {
  std::optional<TimePoint> gate;
  for (int agent = 0; agent < roster_.agents(); ++agent) {
    auto& fence = roster_.at(agent).fence;
    if (!fence) continue;
    if (fence->until <= now) {
      fence.reset();
      continue;
    }
    fenced.push_back(agent);
    if (!gate || fence->until > *gate) gate = fence->until;
  }
  if (journal_fence_ && *journal_fence_ <= now) journal_fence_.reset();
  if (journal_fence_ && (!gate || *journal_fence_ > *gate)) gate = journal_fence_;
  return gate;
}

void Coordinator::MaybeStartRound(TimePoint now, std::vector<CoordinatorEffect>& out) {
  auto* rendezvous = std::get_if<Rendezvous>(&state_);
  if (!rendezvous || unjudged_) return;  // a round TakeOver found is judged first
  if (!placement_.Place(now, absence_origin_, round_, out)) return;
  // Fencing: no round starts while the previous holder of a rank may still run its workers.
  // Only checked once every node has joined, so the scan is once per round, not per join.
  std::vector<int> fenced;
  const std::optional<TimePoint> gate = RoundGate(now, fenced);
  const size_t nodes = roster_.players().size();
  if (gate) {
    // Rounded up: "waiting 10s" must not precede a wait of 10.9 s.
    const Duration wait = std::chrono::ceil<std::chrono::seconds>(*gate - now);
    if (rendezvous->gate != gate) {
      if (gate == journal_fence_) {
        out.push_back(
            LogLine{LogLevel::kWarn,
                    fmt::format("round {}: {} joined; waiting {} before starting it: {}, so "
                                "workers of its rounds may still run until their agents' lease ends (loss "
                                "bound + stop_grace + SIGKILL after its last record)",
                                round_, AllOf(nodes, "node"), HumanDuration(wait), fence_cause_)});
      } else {
        // Its rank went to another agent (a new agent of its host, or a spare), or a smaller
        // round (cluster.min_nodes) simply goes on without it.
        std::vector<std::string> replaced, left_out;
        const std::vector<int>& players = roster_.players();
        for (int agent : fenced) {
          const bool in_round = std::find(players.begin(), players.end(), agent) != players.end();
          (in_round || roster_.at(agent).position < 0 ? replaced : left_out)
              .push_back(roster_.NodeName(agent));
        }
        std::vector<std::string> why;
        if (!replaced.empty()) {
          why.push_back(
              fmt::format("{} was lost while its workers ran and a different agent now holds its rank",
                          fmt::join(replaced, ", ")));
        }
        if (!left_out.empty()) {
          why.push_back(fmt::format("{} was lost while its workers ran and the round goes on without it",
                                    fmt::join(left_out, ", ")));
        }
        out.push_back(
            LogLine{LogLevel::kWarn,
                    fmt::format("round {}: {} joined; waiting {} before starting it: {}, so the "
                                "old workers may still run until their agent's lease ends (loss bound + "
                                "stop_grace + SIGKILL)",
                                round_, AllOf(nodes, "node"), HumanDuration(wait), fmt::join(why, "; "))});
      }
    }
    rendezvous->gate = gate;
    return;
  }
  for (AgentSlot& slot : roster_.slots()) slot.plays = -1;
  for (size_t p = 0; p < nodes; ++p) roster_.at(roster_.players()[p]).plays = static_cast<int>(p);
  Enter(Starting{});
  if (StartReach(now, out)) return;
  CommitOrBegin(out);
}

void Coordinator::CommitOrBegin(std::vector<CoordinatorEffect>& out) {
  // The job's record holds the round before any worker of it can run. Node 0's journal says so
  // at once; with etcd only the holder of the coordinator role can record it (fencing), and a
  // deposed coordinator never hears RoundCommitted, so it never starts a round.
  std::get<Starting>(state_).awaiting_commit = true;
  out.push_back(CommitRound{round_, restarts_used_, static_cast<int>(roster_.players().size())});
}

// gloo and NCCL connect between all nodes on ports they pick, and a firewall that lets only
// master_port through makes them wait in init_process_group for their own timeout (30 minutes
// for gloo) without a word. So before the first round every node connects to every other one on
// a port other than master_port: milliseconds when the way is open, and one connect timeout
// when a firewall drops it.
bool Coordinator::StartReach(TimePoint now, std::vector<CoordinatorEffect>& out) {
  if (reach_checked_ || spec_.rendezvous.probe == JobSpec::Rendezvous::Probe::kOff) return false;
  std::vector<wire::ProbeTarget> targets;
  for (int agent : roster_.players()) {
    const AgentSlot& slot = roster_.at(agent);
    if (slot.conn && !slot.probe_endpoint.empty()) {
      targets.push_back(wire::ProbeTarget{agent, slot.host, slot.probe_endpoint});
    }
  }
  if (targets.size() < 2) {
    reach_checked_ = true;  // nothing to probe: one node, or agents without an endpoint
    return false;
  }
  Reach reach;
  reach.until = now + spec_.timeouts.ProbeWait();
  for (int agent : roster_.players()) {
    const AgentSlot& slot = roster_.at(agent);
    if (!slot.conn) continue;
    wire::ProbePeers probe;
    for (const wire::ProbeTarget& target : targets) {
      if (target.node_rank != agent) probe.targets.push_back(target);
    }
    out.push_back(SendTo{*slot.conn, std::move(probe)});
    reach.waiting.insert(agent);
  }
  out.push_back(
      LogLine{LogLevel::kInfo, fmt::format("round {}: all {} nodes joined; checking that each reaches every "
                                           "other one on a port other than master_port (rendezvous.probe)",
                                           round_, roster_.players().size())});
  std::get<Starting>(state_).reach = std::move(reach);
  return true;
}

void Coordinator::OnPeersProbed(TimePoint now, int agent, const wire::PeersProbed& probed,
                                std::vector<CoordinatorEffect>& out) {
  auto* starting = std::get_if<Starting>(&state_);
  // Stale (a probe that ended, a node that rejoined): nobody waits for it.
  if (!starting || !starting->reach || starting->reach->waiting.erase(agent) == 0) return;
  Reach& reach = *starting->reach;
  for (const wire::ProbeFailure& failure : probed.failures) {
    reach.problems[{agent, failure.target.node_rank}] =
        fmt::format("{} cannot connect to {} at {}: {}", roster_.NodeName(agent),
                    roster_.NodeName(failure.target.node_rank), failure.target.endpoint, failure.error);
  }
  if (reach.waiting.empty()) FinishReach(now, out);
}

void Coordinator::FinishReach(TimePoint now, std::vector<CoordinatorEffect>& out) {
  auto& starting = std::get<Starting>(state_);
  DDPRUN_ASSERT(starting.reach.has_value());
  const Reach reach = std::move(*starting.reach);
  starting.reach.reset();
  reach_checked_ = true;
  for (int agent : reach.waiting) {
    out.push_back(LogLine{LogLevel::kWarn,
                          fmt::format("{} did not report its probe of the other nodes "
                                      "within {}; starting without it",
                                      roster_.NodeName(agent), HumanDuration(spec_.timeouts.ProbeWait()))});
  }
  if (reach.problems.empty()) {
    CommitOrBegin(out);
    return;
  }
  std::vector<std::string> problems = ReachPairLines(roster_, reach.problems);
  const std::string pairs = fmt::format("  {}", fmt::join(problems, "\n  "));
  const std::string fix =
      "fix: gloo and NCCL connect between all nodes on ports they pick, not only master_port: let "
      "TCP from the job's nodes through the firewall of each node named above (e.g. iptables -I "
      "INPUT -s <the nodes' subnet> -p tcp -j ACCEPT); `ddprun preflight` checks it";
  if (spec_.rendezvous.probe == JobSpec::Rendezvous::Probe::kRefuse) {
    EndJob(
        now, ToInt(ExitCode::kRendezvous),
        fmt::format("round {} not started: {} cannot connect on a port other than master_port, as gloo and "
                    "NCCL must (they would wait in init_process_group until their timeout):\n{}\n{}\n"
                    "(rendezvous.probe = \"warn\" starts the job anyway)",
                    round_, reach.problems.size() == 1 ? "a pair of nodes" : "pairs of nodes", pairs, fix),
        out);
    return;
  }
  out.push_back(
      LogLine{LogLevel::kWarn,
              fmt::format("some nodes cannot connect on a port other than master_port; gloo and NCCL "
                          "will likely hang in init_process_group (rendezvous.probe = \"warn\" starts "
                          "round {} anyway):\n{}\n{}",
                          round_, pairs, fix)});
  reach_problems_ = std::move(problems);
  CommitOrBegin(out);
}

void Coordinator::ReserveOrBegin(std::vector<CoordinatorEffect>& out) {
  if (spec_.cluster.store_port) {
    BeginRound(*spec_.cluster.store_port, out);
  } else {
    out.push_back(ReserveStorePort{round_});
  }
}

namespace {

// The phase changes the coordinator makes, from (row) to (column), in Phase order: a round
// starts from a rendezvous, runs or fails while starting, stops, backs off and waits again; the
// job ends from any phase before Ending (an interrupt, the rendezvous timeout, a verdict, a
// takeover of an ended job), and Done follows Ending only.
constexpr bool kEdges[7][7] = {
    //  Rdv    Start  Run    Stop   Back   End    Done
    {false, true, false, false, false, true, false},    // Rendezvous
    {false, false, true, true, false, true, false},     // Starting
    {false, false, false, true, false, true, false},    // Running
    {false, false, false, false, true, true, false},    // Stopping
    {true, false, false, false, false, true, false},    // Backoff
    {false, false, false, false, false, false, true},   // Ending
    {false, false, false, false, false, false, false},  // Done
};

}  // namespace

void Coordinator::Enter(State next) {
  static_assert(std::variant_size_v<State> == 7);
  DDPRUN_ASSERT(kEdges[state_.index()][next.index()]);
  state_ = std::move(next);
}

void Coordinator::BeginRound(uint16_t store_port, std::vector<CoordinatorEffect>& out) {
  Enter(Running{});
  record_running_ = true;  // CommitRound said so; the heartbeat renews it
  for (AgentSlot& slot : roster_.slots()) slot.done = false;
  const std::vector<int>& players = roster_.players();
  const size_t nodes = players.size();
  const size_t all = roster_.holders().size();
  const int world = static_cast<int>(nodes) * spec_.cluster.nproc_per_node;
  if (nodes < all) {
    std::vector<std::string> moved;
    for (size_t p = 0; p < nodes; ++p) {
      if (roster_.at(players[p]).position != static_cast<int>(p)) {
        moved.push_back(fmt::format("{} plays node rank {}", roster_.NodeName(players[p]), p));
      }
    }
    out.push_back(LogLine{LogLevel::kWarn,
                          fmt::format("round {}: starting {} on {} of the job's {} nodes "
                                      "(cluster.min_nodes = {}): {}{}",
                                      round_, Counted(static_cast<size_t>(world), "worker"), nodes, all,
                                      spec_.cluster.min_nodes, placement_.shrunk_note(),
                                      moved.empty() ? "" : fmt::format("; {}", fmt::join(moved, ", ")))});
  } else {
    out.push_back(LogLine{
        LogLevel::kInfo,
        nodes == 1
            ? fmt::format("round {}: starting {}", round_, Counted(static_cast<size_t>(world), "worker"))
            : fmt::format("round {}: all {} nodes joined; starting {} workers", round_, nodes, world)});
  }
  hangs_.NewRound();
  observed::RoundStarted started{round_, restarts_used_, static_cast<int>(nodes), {}};
  for (size_t p = 0; p < nodes && nodes == all; ++p) {
    if (players[p] != static_cast<int>(p)) started.replaced.emplace_back(players[p], static_cast<int>(p));
  }
  out.push_back(Observed{std::move(started)});
  // Each agent hears the node rank it plays: its own, for a spare the one it replaces, in a
  // smaller round its place among the nodes that take part.
  const auto round_nodes = static_cast<int32_t>(nodes < all ? nodes : 0);
  for (size_t p = 0; p < nodes; ++p) {
    const AgentSlot& slot = roster_.at(players[p]);
    if (slot.conn) {
      out.push_back(SendTo{*slot.conn, wire::StartRound{round_, store_port, hangs_.longest_interval_ms(),
                                                        static_cast<int32_t>(p), round_nodes, master_addr_}});
    }
  }
}

void Coordinator::OnNodeDone(TimePoint now, AgentSlot& slot, std::vector<CoordinatorEffect>& out) {
  if (slot.done) return;
  slot.done = true;
  if (++std::get<Running>(state_).done < static_cast<int>(roster_.players().size())) return;
  EndJob(now, ToInt(ExitCode::kOk),
         SuccessText(spec_, roster_,
                     {round_, restarts_used_, placement_.shrunk_note(), hangs_.StragglerNote(),
                      placement_.book().Note(now), EarlierCausesNote(earlier_causes_)}),
         out);
}

void Coordinator::StopForHang(TimePoint now, std::vector<CoordinatorEffect>& out) {
  std::optional<RoundFailure> failure = hangs_.Verdict(round_, reach_problems_);
  if (!failure) {
    // Nobody is hung any more: nothing is stopped and no restart is spent; the agents watch
    // their ranks again.
    out.push_back(LogLine{LogLevel::kWarn, hangs_.cleared()});
    Broadcast(wire::HangCleared{round_}, out);
    return;
  }
  const HangJudgement& judged = hangs_.last_judgement();
  out.push_back(Observed{observed::HangJudged{judged.round, judged.culprits, judged.with_stack}});
  BeginStop(now, *std::move(failure), out);
}

void Coordinator::BeginStop(TimePoint now, RoundFailure failure, std::vector<CoordinatorEffect>& out) {
  DDPRUN_ASSERT(phase() == Phase::kRunning || phase() == Phase::kStarting);
  if (hangs_.probing()) {
    // The round had stopped making progress before this. A lost node or our own stall
    // explains the silence; anything else came after the hang and is not its cause.
    if (failure.explains_silence) {
      failure.detail += fmt::format(
          "  (before that, {} had sent no progress beacon for {}: the "
          "ranks waited for the lost ones)\n",
          roster_.RankName(hangs_.probed().global_rank), HumanDuration(Millis(hangs_.probed().silent_ms)));
      hangs_.EndProbe();
    } else {
      const std::string meanwhile = failure.what;
      if (std::optional<RoundFailure> hang = hangs_.Verdict(round_, reach_problems_)) {
        failure = *std::move(hang);
        failure.detail += fmt::format("  meanwhile, while the stacks were collected: {}\n", meanwhile);
      } else {
        failure.detail += fmt::format("  (before that: {})\n", hangs_.cleared());
      }
    }
  }
  out.push_back(
      LogLine{LogLevel::kError,
              fmt::format("round {} failed: {}; stopping every worker on every node", round_, failure.what)});
  last_failure_ = failure;
  // Leaving Starting drops its reachability probe: the next round probes again.
  Enter(Stopping{std::move(failure), now + spec_.timeouts.ExitBarrier()});
  for (AgentSlot& slot : roster_.slots()) {
    slot.stopped = false;
    slot.stopped_ranks = 0;
  }
  // Waiting spares run nothing: they have nothing to stop.
  for (AgentSlot& slot : roster_.slots()) {
    if (slot.plays < 0 && slot.conn) MarkStopped(slot, 0);
  }
  // Every node hears the root cause with its traceback, also when a restart follows.
  const RoundFailure& cause = std::get<Stopping>(state_).failure;
  const bool last = restarts_used_ >= spec_.restart.max_restarts;
  out.push_back(Observed{
      observed::RoundFailed{round_, cause.node_rank, cause.global_rank, cause.kinds, cause.what, last}});
  Broadcast(
      wire::StopRound{round_, cause.what + "\n" + cause.detail, last, cause.global_rank, cause.lost_peer},
      out);
  MaybeFinishStop(now, out);
}

void Coordinator::ReviseRootCause(RoundFailure failure, std::vector<CoordinatorEffect>& out) {
  RoundFailure& cause = std::get<Stopping>(state_).failure;
  DDPRUN_ASSERT(cause.lost_peer && !failure.lost_peer);
  const std::string first = cause.what;
  failure.detail += fmt::format(
      "  ({} failed before it, with an error that says it lost a peer: "
      "a consequence, not the cause)\n",
      first.substr(0, first.find(" (")));
  out.push_back(
      LogLine{LogLevel::kWarn, fmt::format("round {}: the root cause is {}; {} failed first, but its error "
                                           "says only that it lost a peer",
                                           round_, failure.what, first)});
  cause = std::move(failure);
  last_failure_ = cause;
  // Every node hears the root cause again, so no node is left with the consequence.
  const bool last = restarts_used_ >= spec_.restart.max_restarts;
  out.push_back(Observed{
      observed::RoundFailed{round_, cause.node_rank, cause.global_rank, cause.kinds, cause.what, last}});
  Broadcast(
      wire::StopRound{round_, cause.what + "\n" + cause.detail, last, cause.global_rank, cause.lost_peer},
      out);
}

void Coordinator::MarkStopped(AgentSlot& slot, int stopped_ranks) {
  if (slot.stopped) return;
  slot.stopped = true;
  slot.stopped_ranks = stopped_ranks;
  if (auto* stopping = std::get_if<Stopping>(&state_); stopping && slot.conn) ++stopping->stopped_joined;
}

void Coordinator::MaybeFinishStop(TimePoint now, std::vector<CoordinatorEffect>& out) {
  const auto* stopping = std::get_if<Stopping>(&state_);
  if (!stopping || stopping->stopped_joined < roster_.connected()) return;
  int stopped_ranks = 0;
  int stopped_nodes = 0;
  for (const AgentSlot& slot : roster_.slots()) {
    stopped_ranks += slot.stopped_ranks;
    if (slot.stopped_ranks > 0) ++stopped_nodes;
  }
  const RoundFailure failure = stopping->failure;
  placement_.CountFailure(now, failure, out);
  SpendRestartOrEnd(now, failure, stopped_ranks, stopped_nodes, out);
}

void Coordinator::SpendRestartOrEnd(TimePoint now, const RoundFailure& failure, int stopped_ranks,
                                    int stopped_nodes, std::vector<CoordinatorEffect>& out) {
  const int max_restarts = spec_.restart.max_restarts;
  const std::string never = NeverRestartRule(spec_, failure);
  if (!never.empty()) {
    out.push_back(
        LogLine{LogLevel::kError, fmt::format("restart.never_on has \"{}\": the job ends without a restart "
                                              "({} of {} restarts left)",
                                              never, max_restarts - restarts_used_, max_restarts)});
  } else if (restarts_used_ < max_restarts) {
    earlier_causes_.push_back(
        fmt::format("round {}: {}{}", failure.round, failure.what,
                    failure.kinds.empty() ? "" : " (" + failure.kinds.front().Text() + ")"));
    ++restarts_used_;
    ++round_;
    out.push_back(
        LogLine{LogLevel::kWarn, fmt::format("all workers stopped ({} stopped by ddprun); restart {} of {} "
                                             "in {}",
                                             stopped_ranks, restarts_used_, max_restarts,
                                             FormatDuration(spec_.RestartBackoff(restarts_used_)))});
    Enter(Backoff{now + spec_.RestartBackoff(restarts_used_)});
    out.push_back(
        Observed{observed::RestartSpent{restarts_used_, round_, spec_.RestartBackoff(restarts_used_)}});
    const auto& slots = roster_.slots();
    const bool unconfirmed = std::any_of(
        slots.begin(), slots.end(), [now](const AgentSlot& s) { return s.fence && s.fence->until > now; });
    out.push_back(RecordRestart{round_, restarts_used_, unconfirmed});
    return;
  }
  ended_by_rule_ = !never.empty();
  EndJob(now, ToInt(ExitCode::kJobFailed),
         FailureText(spec_, failure,
                     {stopped_ranks, stopped_nodes, never, restarts_used_, hangs_.StragglerNote(),
                      placement_.book().Note(last_input_), roster_.NodeName(failure.node_rank),
                      EarlierCausesNote(earlier_causes_)}),
         out);
}

void Coordinator::EndJob(TimePoint now, int exit_code, std::string summary,
                         std::vector<CoordinatorEffect>& out) {
  exit_code_ = exit_code;
  end_summary_ = std::move(summary);
  unjudged_.reset();  // ended otherwise (the rendezvous timeout, an interrupt): nothing left to judge
  // The verdict is told once the job's record has it (EndRecorded).
  Enter(Ending{now + spec_.timeouts.ExitBarrier()});
  // Who must hear the verdict before we exit: every connected node (it acknowledges, or its
  // connection closes after we told it), and every node that joined once and is away now (lost
  // to a pause or a partition, it stops its workers and rejoins to hear it). A node that never
  // joined is not waited for.
  int& awaiting = std::get<Ending>(state_).awaiting;
  const bool no_round = roster_.players().empty();
  for (AgentSlot& slot : roster_.slots()) {
    // A node whose rank went to a spare is not waited for: its workers were gone before the
    // spare's round started (its lease), and it takes no part in the job any more.
    // Nor is one that sat out the last round (cluster.min_nodes): it runs nothing either.
    const bool took_part = slot.position >= 0 && (slot.plays >= 0 || no_round);
    slot.end = slot.conn                       ? AgentSlot::EndState::kTold
               : slot.ever_joined && took_part ? AgentSlot::EndState::kAway
                                               : AgentSlot::EndState::kSettled;
    if (slot.end != AgentSlot::EndState::kSettled) ++awaiting;
  }
  out.push_back(RecordEnd{exit_code, end_summary_});
}

void Coordinator::SettleEnd(AgentSlot& slot) {
  if (phase() != Phase::kEnding || slot.end == AgentSlot::EndState::kSettled) return;
  slot.end = AgentSlot::EndState::kSettled;
  --std::get<Ending>(state_).awaiting;
}

void Coordinator::MaybeDone(std::vector<CoordinatorEffect>& out) {
  // Every node, not only the connected ones: one that lost us (a pause, a partition) is
  // stopping its workers and will rejoin to hear the verdict, within the exit barrier.
  const auto* ending = std::get_if<Ending>(&state_);
  if (!ending || ending->awaiting > 0) return;
  // Every node confirmed its workers stopped: the next coordinator here need not wait.
  if (record_running_) out.push_back(RecordWorkers{false});
  Finish(out);
}

void Coordinator::Finish(std::vector<CoordinatorEffect>& out) {
  Enter(Done{});
  record_running_ = false;
  out.push_back(CoordinatorDone{*exit_code_});
}

void Coordinator::Broadcast(const wire::Message& message, std::vector<CoordinatorEffect>& out) const {
  for (const AgentSlot& slot : roster_.slots()) {
    if (slot.conn) out.push_back(SendTo{*slot.conn, message});
  }
}

Coordinator::Rendezvous Coordinator::OpenRendezvous(TimePoint now, Duration timeout) {
  Rendezvous rendezvous;
  rendezvous.started = now;
  rendezvous.deadline = now + timeout;
  rendezvous.progress_every = kFirstProgressInterval;
  rendezvous.next_progress = now + kFirstProgressInterval;
  return rendezvous;
}

void Coordinator::ProgressChanged(TimePoint now) {
  auto* rendezvous = std::get_if<Rendezvous>(&state_);
  if (!rendezvous) return;
  rendezvous->progress_every = kFirstProgressInterval;
  if (rendezvous->progress_sent) {
    // A burst of changes (nodes that join together) is one line, a moment after the first.
    rendezvous->next_progress =
        std::min(rendezvous->next_progress,
                 std::max(now + kProgressGather, *rendezvous->progress_sent + kFirstProgressInterval));
  }
}

void Coordinator::SendProgress(TimePoint now, std::vector<CoordinatorEffect>& out) {
  wire::Progress progress;
  const std::vector<int>& holders = roster_.holders();
  progress.total = static_cast<int32_t>(holders.size());
  progress.joined = 0;
  for (size_t p = 0; p < holders.size(); ++p) {
    if (roster_.at(holders[p]).conn) {
      ++progress.joined;
    } else if (progress.missing.size() < kMaxMissingNamed) {
      progress.missing.push_back(static_cast<int32_t>(holders[p]));
      progress.missing_hosts.push_back(spec_.cluster.HostOf(holders[p]));
      progress.missing_why.push_back(roster_.at(holders[p]).refused);
    }
  }
  Rendezvous& rendezvous = std::get<Rendezvous>(state_);
  progress.elapsed_ms = ToMillis(now - rendezvous.started);
  progress.timeout_ms = ToMillis(spec_.timeouts.rendezvous);
  Broadcast(progress, out);
  // Backs off while the line says the same (but for the time); anything new restarts at the
  // first interval.
  progress.elapsed_ms = 0;
  if (progress == rendezvous.progress_said) {
    rendezvous.progress_every = std::min(2 * rendezvous.progress_every, kLastProgressInterval);
  } else {
    rendezvous.progress_every = kFirstProgressInterval;
    rendezvous.progress_said = std::move(progress);
  }
  rendezvous.progress_sent = now;
  rendezvous.next_progress = now + rendezvous.progress_every;
}

}  // namespace ddprun::core
