// The agent's work in a round (agent.h `Work`): starting its node's workers with the
// environment torchrun would give them, hearing them exit (a failure told once, every rank's
// exit 0 told as NodeDone), and stopping them (SIGTERM, SIGKILL after stop_grace, giving up on
// what SIGKILL did not end) until the stop is confirmed. Methods of Agent, apart from its
// inputs (agent.cc), its link (agent_link.cc) and its progress watch (agent_progress.cc).
#include <algorithm>
#include <csignal>

#include <fmt/format.h>

#include "base/assert.h"
#include "base/plural.h"
#include "runner/core/agent.h"
#include "runner/core/failure.h"
#include "schema/worker_env.h"

namespace ddprun::core {

bool Agent::RoundOpen() const {
  if (!IsJoined()) return false;
  const auto* stopping = std::get_if<Stopping>(&work_);
  return std::holds_alternative<Running>(work_) || (stopping && stopping->open);
}

Agent::Stacks* Agent::stacks() {
  if (auto* running = std::get_if<Running>(&work_)) return &running->stacks;
  if (auto* stopping = std::get_if<Stopping>(&work_)) return &stopping->stacks;
  return nullptr;
}

void Agent::StartWorkers(TimePoint now, const wire::StartRound& start, std::vector<AgentEffect>& out) {
  if (running_workers() > 0) {
    // The coordinator only starts a round after every node confirmed its workers stopped.
    Log(LogLevel::kError,
        fmt::format("round {} started while round {} still has workers; ignoring", start.round, round_), out);
    return;
  }
  auto* joined = std::get_if<Joined>(&link_);
  if (!joined) return;  // rounds start only on a join
  if (interrupted_by_ != 0) {
    // The interrupt crossed this StartRound: the coordinator ends the job when it reads the
    // Interrupted, which it will before anything this agent sends after it.
    Log(LogLevel::kWarn,
        fmt::format("round {} started after this agent received {}; starting no workers (the "
                    "coordinator ends the job)",
                    start.round, SignalName(interrupted_by_)),
        out);
    return;
  }
  // Stale or duplicate; but the first round after a join is new even when its number is not
  // (a coordinator that restarted counts from 0 again). Found by the simulator.
  if (joined->started_round && start.round <= round_) return;
  const int plays = start.node_rank >= 0 ? start.node_rank : config_.node_rank;
  const int nnodes = start.nnodes > 0 ? start.nnodes : spec_.cluster.nnodes;
  if (plays >= nnodes || nnodes > spec_.cluster.nnodes || nnodes < spec_.cluster.min_nodes) {
    Log(LogLevel::kError,
        fmt::format("round {} asks this agent to be node {} of {}, but the job has {} nodes "
                    "(at least {} per round); ignoring",
                    start.round, plays, nnodes, spec_.cluster.nnodes, spec_.cluster.min_nodes),
        out);
    return;
  }
  joined->started_round = true;
  Enter(Running{});
  round_ = start.round;
  if (plays != config_.node_rank && plays != node_rank_) {
    Log(LogLevel::kWarn,
        fmt::format("round {}: this agent ({} {}) takes node rank {} from now on", start.round,
                    config_.node_rank >= spec_.cluster.nnodes ? "spare" : "node",
                    config_.node_rank >= spec_.cluster.nnodes ? config_.node_rank - spec_.cluster.nnodes
                                                              : config_.node_rank,
                    plays),
        out);
  }
  node_rank_ = plays;
  longest_interval_ =
      std::max(longest_interval_, Duration(Millis(std::max<int64_t>(start.longest_interval_ms, 0))));
  const int nproc = spec_.cluster.nproc_per_node;
  workers_.assign(static_cast<size_t>(nproc), Worker{});
  const std::string run_id = RunId(spec_, config_.fingerprint);
  SpawnWorkers spawn;
  spawn.round = round_;
  for (int local = 0; local < nproc; ++local) {
    WorkerPosition position;
    position.node_rank = node_rank_;
    position.nnodes = nnodes;
    position.local_rank = local;
    position.restart_count = round_;
    position.master_addr = start.master_addr;
    const int global = node_rank_ * nproc + local;
    // The store relay (DESIGN.md section 5): rank 0 hosts the round's store on the port node 0
    // picked; every other rank reaches it through master_port. With cluster.store_port, all
    // ranks use that port directly.
    position.master_port =
        spec_.cluster.store_port || global == 0 ? start.master_port : spec_.cluster.master_port;
    std::string error_path = RankErrorFilePath(spec_, round_, global);
    position.error_file = config_.logs_dir + "/" + error_path;
    position.run_id = run_id;
    if (!config_.progress_addr.empty()) {
      position.progress_addr = config_.progress_addr;
      position.progress_token = config_.progress_token;
      position.stacks_file = config_.logs_dir + "/" + RankStacksPath(spec_, round_, global);
    }
    position.python_dir = config_.python_dir;
    position.socket_ifname = config_.socket_ifname;
    WorkerLaunch launch;
    launch.local_rank = local;
    launch.global_rank = global;
    launch.env = local == 0 ? WorkerEnvironment(spec_, position, config_.inherited_env)
                            : SiblingWorkerEnvironment(spawn.workers.front().env, spec_, position);
    launch.log_path = RankLogPath(spec_, round_, global);
    launch.error_path = std::move(error_path);
    spawn.workers.push_back(std::move(launch));
    workers_[static_cast<size_t>(local)] = Worker{global, true, 0, 0, Beats{}};
    workers_[static_cast<size_t>(local)].beats.since = now;
  }
  // Say which MASTER_PORT this node's workers really get: rank 0 hosts the store on the
  // round's port; under the relay every other rank reaches it through master_port.
  const std::string store = spec_.cluster.store_port ? fmt::format("store port {}", start.master_port)
                            : node_rank_ == 0
                                ? fmt::format("rank 0's store on port {}, reached through master_port {}",
                                              start.master_port, spec_.cluster.master_port)
                                : fmt::format("store through master_port {}", spec_.cluster.master_port);
  Log(LogLevel::kInfo,
      fmt::format("round {}: starting {} worker{} (ranks {}..{} of {}), {}", round_, nproc,
                  nproc == 1 ? "" : "s", node_rank_ * nproc, node_rank_ * nproc + nproc - 1, nnodes * nproc,
                  store),
      out);
  out.push_back(std::move(spawn));
}

void Agent::OnWorkerExited(TimePoint now, const WorkerExited& exited, std::vector<AgentEffect>& out) {
  if (exited.round != round_ || exited.local_rank < 0 ||
      exited.local_rank >= static_cast<int>(workers_.size())) {
    return;  // stale: a worker of an earlier round
  }
  Worker& worker = workers_[static_cast<size_t>(exited.local_rank)];
  if (!worker.running) return;
  worker.running = false;
  worker.exit_code = exited.exit_code;
  worker.signal = exited.signal;
  const bool failed = exited.exit_code != 0 || exited.signal != 0;
  // Idle has no worker running: a worker's end finds its round Running or Stopping.
  auto* running = std::get_if<Running>(&work_);
  if (running && !leaving() && failed) {
    Log(LogLevel::kError,
        fmt::format("rank {} (local rank {}) {}", worker.global_rank, exited.local_rank,
                    DescribeExit(exited.exit_code, exited.signal)),
        out);
    // After a hang report too: the coordinator may find no hang and let the round go on.
    if (running->told == Told::kNothing || running->told == Told::kHang) {
      running->told = Told::kFailure;
      Send(wire::WorkerFailed{round_, worker.global_rank, exited.local_rank, exited.exit_code, exited.signal,
                              exited.stderr_tail, exited.error_text},
           out);
    }
    // Stop the rest of this node now rather than a round trip later; the coordinator stops
    // the other nodes.
    StopWorkers(now, out);
  } else if (std::holds_alternative<Stopping>(work_) && !leaving() && failed && !exited.error_text.empty()) {
    // It wrote its error file, so it raised on its own before the stop reached it: when the
    // round's first failure only lost a peer, this one may be the cause (the coordinator
    // decides; Coordinator::ReviseRootCause).
    Send(wire::WorkerFailed{round_, worker.global_rank, exited.local_rank, exited.exit_code, exited.signal,
                            exited.stderr_tail, exited.error_text},
         out);
  } else if (running && !failed && running_workers() == 0 && running->told == Told::kNothing &&
             std::all_of(workers_.begin(), workers_.end(),
                         [](const Worker& w) { return w.exit_code == 0 && w.signal == 0; })) {
    running->told = Told::kDone;
    Log(LogLevel::kInfo,
        fmt::format("round {}: {} of node {}{} exited 0", round_, AllOf(workers_.size(), "worker"),
                    node_rank_ == config_.node_rank ? "" : "rank ", node_rank_),
        out);
    Send(wire::NodeDone{round_}, out);
  }
  MaybeStopped(out);
}

void Agent::StopWorkers(TimePoint now, std::vector<AgentEffect>& out) {
  if (std::holds_alternative<Stopping>(work_)) return;
  Stopping stopping;
  stopping.told = told();
  if (const Stacks* asked = stacks()) stopping.stacks.asked = asked->asked;  // due: nobody waits any more
  stopping.open = RoundOpen();
  stopping.count = running_workers();
  stopping.sigterm_at = now;
  if (stopping.count > 0) {
    out.push_back(SignalWorkers{round_, SIGTERM});
    stopping.kill_at = now + spec_.timeouts.stop_grace;
  }
  Enter(std::move(stopping));
}

void Agent::KillWorkers(TimePoint now, const std::string& why, std::vector<AgentEffect>& out) {
  auto& stopping = std::get<Stopping>(work_);
  stopping.kill_at.reset();
  if (running_workers() == 0) return;
  Log(LogLevel::kWarn,
      fmt::format("{} worker{} {}; sending SIGKILL", running_workers(), running_workers() == 1 ? "" : "s",
                  why),
      out);
  out.push_back(SignalWorkers{round_, SIGKILL});
  stopping.give_up_at = now + JobSpec::Timeouts::kKillAllowance;
}

void Agent::MaybeStopped(std::vector<AgentEffect>& out) {
  if (Exited() || running_workers() > 0) return;
  auto* stopping = std::get_if<Stopping>(&work_);
  if (stopping) {
    stopping->kill_at.reset();
    stopping->give_up_at.reset();
  }
  if (const Leaving* leave = leaving()) {
    if (leave->ack) Send(wire::JobEndAck{}, out);
    out.push_back(AgentExit{leave->code});
    Enter(Gone{leave->code});
    return;
  }
  if (!stopping) return;
  // The coordinator hears that this node's part of the round is over (again, after a stop
  // of nothing: it ignores a round it holds stopped).
  if (round_ >= 0 && IsJoined()) {
    Send(wire::RoundStopped{round_, stopping->count}, out);
    if (stopping->count > 0) {
      Log(LogLevel::kInfo,
          fmt::format("round {}: stopped {} worker{}", round_, stopping->count,
                      stopping->count == 1 ? "" : "s"),
          out);
    }
  }
  Enter(Idle{stopping->told});
}

namespace {

// The work's changes, in Work order: a round starts from Idle, or after its workers all exited
// 0 by themselves (the next round); a stop begins with a round or without one (a signal before
// the first), and once no worker runs it is over.
constexpr bool kWorkEdges[3][3] = {
    // Idle Running Stopping
    {false, true, true},   // Idle
    {false, true, true},   // Running
    {true, false, false},  // Stopping
};

}  // namespace

void Agent::Enter(Work next) {
  static_assert(std::variant_size_v<Work> == 3);
  DDPRUN_ASSERT(kWorkEdges[work_.index()][next.index()]);
  work_ = std::move(next);
}

}  // namespace ddprun::core
