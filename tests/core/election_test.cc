// core::Election on its own, sans-IO: inputs in, effects and deadlines out, with the store's
// answers written by hand. The role against a model of etcd is tests/host/elected_role_test.cc.
#include "runner/core/election.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/core/core_test_util.h"

namespace ddprun::core {
namespace {

using namespace std::chrono_literals;
namespace e = election;

using test::At;

class CoreElectionTest : public ::testing::Test {
 protected:
  CoreElectionTest()
      : spec_(test::SpecFromToml(test::kTwoNodeEtcdJob)),
        election_(spec_, "1a2b3c4d5e6f", 1, "gpu-02:29500") {}

  std::vector<e::Effect> Feed(Duration at, const e::Input& input) {
    std::vector<e::Effect> out;
    election_.Handle(At(at), input, out);
    return out;
  }
  template <typename T>
  static const T& Only(const std::vector<e::Effect>& effects) {
    EXPECT_EQ(effects.size(), 1u);
    const T* effect = effects.empty() ? nullptr : std::get_if<T>(&effects.front());
    EXPECT_NE(effect, nullptr);
    static const T none{};
    return effect ? *effect : none;
  }
  /// Lookup, campaign and read at `at` with no earlier holder and no record: leading.
  void Lead(Duration at) {
    const uint64_t get = Only<e::Get>(Feed(at, e::Lookup{})).tag;
    const uint64_t grant = Only<e::Grant>(Feed(at, e::Answer{.tag = get})).tag;
    const auto put = Only<e::PutIf>(Feed(at, e::Answer{.tag = grant, .lease = 77, .ttl = 6s}));
    EXPECT_EQ(put.create_revision, 0);  // only when the role's key is absent
    EXPECT_EQ(put.lease, 77);
    const uint64_t read =
        Only<e::Get>(Feed(at, e::Answer{.tag = put.tag, .succeeded = true, .revision = 9})).tag;
    const auto led = Feed(at, e::Answer{.tag = read});
    ASSERT_EQ(led.size(), 2u);
    EXPECT_TRUE(std::holds_alternative<e::Lead>(led[0]));
    ASSERT_TRUE(std::holds_alternative<e::Continue>(led[1]));
    EXPECT_EQ(std::get<e::Continue>(led[1]).step, e::Step::kAfterLead);
    // The lookup that started it is answered once the host carried Lead out.
    EXPECT_EQ(Only<e::Found>(Feed(at, e::Resume{e::Step::kAfterLead})).endpoint, "gpu-02:29500");
    ASSERT_TRUE(election_.leading());
  }

  JobSpec spec_;
  Election election_;
};

TEST_F(CoreElectionTest, ACampaignAsksTheStoreStepByStepAndLeads) {
  Lead(0s);
  EXPECT_FALSE(election_.inherited_job());
  // The holder answers its own lookups at once.
  EXPECT_EQ(Only<e::Found>(Feed(1s, e::Lookup{})).endpoint, "gpu-02:29500");
}

TEST_F(CoreElectionTest, ALookupThatFindsAHolderConnectsThere) {
  const auto get = Only<e::Get>(Feed(0s, e::Lookup{}));
  EXPECT_EQ(get.key, "/team/llm/coordinator");
  EXPECT_TRUE(Feed(0s, e::Lookup{}).empty());  // the answer is on its way: no second call
  const e::Entry holder{
      .value = "agent=0\nendpoint=gpu-01:29500\nname=node 0", .create_revision = 4, .lease = 5};
  EXPECT_EQ(Only<e::Found>(Feed(1s, e::Answer{.tag = get.tag, .entry = holder})).endpoint, "gpu-01:29500");
  EXPECT_FALSE(election_.leading());
  // A holder's key without an endpoint is no answer.
  const auto again = Only<e::Get>(Feed(2s, e::Lookup{}));
  EXPECT_EQ(
      Only<e::LookupFailed>(Feed(2s, e::Answer{.tag = again.tag, .entry = e::Entry{.value = "agent=0"}})).why,
      "etcd: /team/llm/coordinator holds no endpoint");
}

TEST_F(CoreElectionTest, WritesAreFencedAndAnsweredInOrderThroughContinue) {
  Lead(0s);
  const auto put = Only<e::PutIf>(Feed(1s, CommitRound{.round = 3, .restarts_used = 1, .nodes = 2}));
  EXPECT_EQ(put.compare_key, "/team/llm/coordinator");
  EXPECT_EQ(put.create_revision, 9);  // fenced by the role key's create revision
  EXPECT_EQ(put.key, "/team/llm/state");
  EXPECT_NE(put.value.find("next_round=4\n"), std::string::npos);
  // A record while the write is in flight waits for it.
  EXPECT_TRUE(Feed(1s, RecordEnd{.exit_code = 0, .summary = "done"}).empty());
  EXPECT_TRUE(election_.Writing());

  const auto committed = Feed(2s, e::Answer{.tag = put.tag, .succeeded = true});
  ASSERT_EQ(committed.size(), 2u);
  EXPECT_EQ(std::get<e::Committed>(committed[0]).round, 3);
  EXPECT_EQ(std::get<e::Continue>(committed[1]).step, e::Step::kAfterCommit);
  // Going on, the waiting record is written: the verdict.
  const auto end = Only<e::PutIf>(Feed(2s, e::Resume{e::Step::kAfterCommit}));
  EXPECT_NE(end.value.find("exit=0\nsummary=done"), std::string::npos);
  const auto written = Feed(3s, e::Answer{.tag = end.tag, .succeeded = true});
  ASSERT_EQ(written.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<e::EndWritten>(written[0]));
  EXPECT_EQ(std::get<e::Continue>(written[1]).step, e::Step::kAfterEnd);
  Only<e::Flushed>(Feed(3s, e::Resume{e::Step::kAfterEnd}));
  EXPECT_FALSE(election_.Writing());
}

// A simulator's quiet stretch passes over an election only when it waits on nothing but its
// own deadlines (sim/quiet.cc ends the stretch before NextDeadline).
TEST_F(CoreElectionTest, ItIsQuietOnlyWhenNothingIsUnderWayButItsOwnDeadlines) {
  EXPECT_FALSE(election_.Quiet());  // its agent has not taken part yet
  Feed(0s, e::TookPart{});
  EXPECT_TRUE(election_.Quiet());
  const uint64_t get = Only<e::Get>(Feed(0s, e::Lookup{})).tag;
  EXPECT_FALSE(election_.Quiet());  // a lookup waits
  const e::Entry holder{
      .value = "agent=0\nendpoint=gpu-01:29500\nname=node 0", .create_revision = 4, .lease = 5};
  Only<e::Found>(Feed(0s, e::Answer{.tag = get, .entry = holder}));
  EXPECT_TRUE(election_.Quiet());  // a follower that found the holder
}

TEST_F(CoreElectionTest, ALeaderIsQuietBetweenItsKeepAlivesAndWrites) {
  Feed(0s, e::TookPart{});
  Lead(0s);
  EXPECT_TRUE(election_.Quiet());
  const auto next = election_.NextDeadline();
  ASSERT_TRUE(next);
  const auto keepalive = Only<e::KeepAlive>(Feed(next->time_since_epoch(), Tick{}));
  EXPECT_FALSE(election_.Quiet());  // its answer is on its way
  Feed(next->time_since_epoch(), e::Answer{.tag = keepalive.tag, .ttl = 6s});
  EXPECT_TRUE(election_.Quiet());
  const auto put = Only<e::PutIf>(Feed(3s, CommitRound{.round = 0, .restarts_used = 0, .nodes = 2}));
  EXPECT_FALSE(election_.Quiet());                         // a write in flight
  Feed(3s, e::Answer{.tag = put.tag, .succeeded = true});  // the host carries Committed out at once
  Feed(3s, e::Resume{e::Step::kAfterCommit});
  EXPECT_TRUE(election_.Quiet());
  Only<e::Revoke>(Feed(4s, e::Resign{}));
  EXPECT_FALSE(election_.Quiet());  // the revoke is not answered
}

TEST_F(CoreElectionTest, ARoleLetGoWhileTheHostCarriedANotificationOutGoesNoFurther) {
  Lead(0s);
  const auto put = Only<e::PutIf>(Feed(1s, CommitRound{.round = 0, .restarts_used = 0, .nodes = 2}));
  Feed(1s, RecordEnd{.exit_code = 1, .summary = "x"});
  Feed(2s, e::Answer{.tag = put.tag, .succeeded = true});
  // The host's coordinator gave the role up on hearing Committed.
  const auto revoke = Only<e::Revoke>(Feed(2s, e::Resign{}));
  EXPECT_EQ(revoke.lease, 77);
  EXPECT_TRUE(Feed(2s, e::Resume{e::Step::kAfterCommit}).empty());  // no write after the revoke
  EXPECT_TRUE(election_.Revoking());
  Only<e::Flushed>(Feed(3s, e::Answer{.tag = revoke.tag}));
  EXPECT_FALSE(election_.Revoking());
}

TEST_F(CoreElectionTest, TheDeadlineTableRenewsAndStepsDown) {
  Lead(0s);
  // Renewal a third of the lease after the grant was asked for; step-down a fifth before it ends.
  EXPECT_EQ(election_.NextDeadline(), At(2s));
  EXPECT_TRUE(Feed(1s, Tick{}).empty());
  const auto keepalive = Only<e::KeepAlive>(Feed(2s, Tick{}));
  EXPECT_EQ(keepalive.lease, 77);
  // While the renewal is in flight only the step-down is due: 6 s - 1.2 s.
  EXPECT_EQ(election_.NextDeadline(), At(4800ms));
  const auto stepped = Feed(4800ms, Tick{});
  ASSERT_EQ(stepped.size(), 2u);
  EXPECT_EQ(std::get<e::Revoke>(stepped[0]).lease, 77);
  EXPECT_EQ(std::get<e::SteppedDown>(stepped[1]).why,
            "it could not renew its etcd lease (rendezvous.lease = 6s) in time");
  EXPECT_FALSE(election_.leading());
  EXPECT_FALSE(election_.NextDeadline());
  // The late renewal is no longer waited for.
  EXPECT_TRUE(Feed(5s, e::Answer{.tag = keepalive.tag, .ttl = 6s}).empty());
}

TEST_F(CoreElectionTest, ARenewalMovesTheStepDown) {
  Lead(0s);
  const auto keepalive = Only<e::KeepAlive>(Feed(2s, Tick{}));
  EXPECT_TRUE(Feed(2100ms, e::Answer{.tag = keepalive.tag, .ttl = 6s}).empty());
  EXPECT_EQ(election_.NextDeadline(), At(4s));    // the next renewal, from the send time
  EXPECT_TRUE(Feed(4800ms, Tick{}).size() == 1);  // a renewal, no step-down: 2 s + 6 s - 1.2 s is later
  EXPECT_TRUE(election_.leading());
}

TEST_F(CoreElectionTest, TimeThatMovesBackIsAnAssertion) {
  Feed(5s, e::Lookup{});
  Feed(5s, Tick{});  // the same instant is fine
  EXPECT_DEATH(Feed(4s, Tick{}), "assertion failed: !last_input_ \\|\\| now >= \\*last_input_");
}

}  // namespace
}  // namespace ddprun::core
