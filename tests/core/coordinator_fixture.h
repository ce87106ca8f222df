#pragma once
// The coordinator tests' fixture: the shared driver (its Feed checks the next deadline) with
// their vocabulary: nodes by connection id, joins whose instance a test may choose, the first
// round started, heartbeats. Included by coordinator_test.cc, coordinator_end_test.cc and
// coordinator_etcd_test.cc.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "runner/core/coordinator.h"
#include "schema/canonical.h"
#include "tests/core/core_test_util.h"
#include "tests/core/drivers.h"

// Not in an anonymous namespace: googletest needs one fixture class per suite across the
// files.
namespace ddprun::core {

using namespace std::chrono_literals;
using test::All;
using test::At;
using test::Edit;
using test::FindLog;
using test::kTwoNodeJob;
using test::Meaningful;
using test::Sent;
using test::SpecFromToml;
using Effects = std::vector<CoordinatorEffect>;

constexpr Duration kNs = Duration(1);

inline ConnId ConnOf(int node) { return 100 + static_cast<ConnId>(node); }

// The shared driver (its Feed checks the next deadline), with this file's vocabulary: nodes by
// connection id, and joins whose instance a test may choose.
class CoordinatorTest : public ::testing::Test, public test::CoordinatorDriver {
 protected:
  void SetUp() override { UseJob(kTwoNodeJob); }

  void UseJob(std::string_view toml) { Use(toml); }
  Effects Tick(Duration at) { return Feed(at, core::Tick{}); }

  Effects Send(Duration at, ConnId conn, wire::Message message) {
    return Feed(at, PeerMessage{conn, std::move(message)});
  }
  Effects Connect(Duration at, ConnId conn, std::string addr) {
    return Feed(at, PeerAccepted{conn, std::move(addr)});
  }

  wire::Join JoinOf(int node, uint64_t instance = 0) const {
    return wire::Join{node,
                      fmt::format("gpu-0{}", node + 1),
                      spec_->cluster.nproc_per_node,
                      "0.1.0",
                      FingerprintOfCanonical(canonical_),
                      canonical_,
                      instance == 0 ? 1000 + static_cast<uint64_t>(node) : instance,
                      "",
                      "",
                      ""};
  }

  /// Both nodes join at `at` and the host answers the store port reservation.
  Effects StartFirstRound(Duration at, uint16_t port = 41000) {
    Join(at, 0);
    Effects reserve = Join(at, 1);
    EXPECT_EQ(All<ReserveStorePort>(reserve).size(), 1u) << test::Describe(reserve);
    return Feed(at, StorePortReady{0, port});
  }

  /// Every listed node sends a heartbeat at `at`; returns everything that happened.
  Effects Beat(Duration at, std::vector<int> nodes = {0, 1}) {
    Effects all;
    for (int node : nodes) {
      Effects e = Send(at, ConnOf(node), wire::Heartbeat{});
      all.insert(all.end(), e.begin(), e.end());
    }
    return all;
  }

  /// Heartbeats from `nodes` every second in (from, to]; returns the meaningful effects.
  Effects BeatUntil(Duration from, Duration to, std::vector<int> nodes = {0, 1}) {
    Effects all;
    for (Duration t = from + 1s; t <= to; t += 1s) {
      Effects e = Meaningful(Beat(t, nodes));
      all.insert(all.end(), e.begin(), e.end());
    }
    return all;
  }

  wire::WorkerFailed RankThreeFailed(int round, std::string stderr_tail = "RuntimeError: boom\n",
                                     std::string error_file = "") const {
    return wire::WorkerFailed{round, 3, 1, 1, 0, std::move(stderr_tail), std::move(error_file)};
  }
};

}  // namespace ddprun::core
