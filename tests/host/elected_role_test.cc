// host::ElectedRole (core::Election run against a host::Store) against the simulator's etcd model
// (sim/sim_store.h: revisions, leases that end in virtual time, a put that compares a create revision): who
// leads, what a new holder reads, when a holder steps down, and that a deposed holder's writes are refused.
#include "runner/host/coordinator_role.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "sim/event_queue.h"
#include "sim/sim_store.h"
#include "tests/core/core_test_util.h"

namespace ddprun::host {
namespace {

TimePoint At(Duration d) { return TimePoint{} + d; }

// The job's etcd: the simulator's model on its own event queue, without network delay, so that
// a call takes effect when the test runs etcd's clock up to the moment it delivers answers (the
// call's linearization point), and a test decides what happens in between.
class Etcd {
 public:
  explicit Etcd(const JobSpec& spec) {
    sim::SimEtcd::Hooks hooks;
    hooks.now_ns = [this] { return now_ns_; };
    hooks.deliver = [this](uint32_t node, uint32_t incarnation, StoreResult result) {
      auto it = inboxes_.find(node);
      // An answer to a client that was replaced since (a restarted agent) is dropped.
      if (it != inboxes_.end() && it->second.incarnation == incarnation)
        it->second.answers.push_back(std::move(result));
    };
    hooks.print = [](std::optional<uint32_t>, const std::string&) {};
    const sim::NetworkOptions instant{.latency_min = Duration(0), .latency_max = Duration(0), .loss = 0};
    model_ = std::make_unique<sim::SimEtcd>(queue_, std::move(hooks), spec, instant, 1, false);
  }

  /// Moves etcd's clock to `t` (never back): serves every call that arrived, ends leases.
  void RunUntil(TimePoint t) {
    const int64_t until = std::max(now_ns_, t.time_since_epoch().count());
    while (!queue_.Empty() && queue_.NextTime().time_since_epoch().count() <= until) {
      const sim::Event event = queue_.Pop();
      now_ns_ = event.time_ns;
      queue_.TakeCall(event.target)();
    }
    now_ns_ = until;
  }
  bool Holds(const std::string& key) const { return model_->Peek(key).has_value(); }
  std::optional<StoreEntry> Peek(const std::string& key) const { return model_->Peek(key); }

  /// Node `node`'s client from now on; answers to its earlier clients are dropped.
  uint32_t Register(uint32_t node) { return ++inboxes_[node].incarnation; }
  std::deque<StoreResult>& Answers(uint32_t node) { return inboxes_[node].answers; }
  void Request(uint32_t node, uint32_t incarnation, uint64_t id, sim::SimEtcd::Op op) {
    model_->Request(node, incarnation, id, std::move(op));
  }

  int keepalives = 0;
  int revokes = 0;

 private:
  struct Inbox {
    uint32_t incarnation = 0;
    std::deque<StoreResult> answers;
  };
  sim::EventQueue queue_;
  int64_t now_ns_ = 0;
  std::unique_ptr<sim::SimEtcd> model_;
  std::map<uint32_t, Inbox> inboxes_;
};

// One agent's client of the model. What it adds is a client's own behaviour, which the model
// leaves to the client: `down` answers every call with a connection error without reaching
// etcd (no endpoint accepts), and `retry_next_put` loses the answer of a put that reached etcd
// and tries it again, as the real client does on another endpoint.
class ModelClient final : public Store {
 public:
  ModelClient(Etcd& etcd, uint32_t node) : etcd_(etcd), node_(node), incarnation_(etcd.Register(node)) {}

  void SetEvents(StoreEvents*) override {}
  uint64_t Grant(Duration ttl) override { return Send(sim::SimEtcd::GrantOp{ttl}); }
  uint64_t KeepAlive(int64_t lease) override {
    ++etcd_.keepalives;
    return Send(sim::SimEtcd::KeepAliveOp{lease});
  }
  uint64_t Revoke(int64_t lease) override {
    ++etcd_.revokes;
    return Send(sim::SimEtcd::RevokeOp{lease});
  }
  uint64_t Get(const std::string& key) override { return Send(sim::SimEtcd::GetOp{key}); }
  uint64_t PutIf(const std::string& key, int64_t create_revision, std::vector<StorePut> puts) override {
    sim::SimEtcd::PutIfOp op{key, create_revision, std::move(puts)};
    if (retry_next_put) {
      // The put reached etcd, its answer was lost, and the client tried it again elsewhere:
      // the caller hears the second try's answer.
      retry_next_put = false;
      lost_.insert(Send(op));
    }
    return Send(std::move(op));
  }

  /// Answers every call this client made so far (and those the answers lead to) at `now`.
  void Deliver(ElectedRole& election, TimePoint now) {
    while (DeliverOne(election, now)) {
    }
  }
  /// Answers only the oldest call.
  bool DeliverOne(ElectedRole& election, TimePoint now) {
    etcd_.RunUntil(now);
    std::deque<StoreResult>& answers = etcd_.Answers(node_);
    while (!answers.empty() && lost_.erase(answers.front().id) > 0) answers.pop_front();
    if (!refused_.empty()) {
      StoreResult r;
      r.id = refused_.front();
      refused_.pop_front();
      r.error = "etcd at http://127.0.0.1:2379: connection refused";
      election.OnStoreResult(now, r);
      return true;
    }
    if (answers.empty()) return false;
    StoreResult r = std::move(answers.front());
    answers.pop_front();
    election.OnStoreResult(now, r);
    return true;
  }

  bool down = false;
  bool retry_next_put = false;

 private:
  uint64_t Send(sim::SimEtcd::Op op) {
    const uint64_t id = ++next_id_;
    if (down) {
      refused_.push_back(id);
    } else {
      etcd_.Request(node_, incarnation_, id, std::move(op));
    }
    return id;
  }

  Etcd& etcd_;
  uint32_t node_;
  uint32_t incarnation_;
  uint64_t next_id_ = 0;
  std::deque<uint64_t> refused_;  // calls `down` answers with an error
  std::set<uint64_t> lost_;       // calls whose answer never reaches the caller
};

constexpr std::string_view kJob = R"(version = 1
[job]
name = "llm"
command = ["python", "train.py"]
[cluster]
nodes = ["gpu-01", "gpu-02", "gpu-03"]
master_port = 29500
nproc_per_node = 1
[rendezvous]
backend = "etcd"
endpoints = ["http://127.0.0.1:2379"]
prefix = "/team"
lease = "6s"
)";

// What one agent's election told it, in order.
struct Heard {
  std::vector<std::string> lines;
  std::optional<core::JobRecord> led_with;
  const ElectedRole* role = nullptr;

  CoordinatorRole::Listener Listener() {
    return CoordinatorRole::Listener{
        .found = [this](const CoordinatorAt& at) { lines.push_back("found " + at.endpoint); },
        .lookup_failed = [this](const std::string& why) { lines.push_back("lookup failed: " + why); },
        .lead =
            [this] {
              const std::optional<core::JobRecord>& s = role->election().inherited_job();
              led_with = s;
              lines.push_back(s ? "lead, round " + std::to_string(s->next_round) : "lead afresh");
            },
        .step_down = [this](const std::string& why) { lines.push_back("step down: " + why); },
        .committed = [this](int round) { lines.push_back("committed " + std::to_string(round)); },
        .end_recorded = [this] { lines.push_back("end recorded"); },
        .flushed = [this] { lines.push_back("flushed"); },
    };
  }
  std::string Take() {
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    lines.clear();
    return out;
  }
};

class ElectionTest : public ::testing::Test {
 protected:
  ElectionTest() : spec_(core::test::SpecFromToml(std::string(kJob))), etcd_(spec_) {}

  std::unique_ptr<ElectedRole> Make(int agent, Heard& heard,
                                    const std::string& fingerprint = "1a2b3c4d5e6f") {
    auto& client = clients_[agent];
    client = std::make_unique<ModelClient>(etcd_, static_cast<uint32_t>(agent));
    auto role = std::make_unique<ElectedRole>(spec_, fingerprint, agent, spec_.cluster.HostOf(agent), *client,
                                              heard.Listener());
    heard.role = role.get();
    return role;
  }
  ModelClient& Client(int agent) { return *clients_.at(agent); }

  JobSpec spec_;
  Etcd etcd_;
  std::map<int, std::unique_ptr<ModelClient>> clients_;
  std::unique_ptr<ModelClient> client_for_test_;
};

TEST_F(ElectionTest, TheFirstToLookCampaignsAndTheOthersFindIt) {
  Heard h1, h2;
  auto e1 = Make(1, h1);
  auto e2 = Make(2, h2);
  EXPECT_EQ(e1->election().role_key(), "/team/llm/coordinator");
  EXPECT_EQ(e1->election().state_key(), "/team/llm/state");

  e1->Lookup(At(Seconds(0)));
  Client(1).Deliver(*e1, At(Seconds(0)));
  EXPECT_EQ(h1.Take(), "lead afresh\nfound gpu-02:29500\n");
  EXPECT_TRUE(e1->election().leading());
  ASSERT_TRUE(etcd_.Holds(e1->election().role_key()));
  EXPECT_NE(etcd_.Peek(e1->election().role_key()).value_or(StoreEntry{}).lease,
            0);  // the role goes with the lease

  e2->Lookup(At(Seconds(1)));
  Client(2).Deliver(*e2, At(Seconds(1)));
  EXPECT_EQ(h2.Take(), "found gpu-02:29500\n");
  EXPECT_FALSE(e2->election().leading());

  // The holder answers its own lookups at once.
  e1->Lookup(At(Seconds(1)));
  EXPECT_EQ(h1.Take(), "found gpu-02:29500\n");
}

TEST_F(ElectionTest, TwoCampaignsAtOnceMakeOneHolder) {
  Heard h0, h1;
  auto e0 = Make(0, h0);
  auto e1 = Make(1, h1);
  // Both read "no holder" before either campaign lands.
  e0->Lookup(At(Seconds(0)));
  e1->Lookup(At(Seconds(0)));
  // One answer each in turn interleaves the two campaigns: both read no holder, both get a
  // lease, both try the put that only succeeds on an absent key.
  for (bool more = true; more;) {
    more = Client(0).DeliverOne(*e0, At(Seconds(0)));
    more = Client(1).DeliverOne(*e1, At(Seconds(0))) || more;
  }
  EXPECT_NE(e0->election().leading(), e1->election().leading());
  const std::string lost = e0->election().leading() ? h1.Take() : h0.Take();
  EXPECT_EQ(lost, e0->election().leading() ? "found gpu-01:29500\n" : "found gpu-02:29500\n");
  EXPECT_GE(etcd_.revokes, 1);  // the loser's lease is given back
}

TEST_F(ElectionTest, AHolderRenewsItsLeaseAndStepsDownBeforeItCanEnd) {
  Heard h;
  auto e = Make(0, h);
  e->Lookup(At(Seconds(0)));
  Client(0).Deliver(*e, At(Seconds(0)));
  h.Take();
  // Renewals every third of the lease keep it.
  for (int s = 1; s <= 30; ++s) {
    e->OnTick(At(Seconds(s)));
    Client(0).Deliver(*e, At(Seconds(s)));
  }
  EXPECT_TRUE(e->election().leading());
  EXPECT_GE(etcd_.keepalives, 14);
  EXPECT_TRUE(etcd_.Holds(e->election().role_key()));

  // etcd stops answering: the holder steps down lease - max(lease/5, 400ms) after the last
  // renewal it sent that was answered, before etcd can hand the role to another agent.
  const TimePoint last_renewal = At(Seconds(30));
  Client(0).down = true;
  std::optional<TimePoint> stepped;
  for (Duration t = Seconds(30); t <= Seconds(40) && !stepped; t += Millis(100)) {
    e->OnTick(At(t));
    Client(0).Deliver(*e, At(t));
    if (!e->election().leading()) stepped = At(t);
  }
  ASSERT_TRUE(stepped);
  EXPECT_LE(*stepped, last_renewal + Seconds(6) - core::Election::StepDownMargin(Seconds(6)));
  EXPECT_GE(*stepped, last_renewal + Seconds(6) - core::Election::StepDownMargin(Seconds(6)) - Seconds(2));
  EXPECT_EQ(core::Election::StepDownMargin(Seconds(6)), Millis(1200));
  EXPECT_EQ(core::Election::StepDownMargin(Seconds(2)), Millis(400));
  EXPECT_NE(h.Take().find("step down: it could not renew its etcd lease (rendezvous.lease = 6s) in time"),
            std::string::npos);
}

TEST_F(ElectionTest, AWriteOfADeposedHolderIsRefusedAndItStepsDown) {
  Heard h1, h2;
  auto e1 = Make(1, h1);
  auto e2 = Make(2, h2);
  e1->Lookup(At(Seconds(0)));
  Client(1).Deliver(*e1, At(Seconds(0)));
  e1->Commit(At(Seconds(0)), core::CommitRound{0, 0, 2});
  Client(1).Deliver(*e1, At(Seconds(0)));
  EXPECT_EQ(h1.Take(), "lead afresh\nfound gpu-02:29500\ncommitted 0\nflushed\n");

  // e1 is paused past its lease (it never ticked): etcd ends it, e2 takes the role.
  etcd_.RunUntil(At(Seconds(7)));
  EXPECT_FALSE(etcd_.Holds(e1->election().role_key()));
  e2->Lookup(At(Seconds(7)));
  Client(2).Deliver(*e2, At(Seconds(7)));
  EXPECT_EQ(h2.Take(), "lead, round 1\nfound gpu-03:29500\n");
  ASSERT_TRUE(h2.led_with);
  EXPECT_TRUE(h2.led_with->round_may_run);
  EXPECT_EQ(h2.led_with->holder, "node 1 (gpu-02)");

  // e1 wakes up and tries to commit its next round: the compare on the role key's create
  // revision fails, nothing is written, and it steps down without "committed".
  const std::string before = etcd_.Peek(e1->election().state_key()).value_or(StoreEntry{}).value;
  e1->Commit(At(Seconds(7)), core::CommitRound{1, 1, 2});
  Client(1).Deliver(*e1, At(Seconds(7)));
  EXPECT_EQ(h1.Take(), "step down: another agent holds the coordinator role now\nflushed\n");
  EXPECT_FALSE(e1->election().leading());
  EXPECT_EQ(etcd_.Peek(e1->election().state_key()).value_or(StoreEntry{}).value, before);
}

TEST_F(ElectionTest, ACommitAnsweredTooLateIsNotActedOn) {
  Heard h;
  auto e = Make(0, h);
  e->Lookup(At(Seconds(0)));
  Client(0).Deliver(*e, At(Seconds(0)));
  h.Take();
  e->Commit(At(Seconds(1)), core::CommitRound{0, 0, 2});
  // The answer comes when the lease may be about to end (6s - 1.2s after the grant).
  Client(0).Deliver(*e, At(Millis(4900)));
  EXPECT_EQ(h.Take(),
            "step down: it could not renew its etcd lease (rendezvous.lease = 6s) in time\nflushed\n");
}

TEST_F(ElectionTest, ANewHolderContinuesTheJobsStateAndAFinishedJobStartsAfresh) {
  Heard h1;
  auto e1 = Make(1, h1);
  e1->Lookup(At(Seconds(0)));
  Client(1).Deliver(*e1, At(Seconds(0)));
  // The coordinator waits for each commit before it starts the round.
  e1->Commit(At(Seconds(0)), core::CommitRound{0, 0, 2});
  Client(1).Deliver(*e1, At(Seconds(0)));
  e1->RecordRestart(At(Seconds(0)), 1, 1, true);
  e1->RecordQuarantine(At(Seconds(0)), {core::QuarantinedHost{"gpu-03", Minutes(30), 3}});
  e1->Commit(At(Seconds(0)), core::CommitRound{1, 1, 2});
  Client(1).Deliver(*e1, At(Seconds(0)));
  EXPECT_EQ(h1.Take(), "lead afresh\nfound gpu-02:29500\ncommitted 0\nflushed\ncommitted 1\nflushed\n");
  e1->Resign(At(Seconds(1)));
  Client(1).Deliver(*e1, At(Seconds(1)));
  EXPECT_FALSE(etcd_.Holds(e1->election().role_key()));  // revoked: no wait for the lease

  Heard h0;
  auto e0 = Make(0, h0);
  e0->Lookup(At(Seconds(1)));
  Client(0).Deliver(*e0, At(Seconds(1)));
  ASSERT_TRUE(h0.led_with);
  EXPECT_EQ(h0.led_with->next_round, 2);
  EXPECT_EQ(h0.led_with->restarts_used, 1);
  EXPECT_TRUE(h0.led_with->round_may_run);
  ASSERT_EQ(h0.led_with->quarantined.size(), 1u);
  EXPECT_EQ(h0.led_with->quarantined[0].host, "gpu-03");
  EXPECT_EQ(h0.led_with->quarantined[0].times, 3);

  e0->RecordEnd(At(Seconds(2)), 0, "job \"llm\" finished\nall ranks exited 0");
  e0->RecordDone(At(Seconds(2)));
  Client(0).Deliver(*e0, At(Seconds(2)));
  e0->Resign(At(Seconds(2)));
  Client(0).Deliver(*e0, At(Seconds(2)));

  // A later launch of the same file: the job starts at round 0 with a full budget, and
  // only the quarantine carries over.
  Heard h2;
  auto e2 = Make(2, h2);
  e2->Lookup(At(Seconds(3)));
  Client(2).Deliver(*e2, At(Seconds(3)));
  EXPECT_EQ(h2.Take(), "lead afresh\nfound gpu-03:29500\n");
  EXPECT_EQ(e2->election().record().next_round, 0);
  ASSERT_EQ(e2->election().record().quarantined.size(), 1u);
  // Nobody confirmed that round 1's workers stopped (the exit barrier passed): the new
  // launch's first round must wait for their lease.
  EXPECT_TRUE(e2->election().earlier_workers_may_run());
  e2->RecordWorkers(At(Seconds(4)), false);
  e2->RecordDone(At(Seconds(4)));
  Client(2).Deliver(*e2, At(Seconds(4)));
  e2->Resign(At(Seconds(4)));
  Client(2).Deliver(*e2, At(Seconds(4)));

  Heard h1b;
  auto again = Make(1, h1b);
  again->Lookup(At(Seconds(5)));
  Client(1).Deliver(*again, At(Seconds(5)));
  EXPECT_EQ(h1b.Take(), "lead afresh\nfound gpu-02:29500\n");
  EXPECT_FALSE(again->election().earlier_workers_may_run());
}

// The keys are the job name's: an agent with another version of the file finds the same
// holder (and its coordinator refuses it at the join). A launch of another file after a run
// that had not ended starts afresh, but waits for that run's workers' lease first.
TEST_F(ElectionTest, AnotherJobFileMeetsTheSameHolderAndTakesOverOnlyAfresh) {
  Heard h1, h2;
  auto e1 = Make(1, h1, "aaaaaaaa1111");
  auto e2 = Make(2, h2, "bbbbbbbb2222");
  EXPECT_EQ(e1->election().role_key(), e2->election().role_key());
  e1->Lookup(At(Seconds(0)));
  Client(1).Deliver(*e1, At(Seconds(0)));
  e1->Commit(At(Seconds(0)), core::CommitRound{0, 0, 2});
  e1->Commit(At(Seconds(0)), core::CommitRound{1, 1, 2});
  Client(1).Deliver(*e1, At(Seconds(0)));
  EXPECT_EQ(h1.Take(), "lead afresh\nfound gpu-02:29500\ncommitted 1\nflushed\n");
  e2->Lookup(At(Seconds(1)));
  Client(2).Deliver(*e2, At(Seconds(1)));
  EXPECT_EQ(h2.Take(), "found gpu-02:29500\n");
  EXPECT_THAT(etcd_.Peek(e1->election().state_key()).value_or(StoreEntry{}).value,
              ::testing::HasSubstr("fingerprint=aaaaaaaa1111\n"));

  // The holder is lost while round 1 runs; the agent with the other file takes the role.
  e1->Resign(At(Seconds(2)));
  Client(1).Deliver(*e1, At(Seconds(2)));
  e2->Lookup(At(Seconds(3)));
  Client(2).Deliver(*e2, At(Seconds(3)));
  EXPECT_EQ(h2.Take(), "lead afresh\nfound gpu-03:29500\n");
  EXPECT_EQ(e2->election().record().next_round, 0);
  EXPECT_EQ(e2->election().record().fingerprint, "bbbbbbbb2222");
  EXPECT_TRUE(e2->election().earlier_workers_may_run());
  EXPECT_EQ(
      e2->election().earlier_run(),
      "a run of job 'llm' from another job file (fingerprint aaaaaaaa, recorded by node 1 (gpu-02)) that had "
      "not ended");
}

// An agent that took part in the job and finds its record done was away when the verdict was
// told: it leads with the record (its coordinator tells it the verdict), not afresh.
TEST_F(ElectionTest, AnAgentThatTookPartReadsADoneRecordAsItsJobsVerdict) {
  Heard h1;
  auto e1 = Make(1, h1);
  e1->Lookup(At(Seconds(0)));
  Client(1).Deliver(*e1, At(Seconds(0)));
  e1->RecordEnd(At(Seconds(1)), 1, "job \"llm\" FAILED");
  e1->RecordDone(At(Seconds(1)));
  Client(1).Deliver(*e1, At(Seconds(1)));
  e1->Resign(At(Seconds(1)));
  Client(1).Deliver(*e1, At(Seconds(1)));

  Heard h2, h0;
  auto late = Make(2, h2);
  late->TookPart(At(Seconds(2)));
  late->Lookup(At(Seconds(2)));
  Client(2).Deliver(*late, At(Seconds(2)));
  ASSERT_TRUE(h2.led_with);
  EXPECT_EQ(h2.led_with->exit_code, 1);
  EXPECT_EQ(h2.led_with->summary, "job \"llm\" FAILED");
  late->Resign(At(Seconds(3)));
  Client(2).Deliver(*late, At(Seconds(3)));

  auto fresh = Make(0, h0);  // a new launch: it starts afresh
  fresh->Lookup(At(Seconds(4)));
  Client(0).Deliver(*fresh, At(Seconds(4)));
  EXPECT_EQ(h0.Take(), "lead afresh\nfound gpu-01:29500\n");
}

TEST_F(ElectionTest, ALookupThatCannotReachEtcdFailsWithWhy) {
  Heard h;
  auto e = Make(1, h);
  Client(1).down = true;
  e->Lookup(At(Seconds(0)));
  Client(1).Deliver(*e, At(Seconds(0)));
  EXPECT_EQ(h.Take(), "lookup failed: etcd at http://127.0.0.1:2379: connection refused\n");
  EXPECT_FALSE(e->election().leading());
}

TEST_F(ElectionTest, ACampaignPutTriedTwiceByTheClientStillWins) {
  Heard h;
  auto e = Make(1, h);
  Client(1).retry_next_put = true;
  e->Lookup(At(Seconds(0)));
  Client(1).Deliver(*e, At(Seconds(0)));
  EXPECT_EQ(h.Take(), "lead afresh\nfound gpu-02:29500\n");
  ASSERT_TRUE(e->election().leading());
  EXPECT_TRUE(etcd_.Holds(e->election().role_key()));  // its lease was not revoked
  e->Commit(At(Seconds(1)), core::CommitRound{0, 0, 2});
  Client(1).Deliver(*e, At(Seconds(1)));
  EXPECT_EQ(h.Take(), "committed 0\nflushed\n");  // fenced writes compare the right revision
}

TEST_F(ElectionTest, ResignRevokesTheLeaseAndSaysWhenEtcdHasIt) {
  Heard h;
  auto e = Make(0, h);
  e->Lookup(At(Seconds(0)));
  Client(0).Deliver(*e, At(Seconds(0)));
  h.Take();
  e->Resign(At(Seconds(1)));
  EXPECT_TRUE(e->election().Revoking());
  EXPECT_TRUE(etcd_.Holds(e->election().role_key()));
  Client(0).Deliver(*e, At(Seconds(1)));
  EXPECT_FALSE(e->election().Revoking());
  EXPECT_FALSE(etcd_.Holds(e->election().role_key()));
  EXPECT_EQ(h.Take(), "flushed\n");
}

// The real host's clock runs while it carries a notification out: the coordinator it starts on
// Lead records at a later time than the answer that made it lead, and the role goes on after
// that (found) without taking the earlier time for a clock that went back.
TEST_F(ElectionTest, ANotificationCarriedOutLaterThanItCameStillGoesOn) {
  Heard h;
  ElectedRole* role = nullptr;
  CoordinatorRole::Listener listener = h.Listener();
  listener.lead = [&] {
    h.lines.push_back("lead");
    role->RecordQuarantine(At(Millis(30)), {core::QuarantinedHost{"gpu-03", Seconds(60), 1}});
  };
  client_for_test_ = std::make_unique<ModelClient>(etcd_, 0u);
  auto e = std::make_unique<ElectedRole>(spec_, "1a2b3c4d5e6f", 0, spec_.cluster.HostOf(0), *client_for_test_,
                                         std::move(listener));
  role = e.get();
  h.role = role;
  e->Lookup(At(Seconds(0)));
  // The lookup, the lease, the campaign's put and the record's read, answered at once.
  for (int answer = 0; answer < 4; ++answer) EXPECT_TRUE(client_for_test_->DeliverOne(*e, At(Seconds(0))));
  EXPECT_EQ(h.Take(), "lead\nfound gpu-01:29500\n");
  client_for_test_->Deliver(*e, At(Seconds(1)));  // the quarantine's write
  EXPECT_EQ(h.Take(), "flushed\n");
  EXPECT_THAT(etcd_.Peek(e->election().state_key()).value_or(StoreEntry{}).value,
              ::testing::HasSubstr("quarantine=60000 1 gpu-03"));
}

TEST(JobRecordTest, FormatAndParseRoundTrip) {
  core::JobRecord s;
  s.next_round = 7;
  s.restarts_used = 3;
  s.round_may_run = true;
  s.workers_may_run = true;
  s.round_nodes = 5;
  s.holder = "spare 0 (gpu-09)";
  s.holder_agent = 9;
  s.fingerprint = "0123456789abcdef";
  s.quarantined = {core::QuarantinedHost{"gpu 03", Millis(1500), 2},
                   core::QuarantinedHost{"h", Seconds(0), 1}};
  s.exit_code = 1;
  s.summary = "job \"x\" FAILED\nroot cause: rank 3\nsummary=not a field\n";
  const auto back = core::ParseJobRecord(core::FormatJobRecord(s));
  ASSERT_TRUE(back);
  EXPECT_EQ(*back, s);
  EXPECT_FALSE(core::ParseJobRecord("something else"));
  EXPECT_FALSE(core::ParseJobRecord("ddprun-state=2\nnext_round=1\nrestarts=0\n"));
  EXPECT_FALSE(core::ParseJobRecord("ddprun-state=1\nnext_round=x\nrestarts=0\n"));
}

}  // namespace
}  // namespace ddprun::host
