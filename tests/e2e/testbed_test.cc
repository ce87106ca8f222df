// The multi-host test bed itself (tests/e2e/testbed.h): host names, stock /etc/hosts, the data
// and management NICs, firewall rules, private and shared homes, and that it leaves nothing behind.

#include <unistd.h>

#include <algorithm>
#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/e2e/testbed.h"
#include "tests/support/require.h"

namespace ddprun::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A TCP listener that accepts and closes forever, and a connect with a bound wait; both in
// Python (every host runs /usr/bin/python3), started from the host's home.
constexpr const char* kListen =
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1])))\n"
    "s.listen(16)\n"
    "while True: s.accept()[0].close()\n";
constexpr const char* kConnect =
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print('failed', e)\n";

class TestbedTest : public ::testing::Test {
 protected:
  void Make(bool shared_home) {
    TestbedOptions options;
    options.tag = "self";
    options.shared_home = shared_home;
    std::string why;
    bed_ = Testbed::Create(options, &why);
    DDPRUN_REQUIRE_OR_SKIP("testbed", bed_ != nullptr, why);
  }
  /// Starts a listener on host `i` (it runs until the bed is gone).
  void Listen(int i, int port) {
    bed_->Write("listen.py", kListen);
    ASSERT_EQ(bed_->Run(i, "/usr/bin/python3 listen.py " + std::to_string(port) + " >/dev/null 2>&1 &"), 0);
  }
  std::string Connect(int from, const std::string& addr, int port) {
    bed_->Write("connect.py", kConnect);
    std::string out;
    // The listener may take a moment to start: a few tries while it is refused.
    for (int attempt = 0; attempt < 20; ++attempt) {
      bed_->Run(from, "/usr/bin/python3 connect.py " + addr + " " + std::to_string(port), &out);
      if (out.find("refused") == std::string::npos) break;
      ::usleep(100'000);
    }
    return out;
  }
  std::unique_ptr<Testbed> bed_;
};

TEST_F(TestbedTest, HostsHaveTheirOwnNamesStockHostsFilesAndTwoNics) {
  Make(false);
  if (!bed_) return;
  ASSERT_EQ(bed_->hosts().size(), 3u);
  for (const TestHost& h : bed_->hosts()) {
    SCOPED_TRACE(h.name);
    std::string out;
    ASSERT_EQ(bed_->Run(h.index, "hostname", &out), 0);
    EXPECT_EQ(out, h.name + "\n");
    // Its own name on 127.0.1.1, as Debian's installer writes it; the others on their NICs.
    bed_->Run(h.index, "getent hosts " + h.name, &out);
    EXPECT_THAT(out, StartsWith("127.0.1.1 "));
    const TestHost& next = bed_->host((h.index + 1) % 3);
    bed_->Run(h.index, "getent hosts " + next.name, &out);
    EXPECT_THAT(out, StartsWith(next.data_addr + " "));
    // The management NIC comes first in the interface list, then the data NIC.
    bed_->Run(h.index, "ip -o -4 addr show | awk '{print $2, $4}'", &out);
    EXPECT_EQ(out, "lo 127.0.0.1/8\n" + h.mgmt_if + " " + h.mgmt_addr + "/24\n" + h.data_if + " " +
                       h.data_addr + "/24\n");
  }
  EXPECT_NE(bed_->host(0).data_if, bed_->host(1).data_if) << "interface names differ between hosts";
  // This machine's own names are untouched.
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  EXPECT_NE(std::string(name), bed_->host(0).name);
}

TEST_F(TestbedTest, DataNicsReachEachOtherAndManagementNicsDoNot) {
  Make(false);
  if (!bed_) return;
  Listen(1, 7001);
  EXPECT_EQ(Connect(0, bed_->host(1).data_addr, 7001), "connected\n");
  EXPECT_EQ(Connect(2, bed_->host(1).data_addr, 7001), "connected\n");
  EXPECT_THAT(Connect(0, bed_->host(1).mgmt_addr, 7001), StartsWith("failed"));
}

TEST_F(TestbedTest, AFirewallThatAcceptsOnlySomePortsDropsTheRest) {
  Make(false);
  if (!bed_) return;
  ASSERT_TRUE(bed_->AcceptTcpOnly(1, {7001}));
  Listen(1, 7001);
  Listen(1, 7002);
  EXPECT_EQ(Connect(0, bed_->host(1).data_addr, 7001), "connected\n");
  EXPECT_THAT(Connect(0, bed_->host(1).data_addr, 7002), HasSubstr("timed out"));
  // On the host itself, loopback stays open.
  EXPECT_EQ(Connect(1, "127.0.0.1", 7002), "connected\n");
}

TEST_F(TestbedTest, HomesArePrivateUnlessShared) {
  Make(false);
  if (!bed_) return;
  ASSERT_EQ(bed_->Run(0, "echo from-0 > note"), 0);
  EXPECT_EQ(bed_->Read(0, "note"), "from-0\n");
  EXPECT_EQ(bed_->Read(1, "note"), "");
  std::string out;
  bed_->Run(1, "cat note 2>&1; pwd", &out);
  EXPECT_THAT(out, HasSubstr(bed_->home() + "\n"));
  EXPECT_THAT(out, Not(HasSubstr("from-0")));
  bed_.reset();

  Make(true);
  if (!bed_) return;
  ASSERT_EQ(bed_->Run(0, "echo from-0 > note"), 0);
  bed_->Run(2, "cat note", &out);
  EXPECT_EQ(out, "from-0\n");
}

TEST_F(TestbedTest, LeavesNoNamespaceOrInterfaceBehind) {
  std::string links_before, links_after;
  ASSERT_EQ(ShellOutput("ip -o link show | awk '{print $2}'", &links_before), 0);
  Make(false);
  if (!bed_) return;
  const auto during = Testbed::AllNamespaces();
  EXPECT_EQ(std::count_if(during.begin(), during.end(),
                          [](const std::string& ns) {
                            return ns.find("-" + std::to_string(::getpid()) + "-") != std::string::npos;
                          }),
            5);     // three hosts, the switch and the management dead end
  Listen(0, 7001);  // a program still running on a host does not keep the bed alive
  bed_.reset();
  ASSERT_EQ(ShellOutput("ip -o link show | awk '{print $2}'", &links_after), 0);
  EXPECT_EQ(links_after, links_before) << "this machine's own interfaces";
  const auto after = Testbed::AllNamespaces();
  for (const std::string& ns : after)
    EXPECT_EQ(ns.find("-" + std::to_string(::getpid()) + "-"), std::string::npos) << ns;
}

}  // namespace
}  // namespace ddprun::e2e
