#include "runner/io/tcp_listener.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/ip/address_v6.hpp>

namespace ddprun::io {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

struct TcpSocketEntry {
  std::string state;  // the kernel's hex code: 0A LISTEN, 01 ESTABLISHED, 06 TIME_WAIT, ...
  std::string local;
  std::string remote;
  std::string inode;  // "0" when no process holds it (TIME_WAIT, orphaned)
};

// "0100007F:C350" (IPv4) or the 32-digit IPv6 form, as /proc/net/tcp* writes it.
std::string ReadableProcAddress(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) return text;
  const std::string hex = text.substr(0, colon);
  const unsigned long port = std::strtoul(text.substr(colon + 1).c_str(), nullptr, 16);
  std::array<uint8_t, 16> bytes{};
  const size_t n = hex.size() / 2;
  if (n != 4 && n != 16) return text;
  // The kernel prints each 32-bit word in host (little-endian) order.
  for (size_t word = 0; word < n / 4; ++word) {
    for (size_t b = 0; b < 4; ++b) {
      const std::string pair = hex.substr(word * 8 + (3 - b) * 2, 2);
      bytes[word * 4 + b] = static_cast<uint8_t>(std::strtoul(pair.c_str(), nullptr, 16));
    }
  }
  if (n == 4) {
    const asio::ip::address_v4 v4({bytes[0], bytes[1], bytes[2], bytes[3]});
    return fmt::format("{}:{}", v4.to_string(), port);
  }
  const asio::ip::address_v6 v6(bytes);
  if (v6.is_v4_mapped()) return fmt::format("{}:{}", v6.to_v4().to_string(), port);
  return fmt::format("[{}]:{}", v6.to_string(), port);
}

std::string StateName(const std::string& code) {
  static const std::map<std::string, std::string> kNames = {
      {"01", "ESTABLISHED"}, {"02", "SYN_SENT"},  {"03", "SYN_RECV"}, {"04", "FIN_WAIT1"},
      {"05", "FIN_WAIT2"},   {"06", "TIME_WAIT"}, {"07", "CLOSE"},    {"08", "CLOSE_WAIT"},
      {"09", "LAST_ACK"},    {"0A", "LISTEN"},    {"0B", "CLOSING"}};
  auto it = kNames.find(code);
  return it == kNames.end() ? code : it->second;
}

std::vector<TcpSocketEntry> SocketsOnLocalPort(uint16_t port) {
  std::vector<TcpSocketEntry> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line) && out.size() < 64) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retrans, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retrans >> uid >> timeout >> inode;
      const auto colon = local.rfind(':');
      if (colon == std::string::npos) continue;
      if (std::strtoul(local.substr(colon + 1).c_str(), nullptr, 16) != port) continue;
      out.push_back(TcpSocketEntry{state, local, remote, inode});
    }
  }
  return out;
}

// "pid 4242 (python3 -m http.server)" for the process holding one of the socket inodes.
std::string ProcessHolding(const std::vector<std::string>& inodes) {
  namespace fs = std::filesystem;
  if (inodes.empty()) return "";
  std::vector<std::string> targets;
  for (const auto& inode : inodes) targets.push_back("socket:[" + inode + "]");
  std::error_code ec;
  for (const auto& proc : fs::directory_iterator("/proc", ec)) {
    const std::string pid = proc.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_ec;
    for (const auto& fd : fs::directory_iterator(proc.path() / "fd", fd_ec)) {
      std::error_code link_ec;
      const auto target = fs::read_symlink(fd.path(), link_ec).string();
      if (link_ec || std::find(targets.begin(), targets.end(), target) == targets.end()) continue;
      std::ifstream cmdline(proc.path() / "cmdline");
      std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
      std::replace(args.begin(), args.end(), '\0', ' ');
      while (!args.empty() && args.back() == ' ') args.pop_back();
      return fmt::format("pid {} ({})", pid, args);
    }
  }
  return "";
}

}  // namespace

std::optional<ListenError> OpenListener(tcp::acceptor& acceptor, const tcp::endpoint& endpoint,
                                        const std::string& where) {
  error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) return std::nullopt;
  error_code ignored;
  acceptor.close(ignored);
  const std::string prefix = fmt::format("cannot listen on {}: ", where);
  if (ec == asio::error::address_in_use) {
    return ListenError{ListenError::Kind::kInUse,
                       prefix + "the port is already in use" + DescribePortUse(endpoint.port())};
  }
  if (ec.value() == EADDRNOTAVAIL) {
    return ListenError{ListenError::Kind::kNotHere,
                       prefix + endpoint.address().to_string() + " is not an address of this machine"};
  }
  if (ec == asio::error::access_denied) {
    return ListenError{ListenError::Kind::kOther, prefix + "permission denied (ports below 1024 need root)"};
  }
  return ListenError{ListenError::Kind::kOther, prefix + ec.message()};
}

std::string FindPortOwner(uint16_t port) {
  std::vector<std::string> inodes;
  for (const auto& socket : SocketsOnLocalPort(port)) {
    if (socket.state == "0A") inodes.push_back(socket.inode);
  }
  return ProcessHolding(inodes);
}

std::string DescribePortUse(uint16_t port) {
  const auto sockets = SocketsOnLocalPort(port);
  std::vector<std::string> listeners;
  for (const auto& socket : sockets) {
    if (socket.state == "0A") listeners.push_back(socket.inode);
  }
  if (!listeners.empty()) {
    const std::string owner = ProcessHolding(listeners);
    return owner.empty() ? " by a listening socket of a process this user cannot see" : " by " + owner;
  }
  // No listener: the port is the local end of a connection, which happens when the kernel
  // gave it to an outgoing connection (master_port inside the ephemeral range).
  std::string range;
  {
    std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
    unsigned low = 0, high = 0;
    if (in >> low >> high && port >= low && port <= high) {
      range = fmt::format(
          "; the port is inside net.ipv4.ip_local_port_range ({}-{}), where the kernel "
          "picks the local ports of outgoing connections",
          low, high);
    }
  }
  for (const auto& socket : sockets) {
    if (socket.inode == "0") continue;
    const std::string owner = ProcessHolding({socket.inode});
    if (owner.empty()) continue;
    return fmt::format(" by a connection of {}, {} -> {} ({}){}", owner, ReadableProcAddress(socket.local),
                       ReadableProcAddress(socket.remote), StateName(socket.state), range);
  }
  if (!sockets.empty()) {
    const auto& socket = sockets.front();
    return fmt::format(", and no process holds it: a connection {} -> {} ({}) still does{}{}",
                       ReadableProcAddress(socket.local), ReadableProcAddress(socket.remote),
                       StateName(socket.state),
                       socket.state == "06" ? " until TIME_WAIT ends (at most a minute)" : "", range);
  }
  return "";
}

}  // namespace ddprun::io
