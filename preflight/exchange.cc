#include "preflight/exchange.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace ddprun::preflight {

namespace {

int MillisUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return left.count() > 60'000 ? 60'000 : static_cast<int>(left.count());
}

ConnectOutcome OutcomeOf(int error) {
  switch (error) {
    case ECONNREFUSED: return ConnectOutcome::kRefused;
    case ETIMEDOUT: return ConnectOutcome::kTimedOut;
    case EHOSTUNREACH:
    case ENETUNREACH: return ConnectOutcome::kUnreachable;
    default: return ConnectOutcome::kError;
  }
}

}  // namespace

std::string EncodeRecord(char type, std::string_view payload) {
  if (payload.size() > kMaxRecordPayload) {
    // A programmer error: callers bound what they send.
    std::fprintf(stderr, "preflight: internal error: record of %zu bytes\n", payload.size());
    std::abort();
  }
  std::string out(kRecordMagic);
  out += type;
  const auto size = static_cast<uint32_t>(payload.size());
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((size >> shift) & 0xff);
  out.append(payload);
  return out;
}

RecordDecoder::Status RecordDecoder::Next(Record& out, std::string& error) {
  // Check the magic as soon as its bytes arrive so a stray peer fails fast.
  const size_t have = std::min(buffer_.size(), kRecordMagic.size());
  if (buffer_.compare(0, have, kRecordMagic.substr(0, have)) != 0) {
    error = "not a preflight record (bad magic)";
    return Status::kError;
  }
  if (buffer_.size() < kRecordHeader) return Status::kNeedMore;
  uint32_t size = 0;
  for (size_t i = 5; i < kRecordHeader; ++i) {
    size = (size << 8) | static_cast<uint8_t>(buffer_[i]);
  }
  if (size > kMaxRecordPayload) {
    error = fmt::format("record of {} bytes is over the {} byte limit", size, kMaxRecordPayload);
    return Status::kError;
  }
  if (buffer_.size() < kRecordHeader + size) return Status::kNeedMore;
  out.type = buffer_[4];
  out.payload = buffer_.substr(kRecordHeader, size);
  buffer_.erase(0, kRecordHeader + size);
  return Status::kRecord;
}

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Fd ConnectOnce(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
               ConnectOutcome& outcome, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list); rc != 0) {
    outcome = ConnectOutcome::kResolveFailed;
    error = fmt::format("cannot resolve {}: {}", host, ::gai_strerror(rc));
    return Fd();
  }
  const auto deadline = Clock::now() + timeout;
  outcome = ConnectOutcome::kError;
  error = fmt::format("no address for {}", host);
  Fd result;
  for (addrinfo* a = list; a && !result.valid(); a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd.valid()) {
      error = fmt::format("socket: {}", std::strerror(errno));
      continue;
    }
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      const int ready = ::poll(&p, 1, MillisUntil(deadline));
      if (ready == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof err;
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err != 0) {
      outcome = OutcomeOf(err);
      error = fmt::format("{}:{}: {}", host, port,
                          err == ETIMEDOUT ? "timed out" : std::strerror(err));
      continue;
    }
    // Back to blocking: the callers bound every read and write with poll.
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    outcome = ConnectOutcome::kConnected;
    error.clear();
    result = std::move(fd);
  }
  ::freeaddrinfo(list);
  return result;
}

Fd ConnectWithRetries(const std::string& host, uint16_t port, Clock::time_point deadline,
                      std::string& error) {
  for (;;) {
    ConnectOutcome outcome{};
    Fd fd = ConnectOnce(host, port, std::chrono::milliseconds(3000), outcome, error);
    if (fd.valid()) return fd;
    if (Clock::now() + std::chrono::milliseconds(200) >= deadline) return Fd();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Fd ListenWildcard(uint16_t port, uint16_t& bound_port, std::string& error) {
  // Dual-stack first, like PyTorch's store; IPv4 when IPv6 is disabled.
  for (const int family : {AF_INET6, AF_INET}) {
    Fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      error = fmt::format("socket: {}", std::strerror(errno));
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage storage{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      int zero = 0;
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* addr = reinterpret_cast<sockaddr_in6*>(&storage);
      addr->sin6_family = AF_INET6;
      addr->sin6_addr = in6addr_any;
      addr->sin6_port = htons(port);
      len = sizeof(sockaddr_in6);
    } else {
      auto* addr = reinterpret_cast<sockaddr_in*>(&storage);
      addr->sin_family = AF_INET;
      addr->sin_addr.s_addr = htonl(INADDR_ANY);
      addr->sin_port = htons(port);
      len = sizeof(sockaddr_in);
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&storage), len) != 0 ||
        ::listen(fd.get(), SOMAXCONN) != 0) {
      error = fmt::format("cannot listen on port {}: {}", port, std::strerror(errno));
      if (errno == EADDRINUSE) return Fd();  // the other family would collide too
      continue;
    }
    len = sizeof storage;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&storage), &len);
    bound_port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&storage)->sin_port);
    error.clear();
    return fd;
  }
  return Fd();
}

std::string LocalAddressOf(int fd) {
  sockaddr_storage storage{};
  socklen_t len = sizeof storage;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&storage)->sin_addr, text, sizeof text);
    return text;
  }
  if (storage.ss_family == AF_INET6) {
    const auto* addr = reinterpret_cast<sockaddr_in6*>(&storage);
    if (IN6_IS_ADDR_V4MAPPED(&addr->sin6_addr)) {
      in_addr v4{};
      std::memcpy(&v4, addr->sin6_addr.s6_addr + 12, sizeof v4);
      ::inet_ntop(AF_INET, &v4, text, sizeof text);
    } else {
      ::inet_ntop(AF_INET6, &addr->sin6_addr, text, sizeof text);
    }
    return text;
  }
  return "";
}

bool SendAll(int fd, std::string_view data, Clock::time_point deadline, std::string& error) {
  size_t sent = 0;
  while (sent < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, MillisUntil(deadline));
    if (ready == 0) {
      if (Clock::now() < deadline) continue;  // poll waits at most a minute at a time
      error = "timed out sending";
      return false;
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      error = fmt::format("poll: {}", std::strerror(errno));
      return false;
    }
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      error = fmt::format("send: {}", std::strerror(errno));
      return false;
    }
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::optional<Record> ReadRecord(int fd, RecordDecoder& decoder, Clock::time_point deadline,
                                 std::string& error) {
  for (;;) {
    Record record;
    switch (decoder.Next(record, error)) {
      case RecordDecoder::Status::kRecord: return record;
      case RecordDecoder::Status::kError: return std::nullopt;
      case RecordDecoder::Status::kNeedMore: break;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, MillisUntil(deadline));
    if (ready == 0) {
      if (Clock::now() < deadline) continue;
      error = "timed out waiting for the peer";
      return std::nullopt;
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      error = fmt::format("poll: {}", std::strerror(errno));
      return std::nullopt;
    }
    char buffer[64 * 1024];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n == 0) {
      error = "the peer closed the connection";
      return std::nullopt;
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      error = fmt::format("recv: {}", std::strerror(errno));
      return std::nullopt;
    }
    decoder.Feed(buffer, static_cast<size_t>(n));
  }
}

}  // namespace ddprun::preflight
