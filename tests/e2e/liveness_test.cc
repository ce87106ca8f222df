// End-to-end tests of the failures that do not exit (issue 10): a paused node 0 must still end
// the job on every node with the right code, and a lost node's old workers must never overlap
// the next round's holder of their ranks. Real agents on 127.0.0.1, paused with SIGSTOP.

#include <signal.h>

#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Two nodes of two workers running `script`; heartbeat 250ms: the loss bound is 750ms, so a
// 2 s pause is a loss on every machine.
std::string Job(uint16_t port, const std::string& script, int max_restarts) {
  TestJob job;
  job.name = "live";
  job.script = script;
  job.master_port = port;
  job.max_restarts = max_restarts;
  job.backoff = "0s";
  job.rendezvous = "15s";
  return job.Toml();
}

// A worker script's test that the previous round's holder of its rank still runs: a zombie
// (killed, its stopped agent cannot reap it) does not. /proc/PID/status is read once: with
// `[ -e /proc/$old ] && ! grep ... /proc/$old/status`, an agent resumed at that moment reaped
// the zombie between the two looks, grep failed, and the gone worker was reported as overlapping
// (issue 37: the guardian had killed it on time, 11 s earlier; 4 runs of 15 under load).
constexpr char kStillRuns[] =
    "still_runs() { s=$(cat /proc/$1/status 2>/dev/null) || return 1; "
    "case \"$s\" in *\"State:\tZ\"*|*\"State:\tX\"*) return 1;; esac; }; ";

class LivenessTest : public ::testing::Test {
 protected:
  AgentProcess& Start(int node_rank) {
    const std::string out = dir_.path() + "/agent-" + std::to_string(agents_.size()) + ".out";
    agents_.push_back(std::make_unique<AgentProcess>(
        std::vector<std::string>{dir_.path() + "/job.toml", "--node-rank", std::to_string(node_rank)}, out));
    return *agents_.back();
  }
  bool OutputHas(const AgentProcess& agent, const std::string& text, std::chrono::milliseconds limit) {
    return WaitFor([&] { return agent.Output().find(text) != std::string::npos; }, limit);
  }
  /// Pauses `agent` (only the agent process: its workers keep running) for `pause`.
  static void Pause(const AgentProcess& agent, std::chrono::milliseconds pause) {
    agent.Signal(SIGSTOP);
    WaitFor([] { return false; }, pause);
    agent.Signal(SIGCONT);
  }
  std::string Describe() const { return DescribeAgents(agents_); }

  ScratchDir dir_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

// The swarm's liveness bug on real agents: node 0's agent (which holds the coordinator) is
// stopped for longer than the loss bound, twice, until the restart budget is spent. Every node
// must end with the job's code (1) and the root cause must be node 0's stall, not a lie about
// the others. Before the fix both agents looped "lost the coordinator ... joining" forever.
TEST_F(LivenessTest, PausedCoordinatorTwiceWithTheBudgetSpentEndsTheJobOnEveryNode) {
  const uint16_t port = FreePort();
  dir_.Write("job.toml", Job(port, "sleep 20", /*max_restarts=*/1));
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_TRUE(OutputHas(node1, "round 0: starting", 10s)) << Describe();
  Pause(node0, 2s);
  ASSERT_TRUE(OutputHas(node1, "round 1: starting", 15s)) << Describe();
  Pause(node0, 2s);
  const auto code1 = node1.Wait(30s);
  const auto code0 = node0.Wait(30s);
  EXPECT_EQ(code0, 1) << Describe();
  EXPECT_EQ(code1, 1) << Describe();
  for (const auto* agent : {&node0, &node1}) {
    EXPECT_THAT(agent->Output(), HasSubstr(") stalled for ")) << Describe();
    EXPECT_THAT(agent->Output(), HasSubstr("job \"live\" FAILED in round 1 after using all 1 restart"))
        << Describe();
    EXPECT_THAT(agent->Output(), HasSubstr("root cause (first failure anywhere in the job): node 0 "))
        << Describe();
  }
}

// Fencing: node 1's agent is stopped while its workers ignore SIGTERM, and a second agent
// claims node rank 1. The round after node 1 is lost must not start until node 1's old workers
// are certainly gone: each new holder of rank 2 or 3 checks that the old one no longer runs.
TEST_F(LivenessTest, LostNodesWorkersNeverOverlapTheNextRoundsHolderOfTheirRank) {
  const uint16_t port = FreePort();
  const std::string script =
      std::string(kStillRuns) +
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then trap '' TERM; echo $$ > old-$RANK.pid; "
      "sleep 60 & wait; sleep 60; else old=$(cat old-$RANK.pid); "
      "if still_runs $old; then echo rank $RANK overlaps $old >> overlap.txt; fi; fi";
  dir_.Write("job.toml", Job(port, script, /*max_restarts=*/1));
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_TRUE(OutputHas(node1, "round 0: starting", 10s)) << Describe();
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("old-2.pid") && dir_.Exists("old-3.pid"); }, 10s))
      << Describe();
  node1.Signal(SIGSTOP);
  AgentProcess& second = Start(1);  // refused while node 1 holds the rank, then takes it
  ASSERT_TRUE(OutputHas(node0, "round 0 failed: node 1 (", 10s)) << Describe();
  // Node 1 stays paused until the second agent holds its rank, so without the fence round 1
  // would start while node 1's old workers still run.
  ASSERT_TRUE(OutputHas(node0, "round 1: all 2 nodes joined", 15s)) << Describe();
  node1.Signal(SIGCONT);  // it notices the loss and stops its workers (SIGKILL after 2 s)
  EXPECT_EQ(node0.Wait(40s), 0) << Describe();
  EXPECT_EQ(second.Wait(10s), 0) << Describe();
  EXPECT_FALSE(dir_.Exists("overlap.txt")) << dir_.Read("overlap.txt") << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr("round 1: all 2 nodes joined; waiting ")) << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr(") was lost while its workers ran and a different agent now "
                                        "holds its rank"))
      << Describe();
  // The paused agent found its rank taken when it came back and said so; it ends by itself.
  EXPECT_TRUE(node1.Wait(30s).has_value()) << Describe();
}

// The guardian's lease: an agent that is stopped (here SIGSTOP of the agent alone) cannot stop
// its workers, and the coordinator will give their ranks to another agent once their lease ends.
// The guardian, a process of its own, SIGKILLs them when it has heard nothing from the agent for
// the loss bound + stop_grace (0.75 s + 2 s here), while the agent is still stopped.
TEST_F(LivenessTest, TheGuardianKillsTheWorkersOfAStoppedAgentWhenItsLeaseRunsOut) {
  const uint16_t port = FreePort();
  dir_.Write("job.toml", Job(port, "echo $$ > w-$RANK.pid; sleep 30", /*max_restarts=*/0));
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_TRUE(WaitFor([&] { return dir_.Exists("w-2.pid") && dir_.Exists("w-3.pid"); }, 10s)) << Describe();
  std::vector<pid_t> workers;
  for (const char* name : {"w-2.pid", "w-3.pid"}) {
    ASSERT_TRUE(WaitFor([&] { return !dir_.Read(name).empty() && dir_.Read(name).back() == '\n'; }, 5s));
    workers.push_back(std::stoi(dir_.Read(name)));
  }
  node1.Signal(SIGSTOP);
  for (pid_t pid : workers) {
    EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(pid); }, 10s))
        << "worker " << pid << " of the stopped agent still runs" << Describe();
  }
  EXPECT_TRUE(ProcessAlive(node1.pid())) << "the agent itself is only stopped";
  node1.Signal(SIGCONT);
  EXPECT_EQ(node0.Wait(30s), 1) << Describe();
  EXPECT_TRUE(node1.Wait(30s).has_value()) << Describe();
}

// The swarm's seed 600612 of examples/lightning-2x8.toml on real agents. Node 1's agent loses
// the coordinator (a 2 s pause stands in for a partition) and begins its stop, but its workers
// ignore SIGTERM; 13 s later, before its SIGKILL, it is frozen (SIGSTOP), and a second agent has
// taken node rank 1. The fence lets round 1 start a heartbeat + the kill allowance (10 s) after
// the old workers' lease, which ends the loss bound + stop_grace (0.75 s + 20 s) after the
// agent's last word from the coordinator. The guardian used to count that lease from the
// agent's last loop (the freeze), so the old workers ran until about 35 s, into round 1 (about
// 32 s); it now kills them when the lease ends, while the agent is still frozen. Each new holder
// of rank 2 or 3 checks that the old one no longer runs (a zombie the stopped agent cannot reap
// does not).
TEST_F(LivenessTest, TheGuardianKillsTheWorkersOfAnAgentFrozenInTheMiddleOfItsStop) {
  TestJob job;
  job.name = "live";
  job.master_port = FreePort();
  job.max_restarts = 1;
  job.backoff = "0s";
  job.rendezvous = "30s";
  job.stop_grace = "20s";
  job.script =
      std::string(kStillRuns) +
      "if [ $TORCHELASTIC_RESTART_COUNT != 0 ]; then if [ -e old-$RANK.pid ]; then old=$(cat old-$RANK.pid); "
      "if still_runs $old; then "
      "echo rank $RANK overlaps $old >> overlap.txt; fi; fi; "
      "elif [ $GROUP_RANK = 1 ]; then trap '' TERM; echo $$ > old-$RANK.pid; sleep 120 & wait; sleep 120; "
      "else sleep 120 & wait; fi";
  dir_.Write("job.toml", job.Toml());
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  std::vector<pid_t> old;
  for (const char* name : {"old-2.pid", "old-3.pid"}) {
    ASSERT_TRUE(WaitFor([&] { return dir_.Exists(name) && dir_.Read(name).ends_with("\n"); }, 10s))
        << Describe();
    old.push_back(std::stoi(dir_.Read(name)));
  }
  const auto lost_at = std::chrono::steady_clock::now();
  node1.Signal(SIGSTOP);
  AgentProcess& second = Start(1);  // refused while node 1 holds the rank, then takes it
  ASSERT_TRUE(OutputHas(node0, "round 0 failed: node 1 (", 10s)) << Describe();
  WaitFor([] { return false; }, 2s);
  node1.Signal(SIGCONT);  // it notices the loss and sends SIGTERM, which its workers ignore
  ASSERT_TRUE(OutputHas(node1, "lost the coordinator", 5s)) << Describe();
  WaitFor([] { return false; }, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    lost_at + 15s - std::chrono::steady_clock::now()));
  node1.Signal(SIGSTOP);  // frozen 5 s before its own SIGKILL
  for (pid_t pid : old) ASSERT_TRUE(ProcessAlive(pid)) << "worker " << pid << " ended before the freeze";
  ASSERT_TRUE(OutputHas(node0, "round 1: all 2 nodes joined; starting", 40s)) << Describe();
  for (pid_t pid : old) {
    EXPECT_FALSE(ProcessAlive(pid)) << "worker " << pid << " of the frozen agent still runs in round 1";
  }
  node1.Signal(SIGCONT);  // its rank is taken: it ends by itself
  EXPECT_EQ(node0.Wait(30s), 0) << Describe();
  EXPECT_EQ(second.Wait(10s), 0) << Describe();
  EXPECT_FALSE(dir_.Exists("overlap.txt")) << dir_.Read("overlap.txt") << Describe();
  EXPECT_THAT(node0.Output(), HasSubstr("round 1: all 2 nodes joined; waiting ")) << Describe();
  EXPECT_TRUE(node1.Wait(30s).has_value()) << Describe();
}

// Issue 11: SIGHUP (a closed terminal or ssh session) ended an agent with 129 and no summary,
// and the other nodes took it for a crash. It is an interrupt like SIGINT and SIGTERM.
TEST_F(LivenessTest, SighupIsAnInterruptThatEndsTheJobEverywhereWith129) {
  const uint16_t port = FreePort();
  dir_.Write("job.toml", Job(port, "sleep 30", /*max_restarts=*/3));
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_TRUE(OutputHas(node1, "round 0: starting", 10s)) << Describe();
  ASSERT_TRUE(OutputHas(node0, "round 0: starting", 10s)) << Describe();
  node1.Signal(SIGHUP);
  EXPECT_EQ(node1.Wait(20s), 129) << Describe();
  EXPECT_EQ(node0.Wait(20s), 129) << Describe();
  for (const auto* agent : {&node0, &node1}) {
    EXPECT_THAT(agent->Output(), HasSubstr("job \"live\" interrupted: node 1 (")) << Describe();
    EXPECT_THAT(agent->Output(), HasSubstr(") received SIGHUP")) << Describe();
    EXPECT_THAT(agent->Output(), ::testing::Not(HasSubstr("restart 1 of 3"))) << Describe();
  }
}

// Node 0's journal: node 0's agent is killed (SIGKILL: it cannot tell anyone) while node 1's
// agent is stopped and its workers ignore SIGTERM, and a second agent takes rank 1. The
// coordinator started again on node 0 knows nothing of the old round but its journal: it must
// not start a round until the old workers' lease has ended (guardian lease 2.75 s; the bound
// is 13 s). Each new holder of a rank checks that the old one no longer runs (a zombie that the
// stopped agent cannot reap does not run).
TEST_F(LivenessTest, ACoordinatorStartedAgainAfterAKillWaitsForThePreviousRoundsWorkers) {
  const uint16_t port = FreePort();
  const std::string script = std::string(kStillRuns) +
                             "if [ -e old-$RANK.pid ]; then old=$(cat old-$RANK.pid); "
                             "if still_runs $old; then echo rank $RANK overlaps $old >> "
                             "overlap.txt; fi; "
                             "else trap '' TERM; echo $$ > old-$RANK.pid; sleep 60 & wait; sleep 60; fi";
  dir_.Write("job.toml", Job(port, script, /*max_restarts=*/0));
  AgentProcess& node0 = Start(0);
  AgentProcess& node1 = Start(1);
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const char* name : {"old-0.pid", "old-1.pid", "old-2.pid", "old-3.pid"}) {
          if (!dir_.Exists(name) || dir_.Read(name).empty() || dir_.Read(name).back() != '\n') return false;
        }
        return true;
      },
      10s))
      << Describe();
  node1.Signal(SIGSTOP);
  node0.Signal(SIGKILL);
  EXPECT_EQ(node0.Wait(5s), 128 + SIGKILL) << Describe();
  AgentProcess& again = Start(0);
  AgentProcess& second = Start(1);
  ASSERT_TRUE(OutputHas(again, "the previous coordinator of this job on this host did not end it", 10s))
      << Describe();
  ASSERT_TRUE(OutputHas(again, "round 0: all 2 nodes joined; waiting ", 10s)) << Describe();
  EXPECT_EQ(again.Wait(40s), 0) << Describe();
  EXPECT_EQ(second.Wait(10s), 0) << Describe();
  EXPECT_FALSE(dir_.Exists("overlap.txt")) << dir_.Read("overlap.txt") << Describe();
  EXPECT_THAT(again.Output(), HasSubstr("before starting it: the previous coordinator of this job on "
                                        "this host ended without ending the job"))
      << Describe();
  node1.Signal(SIGCONT);
  EXPECT_TRUE(node1.Wait(30s).has_value()) << Describe();
  // A clean end is recorded: a coordinator started now would not wait.
  EXPECT_THAT(dir_.Read("logs/live/coordinator.journal"), HasSubstr("rounds_may_run=0")) << Describe();
}

}  // namespace
}  // namespace ddprun::e2e
