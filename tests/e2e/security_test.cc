// End-to-end tests of what may reach the master port: shared-secret joins, the node allowlist,
// and hostile or broken clients, against real agents on 127.0.0.1.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runner/core/wire.h"
#include "tests/e2e/harness.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
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

/// A listener on 127.0.0.1:`port` (0: any) that answers the first frame of every connection
/// with `answer` and keeps the connection until the peer closes it: an impostor on the master
/// port. It serves from its own thread until destroyed.
class Impostor {
 public:
  Impostor(uint16_t port, wire::Message answer) : answer_(wire::Encode(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(fd_, 16) == 0;
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (bound_) thread_ = std::thread([this] { Serve(); });
  }
  ~Impostor() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  bool bound() const { return bound_; }
  uint16_t port() const { return port_; }
  int connections() const { return connections_; }

 private:
  void Serve() {
    std::vector<int> open;
    std::vector<std::string> received;
    while (!stop_) {
      std::vector<pollfd> fds{{fd_, POLLIN, 0}};
      for (int conn : open) fds.push_back({conn, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        if (const int conn = ::accept(fd_, nullptr, nullptr); conn >= 0) {
          open.push_back(conn);
          received.emplace_back();
          ++connections_;
        }
      }
      for (size_t i = fds.size() - 1; i >= 1; --i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buffer[4096];
        const ssize_t n = ::recv(open[i - 1], buffer, sizeof buffer, 0);
        std::string& got = received[i - 1];
        const bool complete_before = got.size() >= wire::kHeaderSize;
        if (n > 0) got.append(buffer, static_cast<size_t>(n));
        if (n > 0 && !complete_before && got.size() >= wire::kHeaderSize) {
          ::send(open[i - 1], answer_.data(), answer_.size(), MSG_NOSIGNAL);
        }
        if (n <= 0) {
          ::close(open[i - 1]);
          open.erase(open.begin() + static_cast<long>(i - 1));
          received.erase(received.begin() + static_cast<long>(i - 1));
        }
      }
    }
    for (int conn : open) ::close(conn);
  }

  std::vector<uint8_t> answer_;
  int fd_ = -1;
  bool bound_ = false;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

/// Hostile text a peer might send: it retitles the window, clears the screen and claims success.
const std::string kHostileText = "\x1b]0;owned\x07\x1b[2J\x1b[31mjob \"sec\" succeeded";

// Issue 25: a listener on the master port that answered the hello with JobEnd(0) made the
// agent print "job succeeded" and exit 0, and a Reject was believed and printed raw. Now an
// agent with a secret believes nothing before the proof: it retries, and exits 3 at its
// rendezvous timeout with the reason; nothing the impostor wrote reaches the console.
TEST(SecurityTest, AnImpostorOnTheMasterPortCanNeitherEndNorFoolAnAgentWithASecret) {
  for (const wire::Message& answer :
       std::vector<wire::Message>{wire::JobEnd{0, kHostileText}, wire::Reject{kHostileText, false}}) {
    SCOPED_TRACE(wire::MessageName(answer));
    ScratchDir dir;
    Impostor impostor(0, answer);
    ASSERT_TRUE(impostor.bound());
    TestJob spec = Job(impostor.port(), "true");
    spec.rendezvous = "4s";
    const std::string job = dir.Write("job.toml", spec.Toml());
    AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out", {{"DDPRUN_SECRET", "x"}});
    EXPECT_EQ(node1.Wait(20s), 3) << node1.Output();
    const std::string out = node1.Output();
    EXPECT_THAT(out, HasSubstr(fmt::format("answered with a {} message before proving that it "
                                           "knows this node's shared secret; not believed",
                                           wire::MessageName(answer))));
    EXPECT_THAT(out, HasSubstr("rendezvous failed: node 1 could not join the coordinator"));
    EXPECT_THAT(out, Not(HasSubstr("succeeded")));
    EXPECT_THAT(out, Not(HasSubstr("owned")));
    EXPECT_EQ(out.find('\x1b'), std::string::npos) << "no escape code reaches the console";
    EXPECT_GE(impostor.connections(), 2) << "it tried again";
  }
}

// Issue 25: the same after node 0 crashed and an impostor took its port: the agent that lost
// its coordinator must not hear the job's end from the impostor.
TEST(SecurityTest, AnImpostorOnADeadCoordinatorsPortCannotEndTheJob) {
  ScratchDir dir;
  const uint16_t port = FreePort();
  TestJob spec = Job(port, "sleep 60");
  spec.rendezvous = "5s";
  const std::string job = dir.Write("job.toml", spec.Toml());
  const std::map<std::string, std::string> secret = {{"DDPRUN_SECRET", "correct horse"}};
  auto node0 = std::make_unique<AgentProcess>(std::vector<std::string>{job, "--node-rank", "0"},
                                              dir.path() + "/n0.out", secret);
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out", secret);
  ASSERT_TRUE(WaitFor([&] { return node1.Output().find("round 0") != std::string::npos; }, 20s))
      << node0->Output() << node1.Output();
  node0->Signal(SIGKILL);
  ASSERT_EQ(node0->Wait(10s), 137);
  Impostor impostor(port, wire::JobEnd{0, kHostileText});
  ASSERT_TRUE(impostor.bound()) << "the dead coordinator's port is free again";
  EXPECT_EQ(node1.Wait(30s), 3) << node1.Output();
  const std::string out = node1.Output();
  EXPECT_THAT(out, HasSubstr("lost the coordinator"));
  EXPECT_THAT(out, HasSubstr("answered with a job-end message before proving"));
  EXPECT_THAT(out, Not(HasSubstr("succeeded")));
  EXPECT_EQ(out.find('\x1b'), std::string::npos);
  EXPECT_GE(impostor.connections(), 1);
}

// Issue 25: on an open channel (no secret) nothing can be proven, but a peer's text is still
// escaped before it reaches the terminal.
TEST(SecurityTest, APeersTextIsEscapedBeforeItReachesTheConsole) {
  ScratchDir dir;
  Impostor impostor(0, wire::Reject{kHostileText, false});
  ASSERT_TRUE(impostor.bound());
  const std::string job = dir.Write("job.toml", Job(impostor.port(), "true").Toml());
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out", {{"DDPRUN_SECRET", ""}});
  EXPECT_EQ(node1.Wait(20s), 3) << node1.Output();
  const std::string out = node1.Output();
  EXPECT_THAT(out, HasSubstr("the coordinator refused this node: <U+001B>]0;owned<U+0007><U+001B>[2J"
                             "<U+001B>[31mjob \"sec\" succeeded"));
  EXPECT_EQ(out.find('\x1b'), std::string::npos);
}

// Issue 25: a worker's traceback is relayed to the root-cause summary on every node; what it
// holds reaches the terminal escaped there (the workers' own live lines, off here with
// logs.console = "none", are the job's output and pass as they are).
TEST(SecurityTest, AWorkersTracebackIsEscapedInTheSummary) {
  ScratchDir dir;
  TestJob spec = Job(FreePort(), "printf 'Traceback\\033]0;owned\\007\\033[2J boom\\n' >&2; exit 1");
  spec.nnodes = 1;
  spec.max_restarts = 0;
  spec.extra = "[logs]\nconsole = \"none\"\n";
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess node0({job}, dir.path() + "/n0.out", {{"DDPRUN_SECRET", ""}});
  EXPECT_EQ(node0.Wait(20s), 1) << node0.Output();
  const std::string out = node0.Output();
  EXPECT_THAT(out, HasSubstr("Traceback<U+001B>]0;owned<U+0007><U+001B>[2J boom"));
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
}

TEST(SecurityTest, AgentsWithTheWrongOrNoSecretAreRefusedAndTheJobGoesOn) {
  ScratchDir dir;
  const uint16_t port = FreePort();
  const std::string job = dir.Write("job.toml", Job(port, "sleep 0.5").Toml());
  dir.Write("secret", "correct horse\n");
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/n0.out",
                     {{"DDPRUN_SECRET_FILE", dir.path() + "/secret"}});
  // A wrong secret: the agent says so at once and keeps trying (node 0 might be an impostor's
  // port for a while); node 0 names the node that failed the challenge.
  AgentProcess wrong({job, "--node-rank", "1"}, dir.path() + "/wrong.out", {{"DDPRUN_SECRET", "guess"}});
  EXPECT_TRUE(WaitFor(
      [&] {
        return wrong.Output().find(
                   "did not prove that it knows this node's shared secret: either the "
                   "secrets of this node and node 0 differ") != std::string::npos;
      },
      10s))
      << wrong.Output();
  EXPECT_TRUE(WaitFor(
      [&] {
        return node0.Output().find(
                   "claiming node rank 1 closed the connection without answering the "
                   "shared-secret challenge: its DDPRUN_SECRET (or DDPRUN_SECRET_FILE) "
                   "differs from node 0's") != std::string::npos;
      },
      10s))
      << node0.Output();
  wrong.Signal(SIGTERM);
  EXPECT_EQ(wrong.Wait(10s), 143) << wrong.Output();
  AgentProcess none({job, "--node-rank", "1"}, dir.path() + "/none.out", {{"DDPRUN_SECRET", ""}});
  EXPECT_EQ(none.Wait(20s), 3) << none.Output();
  EXPECT_THAT(none.Output(), HasSubstr("has no shared secret and node 0 requires one"));
  // Node 0 may write its line after the refused agent has read the refusal and exited.
  EXPECT_TRUE(WaitFor(
      [&] {
        return node0.Output().find("has no shared secret and node 0 requires one") != std::string::npos;
      },
      5s))
      << node0.Output();
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out", {{"DDPRUN_SECRET", "correct horse"}});
  EXPECT_EQ(node1.Wait(30s), 0) << node1.Output();
  EXPECT_EQ(node0.Wait(30s), 0) << node0.Output();
  EXPECT_THAT(node0.Output(), ::testing::Not(HasSubstr("warning: no shared secret")));
}

// Issue 25: with a wrong secret on node 1 only, node 0 said "never joined: node 1" and
// suggested a firewall. Its rendezvous summary now says node 1 failed the challenge.
TEST(SecurityTest, Node0SaysWhichNodeFailedTheChallenge) {
  ScratchDir dir;
  const uint16_t port = FreePort();
  TestJob spec = Job(port, "true");
  spec.rendezvous = "4s";
  const std::string job = dir.Write("job.toml", spec.Toml());
  AgentProcess node0({job, "--node-rank", "0"}, dir.path() + "/n0.out", {{"DDPRUN_SECRET", "a"}});
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out", {{"DDPRUN_SECRET", "b"}});
  EXPECT_EQ(node0.Wait(20s), 3) << node0.Output();
  EXPECT_EQ(node1.Wait(20s), 3) << node1.Output();
  const std::string out = node0.Output();
  EXPECT_THAT(out, HasSubstr("rendezvous failed: 1/2 nodes joined within timeouts.rendezvous = 4s; "
                             "refused: node 1: a peer from 127.0.0.1 claiming this rank "
                             "left without answering the shared-secret challenge: its secret "
                             "differs from node 0's"));
  EXPECT_THAT(out, Not(HasSubstr("never joined")));
  EXPECT_THAT(out, Not(HasSubstr("firewall")));
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
  // Node 0's refusal is unproven, so node 1 does not believe it (issue 25): it says that node 0
  // may run without a secret and keeps trying; node 0 says why it refuses.
  EXPECT_TRUE(WaitFor(
      [&] {
        return node1.Output().find(
                   "answered with a reject message before proving that it knows this "
                   "node's shared secret; not believed (node 0 refuses a node with a "
                   "secret when it has none") != std::string::npos;
      },
      10s))
      << node1.Output();
  const std::string reason = "has a shared secret (DDPRUN_SECRET or DDPRUN_SECRET_FILE) and node 0 has none";
  EXPECT_TRUE(WaitFor([&] { return node0.Output().find(reason) != std::string::npos; }, 5s))
      << node0.Output();
  node1.Signal(SIGTERM);
  EXPECT_EQ(node1.Wait(10s), 143) << node1.Output();
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
  spec.rendezvous = "3s";
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
  // A challenge whose proof is wrong: the agent must leave without sending the job (and, not
  // believing it, tries again until its rendezvous timeout).
  const auto challenge = wire::Encode(wire::Challenge{"0123456789abcdef", std::string(64, '0')});
  ASSERT_EQ(::send(conn, challenge.data(), challenge.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(challenge.size()));
  EXPECT_EQ(node1.Wait(10s), 3) << node1.Output();
  for (ssize_t n; (n = ::recv(conn, buffer, sizeof buffer, 0)) > 0;)
    received.append(buffer, static_cast<size_t>(n));
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
  EXPECT_TRUE(WaitFor(
      [&] {
        return node0.Output().find("refused a connection from 127.0.0.2: not one of cluster.nodes") !=
               std::string::npos;
      },
      5s))
      << node0.Output();
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
  fds.push_back(send_and_keep(""));                                                       // silent
  // Node 0 has dropped the three it can judge at once before node 1 joins, rather than
  // before the job's two seconds run out.
  const std::vector<std::string> dropped = {"protocol error: unsupported protocol version 9",
                                            "protocol error: frame of 2147483647 bytes is over the limit",
                                            "protocol error: unknown message type 99"};
  EXPECT_TRUE(WaitFor(
      [&] {
        const std::string out = node0.Output();
        for (const std::string& line : dropped) {
          if (out.find(line) == std::string::npos) return false;
        }
        return true;
      },
      10s))
      << node0.Output();
  AgentProcess node1({job, "--node-rank", "1"}, dir.path() + "/n1.out");
  EXPECT_EQ(node1.Wait(30s), 0) << node1.Output();
  EXPECT_EQ(node0.Wait(30s), 0) << node0.Output();
  for (int fd : fds) ::close(fd);
}

}  // namespace
}  // namespace ddprun::e2e
