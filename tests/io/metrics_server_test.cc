// The metrics endpoint's HTTP server (runner/io/metrics_server.h) on 127.0.0.1, in-process:
// the request parser, the answers to each kind of request, and its bounds (an idle client,
// too many clients, an oversized request, a taken port).

#include "runner/io/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

namespace ddprun::io {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;
using HeadStatus = HttpRequestHead::Status;

TEST(HttpRequestHeadTest, ACompleteHeadGivesMethodAndTarget) {
  const auto head = ParseHttpRequestHead("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n");
  EXPECT_EQ(head.status, HeadStatus::kComplete);
  EXPECT_EQ(head.method, "GET");
  EXPECT_EQ(head.target, "/metrics?x=1");
  EXPECT_EQ(ParseHttpRequestHead("HEAD / HTTP/1.0\n\n").status, HeadStatus::kComplete);
}

TEST(HttpRequestHeadTest, AnIncompleteHeadNeedsMore) {
  EXPECT_EQ(ParseHttpRequestHead("").status, HeadStatus::kNeedMore);
  EXPECT_EQ(ParseHttpRequestHead("GET /metrics HTTP/1.1\r\nHost: a\r\n").status, HeadStatus::kNeedMore);
}

TEST(HttpRequestHeadTest, AnythingButAnHttp1RequestLineIsBad) {
  for (const char* text :
       {"\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET  /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/2.0\r\n\r\n", "GET /me trics HTTP/1.1\r\n\r\n", "G(T /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1x\r\n\r\n", "\x16\x03\x01\x02\x01\n\n"}) {
    EXPECT_EQ(ParseHttpRequestHead(text).status, HeadStatus::kBad) << text;
  }
}

TEST(HttpResponseTest, HasLengthTypeAndClose) {
  EXPECT_EQ(HttpResponse(200, "OK", "text/plain", "hi\n"),
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
            "Connection: close\r\n\r\nhi\n");
  EXPECT_EQ(HttpResponse(200, "OK", "text/plain", "hi\n", /*head_only=*/true),
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
            "Connection: close\r\n\r\n");
  EXPECT_THAT(HttpResponse(405, "Method Not Allowed", "text/plain", ""),
              HasSubstr("\r\nAllow: GET, HEAD\r\n"));
}

/// A server on 127.0.0.1 whose loop runs on its own thread, and a loop timer that counts its
/// ticks (every 10 ms) to show that the loop never stalls.
class MetricsServerTest : public ::testing::Test {
 protected:
  void Start(MetricsServer::Limits limits = {}, std::string payload = "") {
    payload_ = std::move(payload);
    server_ = std::make_unique<MetricsServer>(
        io_, [this] { return "scrape " + std::to_string(++scrapes_) + "\n" + payload_; }, limits);
    ASSERT_TRUE(server_->Listen("127.0.0.1", 0));
    port_ = server_->port();
    ASSERT_GT(port_, 0);
    Tick();
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    if (thread_.joinable()) {
      boost::asio::post(io_, [this] {
        server_->Shutdown();
        // A tick whose wait already finished is not cancelled: the flag keeps it from
        // arming the next one, which would keep the loop (and this join) going for ever.
        stopping_ = true;
        ticker_.cancel();
        work_.reset();
      });
      thread_.join();
    }
  }
  void Tick() {
    ticker_.expires_after(10ms);
    ticker_.async_wait([this](boost::system::error_code ec) {
      if (ec || stopping_) return;
      ++ticks_;
      Tick();
    });
  }
  /// A connected client socket with a 5 s receive timeout.
  int Connect() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    timeval limit{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    return fd;
  }
  /// Everything the server sends until it closes (or 5 s pass).
  static std::string ReadAll(int fd) {
    std::string out;
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }
  std::string Fetch(const std::string& request) const {
    const int fd = Connect();
    EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    std::string answer = ReadAll(fd);
    ::close(fd);
    return answer;
  }

  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_{
      io_.get_executor()};
  boost::asio::steady_timer ticker_{io_};
  std::unique_ptr<MetricsServer> server_;
  std::thread thread_;
  uint16_t port_ = 0;
  std::atomic<int> scrapes_{0};
  std::atomic<int> ticks_{0};
  bool stopping_ = false;  // set on the loop thread by TearDown
  std::string payload_;    // appended to every rendered answer
};

TEST_F(MetricsServerTest, GetMetricsAnswersWithTheRenderedTextAndCloses) {
  Start();
  EXPECT_EQ(Fetch("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Content-Length: 9\r\nConnection: close\r\n\r\nscrape 1\n");
  // Rendered again for each request.
  EXPECT_THAT(Fetch("GET /metrics?name[]=x HTTP/1.0\r\n\r\n"), HasSubstr("\r\n\r\nscrape 2\n"));
}

TEST_F(MetricsServerTest, OtherPathsMethodsAndGarbageGetTheirStatus) {
  Start();
  EXPECT_THAT(Fetch("GET / HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.0 404 Not Found\r\n"));
  EXPECT_THAT(Fetch("GET /metricsx HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.0 404 Not Found\r\n"));
  EXPECT_THAT(Fetch("POST /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.0 405 Method Not Allowed\r\n"));
  EXPECT_THAT(Fetch("hello\r\n\r\n"), StartsWith("HTTP/1.0 400 Bad Request\r\n"));
  const std::string head = Fetch("HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
}

TEST_F(MetricsServerTest, AnOversizedRequestHeadIsRefused) {
  MetricsServer::Limits limits;
  limits.max_request_bytes = 1024;
  Start(limits);
  EXPECT_THAT(Fetch("GET /metrics HTTP/1.1\r\nX: " + std::string(2000, 'a') + "\r\n\r\n"),
              StartsWith("HTTP/1.0 431 Request Header Fields Too Large\r\n"));
  EXPECT_EQ(scrapes_, 0);
}

TEST_F(MetricsServerTest, AClientThatSaysNothingIsCutOffAtTheDeadlineAndHoldsNothingUp) {
  MetricsServer::Limits limits;
  limits.deadline = 300ms;
  Start(limits);
  const auto begin = std::chrono::steady_clock::now();
  const int idle = Connect();
  // Others are served while it waits, and the loop keeps running.
  EXPECT_THAT(Fetch("GET /metrics HTTP/1.1\r\n\r\n"), HasSubstr("scrape 1"));
  EXPECT_EQ(ReadAll(idle), "");  // closed by the server
  const auto waited = std::chrono::steady_clock::now() - begin;
  EXPECT_GE(waited, 250ms);
  EXPECT_LT(waited, 3s);
  EXPECT_GE(ticks_, 10);
  ::close(idle);
}

class MetricsServerSlotsTest : public MetricsServerTest {
 protected:
  /// Waits until the server holds `count` connections.
  bool WaitForConnections(size_t count) {
    for (int i = 0; i < 500; ++i) {
      std::atomic<size_t> open{0};
      std::atomic<bool> done{false};
      boost::asio::post(io_, [&] {
        open = server_->connections();
        done = true;
      });
      while (!done) std::this_thread::sleep_for(1ms);
      if (open == count) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

// Issue 36: 20 slow clients held the 4 slots and 7 of 8 real scrapes got 503. Now 100 slow
// clients (each sent half a request head and waits) cannot keep a scraper out: each new
// connection closes the oldest one still sending its head.
TEST_F(MetricsServerSlotsTest, ARealScrapeIsAnsweredWhileAHundredSlowClientsAreConnected) {
  MetricsServer::Limits limits;
  limits.max_connections = 4;
  Start(limits);
  std::vector<int> slow;
  for (int i = 0; i < 100; ++i) {
    const int fd = Connect();
    ASSERT_EQ(::send(fd, "GET /met", 8, MSG_NOSIGNAL), 8);
    slow.push_back(fd);
  }
  ASSERT_TRUE(WaitForConnections(4));
  for (int scrape = 1; scrape <= 8; ++scrape) {
    EXPECT_THAT(Fetch("GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.0 200 OK\r\n"))
        << "scrape " << scrape;
  }
  EXPECT_EQ(scrapes_, 8);
  for (int fd : slow) ::close(fd);
}

// When every slot is writing an answer to a client that does not read it, one more is told so
// at once (503) rather than kept waiting, and the loop keeps running.
TEST_F(MetricsServerSlotsTest, OneClientTooManyWhileEverySlotAnswersGetsA503AtOnce) {
  MetricsServer::Limits limits;
  limits.max_connections = 2;
  Start(limits, std::string(16u << 20, 'x'));  // more than the sockets' buffers hold
  const std::string get = "GET /metrics HTTP/1.1\r\n\r\n";
  auto send_get = [&](int fd) { return ::send(fd, get.data(), get.size(), MSG_NOSIGNAL); };
  const int a = Connect();
  const int b = Connect();
  for (int fd : {a, b}) ASSERT_EQ(send_get(fd), static_cast<ssize_t>(get.size()));
  ASSERT_TRUE(WaitForConnections(2));
  ASSERT_TRUE([&] {
    for (int i = 0; i < 500 && scrapes_ < 2; ++i) std::this_thread::sleep_for(10ms);
    return scrapes_ == 2;
  }());
  const int c = Connect();
  ASSERT_EQ(send_get(c), static_cast<ssize_t>(get.size()));
  char head[64] = {};
  ASSERT_GT(::recv(c, head, sizeof head - 1, 0), 0);
  EXPECT_THAT(std::string(head), StartsWith("HTTP/1.0 503 Service Unavailable\r\n"));
  ::close(c);
  ::close(a);
  ::close(b);
  // Once they are gone, requests are served again.
  std::string answer;
  for (int i = 0; i < 100 && answer.find("200 OK") == std::string::npos; ++i) {
    const int fd = Connect();
    send_get(fd);
    char first[64] = {};
    if (::recv(fd, first, sizeof first - 1, 0) > 0) answer = first;
    ::close(fd);
    if (answer.find("200 OK") == std::string::npos) std::this_thread::sleep_for(10ms);
  }
  EXPECT_THAT(answer, StartsWith("HTTP/1.0 200 OK\r\n"));
  EXPECT_GE(ticks_, 1);  // the loop ran meanwhile
}

TEST_F(MetricsServerTest, ATakenPortIsRefusedWithWhy) {
  Start();
  boost::asio::io_context other_io;
  MetricsServer other(other_io, [] { return std::string(); });
  const Status listening = other.Listen("127.0.0.1", port_);
  ASSERT_FALSE(listening);
  EXPECT_THAT(listening.error(), StartsWith("cannot listen on 127.0.0.1:" + std::to_string(port_) +
                                            ": the port is already in use"));
  const Status nowhere = other.Listen("192.0.2.1", 0);
  ASSERT_FALSE(nowhere);
  EXPECT_EQ(nowhere.error(), "cannot listen on 192.0.2.1:0: 192.0.2.1 is not an address of this machine");
}

}  // namespace
}  // namespace ddprun::io
