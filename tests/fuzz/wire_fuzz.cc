// libFuzzer target: any byte stream, cut into any chunks, gives the frame decoder messages,
// "need more" or one protocol error; never a crash, an unbounded buffer or a sanitizer report.
// Every decoded message must encode back to a frame that decodes to the same message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "runner/core/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ddprun::wire::Decoder;
  if (size == 0) return 0;
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
