#include "runner/io/controller_link.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <memory>

#include <fmt/format.h>
#include <boost/asio/buffer.hpp>

#include "base/parse_int.h"

namespace ddprun::io {
namespace {

// Nothing but stop lines travel on the link; more than this is not `up` speaking.
constexpr size_t kMaxReceived = 4096;

}  // namespace

std::string StopRequestLine(int signal) { return fmt::format("stop {}\n", signal); }

int ParseStopRequest(std::string_view received) {
  size_t start = 0;
  while (start < received.size()) {
    const size_t end = received.find('\n', start);
    if (end == std::string_view::npos) return 0;  // an incomplete line waits for the rest
    const std::string_view line = received.substr(start, end - start);
    if (line.starts_with("stop ")) {
      const auto signal = ParseNonNegative(std::string(line.substr(5)), 64);
      if (signal && *signal > 0) return static_cast<int>(*signal);
    }
    start = end + 1;
  }
  return 0;
}

Result<std::unique_ptr<ControllerLink>> ControllerLink::Watch(boost::asio::io_context& io,
                                                              std::function<void(int)> on_stop) {
  // A descriptor of our own (close-on-exec, so workers never hold the link open).
  const int fd = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return Fail(fmt::format("cannot watch stdin: {}", std::strerror(errno)));
  std::unique_ptr<ControllerLink> link(new ControllerLink(io, fd, std::move(on_stop)));
  boost::system::error_code ec;
  link->stdin_.non_blocking(true, ec);
  if (ec) return Fail(fmt::format("cannot watch stdin: {}", ec.message()));
  link->ReadMore();
  return link;
}

ControllerLink::ControllerLink(boost::asio::io_context& io, int fd, std::function<void(int)> on_stop)
    : stdin_(io, fd), on_stop_(std::move(on_stop)) {}

ControllerLink::~ControllerLink() {
  boost::system::error_code ec;
  stdin_.close(ec);
}

void ControllerLink::ReadMore() {
  stdin_.async_read_some(boost::asio::buffer(buffer_), [this](boost::system::error_code ec, size_t n) {
    if (ec == boost::asio::error::operation_aborted) return;
    if (ec) {
      // End of file (or a broken link): the controller is gone.
      Stop(SIGHUP);
      return;
    }
    if (received_.size() < kMaxReceived)
      received_.append(buffer_, std::min(n, kMaxReceived - received_.size()));
    if (const int signal = ParseStopRequest(received_)) Stop(signal);
    ReadMore();
  });
}

void ControllerLink::Stop(int signal) {
  if (stopped_) return;
  stopped_ = true;
  on_stop_(signal);
}

}  // namespace ddprun::io
