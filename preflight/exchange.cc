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
#include <memory>
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
    case ECONNREFUSED:
      return ConnectOutcome::kRefused;
    case ETIMEDOUT:
      return ConnectOutcome::kTimedOut;
    case EHOSTUNREACH:
    case ENETUNREACH:
      return ConnectOutcome::kUnreachable;
    default:
      return ConnectOutcome::kError;
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

Result<std::optional<Record>> RecordDecoder::Next() {
  // Check the magic as soon as its bytes arrive so a stray peer fails fast.
  const size_t have = std::min(buffer_.size(), kRecordMagic.size());
  if (buffer_.compare(0, have, kRecordMagic.substr(0, have)) != 0) {
    return Fail("not a preflight record (bad magic)");
  }
  if (buffer_.size() < kRecordHeader) return std::optional<Record>();
  uint32_t size = 0;
  for (size_t i = 5; i < kRecordHeader; ++i) {
    size = (size << 8) | static_cast<uint8_t>(buffer_[i]);
  }
  if (size > kMaxRecordPayload) {
    return Fail(fmt::format("record of {} bytes is over the {} byte limit", size, kMaxRecordPayload));
  }
  if (buffer_.size() < kRecordHeader + size) return std::optional<Record>();
  Record record;
  record.type = buffer_[4];
  record.payload = buffer_.substr(kRecordHeader, size);
  buffer_.erase(0, kRecordHeader + size);
  return std::optional<Record>(std::move(record));
}

namespace {

/// One target's connect in progress: its addresses, tried in turn, and the one in flight.
class Attempt {
 public:
  Attempt(const ConnectTarget& target, std::chrono::milliseconds timeout) : target_(target) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const std::string service = std::to_string(target.port);
    if (const int rc = ::getaddrinfo(target.host.c_str(), service.c_str(), &hints, &list_); rc != 0) {
      list_ = nullptr;
      Finish(ConnectOutcome::kResolveFailed,
             Fail(fmt::format("cannot resolve {}: {}", target.host, ::gai_strerror(rc))));
      return;
    }
    deadline_ = Clock::now() + timeout;
    next_ = list_;
    last_ = Fail(fmt::format("no address for {}", target.host));
    StartNext();
  }
  ~Attempt() {
    if (list_) ::freeaddrinfo(list_);
  }
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  bool done() const { return done_; }
  int fd() const { return fd_.get(); }
  Clock::time_point deadline() const { return deadline_; }
  ConnectResult TakeResult() { return std::move(result_); }

  /// The socket in flight became writable (`ready`) or the deadline passed (`!ready`).
  void OnPoll(bool ready) {
    int err = ETIMEDOUT;
    if (ready) {
      socklen_t len = sizeof err;
      ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    Settle(err);
  }

 private:
  // Starts the next address's connect; finishes when there is none left.
  void StartNext() {
    while (!done_ && !fd_.valid()) {
      if (!next_) {
        Finish(outcome_, std::move(last_));
        return;
      }
      const addrinfo* a = next_;
      next_ = next_->ai_next;
      Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!fd.valid()) {
        last_ = Fail(fmt::format("socket: {}", std::strerror(errno)));
        continue;
      }
      const int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
      const int err = rc == 0 ? 0 : errno;
      fd_ = std::move(fd);
      if (err != EINPROGRESS) Settle(err);
    }
  }

  void Settle(int err) {
    if (err == 0) {
      Finish(ConnectOutcome::kConnected, std::move(fd_));
      return;
    }
    fd_.Reset();
    outcome_ = OutcomeOf(err);
    last_ = Fail(fmt::format("{}:{}: {}", target_.host, target_.port,
                             err == ETIMEDOUT ? "timed out" : std::strerror(err)));
    StartNext();
  }

  void Finish(ConnectOutcome outcome, Result<Fd> fd) {
    result_.outcome = outcome;
    result_.fd = std::move(fd);
    done_ = true;
  }

  ConnectTarget target_;
  addrinfo* list_ = nullptr;
  const addrinfo* next_ = nullptr;
  Clock::time_point deadline_{};
  Fd fd_;                                            // the connect in flight
  ConnectOutcome outcome_ = ConnectOutcome::kError;  // of the last address tried
  Result<Fd> last_ = Fail("not tried");              // why the last address failed
  ConnectResult result_;
  bool done_ = false;
};

}  // namespace

std::vector<ConnectResult> ConnectAll(const std::vector<ConnectTarget>& targets,
                                      std::chrono::milliseconds timeout, size_t max_in_flight) {
  std::vector<ConnectResult> results(targets.size());
  std::vector<std::pair<size_t, std::unique_ptr<Attempt>>> in_flight;
  size_t started = 0;
  while (started < targets.size() || !in_flight.empty()) {
    while (started < targets.size() && in_flight.size() < std::max<size_t>(max_in_flight, 1)) {
      in_flight.emplace_back(started, std::make_unique<Attempt>(targets[started], timeout));
      ++started;
    }
    std::vector<pollfd> fds;
    auto first_deadline = Clock::time_point::max();
    for (const auto& [index, attempt] : in_flight) {
      if (attempt->done()) continue;
      fds.push_back({attempt->fd(), POLLOUT, 0});
      first_deadline = std::min(first_deadline, attempt->deadline());
    }
    if (!fds.empty() && ::poll(fds.data(), fds.size(), MillisUntil(first_deadline)) < 0 && errno != EINTR) {
      // Not expected with valid descriptors; the deadlines below still end every attempt.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const auto now = Clock::now();
    size_t polled = 0;
    for (auto& [index, attempt] : in_flight) {
      if (attempt->done()) continue;
      const pollfd& p = fds[polled++];
      if (p.revents != 0) {
        attempt->OnPoll(true);
      } else if (now >= attempt->deadline()) {
        attempt->OnPoll(false);
      }
    }
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      if (!it->second->done()) {
        ++it;
        continue;
      }
      results[it->first] = it->second->TakeResult();
      it = in_flight.erase(it);
    }
  }
  return results;
}

Result<Fd> ConnectOnce(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  ConnectResult result = std::move(ConnectAll({ConnectTarget{host, port}}, timeout, 1).front());
  if (!result.fd) return std::move(result.fd);
  const int fd = result.fd->get();
  // Back to blocking: the callers bound every read and write with poll.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return std::move(result.fd);
}

Result<Fd> ConnectWithRetries(const std::string& host, uint16_t port, Clock::time_point deadline) {
  for (;;) {
    auto fd = ConnectOnce(host, port, std::chrono::milliseconds(3000));
    if (fd || Clock::now() + std::chrono::milliseconds(200) >= deadline) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Result<Listener> ListenWildcard(uint16_t port) {
  // Dual-stack first, like PyTorch's store; IPv4 when IPv6 is disabled.
  Error failure;
  for (const int family : {AF_INET6, AF_INET}) {
    Fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      failure = Fail(fmt::format("socket: {}", std::strerror(errno)));
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
      const int err = errno;
      failure = Fail(fmt::format("cannot listen on port {}: {}", port, std::strerror(err)));
      if (err == EADDRINUSE) return failure;  // the other family would collide too
      continue;
    }
    len = sizeof storage;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&storage), &len);
    Listener listener;
    listener.port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&storage)->sin_port);
    listener.fd = std::move(fd);
    return listener;
  }
  return failure;
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

Status SendAll(int fd, std::string_view data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, MillisUntil(deadline));
    if (ready == 0) {
      if (Clock::now() < deadline) continue;  // poll waits at most a minute at a time
      return Fail("timed out sending");
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Fail(fmt::format("poll: {}", std::strerror(errno)));
    }
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Fail(fmt::format("send: {}", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  return {};
}

Result<Record> ReadRecord(int fd, RecordDecoder& decoder, Clock::time_point deadline) {
  for (;;) {
    auto next = decoder.Next();
    if (!next) return Fail(next.error());
    if (*next) return std::move(**next);
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, MillisUntil(deadline));
    if (ready == 0) {
      if (Clock::now() < deadline) continue;
      return Fail("timed out waiting for the peer");
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Fail(fmt::format("poll: {}", std::strerror(errno)));
    }
    char buffer[64 * 1024];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n == 0) return Fail("the peer closed the connection");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Fail(fmt::format("recv: {}", std::strerror(errno)));
    }
    decoder.Feed(buffer, static_cast<size_t>(n));
  }
}

}  // namespace ddprun::preflight
