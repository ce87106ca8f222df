// The Chrome trace of a Timeline (--trace): JSON that Perfetto and chrome://tracing open.
#include "report/render.h"

#include <algorithm>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace ddprun::report {
namespace {

// Microseconds with a fraction, as the trace format wants.
std::string Micros(int64_t ns) { return fmt::format("{}.{:03}", ns / 1000, ns % 1000); }

std::string JsonEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  return out;
}

const char* MarkName(MarkKind kind) {
  switch (kind) {
    case MarkKind::kFault:
      return "fault";
    case MarkKind::kFailure:
      return "failure";
    case MarkKind::kRestart:
      return "round";
    case MarkKind::kExit:
      return "exit";
    case MarkKind::kHeal:
      return "heal";
  }
  return "mark";
}

}  // namespace

void WriteChromeTrace(const Timeline& timeline, std::ostream& out) {
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\""
      << JsonEscape(timeline.title) << "\"}},\n";
  out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"job\"}}";
  for (size_t i = 0; i < timeline.labels.size(); ++i) {
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << i + 1 << ",\"args\":{\"name\":\""
        << JsonEscape(timeline.labels[i]) << "\"}}";
    out << ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":" << i + 1
        << ",\"args\":{\"sort_index\":" << i + 1 << "}}";
  }
  for (const auto& [start, end] : timeline.training) {
    out << ",\n{\"name\":\"training\",\"cat\":\"job\",\"ph\":\"X\",\"pid\":1,\"tid\":0,\"ts\":"
        << Micros(start) << ",\"dur\":" << Micros(std::max<int64_t>(0, end - start)) << "}";
  }
  for (size_t i = 0; i < timeline.segments.size(); ++i) {
    for (const Segment& s : timeline.segments[i]) {
      if (s.phase == NodePhase::kOff || s.phase == NodePhase::kDone) continue;
      const int64_t end = s.end_ns < 0 ? timeline.end_ns : s.end_ns;
      out << ",\n{\"name\":\"" << NodePhaseName(s.phase) << "\",\"cat\":\"phase\",\"ph\":\"X\",\"pid\":1,"
          << "\"tid\":" << i + 1 << ",\"ts\":" << Micros(s.start_ns)
          << ",\"dur\":" << Micros(std::max<int64_t>(0, end - s.start_ns));
      if (s.round >= 0) out << ",\"args\":{\"round\":" << s.round << "}";
      out << "}";
    }
  }
  for (const Mark& m : timeline.marks) {
    const size_t tid = m.node == Mark::kJob ? 0 : m.node + 1;
    if (m.end_ns > m.at_ns) {
      out << ",\n{\"name\":\"" << JsonEscape(m.text) << "\",\"cat\":\"" << MarkName(m.kind)
          << "\",\"ph\":\"X\",\"pid\":1,\"tid\":" << tid << ",\"ts\":" << Micros(m.at_ns)
          << ",\"dur\":" << Micros(m.end_ns - m.at_ns) << "}";
    } else {
      out << ",\n{\"name\":\"" << JsonEscape(m.text) << "\",\"cat\":\"" << MarkName(m.kind)
          << "\",\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":" << tid << ",\"ts\":" << Micros(m.at_ns) << "}";
    }
  }
  out << "\n]}\n";
}

}  // namespace ddprun::report
