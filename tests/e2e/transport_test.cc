// The real transport (runner/io/asio_transport) in this process, where the test controls
// RLIMIT_NOFILE: accepting when descriptors run out must back off, not spin.

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>

#include "runner/io/asio_transport.h"
#include "tests/e2e/harness.h"

namespace ddprun::io {
namespace {

using namespace std::chrono_literals;

double CpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

int OpenDescriptorCount() {
  int n = 0;
  for (int fd = 0; fd < 65536; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0) ++n;
  }
  return n;
}

// Issue 11.3: with the budget wrong on purpose (as when descriptors go elsewhere), accept()
// fails with EMFILE while clients keep waiting in the backlog. The old loop re-armed at once
// and burned a core; now it frees some descriptors, lowers its budget, says so once, and waits.
TEST(TransportTest, AcceptBacksOffWhenDescriptorsRunOut) {
  boost::asio::io_context io;
  AsioTransport transport(io, Seconds(3));
  AsioTransport::Limits limits;
  limits.max_sockets = 100000;  // far more than the descriptors there are
  transport.SetLimits(limits);
  std::vector<std::string> warnings;
  transport.SetWarningSink([&](const std::string& text) { warnings.push_back(text); });
  const uint16_t port = e2e::FreePort();
  const Status listening = transport.Listen("127.0.0.1", port);
  ASSERT_TRUE(listening) << listening.error();

  // The clients live in a child, which keeps the descriptors of this process for the test.
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(go[1]);
    char byte;
    if (::read(go[0], &byte, 1) != 1) ::_exit(1);
    std::vector<int> fds;
    for (int i = 0; i < 64; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(port);
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) fds.push_back(fd);
    }
    while (::read(go[0], &byte, 1) > 0) {
    }
    ::_exit(0);
  }
  ::close(go[0]);
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &original), 0);
  rlimit low = original;
  low.rlim_cur = static_cast<rlim_t>(OpenDescriptorCount() + 10);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  ASSERT_EQ(::write(go[1], "x", 1), 1);

  const std::string expected =
      "cannot accept connections on the master port: Too many open files (RLIMIT_NOFILE " +
      std::to_string(low.rlim_cur) + "); keeping at most 16 connections from now on";
  for (int i = 0; i < 200 && warnings.empty(); ++i) io.run_for(50ms);
  const double before = CpuSeconds();
  io.run_for(1s);
  const double cpu = CpuSeconds() - before;
  ::setrlimit(RLIMIT_NOFILE, &original);
  ::close(go[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_THAT(warnings, ::testing::ElementsAre(expected));
  EXPECT_LT(cpu, 0.2) << "CPU seconds in 1 s of the loop while clients wait in the backlog";
}

}  // namespace
}  // namespace ddprun::io
