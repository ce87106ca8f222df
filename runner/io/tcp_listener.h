#pragma once
// Opening a TCP listener, and when it cannot be opened, saying why in words the user can act
// on: which process holds the port (read from /proc/net/tcp and each process's descriptors),
// or which connection took it as its local port, and whether the port lies in the kernel's
// range for outgoing connections. The transport and the metrics endpoint listen through it.

#include <cstdint>
#include <optional>
#include <string>

#include <boost/asio/ip/tcp.hpp>

namespace ddprun::io {

/// Why a listener could not be opened: "cannot listen on <where>: " and the cause (what holds
/// the port, an address not of this machine, a privileged port, the system's words); the kind
/// lets the caller add its own hint.
struct ListenError {
  enum class Kind { kInUse, kNotHere, kOther };
  Kind kind = Kind::kOther;
  std::string text;
};

/// Opens `acceptor` on `endpoint` with SO_REUSEADDR (a port whose last connections are in
/// TIME_WAIT is taken again) and listens; `where` names it in the error ("10.0.0.1:29500").
std::optional<ListenError> OpenListener(boost::asio::ip::tcp::acceptor& acceptor,
                                        const boost::asio::ip::tcp::endpoint& endpoint,
                                        const std::string& where);

/// "pid 4242 (python3 -m http.server 50000)" for the process listening on TCP `port`, or ""
/// when it cannot be found (another user's process without privileges, or a race).
std::string FindPortOwner(uint16_t port);

/// What holds TCP `port` on this host, for "the port is already in use ...": " by pid 4242
/// (...)" for a listener, the connection and its process for a socket whose local port it is
/// (an outgoing connection took it), or why no process holds it; "" when nothing is seen.
std::string DescribePortUse(uint16_t port);

}  // namespace ddprun::io
