// End-to-end tests of what may reach the master port: shared-secret joins, the node allowlist,
// and hostile or broken clients, against real agents on 127.0.0.1.

#include <arpa/inet.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/core/wire.h"
#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

/// Two nodes of one worker running `script`.
TestJob Job(uint16_t port, const std::string& script) {
  TestJob job;
  job.name = "sec";
  job.script = script;
  job.master_port = port;
  job.devices = 1;
  return job;
}

/// A raw TCP client on 127.0.0.1, optionally bound to another loopback source address.
int ConnectRaw(uint16_t port, const char* source = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (source) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &local.sin_addr);
    ::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local);
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(SecurityTest, AgentsWithTheWrongOrNoSecretAreRefusedAndTheJobGoesOn) {
  ScratchDir dir;
  const uint16_t port = FreePort();
  const std::string job = dir.Write("job.toml", Job(port, "sleep 0.5").Toml());
  dir.Write("secret", "correct horse\n");
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/n0.out",
                     {{"DDPRUN_SECRET_FILE", dir.path() + "/secret"}});
  AgentProcess wrong({job, "--node-rank", "1"}, dir.path() + "/wrong.out", {{"DDPRUN_SECRET", "guess"}});
  EXPECT_EQ(wrong.Wait(20s), 3) << node0.Output() << wrong.Output();
  EXPECT_THAT(wrong.Output(), HasSubstr("did not prove that it knows this node's shared secret: "
                                        "either the secrets of this node and node 0 differ"));
  AgentProcess none({job, "--node-rank", "1"}, dir.path() + "/none.out", {{"DDPRUN_SECRET", ""}});
  EXPECT_EQ(none.Wait(20s), 3) << none.Output();
  EXPECT_THAT(none.Output(), HasSubstr("has no shared secret and node 0 requires one"));
  // Node 0 may write its line after the refused agent has read the refusal and exited.
  EXPECT_TRUE(WaitFor([&] {
    return node0.Output().find("has no shared secret and node 0 requires one") != std::string::npos;
  }, 5s)) << node0.Output();
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out", {{"DDPRUN_SECRET", "correct horse"}});
  EXPECT_EQ(node1.Wait(30s), 0) << node1.Output();
  EXPECT_EQ(node0.Wait(30s), 0) << node0.Output();
  EXPECT_THAT(node0.Output(), ::testing::Not(HasSubstr("warning: no shared secret")));
}

// Issue 11: a secret on node 1 only. Node 0 used to start a round, then report "node 1 lost"
// and burn a restart; now both sides say why at once and no round starts.
TEST(SecurityTest, WithoutASecretNode0WarnsOnceAndRefusesASecretAgentWithTheReason) {
  ScratchDir dir;
  const uint16_t port = FreePort();
  TestJob spec = Job(port, "true");
  spec.max_restarts = 1;
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/n0.out", {{"DDPRUN_SECRET", ""}});
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out", {{"DDPRUN_SECRET", "x"}});
  EXPECT_EQ(node1.Wait(20s), 3) << node1.Output();
  const std::string reason = "has a shared secret (DDPRUN_SECRET or DDPRUN_SECRET_FILE) and node 0 has none";
  EXPECT_THAT(node1.Output(), HasSubstr(reason));
  EXPECT_TRUE(WaitFor([&] { return node0.Output().find(reason) != std::string::npos; }, 5s))
      << node0.Output();
  EXPECT_THAT(node0.Output(), HasSubstr("warning: no shared secret (DDPRUN_SECRET or DDPRUN_SECRET_FILE)"));
  node0.Signal(SIGTERM);
  EXPECT_EQ(node0.Wait(20s), 143) << node0.Output();
  EXPECT_THAT(node0.Output(), ::testing::Not(HasSubstr("round 0")));
  EXPECT_THAT(node0.Output(), ::testing::Not(HasSubstr("restart")));
}

// Issue 11: a fake listener on the master port captured a WANDB_API_KEY from job.env. With a
// secret the agent now sends only a hello (node rank, version, nonce) until the listener proves
// it knows the secret, and ends with the reason when it cannot.
TEST(SecurityTest, AFakeListenerLearnsNothingAboutTheJob) {
  ScratchDir dir;
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const uint16_t port = ntohs(addr.sin_port);
  TestJob spec = Job(port, "true");
  spec.extra = "[job.env]\nWANDB_API_KEY = \"sk-canary-1234\"\n";
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out", {{"DDPRUN_SECRET", "x"}});
  const int conn = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  std::string received;
  char buffer[4096];
  timeval timeout{1, 0};
  ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  // Read the agent's first frame (the 12-byte header says the payload length), then answer
  // at once: the agent gives up on a silent listener after 3 heartbeats.
  auto frame_complete = [&] {
    if (received.size() < 12) return false;
    const auto* b = reinterpret_cast<const unsigned char*>(received.data());
    const size_t payload = b[8] | (b[9] << 8) | (b[10] << 16) | (static_cast<size_t>(b[11]) << 24);
    return received.size() >= 12 + payload;
  };
  for (ssize_t n; !frame_complete() && (n = ::recv(conn, buffer, sizeof buffer, 0)) > 0;) {
    received.append(buffer, static_cast<size_t>(n));
  }
  ASSERT_TRUE(frame_complete()) << received.size() << " bytes" << node1.Output();
  // A challenge whose proof is wrong: the agent must give up without sending the job.
  const auto challenge = wire::Encode(wire::Challenge{"0123456789abcdef", std::string(64, '0')});
  ASSERT_EQ(::send(conn, challenge.data(), challenge.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(challenge.size()));
  EXPECT_EQ(node1.Wait(10s), 3) << node1.Output();
  for (ssize_t n; (n = ::recv(conn, buffer, sizeof buffer, 0)) > 0;) received.append(buffer, static_cast<size_t>(n));
  ::close(conn);
  ::close(listener);
  EXPECT_FALSE(received.empty());
  EXPECT_EQ(received.find("sk-canary-1234"), std::string::npos);
  EXPECT_EQ(received.find("WANDB"), std::string::npos);
  EXPECT_EQ(received.find("true"), std::string::npos) << "not even the command";
  EXPECT_THAT(node1.Output(), HasSubstr("did not prove that it knows this node's shared secret"));
}

TEST(SecurityTest, OnlyListedNodesMayConnect) {
  ScratchDir dir;
  const uint16_t port = FreePort();
  TestJob spec = Job(port, "sleep 1");
  spec.nodes = {"127.0.0.1", "127.0.0.3"};
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/n0.out");
  ASSERT_TRUE(WaitFor([&] { return node0.Output().find("joined from") != std::string::npos; }, 10s))
      << node0.Output();
  // 127.0.0.2 is on this machine's loopback but not in cluster.nodes.
  const int fd = ConnectRaw(port, "127.0.0.2");
  ASSERT_GE(fd, 0);
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0) << "the connection must be closed at once";
  ::close(fd);
  EXPECT_TRUE(WaitFor([&] {
    return node0.Output().find("refused a connection from 127.0.0.2: not one of cluster.nodes") != std::string::npos;
  }, 5s)) << node0.Output();
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out");
  EXPECT_EQ(node1.Wait(30s), 0) << node1.Output();
  EXPECT_EQ(node0.Wait(30s), 0) << node0.Output();
}

TEST(SecurityTest, GarbageTruncatedOversizedAndSilentClientsAreDroppedAndTheJobGoesOn) {
  ScratchDir dir;
  const uint16_t port = FreePort();
  const std::string job = dir.Write("job.toml", Job(port, "sleep 2").Toml());
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/n0.out");
  ASSERT_TRUE(WaitFor([&] { return node0.Output().find("joined from") != std::string::npos; }, 10s));
  auto send_and_keep = [&](const std::string& bytes) {
    const int fd = ConnectRaw(port);
    EXPECT_GE(fd, 0);
    if (!bytes.empty()) {
      EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    }
    return fd;
  };
  const std::string magic = "DDPR";
  std::vector<int> fds;
  fds.push_back(send_and_keep(magic + std::string("\x09\x01\0\0\0\0\0\0", 8)));           // bad version
  fds.push_back(send_and_keep(magic + std::string("\x01\x01\0\0\xff\xff\xff\x7f", 8)));   // 2 GiB frame
  fds.push_back(send_and_keep(magic + std::string("\x01\x63\0\0\0\0\0\0", 8)));           // unknown type
  fds.push_back(send_and_keep(magic + std::string("\x01\x01\0\0\x40\0\0\0", 8) + "ab"));  // truncated
  fds.push_back(send_and_keep(""));                                                      // silent
  // Node 0 has dropped the three it can judge at once before node 1 joins, rather than
  // before the job's two seconds run out.
  const std::vector<std::string> dropped = {"protocol error: unsupported protocol version 9",
                                            "protocol error: frame of 2147483647 bytes is over the limit",
                                            "protocol error: unknown message type 99"};
  EXPECT_TRUE(WaitFor([&] {
    const std::string out = node0.Output();
    for (const std::string& line : dropped) {
      if (out.find(line) == std::string::npos) return false;
    }
    return true;
  }, 10s)) << node0.Output();
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out");
  EXPECT_EQ(node1.Wait(30s), 0) << node1.Output();
  EXPECT_EQ(node0.Wait(30s), 0) << node0.Output();
  for (int fd : fds) ::close(fd);
}

}  // namespace
}  // namespace ddprun::e2e
