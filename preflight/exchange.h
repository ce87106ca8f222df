#pragma once
// A tiny length-prefixed record exchange over TCP for the preflight worker and the C++ DDP
// example: worker rank 0 listens on MASTER_PORT (the wildcard, like PyTorch's store), every rank
// connects to MASTER_ADDR:MASTER_PORT, through ddprun's store relay on the other nodes
// (docs/running.md, "Ports and the store relay"). Records start with "PFL1", never with
// ddprun's own magic, so the relay treats them as store traffic.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"

namespace ddprun::preflight {

using Clock = std::chrono::steady_clock;

inline constexpr std::string_view kRecordMagic = "PFL1";
inline constexpr size_t kRecordHeader = 9;              // magic, type, 4-byte big-endian length
inline constexpr size_t kMaxRecordPayload = 16u << 20;  // 16 MiB: a table of many thousand ranks

/// One record: a type byte the caller defines and an opaque payload.
struct Record {
  char type = 0;
  std::string payload;
};

/// The bytes of one record. Asserts payload.size() <= kMaxRecordPayload.
std::string EncodeRecord(char type, std::string_view payload);

/// Total decoder: any byte sequence yields records, "need more", or a failure.
class RecordDecoder {
 public:
  void Feed(const char* data, size_t size) { buffer_.append(data, size); }
  /// Takes the next complete record out of the buffer; nullopt while it needs more bytes; a
  /// failure when the bytes are not preflight records (the connection is then of no use).
  Result<std::optional<Record>> Next();

 private:
  std::string buffer_;
};

/// A file descriptor closed by the destructor.
using Fd = UniqueFd;

/// How a connect attempt ended.
enum class ConnectOutcome { kConnected, kRefused, kTimedOut, kUnreachable, kResolveFailed, kError };

struct ConnectTarget {
  std::string host;  // a name or an address
  uint16_t port = 0;
};

/// One target's connect: the (non-blocking) socket, or the system's words on why not.
struct ConnectResult {
  ConnectOutcome outcome = ConnectOutcome::kError;
  Result<Fd> fd = Fail("not tried");
};

/// One TCP connect to each target (every address a name resolves to, in turn), each giving up
/// `timeout` after its name resolved; at most `max_in_flight` at once, all polled together on
/// the calling thread. Results in the order of `targets`.
std::vector<ConnectResult> ConnectAll(const std::vector<ConnectTarget>& targets,
                                      std::chrono::milliseconds timeout, size_t max_in_flight);

/// One TCP connect to host:port that gives up after `timeout`; the socket is blocking.
Result<Fd> ConnectOnce(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

/// Connects with retries (every 200 ms) until `deadline`: rank 0 may not listen yet.
Result<Fd> ConnectWithRetries(const std::string& host, uint16_t port, Clock::time_point deadline);

/// A listening socket and the port it got.
struct Listener {
  Fd fd;
  uint16_t port = 0;
};

/// A listening TCP socket on the wildcard address (IPv6 dual-stack where available, else IPv4)
/// at `port` (0: the kernel picks).
Result<Listener> ListenWildcard(uint16_t port);

/// The local address of a connected socket, as text ("" on failure).
std::string LocalAddressOf(int fd);

/// Writes all of `data` before `deadline`.
Status SendAll(int fd, std::string_view data, Clock::time_point deadline);

/// Reads until one whole record is decoded or `deadline` passes.
Result<Record> ReadRecord(int fd, RecordDecoder& decoder, Clock::time_point deadline);

}  // namespace ddprun::preflight
