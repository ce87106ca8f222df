#pragma once
// The metrics endpoint ([metrics] listen): a small HTTP/1.x server on the driver's one
// io_context. GET /metrics answers with the text a callback renders (Prometheus text format),
// any other path 404; every answer closes its connection (HTTP/1.0 style). Bounded whatever
// connects: a few connections at once, a small request head, one deadline per connection
// from accept to the last byte written. Nothing in it waits on a peer, so a scraper that
// connects and says nothing, or never reads, does not delay heartbeats.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "base/result.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

/// The request line of an HTTP request head, once the head is complete. Parsed apart from
/// the connection code, so that it is tested on its own.
struct HttpRequestHead {
  enum class Status {
    kNeedMore,  // no blank line yet
    kBad,       // not an HTTP/1.x request line
    kComplete,
  };
  Status status = Status::kNeedMore;
  std::string method;
  std::string target;  // as sent: "/metrics", "/metrics?x=1", "/"
};

/// Reads `bytes`, the start of what a client sent. Total: never fails on any input.
HttpRequestHead ParseHttpRequestHead(std::string_view bytes);

/// A whole HTTP/1.0 response with Content-Type, Content-Length and Connection: close; without
/// the body for a HEAD request (`head_only`), its length still given.
std::string HttpResponse(int status, std::string_view reason, std::string_view content_type,
                         std::string_view body, bool head_only = false);

class MetricsServer {
 public:
  struct Limits {
    /// Connections served at once. One more closes the oldest that has not sent its whole
    /// request head yet; when every one has (their answers are being written), it is answered
    /// 503 at once and closed.
    size_t max_connections = 16;
    /// The most a request head may take (request line and headers).
    size_t max_request_bytes = 8 * 1024;
    /// From accept to the last byte of the answer: a client that sends nothing, or too
    /// slowly, or does not read the answer, is cut off then.
    std::chrono::milliseconds deadline{5000};
  };

  /// `render` gives the body of GET /metrics; it runs on the event loop and must be quick.
  MetricsServer(boost::asio::io_context& io, std::function<std::string()> render, Limits limits);
  MetricsServer(boost::asio::io_context& io, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  /// Listens on addr:port (an IP address, or a name resolved here; port 0 picks a free one);
  /// a failure says why, for the console ("the port is already in use by pid ...").
  Status Listen(const std::string& addr, uint16_t port);
  /// The port listened on; 0 before Listen succeeded.
  uint16_t port() const { return port_; }
  /// Connections open now (for tests).
  size_t connections() const { return connections_.size(); }
  /// Closes the listener and every connection.
  void Shutdown();
  /// Called after each GET /metrics whose whole answer was written, with the number of the
  /// render it carried (1 for the first): the driver's linger waits for one made after the end.
  void OnScraped(std::function<void(uint64_t)> on_scraped) { on_scraped_ = std::move(on_scraped); }
  /// GET /metrics answers rendered so far.
  uint64_t renders() const { return renders_; }

 private:
  struct Connection;
  struct Acceptor;
  void StartAccept();
  void OnAccepted(std::shared_ptr<Connection> conn);
  void Read(const std::shared_ptr<Connection>& conn);
  void Answer(const std::shared_ptr<Connection>& conn, const HttpRequestHead& head);
  void Write(const std::shared_ptr<Connection>& conn, std::string response);
  void Close(const std::shared_ptr<Connection>& conn);

  boost::asio::io_context& io_;
  std::function<std::string()> render_;
  std::function<void(uint64_t)> on_scraped_;
  uint64_t renders_ = 0;
  Limits limits_;
  std::unique_ptr<Acceptor> acceptor_;
  uint16_t port_ = 0;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::shared_ptr<Connection>> connections_;
};

}  // namespace ddprun::io
