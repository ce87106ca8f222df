// The frame codec: exact layout, round trips, and a decoder that is total on any byte sequence.

#include "runner/core/wire.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace ddprun::wire {
namespace {

using Bytes = std::vector<uint8_t>;

// One message of every type, with values that catch byte-order and sign mistakes.
std::vector<Message> Samples() {
  return {
      Join{3, "gpu-04.cluster", 8, "0.1.0", std::string(64, 'f'), "cluster.nnodes = 4\n",
           0xfedcba9876543210ull, std::string(64, 'a'), std::string(32, 'n'), "10.77.0.4:41234"},
      Join{3, "gpu-04", 8, "0.1.0", "f", "c", 1, "", "", "", 12, 5, true},
      Join{3, "gpu-04", 8, "0.1.0", "f", "c", 1, "", "", "", 0, 0, false},
      JoinAck{4},
      JoinAck{4, true},
      Reject{"node 1: cluster.nproc_per_node = 4, node 0 has 8", false},
      Reject{"node rank 1 is claimed twice", true},
      Progress{2, 4, {2, 3}, 41'000, 900'000, {"gpu-03", ""}, {"", "it runs a different job file"}},
      StartRound{7, 65535, 0, -1, 0, ""},
      WorkerFailed{2, 13, 5, -1, 9, std::string("NCCL error\0with a NUL\n", 22), "{\"message\": 1}"},
      NodeDone{1},
      StopRound{3, "rank 3 (node 1 (gpu-02), local rank 1) exited with code 1"},
      StopRound{3, "rank 3 (node 1 (gpu-02), local rank 1) exited with code 1", true, 3},
      StopRound{3, "rank 2 (node 1 (gpu-02), local rank 0) exited with code 1", false, 2, true},
      RoundStopped{3, 7},
      Interrupted{15},
      JobEnd{1, "job \"demo\" FAILED in round 1\n\xe2\x9c\x97 unicode kept"},
      JobEndAck{},
      Heartbeat{},
      Challenge{"0123456789abcdef0123456789abcdef", std::string(64, 'p')},
      RankHung{2, 13, 5, 4711, 61'000, 60'000, false},
      DumpStacks{2},
      RankStacks{
          2,
          {RankState{12, 4711, 100, "File \"train.py\", line 88 in main\n"}, RankState{13, -1, 61'000, ""}}},
      RankProgress{2, {RankRate{12, 4711, 180'000, 250'000, 2'100}, RankRate{13, 4700, -1, -1, 0}}},
      StartRound{8, 29501, 2'100, 1, 3, "gpu-02.cluster"},
      ProbePeers{{ProbeTarget{0, "gpu-01", "10.77.0.1:41000"}, ProbeTarget{2, "gpu-03", "[fd00::3]:41002"}}},
      PeersProbed{
          {ProbeFailure{ProbeTarget{0, "gpu-01", "10.77.0.1:41000"}, "timed out (a firewall drops it)"}}},
      PeersProbed{},
      HangCleared{4},
  };
}

Bytes Concat(const std::vector<Message>& messages) {
  Bytes out;
  for (const Message& m : messages) Encode(m, out);
  return out;
}

Bytes Frame(uint8_t type, const Bytes& payload, uint8_t version = kVersion) {
  Bytes out = {'D', 'D', 'P', 'R', version, type, 0, 0};
  const auto n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void PutU32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Drains the decoder; returns the messages and leaves the final status in `last`.
std::vector<Message> Drain(Decoder& decoder, Decoder::Status& last) {
  std::vector<Message> got;
  Message m;
  while ((last = decoder.Next(m)) == Decoder::Status::kMessage) got.push_back(m);
  return got;
}

std::string ErrorOf(const Bytes& bytes) {
  Decoder decoder;
  decoder.Feed(bytes);
  Decoder::Status last;
  const auto got = Drain(decoder, last);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(last, Decoder::Status::kError);
  return decoder.error();
}

// SplitMix64: our own PRNG, the same sequence on every standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }
  uint8_t Byte() { return static_cast<uint8_t>(Next()); }

 private:
  uint64_t state_;
};

TEST(WireTest, SamplesCoverEveryMessageType) {
  std::set<size_t> types;
  for (const Message& m : Samples()) types.insert(m.index());
  EXPECT_EQ(types.size(), std::variant_size_v<Message>);
}

TEST(WireTest, HeaderLayoutIsMagicVersionTypeReservedLengthPayload) {
  const Bytes frame = Encode(StartRound{0x01020304, 0xa1b2, 0x0102, 3, 2, "ab"});
  const Bytes expected = {'D',  'D',  'P',  'R',  1,    5,    0, 0, 28, 0, 0,   0,  0x04, 0x03,
                          0x02, 0x01, 0xb2, 0xa1, 0x02, 0x01, 0, 0, 0,  0, 0,   0,  3,    0,
                          0,    0,    2,    0,    0,    0,    2, 0, 0,  0, 'a', 'b'};
  EXPECT_EQ(frame, expected);
  EXPECT_EQ(Encode(Heartbeat{}), (Bytes{'D', 'D', 'P', 'R', 1, 13, 0, 0, 0, 0, 0, 0}));
  // The echo of an agent that ran again after a stall (issue 37); only then is there a payload.
  EXPECT_EQ(Encode(Heartbeat{0x0102}),
            (Bytes{'D', 'D', 'P', 'R', 1, 13, 0, 0, 8, 0, 0, 0, 0x02, 0x01, 0, 0, 0, 0, 0, 0}));
}

TEST(WireTest, EveryMessageTypeRoundTrips) {
  for (const Message& original : Samples()) {
    SCOPED_TRACE(MessageName(original));
    Decoder decoder;
    decoder.Feed(Encode(original));
    Message decoded;
    ASSERT_EQ(decoder.Next(decoded), Decoder::Status::kMessage) << decoder.error();
    EXPECT_EQ(decoded, original);
    EXPECT_EQ(decoder.Next(decoded), Decoder::Status::kNeedMore);
  }
}

TEST(WireTest, AJoinBeforeAnyRoundCarriesNoRoundReport) {
  // A hello and a first join keep their form: the round report (9 bytes) follows a round only.
  const Join before{1, "gpu-02", 2, "0.1.0", "f", "c", 7, "", "", ""};
  Join after = before;
  after.ran_round = 0;
  after.ran_as = 1;
  EXPECT_EQ(Encode(after).size(), Encode(before).size() + 9);
  Decoder decoder;
  decoder.Feed(Encode(before));
  Message decoded;
  ASSERT_EQ(decoder.Next(decoded), Decoder::Status::kMessage);
  EXPECT_EQ(std::get<Join>(decoded).ran_round, -1);
  EXPECT_FALSE(std::get<Join>(decoded).ran_ok);
}

TEST(WireTest, MessageNamesAreTheProtocolWords) {
  EXPECT_STREQ(MessageName(Join{}), "join");
  EXPECT_STREQ(MessageName(StartRound{}), "start-round");
  EXPECT_STREQ(MessageName(WorkerFailed{}), "worker-failed");
  EXPECT_STREQ(MessageName(JobEndAck{}), "job-end-ack");
  EXPECT_STREQ(MessageName(Heartbeat{}), "heartbeat");
  EXPECT_STREQ(MessageName(Challenge{}), "challenge");
  EXPECT_STREQ(MessageName(ProbePeers{}), "probe-peers");
  EXPECT_STREQ(MessageName(PeersProbed{}), "peers-probed");
  EXPECT_STREQ(MessageName(HangCleared{}), "hang-cleared");
}

TEST(WireTest, ExtremeValuesRoundTrip) {
  const std::vector<Message> extremes = {
      Join{INT32_MIN, "", INT32_MAX, "", "", "", UINT64_MAX, "", "", ""},
      Join{0, "", 0, "", "", "", 0, "", "", "", INT32_MAX, INT32_MIN, true},
      Progress{0, 0, {}, INT64_MIN, INT64_MAX, {}, {}},
      WorkerFailed{INT32_MAX, -1, -2, INT32_MIN, INT32_MAX, "", ""},
      StartRound{0, 0, 0, -1, 0, std::string(300, 'h')},
  };
  for (const Message& original : extremes) {
    Decoder decoder;
    decoder.Feed(Encode(original));
    Message decoded;
    ASSERT_EQ(decoder.Next(decoded), Decoder::Status::kMessage) << decoder.error();
    EXPECT_EQ(decoded, original);
  }
}

TEST(WireTest, TruncatedFrameNeedsMoreAtEverySplitPoint) {
  for (const Message& original : Samples()) {
    SCOPED_TRACE(MessageName(original));
    const Bytes frame = Encode(original);
    for (size_t split = 0; split < frame.size(); ++split) {
      Decoder decoder;
      decoder.Feed(std::span(frame).first(split));
      Message decoded;
      ASSERT_EQ(decoder.Next(decoded), Decoder::Status::kNeedMore) << "split at " << split;
      EXPECT_FALSE(decoder.LooksForeign());
      decoder.Feed(std::span(frame).subspan(split));
      ASSERT_EQ(decoder.Next(decoded), Decoder::Status::kMessage) << "split at " << split;
      EXPECT_EQ(decoded, original);
    }
  }
}

TEST(WireTest, ByteByByteFeedingYieldsEveryMessageInOrder) {
  const std::vector<Message> samples = Samples();
  const Bytes stream = Concat(samples);
  Decoder decoder;
  std::vector<Message> got;
  for (uint8_t byte : stream) {
    decoder.Feed(std::span(&byte, 1));
    Decoder::Status last;
    for (Message& m : Drain(decoder, last)) got.push_back(std::move(m));
    ASSERT_EQ(last, Decoder::Status::kNeedMore);
  }
  EXPECT_EQ(got, samples);
}

TEST(WireTest, ManyFramesInOneFeed) {
  std::vector<Message> sent;
  for (int i = 0; i < 2000; ++i) sent.push_back(RoundStopped{i, i % 9});
  Decoder decoder;
  decoder.Feed(Concat(sent));
  Decoder::Status last;
  EXPECT_EQ(Drain(decoder, last), sent);
  EXPECT_EQ(last, Decoder::Status::kNeedMore);
}

TEST(WireTest, LongConnectionKeepsDecodingAcrossBufferCompaction) {
  // Over 64 KiB of frames in uneven chunks, so the decoder compacts mid-frame.
  std::vector<Message> sent;
  for (int i = 0; i < 3000; ++i) sent.push_back(StopRound{i, std::string(static_cast<size_t>(i % 50), 'x')});
  const Bytes stream = Concat(sent);
  ASSERT_GT(stream.size(), 128u * 1024);
  Decoder decoder;
  std::vector<Message> got;
  for (size_t at = 0; at < stream.size(); at += 997) {
    decoder.Feed(std::span(stream).subspan(at, std::min<size_t>(997, stream.size() - at)));
    Decoder::Status last;
    for (Message& m : Drain(decoder, last)) got.push_back(std::move(m));
    ASSERT_EQ(last, Decoder::Status::kNeedMore) << decoder.error();
  }
  EXPECT_EQ(got, sent);
}

TEST(WireTest, BadMagicIsAnErrorFromTheFirstByte) {
  EXPECT_EQ(ErrorOf({'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1', '.', '1'}),
            "not a ddprun frame (bad magic)");
  EXPECT_EQ(ErrorOf({'D', 'X'}), "not a ddprun frame (bad magic)");
  Decoder decoder;
  decoder.Feed(Bytes{'x'});
  EXPECT_TRUE(decoder.LooksForeign());
}

// Found by the ASan + UBSan stage of scripts/test.sh: with nothing buffered, LooksForeign passed
// memcmp a null pointer (undefined behaviour even for 0 bytes); under UBSan this test aborted.
TEST(WireTest, ADecoderWithNothingBufferedIsNotForeign) {
  const Decoder fresh;
  EXPECT_FALSE(fresh.LooksForeign());
  Decoder emptied;
  emptied.Feed(Encode(Heartbeat{}));
  Message m;
  ASSERT_EQ(emptied.Next(m), Decoder::Status::kMessage);
  EXPECT_FALSE(emptied.LooksForeign());
}

TEST(WireTest, LooksForeignTellsStoreClientsFromAgents) {
  Decoder empty;
  EXPECT_FALSE(empty.LooksForeign());
  Decoder agent;
  agent.Feed(Bytes{'D', 'D', 'P'});
  EXPECT_FALSE(agent.LooksForeign());
  Decoder store_client;
  store_client.Feed(Bytes{0x00, 0x01, 0x02, 0x03});
  EXPECT_TRUE(store_client.LooksForeign());
}

TEST(WireTest, BadVersionIsAnError) {
  EXPECT_EQ(ErrorOf(Frame(2, {1, 0, 0, 0}, /*version=*/2)), "unsupported protocol version 2");
  EXPECT_EQ(ErrorOf(Frame(2, {1, 0, 0, 0}, /*version=*/0)), "unsupported protocol version 0");
}

TEST(WireTest, OversizedLengthIsAnErrorBeforeThePayloadArrives) {
  Bytes header = {'D', 'D', 'P', 'R', kVersion, 3, 0, 0};
  PutU32(header, kMaxPayload + 1);
  EXPECT_EQ(ErrorOf(header), "frame of 1048577 bytes is over the limit");

  Bytes at_limit = {'D', 'D', 'P', 'R', kVersion, 3, 0, 0};
  PutU32(at_limit, kMaxPayload);
  Decoder decoder;
  decoder.Feed(at_limit);
  Message m;
  EXPECT_EQ(decoder.Next(m), Decoder::Status::kNeedMore);

  Bytes huge = {'D', 'D', 'P', 'R', kVersion, 3, 0, 0, 0xff, 0xff, 0xff, 0xff};
  EXPECT_EQ(ErrorOf(huge), "frame of 4294967295 bytes is over the limit");
}

TEST(WireTest, UnknownTypeIsAnError) {
  EXPECT_EQ(ErrorOf(Frame(0, {})), "unknown message type 0");
  EXPECT_EQ(ErrorOf(Frame(22, {})), "unknown message type 22");
  EXPECT_EQ(ErrorOf(Frame(255, {})), "unknown message type 255");
}

TEST(WireTest, StringLengthPastTheEndIsMalformed) {
  Bytes payload;
  PutU32(payload, 100);
  payload.insert(payload.end(), {'a', 'b', 'c'});
  EXPECT_EQ(ErrorOf(Frame(3, payload)), "malformed reject payload");
}

TEST(WireTest, StringOverItsBoundIsMalformedEvenInsideTheFrame) {
  Bytes payload;
  PutU32(payload, kMaxString + 1);
  payload.resize(payload.size() + kMaxString + 1, 'a');
  EXPECT_EQ(ErrorOf(Frame(3, payload)), "malformed reject payload");
}

TEST(WireTest, ListCountPastTheEndIsMalformed) {
  Bytes payload;
  PutU32(payload, 1);     // joined
  PutU32(payload, 2);     // total
  PutU32(payload, 1000);  // missing: 1000 items, none present
  EXPECT_EQ(ErrorOf(Frame(4, payload)), "malformed progress payload");
}

TEST(WireTest, RecordListCountPastTheEndIsMalformed) {
  Bytes payload;
  PutU32(payload, 2);          // round
  PutU32(payload, 1'000'000);  // ranks: more records than the payload could hold
  EXPECT_EQ(ErrorOf(Frame(17, payload)), "malformed rank-stacks payload");
  Bytes one;
  PutU32(one, 2);
  PutU32(one, 1);  // one record, cut short in its step
  PutU32(one, 12);
  PutU32(one, 7);
  EXPECT_EQ(ErrorOf(Frame(18, one)), "malformed rank-progress payload");
}

TEST(WireTest, TrailingBytesAreMalformed) {
  EXPECT_EQ(ErrorOf(Frame(2, {4, 0, 0, 0, 0, 0})), "malformed join-ack payload");
  EXPECT_EQ(ErrorOf(Frame(13, {0})), "malformed heartbeat payload");
}

TEST(WireTest, ShortPayloadIsMalformed) {
  EXPECT_EQ(ErrorOf(Frame(5, {1, 0, 0, 0, 7})), "malformed start-round payload");
  EXPECT_EQ(ErrorOf(Frame(1, {})), "malformed join payload");
}

TEST(WireTest, ErrorIsStickyAndLaterFramesAreNotDecoded) {
  Decoder decoder;
  decoder.Feed(Frame(22, {}));
  Message m;
  EXPECT_EQ(decoder.Next(m), Decoder::Status::kError);
  decoder.Feed(Encode(Heartbeat{}));
  EXPECT_EQ(decoder.Next(m), Decoder::Status::kError);
  EXPECT_EQ(decoder.error(), "unknown message type 22");
}

TEST(WireTest, GoodFrameBeforeABadOneIsStillDelivered) {
  Bytes stream = Encode(NodeDone{4});
  const Bytes bad = Frame(2, {1, 2, 3});
  stream.insert(stream.end(), bad.begin(), bad.end());
  Decoder decoder;
  decoder.Feed(stream);
  Decoder::Status last;
  EXPECT_EQ(Drain(decoder, last), std::vector<Message>{NodeDone{4}});
  EXPECT_EQ(last, Decoder::Status::kError);
  EXPECT_EQ(decoder.error(), "malformed join-ack payload");
}

TEST(WireTest, EncoderCutsOverlongStringsToTheBoundPeersAccept) {
  const std::string tail(kMaxString + 1000, 'e');
  Decoder decoder;
  decoder.Feed(Encode(WorkerFailed{0, 0, 0, 1, 0, tail, tail}));
  Message m;
  ASSERT_EQ(decoder.Next(m), Decoder::Status::kMessage) << decoder.error();
  const auto& failed = std::get<WorkerFailed>(m);
  EXPECT_EQ(failed.stderr_tail, tail.substr(0, kMaxString));
  EXPECT_EQ(failed.error_file, tail.substr(0, kMaxString));
}

TEST(WireTest, RandomBytesNeverCrashTheDecoder) {
  Rng rng(20240611);
  for (int iteration = 0; iteration < 3000; ++iteration) {
    Bytes bytes;
    if (iteration % 2 == 0) {
      // Pure noise, sometimes behind a valid magic and version to reach the deeper checks.
      const size_t n = rng.Below(200);
      if (rng.Below(2) == 0) bytes = {'D', 'D', 'P', 'R', kVersion};
      for (size_t i = 0; i < n; ++i) bytes.push_back(rng.Byte());
    } else {
      // Valid frames with a few bytes flipped.
      bytes = Concat(Samples());
      const size_t flips = 1 + rng.Below(4);
      for (size_t i = 0; i < flips; ++i) bytes[rng.Below(bytes.size())] = rng.Byte();
    }
    Decoder decoder;
    size_t at = 0;
    size_t messages = 0;
    Decoder::Status last = Decoder::Status::kNeedMore;
    while (at < bytes.size() && last != Decoder::Status::kError) {
      const size_t chunk = std::min(bytes.size() - at, 1 + rng.Below(40));
      decoder.Feed(std::span(bytes).subspan(at, chunk));
      at += chunk;
      messages += Drain(decoder, last).size();
      ASSERT_LE(messages, bytes.size() / kHeaderSize);
    }
    if (last == Decoder::Status::kError) {
      EXPECT_FALSE(decoder.error().empty());
    }
  }
}

}  // namespace
}  // namespace ddprun::wire
