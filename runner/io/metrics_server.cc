#include "runner/io/metrics_server.h"

#include <array>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "runner/host/metrics_text.h"
#include "runner/io/tcp_listener.h"

namespace ddprun::io {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// Accepting again after a failed accept (no descriptors): not at once, which would spin.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
constexpr size_t kReadChunk = 1024;

bool IsTokenChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '!' || c == '~' || c == '*' || c == '\'' || c == '+' || c == '#' || c == '$' ||
         c == '%' || c == '&' || c == '^' || c == '`' || c == '|';
}

bool IsTargetChar(char c) { return c > ' ' && c < 0x7f; }

}  // namespace

HttpRequestHead ParseHttpRequestHead(std::string_view bytes) {
  HttpRequestHead head;
  // The head ends at a blank line; clients send CRLF, a bare LF is tolerated (RFC 9112 2.2).
  const size_t crlf = bytes.find("\r\n\r\n");
  const size_t lf = bytes.find("\n\n");
  if (crlf == std::string_view::npos && lf == std::string_view::npos) return head;
  const size_t line_end = bytes.find('\n');
  std::string_view line = bytes.substr(0, line_end);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  head.status = HttpRequestHead::Status::kBad;
  // METHOD SP TARGET SP HTTP/1.x
  const size_t first = line.find(' ');
  if (first == std::string_view::npos || first == 0) return head;
  const size_t second = line.find(' ', first + 1);
  if (second == std::string_view::npos || second == first + 1) return head;
  const std::string_view method = line.substr(0, first);
  const std::string_view target = line.substr(first + 1, second - first - 1);
  const std::string_view version = line.substr(second + 1);
  for (const char c : method) {
    if (!IsTokenChar(c)) return head;
  }
  for (const char c : target) {
    if (!IsTargetChar(c)) return head;
  }
  if (version.size() != 8 || !version.starts_with("HTTP/1.") || version[7] < '0' || version[7] > '9') {
    return head;
  }
  head.status = HttpRequestHead::Status::kComplete;
  head.method = std::string(method);
  head.target = std::string(target);
  return head;
}

std::string HttpResponse(int status, std::string_view reason, std::string_view content_type,
                         std::string_view body, bool head_only) {
  std::string extra;
  if (status == 405) extra = "Allow: GET, HEAD\r\n";
  return fmt::format(
      "HTTP/1.0 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{}", status,
      reason, content_type, body.size(), extra, head_only ? "" : body);
}

struct MetricsServer::Connection {
  Connection(asio::io_context& io, uint64_t conn_id) : id(conn_id), socket(io), timer(io) {}
  uint64_t id;
  tcp::socket socket;
  asio::steady_timer timer;
  std::array<char, kReadChunk> chunk{};
  std::string request;
  std::string response;
  uint64_t render = 0;  // which render of GET /metrics it answers; 0: another answer
  bool closed = false;
};

struct MetricsServer::Acceptor {
  explicit Acceptor(asio::io_context& io) : acceptor(io), retry(io) {}
  tcp::acceptor acceptor;
  asio::steady_timer retry;
};

MetricsServer::MetricsServer(asio::io_context& io, std::function<std::string()> render, Limits limits)
    : io_(io), render_(std::move(render)), limits_(limits) {}

MetricsServer::MetricsServer(asio::io_context& io, std::function<std::string()> render)
    : MetricsServer(io, std::move(render), Limits{}) {}

MetricsServer::~MetricsServer() { Shutdown(); }

Status MetricsServer::Listen(const std::string& addr, uint16_t port) {
  error_code ec;
  tcp::endpoint endpoint;
  const auto address = asio::ip::make_address(addr, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, port);
  } else {
    // "*" names each node's entry of cluster.nodes, which may be a host name.
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(addr, std::to_string(port), tcp::resolver::passive, ec);
    if (ec || results.empty()) {
      return Fail(fmt::format("cannot resolve \"{}\" on this node: {}", addr, ec.message()));
    }
    endpoint = results.begin()->endpoint();
  }
  const std::string where = endpoint.address().is_v6()
                                ? fmt::format("[{}]:{}", endpoint.address().to_string(), port)
                                : fmt::format("{}:{}", endpoint.address().to_string(), port);
  auto acceptor = std::make_unique<Acceptor>(io_);
  if (auto error = OpenListener(acceptor->acceptor, endpoint, where)) return Fail(error->text);
  port_ = acceptor->acceptor.local_endpoint(ec).port();
  acceptor_ = std::move(acceptor);
  StartAccept();
  return {};
}

void MetricsServer::Shutdown() {
  if (acceptor_) {
    error_code ignored;
    acceptor_->acceptor.close(ignored);
    acceptor_->retry.cancel();
  }
  auto connections = std::move(connections_);
  connections_.clear();
  for (auto& [id, conn] : connections) Close(conn);
}

void MetricsServer::StartAccept() {
  auto conn = std::make_shared<Connection>(io_, next_id_++);
  acceptor_->acceptor.async_accept(conn->socket, [this, conn](error_code ec) {
    if (ec == asio::error::operation_aborted || !acceptor_ || !acceptor_->acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors, or the client left first: try again a little later.
      acceptor_->retry.expires_after(kAcceptRetry);
      acceptor_->retry.async_wait([this](error_code wait_ec) {
        if (!wait_ec && acceptor_ && acceptor_->acceptor.is_open()) StartAccept();
      });
      return;
    }
    OnAccepted(conn);
    StartAccept();
  });
}

void MetricsServer::OnAccepted(std::shared_ptr<Connection> conn) {
  error_code ignored;
  if (connections_.size() >= limits_.max_connections) {
    // Full. A connection still sending its request head (a slow client, or one that says
    // nothing) makes room, the oldest first: a scraper sends its head at once and is past that
    // point within a round trip, so slow clients cannot starve it (issue 36: 20 slow clients
    // held every slot and 7 of 8 real scrapes got 503).
    for (auto& [id, held] : connections_) {
      if (held->response.empty()) {
        const std::shared_ptr<Connection> slow = held;  // outlives the erase in Close
        Close(slow);
        break;
      }
    }
  }
  if (connections_.size() >= limits_.max_connections) {
    // Every slot is writing an answer to a client that reads slowly: 503, said at once and
    // without waiting (the kernel's send buffer of a new socket takes it).
    const std::string busy = HttpResponse(503, "Service Unavailable", "text/plain; charset=utf-8",
                                          "too many metrics requests at once; try again\n");
    conn->socket.non_blocking(true, ignored);
    conn->socket.write_some(asio::buffer(busy), ignored);
    conn->socket.shutdown(tcp::socket::shutdown_both, ignored);
    conn->socket.close(ignored);
    return;
  }
  connections_[conn->id] = conn;
  conn->timer.expires_after(limits_.deadline);
  conn->timer.async_wait([this, conn](error_code ec) {
    if (!ec) Close(conn);
  });
  Read(conn);
}

void MetricsServer::Read(const std::shared_ptr<Connection>& conn) {
  conn->socket.async_read_some(asio::buffer(conn->chunk), [this, conn](error_code ec, size_t n) {
    if (conn->closed) return;
    if (ec) {
      Close(conn);
      return;
    }
    conn->request.append(conn->chunk.data(), n);
    const HttpRequestHead head = ParseHttpRequestHead(conn->request);
    if (head.status == HttpRequestHead::Status::kComplete) {
      Answer(conn, head);
    } else if (head.status == HttpRequestHead::Status::kBad) {
      Write(conn, HttpResponse(400, "Bad Request", "text/plain; charset=utf-8", "not an HTTP/1.x request\n"));
    } else if (conn->request.size() >= limits_.max_request_bytes) {
      Write(conn,
            HttpResponse(431, "Request Header Fields Too Large", "text/plain; charset=utf-8",
                         fmt::format("the request head is over {} bytes\n", limits_.max_request_bytes)));
    } else {
      Read(conn);
    }
  });
}

void MetricsServer::Answer(const std::shared_ptr<Connection>& conn, const HttpRequestHead& head) {
  constexpr std::string_view kText = "text/plain; charset=utf-8";
  const bool head_only = head.method == "HEAD";
  if (head.method != "GET" && !head_only) {
    Write(conn, HttpResponse(405, "Method Not Allowed", kText, "only GET and HEAD\n"));
    return;
  }
  const std::string_view path = std::string_view(head.target).substr(0, head.target.find('?'));
  if (path != "/metrics") {
    Write(conn, HttpResponse(404, "Not Found", kText, "not found; ddprun serves /metrics\n", head_only));
    return;
  }
  Write(conn, HttpResponse(200, "OK", host::kPrometheusContentType, render_(), head_only));
  if (!head_only) conn->render = ++renders_;
}

void MetricsServer::Write(const std::shared_ptr<Connection>& conn, std::string response) {
  conn->response = std::move(response);
  asio::async_write(conn->socket, asio::buffer(conn->response), [this, conn](error_code ec, size_t) {
    if (conn->closed) return;
    error_code ignored;
    conn->socket.shutdown(tcp::socket::shutdown_send, ignored);
    Close(conn);
    if (!ec && conn->render > 0 && on_scraped_) on_scraped_(conn->render);
  });
}

void MetricsServer::Close(const std::shared_ptr<Connection>& conn) {
  if (conn->closed) return;
  conn->closed = true;
  error_code ignored;
  conn->socket.close(ignored);
  conn->timer.cancel();
  connections_.erase(conn->id);
}

}  // namespace ddprun::io
