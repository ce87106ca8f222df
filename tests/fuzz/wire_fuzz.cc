// libFuzzer target: any byte stream, cut into any chunks, gives the frame decoder messages,
// "need more" or one protocol error; never a crash, an unbounded buffer or a sanitizer report.
// Every decoded message must encode back to a frame that decodes to the same message.
// The same bytes are also what a worker may send the agent outside the protocol: a progress
// beacon (any well-formed one formats back to itself) and a stacks file (a bounded stack).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include <string_view>

#include "runner/core/progress.h"
#include "runner/core/wire.h"

namespace {

void WorkerWords(const uint8_t* data, size_t size) {
  using namespace ddprun::core;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto beacon = ParseBeacon(text, "tok")) {
    auto again = ParseBeacon(FormatBeacon(*beacon, "tok"), "tok");
    if (!again || again->step != beacon->step || again->round != beacon->round ||
        again->local_rank != beacon->local_rank || again->kind != beacon->kind ||
        again->busy_us != beacon->busy_us || again->stack_signal != beacon->stack_signal) {
      std::abort();
    }
  }
  const auto frames = MainThreadStack(text);
  if (frames.size() > kMaxFrames) std::abort();
  if (ParseFrames(text).size() > kMaxFrames) std::abort();
  (void)DescribeStack(frames);
  std::vector<RankAtHang> ranks;
  for (size_t i = 0; i < 4; ++i) {
    ranks.push_back(RankAtHang{static_cast<int>(i), 0, static_cast<int>(i), size > i ? data[i] % 3 : 0, 1000,
                               i % 2 == 0 ? frames : std::vector<Frame>{}});
  }
  const auto verdict = FindHungRanks(ranks, 1);
  if (verdict.culprits.empty()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ddprun::wire::Decoder;
  if (size == 0) return 0;
  WorkerWords(data, size);
  // The first byte picks the chunk size, so split points are explored too.
  const size_t chunk = 1 + data[0] % 64;
  Decoder decoder;
  for (size_t offset = 1; offset < size; offset += chunk) {
    const size_t n = offset + chunk <= size ? chunk : size - offset;
    decoder.Feed(std::span<const uint8_t>(data + offset, n));
    for (;;) {
      ddprun::wire::Message message;
      const auto status = decoder.Next(message);
      if (status != Decoder::Status::kMessage) break;
      Decoder again;
      again.Feed(ddprun::wire::Encode(message));
      ddprun::wire::Message copy;
      if (again.Next(copy) != Decoder::Status::kMessage || !(copy == message)) std::abort();
    }
  }
  return 0;
}
