// The simulated network built alone from its handles (sim/parts.h), without a Cluster: a
// connection delivers in order, and a partition holds bytes until it heals.

#include "sim/network.h"

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "schema/loader.h"
#include "sim/invariants.h"
#include "sim/node.h"
#include "sim/sim_log.h"
#include "tests/sim/sim_test_util.h"

namespace ddprun::sim {
namespace {

// What one node's transport heard, in order.
class Heard final : public host::TransportEvents {
 public:
  void OnAccepted(core::ConnId conn, std::string) override { lines.push_back(Line("accepted", conn)); }
  void OnConnected(core::ConnId conn) override { lines.push_back(Line("connected", conn)); }
  void OnConnectFailed(core::ConnId conn, core::ConnectError, std::string detail) override {
    lines.push_back(Line("failed", conn) + " " + detail);
  }
  void OnData(core::ConnId conn, std::span<const uint8_t> bytes) override {
    lines.push_back(Line("data", conn) + " " + std::string(bytes.begin(), bytes.end()));
  }
  void OnClosed(core::ConnId conn, std::string reason) override {
    lines.push_back(Line("closed", conn) + " " + reason);
  }
  std::vector<std::string> lines;

 private:
  static std::string Line(const char* what, core::ConnId conn) {
    return std::string(what) + " " + std::to_string(conn);
  }
};

class NoPhases final : public PhaseSource {
 public:
  NodePhase PhaseOf(uint32_t, int*) const override { return NodePhase::kRendezvous; }
};

class NetworkTest : public ::testing::Test {
 protected:
  NetworkTest()
      : spec_(*ParseJobText(ddprun::testing::SmallJob(), "job.toml").spec),
        invariants_(InvariantBounds{}, [](int64_t) {}),
        log_(&out_, nullptr, loop_, nodes_, phases_, false),
        network_(Handles{loop_, nodes_, log_, stats_, invariants_}, spec_, NetworkOptions{}, 7) {
    stats_.messages_by_node.assign(2, 0);
    for (uint32_t i = 0; i < 2; ++i) {
      auto node = std::make_unique<Node>(nullptr, i);  // its ports are never called here
      node->index = i;
      node->label = "node " + std::to_string(i);
      node->addr = "10.0.0." + std::to_string(i + 1);
      node->up = true;
      node->tevents = &heard_[i];
      nodes_.Add(std::move(node));
      invariants_.AddNode(i, nodes_.Label(i));
      network_.AddNode();
    }
  }

  // The event loop, for the network's events only.
  void RunUntil(int64_t until_ns) {
    while (!loop_.queue.Empty() && loop_.queue.NextTime().time_since_epoch().count() <= until_ns) {
      const Event event = loop_.queue.Pop();
      loop_.now_ns = event.time_ns;
      if (event.kind == EventKind::kConnectDone) network_.ConnectDone(event.target);
      if (event.kind == EventKind::kAccept) network_.Accept(event.target);
      if (event.kind == EventKind::kPump) network_.Pump(event.target, event.side);
    }
    loop_.now_ns = until_ns;
  }

  static std::vector<uint8_t> Bytes(const std::string& text) { return {text.begin(), text.end()}; }

  JobSpec spec_;
  Loop loop_;
  Nodes nodes_;
  SimStats stats_;
  Invariants invariants_;
  NoPhases phases_;
  std::ostringstream out_;
  SimLog log_;
  Network network_;
  Heard heard_[2];
};

TEST_F(NetworkTest, DeliversInOrderAndHoldsBytesWhileAPartitionLasts) {
  ASSERT_TRUE(network_.Listen(0, spec_.cluster.master_addr, spec_.cluster.master_port));
  const core::ConnId conn = network_.Connect(1, spec_.cluster.master_addr, spec_.cluster.master_port);
  RunUntil(Seconds(1).count());
  ASSERT_EQ(heard_[1].lines, std::vector<std::string>{"connected " + std::to_string(conn)});
  ASSERT_EQ(heard_[0].lines.size(), 1u);
  network_.Send(1, conn, Bytes("a"));
  network_.Send(1, conn, Bytes("b"));
  RunUntil(Seconds(2).count());
  EXPECT_EQ(heard_[0].lines.size(), 3u);
  EXPECT_EQ(heard_[0].lines[1].substr(heard_[0].lines[1].size() - 1), "a");
  EXPECT_EQ(heard_[0].lines[2].substr(heard_[0].lines[2].size() - 1), "b");

  network_.Partition(1, {0}, false);
  EXPECT_TRUE(network_.partitioned());
  network_.Send(1, conn, Bytes("c"));
  RunUntil(Minutes(5).count());
  EXPECT_EQ(heard_[0].lines.size(), 3u) << "a partition holds the bytes";
  network_.Partition(1, {0}, true);
  RunUntil(Minutes(5).count() + Seconds(1).count());
  ASSERT_EQ(heard_[0].lines.size(), 4u) << "healed, TCP delivers what it held";
  EXPECT_EQ(heard_[0].lines[3].substr(heard_[0].lines[3].size() - 1), "c");
  EXPECT_EQ(stats_.messages, 3u);
}

}  // namespace
}  // namespace ddprun::sim
