#include "runner/core/wire.h"

#include <cstring>
#include <type_traits>

namespace ddprun::wire {
namespace {

// The payload of each type, in the order of the Message variant; the type byte is index + 1.
template <typename T>
constexpr uint8_t TypeOf() {
  return []<size_t... I>(std::index_sequence<I...>) {
    uint8_t type = 0;
    ((std::is_same_v<T, std::variant_alternative_t<I, Message>> ? (type = I + 1) : 0), ...);
    return type;
  }
  (std::make_index_sequence<std::variant_size_v<Message>>{});
}

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  void U8(uint8_t v) { out_.push_back(v); }
  void U16(uint16_t v) { Little(v, 2); }
  void U32(uint32_t v) { Little(v, 4); }
  void U64(uint64_t v) { Little(v, 8); }
  void I32(int32_t v) { U32(static_cast<uint32_t>(v)); }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Bool(bool v) { U8(v ? 1 : 0); }
  void Str(const std::string& s) {
    // Senders cut long texts (stderr tails, diffs) rather than produce a frame peers refuse.
    const size_t n = s.size() < kMaxString ? s.size() : kMaxString;
    U32(static_cast<uint32_t>(n));
    out_.insert(out_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  void I32List(const std::vector<int32_t>& v) {
    const size_t n = v.size() < kMaxListItems ? v.size() : kMaxListItems;
    U32(static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) I32(v[i]);
  }
  /// A list of records, each written by its Put (defined below).
  template <typename T>
  void List(const std::vector<T>& v);
  void StrList(const std::vector<std::string>& v) {
    const size_t n = v.size() < kMaxListItems ? v.size() : kMaxListItems;
    U32(static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; ++i) Str(v[i]);
  }

 private:
  void Little(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t>& out_;
};

/// Reads a payload; any overrun or bound violation sets `bad` and yields zero values.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t U8() { return static_cast<uint8_t>(Little(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Little(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Little(4)); }
  uint64_t U64() { return Little(8); }
  int32_t I32() { return static_cast<int32_t>(U32()); }
  int64_t I64() { return static_cast<int64_t>(U64()); }
  bool Bool() {
    const uint8_t v = U8();
    if (v > 1) bad = true;
    return v == 1;
  }
  std::string Str() {
    const uint32_t n = U32();
    if (n > kMaxString || n > size_ - pos_) {
      bad = true;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  std::vector<int32_t> I32List() {
    const uint32_t n = U32();
    if (n > kMaxListItems || static_cast<size_t>(n) * 4 > size_ - pos_) {
      bad = true;
      return {};
    }
    std::vector<int32_t> v(n);
    for (auto& x : v) x = I32();
    return v;
  }
  /// A list of records; each takes at least 4 bytes, which bounds the count by the payload.
  template <typename T>
  void List(std::vector<T>& v);
  /// A list of strings; each takes at least its 4-byte length, which bounds the count.
  std::vector<std::string> StrList() {
    const uint32_t n = U32();
    std::vector<std::string> v;
    if (n > kMaxListItems || n > (size_ - pos_) / 4) {
      bad = true;
      return v;
    }
    v.reserve(n);
    for (uint32_t i = 0; i < n && !bad; ++i) v.push_back(Str());
    return v;
  }
  bool AtEnd() const { return pos_ == size_; }
  bool bad = false;

 private:
  uint64_t Little(int bytes) {
    if (bad || size_ - pos_ < static_cast<size_t>(bytes)) {
      bad = true;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= static_cast<uint64_t>(data_[pos_ + static_cast<size_t>(i)]) << (8 * i);
    pos_ += static_cast<size_t>(bytes);
    return v;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// One function per message and direction keeps the two in sight of each other.
void Put(Writer& w, const Join& m) {
  w.I32(m.node_rank);
  w.Str(m.host);
  w.I32(m.nproc);
  w.Str(m.ddprun_version);
  w.Str(m.fingerprint);
  w.Str(m.canonical);
  w.U64(m.instance);
  w.Str(m.proof);
  w.Str(m.nonce);
  w.Str(m.probe_endpoint);
  // Written only after a round: a hello, or a join before any round, keeps its old form.
  if (m.ran_round >= 0) {
    w.I32(m.ran_round);
    w.I32(m.ran_as);
    w.Bool(m.ran_ok);
  }
}
void Get(Reader& r, Join& m) {
  m.node_rank = r.I32();
  m.host = r.Str();
  m.nproc = r.I32();
  m.ddprun_version = r.Str();
  m.fingerprint = r.Str();
  m.canonical = r.Str();
  m.instance = r.U64();
  m.proof = r.Str();
  m.nonce = r.Str();
  m.probe_endpoint = r.Str();
  if (!r.AtEnd()) {
    m.ran_round = r.I32();
    m.ran_as = r.I32();
    m.ran_ok = r.Bool();
  }
}
void Put(Writer& w, const JoinAck& m) {
  w.I32(m.nnodes);
  w.Bool(m.standby);
}
void Get(Reader& r, JoinAck& m) {
  m.nnodes = r.I32();
  m.standby = r.Bool();
}
void Put(Writer& w, const Reject& m) {
  w.Str(m.reason);
  w.Bool(m.retry);
}
void Get(Reader& r, Reject& m) {
  m.reason = r.Str();
  m.retry = r.Bool();
}
void Put(Writer& w, const Progress& m) {
  w.I32(m.joined);
  w.I32(m.total);
  w.I32List(m.missing);
  w.I64(m.elapsed_ms);
  w.I64(m.timeout_ms);
  w.StrList(m.missing_hosts);
  w.StrList(m.missing_why);
}
void Get(Reader& r, Progress& m) {
  m.joined = r.I32();
  m.total = r.I32();
  m.missing = r.I32List();
  m.elapsed_ms = r.I64();
  m.timeout_ms = r.I64();
  m.missing_hosts = r.StrList();
  m.missing_why = r.StrList();
}
void Put(Writer& w, const StartRound& m) {
  w.I32(m.round);
  w.U16(m.master_port);
  w.I64(m.longest_interval_ms);
  w.I32(m.node_rank);
  w.I32(m.nnodes);
  w.Str(m.master_addr);
}
void Get(Reader& r, StartRound& m) {
  m.round = r.I32();
  m.master_port = r.U16();
  m.longest_interval_ms = r.I64();
  m.node_rank = r.I32();
  m.nnodes = r.I32();
  m.master_addr = r.Str();
}
void Put(Writer& w, const WorkerFailed& m) {
  w.I32(m.round);
  w.I32(m.global_rank);
  w.I32(m.local_rank);
  w.I32(m.exit_code);
  w.I32(m.signal);
  w.Str(m.stderr_tail);
  w.Str(m.error_file);
}
void Get(Reader& r, WorkerFailed& m) {
  m.round = r.I32();
  m.global_rank = r.I32();
  m.local_rank = r.I32();
  m.exit_code = r.I32();
  m.signal = r.I32();
  m.stderr_tail = r.Str();
  m.error_file = r.Str();
}
void Put(Writer& w, const NodeDone& m) { w.I32(m.round); }
void Get(Reader& r, NodeDone& m) { m.round = r.I32(); }
void Put(Writer& w, const StopRound& m) {
  w.I32(m.round);
  w.Str(m.cause);
  w.Bool(m.last);
  w.I32(m.cause_rank);
  w.Bool(m.cause_lost_peer);
}
void Get(Reader& r, StopRound& m) {
  m.round = r.I32();
  m.cause = r.Str();
  m.last = r.Bool();
  m.cause_rank = r.I32();
  m.cause_lost_peer = r.Bool();
}
void Put(Writer& w, const RoundStopped& m) {
  w.I32(m.round);
  w.I32(m.stopped);
}
void Get(Reader& r, RoundStopped& m) {
  m.round = r.I32();
  m.stopped = r.I32();
}
void Put(Writer& w, const Interrupted& m) { w.I32(m.signal); }
void Get(Reader& r, Interrupted& m) { m.signal = r.I32(); }
void Put(Writer& w, const JobEnd& m) {
  w.I32(m.exit_code);
  w.Str(m.summary);
}
void Get(Reader& r, JobEnd& m) {
  m.exit_code = r.I32();
  m.summary = r.Str();
}
void Put(Writer&, const JobEndAck&) {}
void Get(Reader&, JobEndAck&) {}
// The echo is written only when there is one: every other heartbeat stays a bare header.
void Put(Writer& w, const Heartbeat& m) {
  if (m.echo != 0) w.U64(m.echo);
}
void Get(Reader& r, Heartbeat& m) {
  if (!r.AtEnd()) m.echo = r.U64();
}
void Put(Writer& w, const Challenge& m) {
  w.Str(m.nonce);
  w.Str(m.proof);
}
void Get(Reader& r, Challenge& m) {
  m.nonce = r.Str();
  m.proof = r.Str();
}
void Put(Writer& w, const RankHung& m) {
  w.I32(m.round);
  w.I32(m.global_rank);
  w.I32(m.local_rank);
  w.I64(m.step);
  w.I64(m.silent_ms);
  w.I64(m.timeout_ms);
  w.Bool(m.first_beat);
  w.Bool(m.learnt);
}
void Get(Reader& r, RankHung& m) {
  m.round = r.I32();
  m.global_rank = r.I32();
  m.local_rank = r.I32();
  m.step = r.I64();
  m.silent_ms = r.I64();
  m.timeout_ms = r.I64();
  m.first_beat = r.Bool();
  m.learnt = r.Bool();
}
void Put(Writer& w, const DumpStacks& m) { w.I32(m.round); }
void Get(Reader& r, DumpStacks& m) { m.round = r.I32(); }
void Put(Writer& w, const HangCleared& m) { w.I32(m.round); }
void Get(Reader& r, HangCleared& m) { m.round = r.I32(); }
void Put(Writer& w, const RankState& m) {
  w.I32(m.global_rank);
  w.I64(m.step);
  w.I64(m.silent_ms);
  w.Str(m.stack);
}
void Get(Reader& r, RankState& m) {
  m.global_rank = r.I32();
  m.step = r.I64();
  m.silent_ms = r.I64();
  m.stack = r.Str();
}
void Put(Writer& w, const RankRate& m) {
  w.I32(m.global_rank);
  w.I64(m.step);
  w.I64(m.work_us);
  w.I64(m.step_us);
  w.I64(m.longest_ms);
}
void Get(Reader& r, RankRate& m) {
  m.global_rank = r.I32();
  m.step = r.I64();
  m.work_us = r.I64();
  m.step_us = r.I64();
  m.longest_ms = r.I64();
}
void Put(Writer& w, const RankStacks& m) {
  w.I32(m.round);
  w.List(m.ranks);
}
void Get(Reader& r, RankStacks& m) {
  m.round = r.I32();
  r.List(m.ranks);
}
void Put(Writer& w, const RankProgress& m) {
  w.I32(m.round);
  w.List(m.ranks);
}
void Get(Reader& r, RankProgress& m) {
  m.round = r.I32();
  r.List(m.ranks);
}
void Put(Writer& w, const ProbeTarget& m) {
  w.I32(m.node_rank);
  w.Str(m.host);
  w.Str(m.endpoint);
}
void Get(Reader& r, ProbeTarget& m) {
  m.node_rank = r.I32();
  m.host = r.Str();
  m.endpoint = r.Str();
}
void Put(Writer& w, const ProbePeers& m) { w.List(m.targets); }
void Get(Reader& r, ProbePeers& m) { r.List(m.targets); }
void Put(Writer& w, const ProbeFailure& m) {
  Put(w, m.target);
  w.Str(m.error);
}
void Get(Reader& r, ProbeFailure& m) {
  Get(r, m.target);
  m.error = r.Str();
}
void Put(Writer& w, const PeersProbed& m) { w.List(m.failures); }
void Get(Reader& r, PeersProbed& m) { r.List(m.failures); }

template <typename T>
void Writer::List(const std::vector<T>& v) {
  const size_t n = v.size() < kMaxListItems ? v.size() : kMaxListItems;
  U32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) Put(*this, v[i]);
}

template <typename T>
void Reader::List(std::vector<T>& v) {
  const uint32_t n = U32();
  if (n > kMaxListItems || static_cast<size_t>(n) * 4 > size_ - pos_) {
    bad = true;
    return;
  }
  v.resize(n);
  for (auto& item : v) {
    Get(*this, item);
    if (bad) return;
  }
}

template <size_t I = 0>
bool DecodePayload(uint8_t type, Reader& r, Message& out) {
  if constexpr (I < std::variant_size_v<Message>) {
    if (type == I + 1) {
      std::variant_alternative_t<I, Message> m;
      Get(r, m);
      out = std::move(m);
      return true;
    }
    return DecodePayload<I + 1>(type, r, out);
  } else {
    return false;
  }
}

}  // namespace

const char* MessageName(const Message& message) {
  static constexpr const char* kNames[] = {
      "join",        "join-ack",     "reject",        "progress",    "start-round", "worker-failed",
      "node-done",   "stop-round",   "round-stopped", "interrupted", "job-end",     "job-end-ack",
      "heartbeat",   "challenge",    "rank-hung",     "dump-stacks", "rank-stacks", "rank-progress",
      "probe-peers", "peers-probed", "hang-cleared"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  return kNames[message.index()];
}

void Encode(const Message& message, std::vector<uint8_t>& out) {
  const size_t start = out.size();
  out.insert(out.end(), std::begin(kMagic), std::end(kMagic));
  Writer w(out);
  w.U8(kVersion);
  w.U8(static_cast<uint8_t>(message.index() + 1));
  w.U16(0);
  w.U32(0);  // length, patched below
  std::visit([&](const auto& m) { Put(w, m); }, message);
  const size_t payload = out.size() - start - kHeaderSize;
  for (int i = 0; i < 4; ++i) {
    out[start + 8 + static_cast<size_t>(i)] = static_cast<uint8_t>(payload >> (8 * i));
  }
}

std::vector<uint8_t> Encode(const Message& message) {
  std::vector<uint8_t> out;
  Encode(message, out);
  return out;
}

void Decoder::Feed(std::span<const uint8_t> bytes) {
  if (!error_.empty()) return;
  // Compact before growing so a long-lived connection's buffer stays one frame in size.
  if (offset_ > 0 && offset_ == buffer_.size()) {
    buffer_.clear();
    // A large frame's capacity is not kept once it is decoded (a Join, a stack dump).
    if (buffer_.capacity() > 64 * 1024) buffer_.shrink_to_fit();
    offset_ = 0;
  } else if (offset_ > 64 * 1024) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(offset_));
    offset_ = 0;
  }
  buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
}

bool Decoder::LooksForeign() const {
  const size_t have = buffer_.size() - offset_;
  const size_t n = have < 4 ? have : 4;
  // Nothing buffered: an empty vector's data() may be null, and memcmp on null is undefined
  // even for 0 bytes (UBSan reported it).
  if (n == 0) return false;
  return std::memcmp(buffer_.data() + offset_, kMagic, n) != 0;
}

Decoder::Status Decoder::Next(Message& out) {
  if (!error_.empty()) return Status::kError;
  const size_t have = buffer_.size() - offset_;
  if (have > 0 && LooksForeign()) {
    error_ = "not a ddprun frame (bad magic)";
    return Status::kError;
  }
  if (have < kHeaderSize) return Status::kNeedMore;
  const uint8_t* h = buffer_.data() + offset_;
  if (h[4] != kVersion) {
    error_ = "unsupported protocol version " + std::to_string(h[4]);
    return Status::kError;
  }
  const uint8_t type = h[5];
  const uint32_t length = static_cast<uint32_t>(h[8]) | static_cast<uint32_t>(h[9]) << 8 |
                          static_cast<uint32_t>(h[10]) << 16 | static_cast<uint32_t>(h[11]) << 24;
  if (length > limit_) {
    error_ = "frame of " + std::to_string(length) + " bytes is over the limit";
    if (limit_ < kMaxPayload)
      error_ += " for a peer that has not joined (" + std::to_string(limit_) + " bytes)";
    return Status::kError;
  }
  if (type == 0 || type > std::variant_size_v<Message>) {
    error_ = "unknown message type " + std::to_string(type);
    return Status::kError;
  }
  if (have < kHeaderSize + length) return Status::kNeedMore;
  Reader r(h + kHeaderSize, length);
  Message message;
  DecodePayload(type, r, message);
  if (r.bad || !r.AtEnd()) {
    error_ = std::string("malformed ") + MessageName(message) + " payload";
    return Status::kError;
  }
  offset_ += kHeaderSize + length;
  out = std::move(message);
  return Status::kMessage;
}

}  // namespace ddprun::wire
