#pragma once
// Where the job's coordinator runs: a port with two implementations, chosen once by
// rendezvous.backend and consumed once by NodeHost (and read by the simulator's watch).
//   - StaticRole ("static"): node 0 holds the role from its start, on master_addr; its journal
//     keeps the job's record (JournalRecord); every other agent connects to master_addr.
//   - ElectedRole ("etcd"): whichever agent wins the campaign in the job's store holds it, on its
//     own host, and writes the job's record there, fenced by the role (core::Election, run
//     against host::Store).
// NodeHost never asks which one it has: it looks the coordinator up, leads when told, steps
// down when told, and lets the role go on its way out.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runner/core/coordinator.h"
#include "runner/core/election.h"
#include "runner/host/job_record.h"
#include "runner/host/ports.h"
#include "schema/job_spec.h"

namespace ddprun::host {

/// "host:port" or "[v6]:port" split; port 0 when there is none.
std::pair<std::string, uint16_t> SplitEndpoint(const std::string& endpoint);

/// Where this agent's coordinator listens.
struct CoordinatorAt {
  std::string host;
  uint16_t port = 0;
  /// "host:port" as the agent names it in its words; "": the job file's master address.
  std::string endpoint;
};

class CoordinatorRole : public JobRecordKeeper {
 public:
  /// What the role tells its host. A lookup may be answered before Lookup returns (the
  /// address is known); the others come from a store answer, a Tick, or a Resign.
  struct Listener {
    std::function<void(const CoordinatorAt& at)> found;
    /// A lookup could not be answered (the store unreachable, or the campaign failed): why.
    std::function<void(const std::string& why)> lookup_failed;
    /// This agent holds the role now: Inherited() says what the previous holder left.
    std::function<void()> lead;
    /// This agent no longer holds the role (its lease may have ended, or another holds it).
    std::function<void(const std::string& why)> step_down;
    /// CommitRound(round) is in the record.
    std::function<void(int round)> committed;
    /// RecordEnd's verdict is in the record.
    std::function<void()> end_recorded;
    /// Every write is in the record (or can no longer be made), or Resign was answered.
    std::function<void()> flushed;
  };

  /// This agent holds the role from its start (node 0 of a static job): no lead follows.
  virtual bool HeldFromStart() const = 0;
  /// Where this agent's coordinator listens when it holds the role.
  virtual const std::string& ListenAddr() const = 0;
  /// Before a new coordinator of this agent's takes its first input: where it sits.
  virtual void Seat(core::Coordinator& coordinator) const = 0;
  /// How the log names this holder when it leads ("" when it never leads).
  virtual std::string Holding() const { return ""; }
  /// The agent wants its coordinator: answered by found or lookup_failed.
  virtual void Lookup(TimePoint now) = 0;
  /// The agent was admitted to the job (it waits for or runs a round).
  virtual void TookPart(TimePoint) {}
  /// Lets the role go without a step_down (the job is over here, or this agent cannot serve
  /// it). A lookup waiting for its answer fails.
  virtual void Resign(TimePoint) {}
  /// The host's timer fired: true when the role acted on its deadlines (re-arm the timer).
  virtual bool OnTick(TimePoint) { return false; }
  virtual void OnStoreResult(TimePoint, const StoreResult&) {}
  virtual std::optional<TimePoint> NextDeadline() const { return std::nullopt; }
  /// The agent is done: true once its host may go (the record is written and the role let go,
  /// which this starts); false: flushed follows.
  virtual bool LetGoOnExit(TimePoint) { return true; }
  /// Nothing under way but what the cores do and its own deadlines (NextDeadline, which a
  /// quiet stretch ends before): the simulator may skip a quiet stretch.
  virtual bool Quiet() const { return true; }
  /// The key of the job's record in the job's store; "" when the record is node 0's journal.
  virtual std::string_view RecordKey() const { return {}; }
};

/// rendezvous.backend = "static". `journal` is node 0's (null: none, unit tests).
class StaticRole final : public CoordinatorRole {
 public:
  StaticRole(const JobSpec& spec, int agent, std::string master_at, Journal* journal, Listener listener);

  bool HeldFromStart() const override { return agent_ == 0; }
  const std::string& ListenAddr() const override { return listen_addr_; }
  void Seat(core::Coordinator& coordinator) const override;
  void Lookup(TimePoint now) override;

  Inheritance Inherited() override { return record_.Inherited(); }
  bool Commit(TimePoint now, const core::CommitRound& round) override { return record_.Commit(now, round); }
  void RecordWorkers(TimePoint now, bool may_run) override { record_.RecordWorkers(now, may_run); }
  void RecordRestart(TimePoint now, int next_round, int restarts_used, bool workers_may_run) override {
    record_.RecordRestart(now, next_round, restarts_used, workers_may_run);
  }
  bool RecordEnd(TimePoint now, int exit_code, const std::string& summary) override {
    return record_.RecordEnd(now, exit_code, summary);
  }
  void RecordQuarantine(TimePoint now, const std::vector<core::QuarantinedHost>& hosts) override {
    record_.RecordQuarantine(now, hosts);
  }
  void RecordDone(TimePoint now) override { record_.RecordDone(now); }

 private:
  const JobSpec& spec_;
  int agent_;
  std::string master_at_;    // the agent's Config::master_at ("": none)
  std::string listen_addr_;  // master_at, else cluster.master_addr
  JournalRecord record_;
  Listener listener_;
};

/// rendezvous.backend = "etcd": core::Election against the job's store. `addr` is this agent's
/// host, where its coordinator listens when it holds the role.
class ElectedRole final : public CoordinatorRole {
 public:
  ElectedRole(const JobSpec& spec, std::string fingerprint, int agent, std::string addr, Store& store,
              Listener listener);

  bool HeldFromStart() const override { return false; }
  const std::string& ListenAddr() const override { return addr_; }
  void Seat(core::Coordinator& coordinator) const override;
  std::string Holding() const override;
  void Lookup(TimePoint now) override { Run(now, core::election::Lookup{}); }
  /// Called on every input of an admitted agent (heartbeats, beacons): the machine hears it once.
  void TookPart(TimePoint now) override {
    if (!election_.took_part()) Run(now, core::election::TookPart{});
  }
  void Resign(TimePoint now) override { Run(now, core::election::Resign{}); }
  bool OnTick(TimePoint now) override {
    Run(now, core::Tick{});
    return true;
  }
  void OnStoreResult(TimePoint now, const StoreResult& result) override;
  std::optional<TimePoint> NextDeadline() const override { return election_.NextDeadline(); }
  bool LetGoOnExit(TimePoint now) override;
  bool Quiet() const override { return election_.Quiet(); }
  std::string_view RecordKey() const override { return election_.state_key(); }

  /// While leading: the job as the previous holder left it (nullopt: a fresh start), an
  /// earlier run whose workers may still run, and the quarantine.
  Inheritance Inherited() override;
  // The coordinator's records, while leading: each rewrites the record, fenced. Commit and
  // RecordEnd are answered through the listener (committed, end_recorded), never at once.
  bool Commit(TimePoint now, const core::CommitRound& round) override;
  void RecordWorkers(TimePoint now, bool may_run) override { Run(now, core::RecordWorkers{may_run}); }
  void RecordRestart(TimePoint now, int next_round, int restarts_used, bool workers_may_run) override {
    Run(now, core::RecordRestart{next_round, restarts_used, workers_may_run});
  }
  bool RecordEnd(TimePoint now, int exit_code, const std::string& summary) override;
  void RecordQuarantine(TimePoint now, const std::vector<core::QuarantinedHost>& hosts) override {
    Run(now, core::RecordQuarantine{hosts});
  }
  /// The job is over here (every agent heard the end, or the exit barrier passed): the next
  /// launch of the job file starts afresh.
  void RecordDone(TimePoint now) override { Run(now, core::CoordinatorDone{}); }

  const core::Election& election() const { return election_; }

 private:
  /// Feeds the machine and carries its effects out, in order.
  void Run(TimePoint now, const core::election::Input& input);
  void Execute(TimePoint now, const core::election::Effect& effect);
  /// A store call's id is answered with the machine's tag (0: the answer is not wanted).
  void Sent(uint64_t id, uint64_t tag);

  const JobSpec& spec_;
  core::Election election_;
  std::string addr_;
  int agent_;
  Store& store_;
  Listener listener_;
  std::unordered_map<uint64_t, uint64_t> tags_;  // store call id -> the machine's tag
  bool resigned_ = false;                        // LetGoOnExit resigned
};

}  // namespace ddprun::host
