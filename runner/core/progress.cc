#include "runner/core/progress.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include <fmt/format.h>

namespace ddprun::core {
namespace {

constexpr std::string_view kBeaconMagic = "ddprun1";

std::optional<int64_t> Number(std::string_view text, int64_t min, int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty() || value < min || value > max) return std::nullopt;
  return value;
}

std::vector<std::string_view> Fields(std::string_view text) {
  std::vector<std::string_view> fields;
  size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && text[pos] == ' ') ++pos;
    if (pos >= text.size()) break;
    const size_t end = std::min(text.find(' ', pos), text.size());
    fields.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return fields;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// `File "/path/x.py", line 88 in main`, as faulthandler writes it (after the indentation).
std::optional<Frame> ParseFrameLine(std::string_view line) {
  line = Trim(line);
  constexpr std::string_view kFile = "File \"";
  if (line.substr(0, kFile.size()) != kFile) return std::nullopt;
  line.remove_prefix(kFile.size());
  const size_t quote = line.rfind("\", line ");
  if (quote == std::string_view::npos) return std::nullopt;
  Frame frame;
  frame.file = std::string(line.substr(0, quote));
  std::string_view rest = line.substr(quote + 8);
  const size_t in = rest.find(" in ");
  const auto number = Number(rest.substr(0, in), 0, 100'000'000);
  if (!number) return std::nullopt;
  frame.line = static_cast<int>(*number);
  frame.function = in == std::string_view::npos ? "???" : std::string(rest.substr(in + 4));
  return frame;
}

// Library code: the interpreter's and installed packages'; the rest is the user's own.
bool IsLibrary(const std::string& file) {
  return file.find("/site-packages/") != std::string::npos ||
         file.find("/dist-packages/") != std::string::npos ||
         file.find("/lib/python3") != std::string::npos || file.rfind("<frozen", 0) == 0 ||
         file.find("/ddprun/__init__.py") != std::string::npos;
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Key(const std::vector<Frame>& frames) { return FormatFrames(frames); }

}  // namespace

std::optional<Beacon> ParseBeacon(std::string_view datagram, std::string_view token) {
  if (datagram.size() > kMaxBeaconSize || token.empty()) return std::nullopt;
  while (!datagram.empty() && (datagram.back() == '\n' || datagram.back() == '\r')) datagram.remove_suffix(1);
  const auto f = Fields(datagram);
  if (f.size() != 8 || f[0] != kBeaconMagic || f[1] != token) return std::nullopt;
  Beacon beacon;
  const auto round = Number(f[2], 0, INT32_MAX);
  const auto local = Number(f[3], 0, INT32_MAX);
  const auto step = Number(f[5], 0, INT64_MAX);
  const auto busy = Number(f[6], -1, INT64_MAX);
  const auto signal = Number(f[7], 0, 64);
  if (!round || !local || !step || !busy || !signal) return std::nullopt;
  if (f[4] == "hello") {
    beacon.kind = BeaconKind::kHello;
  } else if (f[4] == "step") {
    beacon.kind = BeaconKind::kStep;
  } else if (f[4] == "phase") {
    beacon.kind = BeaconKind::kPhase;
  } else {
    return std::nullopt;
  }
  beacon.round = static_cast<int>(*round);
  beacon.local_rank = static_cast<int>(*local);
  beacon.step = *step;
  beacon.busy_us = *busy;
  beacon.stack_signal = static_cast<int>(*signal);
  return beacon;
}

std::string FormatBeacon(const Beacon& beacon, std::string_view token) {
  const char* kind = beacon.kind == BeaconKind::kHello  ? "hello"
                     : beacon.kind == BeaconKind::kStep ? "step"
                                                        : "phase";
  return fmt::format("{} {} {} {} {} {} {} {}", kBeaconMagic, token, beacon.round, beacon.local_rank, kind,
                     beacon.step, beacon.busy_us, beacon.stack_signal);
}

std::vector<Frame> MainThreadStack(std::string_view dump) {
  struct Thread {
    bool current = false;
    std::vector<Frame> frames;
  };
  std::vector<Thread> threads;
  std::set<std::string> seen;  // thread ids of this dump: one seen again starts a later dump
  size_t pos = 0;
  while (pos < dump.size()) {
    size_t end = dump.find('\n', pos);
    if (end == std::string_view::npos) end = dump.size();
    const std::string_view line = dump.substr(pos, end - pos);
    pos = end + 1;
    const std::string_view trimmed = Trim(line);
    const bool current = trimmed.rfind("Current thread ", 0) == 0;
    if (current || trimmed.rfind("Thread ", 0) == 0 || trimmed.rfind("Stack (most recent", 0) == 0) {
      const std::string id(trimmed.substr(0, trimmed.find(" (")));
      const std::string bare = current ? id.substr(8) : id;  // "Current thread 0x.." -> "thread 0x.."
      std::string key = bare;
      if (!key.empty()) key[0] = 't';
      if (!seen.insert(key).second) {
        threads.clear();
        seen = {key};
      }
      threads.push_back(Thread{current, {}});
      continue;
    }
    if (threads.empty()) continue;
    if (auto frame = ParseFrameLine(line)) threads.back().frames.push_back(std::move(*frame));
  }
  const Thread* main = nullptr;
  for (const Thread& t : threads) {
    if (!t.frames.empty() && t.frames.back().function == "<module>") {
      main = &t;
      break;
    }
  }
  for (const Thread& t : threads) {
    if (!main && t.current && !t.frames.empty()) main = &t;
  }
  for (const Thread& t : threads) {
    if (!main && !t.frames.empty()) main = &t;
  }
  if (!main) return {};
  std::vector<Frame> frames = main->frames;
  if (frames.size() > kMaxFrames) frames.resize(kMaxFrames);
  return frames;
}

std::string FormatFrames(const std::vector<Frame>& frames) {
  std::string text;
  for (const Frame& f : frames)
    text += fmt::format("File \"{}\", line {} in {}\n", f.file, f.line, f.function);
  return text;
}

std::vector<Frame> ParseFrames(std::string_view text) {
  std::vector<Frame> frames;
  size_t pos = 0;
  while (pos < text.size() && frames.size() < kMaxFrames) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    if (auto frame = ParseFrameLine(text.substr(pos, end - pos))) frames.push_back(std::move(*frame));
    pos = end + 1;
  }
  return frames;
}

std::string DescribeStack(const std::vector<Frame>& frames) {
  if (frames.empty()) return "no stack";
  const Frame& inner = frames.front();
  const auto user =
      std::find_if(frames.begin(), frames.end(), [](const Frame& f) { return !IsLibrary(f.file); });
  if (user == frames.end()) {
    return fmt::format("in {} ({}:{})", inner.function, BaseName(inner.file), inner.line);
  }
  if (user == frames.begin()) {
    return fmt::format("in {} at {}:{}", inner.function, BaseName(inner.file), inner.line);
  }
  return fmt::format("in {} at {}:{}", inner.function, BaseName(user->file), user->line);
}

bool WaitsForOtherRanks(const std::vector<Frame>& frames) {
  // Only the calls below the user's innermost frame say where the thread waits: outer library
  // frames are wrappers (torchelastic's @record, Lightning's loops) that every rank has.
  for (const Frame& f : frames) {
    if (!IsLibrary(f.file)) break;
    if (f.file.find("torch/distributed/") != std::string::npos &&
        f.file.find("torch/distributed/elastic/") == std::string::npos) {
      return true;
    }
    if (f.file.find("torch/nn/parallel/distributed") != std::string::npos) return true;
    // Under DDP the gradients are all-reduced from backward's hooks: a rank blocked in
    // backward waits for the others.
    if ((f.file.find("torch/autograd/") != std::string::npos ||
         f.file.find("torch/_tensor.py") != std::string::npos) &&
        f.function.find("backward") != std::string::npos) {
      return true;
    }
  }
  return false;
}

HangVerdict FindHungRanks(const std::vector<RankAtHang>& ranks, int first_silent) {
  HangVerdict verdict;
  auto finish = [&](std::vector<const RankAtHang*> chosen, std::string reason) {
    for (const RankAtHang* r : chosen) verdict.culprits.push_back(r->global_rank);
    std::sort(verdict.culprits.begin(), verdict.culprits.end());
    verdict.reason = std::move(reason);
    return verdict;
  };
  std::vector<const RankAtHang*> all;
  for (const RankAtHang& r : ranks) all.push_back(&r);

  // 1. Behind the others: the lowest last step, when the ranks that reported one differ.
  std::vector<const RankAtHang*> candidates = all;
  bool behind = false;
  {
    int64_t low = INT64_MAX, high = -1;
    for (const RankAtHang* r : all) {
      low = std::min(low, r->step);
      high = std::max(high, r->step);
    }
    if (!all.empty() && low < high) {
      candidates.clear();
      for (const RankAtHang* r : all) {
        if (r->step == low) candidates.push_back(r);
      }
      behind = true;
    }
  }
  // 2. Of those, the ones not waiting for other ranks (with a stack to tell).
  std::vector<const RankAtHang*> working;
  for (const RankAtHang* r : candidates) {
    if (!r->stack.empty() && !WaitsForOtherRanks(r->stack)) working.push_back(r);
  }
  if (!working.empty() && working.size() < all.size()) {
    return finish(working, behind                ? "behind the others, and not waiting for them"
                           : working.size() == 1 ? "the only rank not waiting for the others"
                                                 : "the ranks not waiting for the others");
  }
  // Every rank with a stack waits for the others: one without a stack (it hung before the
  // module said hello, or has no handler) is what they wait for.
  {
    std::vector<const RankAtHang*> silent, stacked;
    for (const RankAtHang* r : candidates) (r->stack.empty() ? silent : stacked).push_back(r);
    const bool all_wait = std::all_of(stacked.begin(), stacked.end(),
                                      [](const RankAtHang* r) { return WaitsForOtherRanks(r->stack); });
    if (!stacked.empty() && all_wait && !silent.empty() && silent.size() < stacked.size()) {
      return finish(silent, silent.size() == 1
                                ? "every other rank waits in a collective; it has no stack"
                                : "every other rank waits in a collective; they have no stack");
    }
  }
  if (behind && candidates.size() * 2 <= all.size()) {
    return finish(candidates, candidates.size() == 1 ? "its last step is behind every other rank's"
                                                     : "their last step is behind the other ranks'");
  }
  // 3. A stack that differs from a strict majority's.
  std::map<std::string, std::vector<const RankAtHang*>> groups;
  size_t with_stack = 0;
  for (const RankAtHang* r : all) {
    if (r->stack.empty()) continue;
    ++with_stack;
    groups[Key(r->stack)].push_back(r);
  }
  const std::vector<const RankAtHang*>* majority = nullptr;
  for (const auto& [key, members] : groups) {
    if (!majority || members.size() > majority->size()) majority = &members;
  }
  if (majority && majority->size() * 2 > all.size() && majority->size() < with_stack) {
    std::vector<const RankAtHang*> others;
    for (const RankAtHang* r : all) {
      if (!r->stack.empty() && Key(r->stack) != Key(majority->front()->stack)) others.push_back(r);
    }
    return finish(others, "stuck elsewhere than the other ranks");
  }
  // 4. The first rank reported silent.
  for (const RankAtHang* r : all) {
    if (r->global_rank == first_silent) {
      return finish({r}, "the first rank found silent; the stacks do not tell the others apart");
    }
  }
  // It is not among the ranks still silent: the one silent longest of those.
  if (!all.empty()) {
    const RankAtHang* longest = *std::max_element(
        all.begin(), all.end(),
        [](const RankAtHang* a, const RankAtHang* b) { return a->silent_ms < b->silent_ms; });
    return finish({longest}, "the rank silent longest; the stacks do not tell the others apart");
  }
  verdict.culprits = {first_silent};
  verdict.reason = "the first rank found silent";
  return verdict;
}

std::string RankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace ddprun::core
