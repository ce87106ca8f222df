#include "runner/io/probe_listener.h"

#include <fmt/format.h>

namespace ddprun::io {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

Result<std::string> ProbeListener::Open(const std::string& address) {
  error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  if (ec) return Fail(fmt::format("\"{}\" is not an address: {}", address, ec.message()));
  const tcp::endpoint endpoint(ip, 0);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  const auto local = ec ? tcp::endpoint() : acceptor_.local_endpoint(ec);
  if (ec) {
    Close();
    return Fail(fmt::format("cannot listen on {}: {}", address, ec.message()));
  }
  Accept();
  return ip.is_v6() ? fmt::format("[{}]:{}", address, local.port())
                    : fmt::format("{}:{}", address, local.port());
}

void ProbeListener::Close() {
  error_code ignored;
  acceptor_.close(ignored);
}

void ProbeListener::Accept() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    // The connect succeeded on the prober's side: that is the whole answer.
    error_code ignored;
    socket.close(ignored);
    Accept();
  });
}

}  // namespace ddprun::io
