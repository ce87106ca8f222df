#pragma once
// What the other nodes probe before the first round (rendezvous.probe): a TCP listener on a
// port the kernel picks, at the address this node's workers' sockets use, as gloo and NCCL
// listen. It accepts every connection and closes it at once; nothing is read or written.

#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "base/result.h"

namespace ddprun::io {

class ProbeListener {
 public:
  explicit ProbeListener(boost::asio::io_context& io) : acceptor_(io) {}
  ~ProbeListener() { Close(); }
  ProbeListener(const ProbeListener&) = delete;
  ProbeListener& operator=(const ProbeListener&) = delete;

  /// Listens on `address` (an IP address of this host), port 0; returns "addr:port" ("[v6]:port").
  Result<std::string> Open(const std::string& address);
  void Close();

 private:
  void Accept();
  boost::asio::ip::tcp::acceptor acceptor_;
};

}  // namespace ddprun::io
