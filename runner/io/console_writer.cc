#include "runner/io/console_writer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <optional>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

namespace ddprun::io {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

// How a stream is written without blocking depends on what it is.
enum class Mode {
  kOwn,      // a pipe, FIFO or terminal reopened as our own non-blocking open file description
  kSocket,   // send(MSG_DONTWAIT): a socket cannot be reopened, and its flags are shared
  kRegular,  // a file: writes do not wait for a reader
  kPolled,   // could not reopen: poll, then write at most one atomic pipe chunk
  kBroken,   // closed or gone: output is discarded
};

// How often a stream without readiness events (kSocket, kPolled) is tried again while full.
constexpr auto kRetryInterval = std::chrono::milliseconds(20);
// poll() promises room for PIPE_BUF bytes on a pipe; a smaller chunk cannot block.
constexpr size_t kPolledChunk = 512;

size_t CountLines(std::string_view text) {
  const auto n = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
  return std::max<size_t>(n, 1);
}

}  // namespace

struct ConsoleWriter::Sink {
  Sink(asio::io_context& io, int original_fd) : fd(original_fd), descriptor(io), timer(io) {}
  struct Entry {
    std::string text;
    uint64_t dropped_lines = 0;  // > 0: a notice about lines dropped at this point
  };
  int fd;
  Mode mode = Mode::kBroken;
  asio::posix::stream_descriptor descriptor;  // kOwn: owns `fd`
  asio::steady_timer timer;
  std::deque<Entry> queue;
  size_t queued_bytes = 0;
  size_t front_offset = 0;  // bytes of queue.front() already written
  bool waiting = false;
  uint64_t dropped_total = 0;
};

ConsoleWriter::ConsoleWriter(asio::io_context& io, std::string logs_hint, size_t queue_limit)
    : io_(io), logs_hint_(std::move(logs_hint)), queue_limit_(queue_limit) {
  for (int i = 0; i < 2; ++i) {
    const int original = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
    auto sink = std::make_unique<Sink>(io, original);
    struct stat st {};
    if (::fstat(original, &st) != 0) {
      sink->mode = Mode::kBroken;
    } else if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) {
      sink->mode = Mode::kRegular;
    } else if (S_ISSOCK(st.st_mode)) {
      sink->mode = Mode::kSocket;
    } else {
      // Setting O_NONBLOCK on fd 1 itself would change the open file description we share
      // with the shell (which then sees EAGAIN on its terminal after we exit). Opening the
      // same pipe or terminal again gives a description of our own; O_NOCTTY so a terminal
      // does not become our controlling terminal.
      const std::string path = fmt::format("/proc/self/fd/{}", original);
      const int own = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
      error_code ec;
      if (own >= 0) sink->descriptor.assign(own, ec);
      if (own >= 0 && !ec) {
        sink->fd = own;
        sink->mode = Mode::kOwn;
      } else {
        if (own >= 0) ::close(own);
        sink->mode = Mode::kPolled;
      }
    }
    sinks_[i] = std::move(sink);
  }
}

ConsoleWriter::~ConsoleWriter() {
  for (auto& sink : sinks_) {
    error_code ignored;
    sink->timer.cancel();
    if (sink->descriptor.is_open()) sink->descriptor.close(ignored);
  }
}

uint64_t ConsoleWriter::DroppedLines() const { return sinks_[0]->dropped_total + sinks_[1]->dropped_total; }

void ConsoleWriter::Write(Stream stream, std::string_view text) {
  if (text.empty()) return;
  Sink& sink = *sinks_[static_cast<int>(stream)];
  if (sink.mode == Mode::kBroken) return;
  if (sink.queued_bytes + text.size() > queue_limit_ && !sink.queue.empty()) {
    // Whole chunks of whole lines are dropped, never the middle of a line; consecutive drops
    // share one notice, which appears where the lines would have been.
    const uint64_t lines = CountLines(text);
    sink.dropped_total += lines;
    if (sink.queue.back().dropped_lines == 0) sink.queue.push_back(Sink::Entry{});
    sink.queue.back().dropped_lines += lines;
    return;
  }
  sink.queue.push_back(Sink::Entry{std::string(text), 0});
  sink.queued_bytes += text.size();
  if (!sink.waiting) Pump(sink);
}

void ConsoleWriter::Pump(Sink& sink) {
  while (!sink.queue.empty()) {
    Sink::Entry& front = sink.queue.front();
    if (front.dropped_lines > 0 && front.text.empty()) {
      front.text = fmt::format("[... {} line{} not shown on the console; see {}]\n", front.dropped_lines,
                               front.dropped_lines == 1 ? "" : "s", logs_hint_);
      sink.queued_bytes += front.text.size();
    }
    const char* data = front.text.data() + sink.front_offset;
    size_t size = front.text.size() - sink.front_offset;
    ssize_t n = -1;
    switch (sink.mode) {
      case Mode::kSocket:
        n = ::send(sink.fd, data, size, MSG_DONTWAIT | MSG_NOSIGNAL);
        break;
      case Mode::kPolled: {
        pollfd p{sink.fd, POLLOUT, 0};
        if (::poll(&p, 1, 0) != 1 || (p.revents & POLLOUT) == 0) {
          n = -1;
          errno = (p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0 ? EPIPE : EAGAIN;
          break;
        }
        n = ::write(sink.fd, data, std::min(size, kPolledChunk));
        break;
      }
      case Mode::kOwn:
      case Mode::kRegular:
        n = ::write(sink.fd, data, size);
        break;
      case Mode::kBroken:
        return;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      WaitWritable(sink);
      return;
    }
    if (n <= 0) {
      // The reader is gone (EPIPE) or the stream failed: nothing more can be shown.
      sink.mode = Mode::kBroken;
      sink.queue.clear();
      sink.queued_bytes = 0;
      sink.front_offset = 0;
      return;
    }
    sink.front_offset += static_cast<size_t>(n);
    if (sink.front_offset == front.text.size()) {
      sink.queued_bytes -= front.text.size();
      sink.queue.pop_front();
      sink.front_offset = 0;
    }
  }
}

void ConsoleWriter::WaitWritable(Sink& sink) {
  if (sink.waiting) return;
  sink.waiting = true;
  auto resume = [this, &sink](error_code ec) {
    sink.waiting = false;
    if (ec == asio::error::operation_aborted) return;
    Pump(sink);
  };
  if (sink.mode == Mode::kOwn) {
    sink.descriptor.async_wait(asio::posix::stream_descriptor::wait_write, resume);
  } else {
    sink.timer.expires_after(kRetryInterval);
    sink.timer.async_wait(resume);
  }
}

void ConsoleWriter::FlushForExit(int limit_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit_ms);
  for (auto& sink_ptr : sinks_) {
    Sink& sink = *sink_ptr;
    while (!sink.queue.empty() && sink.mode != Mode::kBroken) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return;
      pollfd p{sink.fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return;
      // The wait that Pump may have armed belongs to the stopped loop; write from here.
      sink.waiting = false;
      Pump(sink);
    }
  }
}

}  // namespace ddprun::io
