#pragma once
// The console as the event loop sees it: writes to stdout and stderr that never block.
//
// A terminal stopped with Ctrl-S, `| less` left unscrolled or a stalled ssh session stops
// reading our output. A blocking write would then freeze the one thread that also sends
// heartbeats and writes the rank logs, so every console write goes through here instead:
// what the stream takes now is written, the rest waits in a bounded queue, and when the queue
// is full whole chunks of lines are dropped and counted, then announced once the stream moves
// again. The log files never go through this class.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace boost::asio {
class io_context;
}

namespace ddprun::io {

class ConsoleWriter {
 public:
  enum class Stream { kOut = 0, kErr = 1 };

  /// `logs_hint` names where the dropped lines can be read ("logs/resnet50/"); `queue_limit`
  /// bounds the bytes waiting per stream.
  ConsoleWriter(boost::asio::io_context& io, std::string logs_hint, size_t queue_limit = kDefaultQueueLimit);
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  /// Queues `text` (whole lines) for `stream`; never blocks. When the queue cannot take all of
  /// it, the whole chunk is dropped and its lines counted.
  void Write(Stream stream, std::string_view text);

  /// At exit: waits up to `limit_ms` in total for the queues to drain (a console nobody reads
  /// does not hold the exit for longer), then gives up on what is left.
  void FlushForExit(int limit_ms);

  /// Lines dropped so far on both streams (for tests and the summary).
  uint64_t DroppedLines() const;

  static constexpr size_t kDefaultQueueLimit = 1u << 20;

 private:
  struct Sink;
  void Pump(Sink& sink);
  void WaitWritable(Sink& sink);

  boost::asio::io_context& io_;
  std::string logs_hint_;
  size_t queue_limit_;
  std::unique_ptr<Sink> sinks_[2];
};

}  // namespace ddprun::io
