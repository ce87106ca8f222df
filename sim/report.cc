#include "sim/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "schema/duration.h"

namespace ddprun::sim {
namespace {

// Microseconds with a fraction, as the trace format wants.
std::string Micros(int64_t ns) { return fmt::format("{}.{:03}", ns / 1000, ns % 1000); }

std::string JsonEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
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

std::string HtmlEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* MarkName(MarkKind kind) {
  switch (kind) {
    case MarkKind::kFault: return "fault";
    case MarkKind::kFailure: return "failure";
    case MarkKind::kRestart: return "round";
    case MarkKind::kExit: return "exit";
    case MarkKind::kHeal: return "heal";
  }
  return "mark";
}

constexpr size_t kPhases = 9;
// Colours per NodePhase, in enum order.
constexpr std::array<const char*, kPhases> kColours = {
    "#ffffff",  // off
    "#9ecae1",  // rendezvous
    "#fdd49e",  // starting
    "#41ab5d",  // training
    "#fd8d3c",  // stalled
    "#d94801",  // stopping
    "#bdbdbd",  // waiting
    "#252525",  // down
    "#f0f0f0",  // done
};
// When phases share a pixel column, the one that matters most to a reader wins.
constexpr std::array<int, kPhases> kPriority = {0, 3, 4, 2, 6, 7, 5, 8, 1};

}  // namespace

void WriteChromeTrace(const Timeline& timeline, std::ostream& out) {
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\""
      << JsonEscape(timeline.title) << "\"}},\n";
  out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"job\"}}";
  for (size_t i = 0; i < timeline.labels.size(); ++i) {
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << i + 1
        << ",\"args\":{\"name\":\"" << JsonEscape(timeline.labels[i]) << "\"}}";
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

void WriteHtmlReport(const Timeline& timeline, const std::string& summary, std::ostream& out) {
  constexpr int kLabelWidth = 230;
  constexpr int kPlotWidth = 1100;
  constexpr int kRowHeight = 16;
  constexpr int kTop = 40;
  constexpr size_t kMaxRows = 48;
  const int64_t end = std::max<int64_t>(timeline.end_ns, 1);
  const auto x_of = [&](int64_t ns) {
    return static_cast<double>(ns) * kPlotWidth / static_cast<double>(end);
  };

  // Rows: every node when they fit; else the nodes faults touched, node 0, and the rest in
  // bands drawn from their first node (the others in a band behave the same: DDP is a gang).
  struct Row {
    std::string label;
    size_t node;  // whose segments are drawn
    std::vector<uint32_t> members;
  };
  std::vector<Row> rows;
  const size_t n = timeline.labels.size();
  if (n <= kMaxRows) {
    for (size_t i = 0; i < n; ++i) rows.push_back(Row{timeline.labels[i], i, {static_cast<uint32_t>(i)}});
  } else {
    std::vector<size_t> rest;
    for (size_t i = 0; i < n; ++i) {
      if ((i == 0 || timeline.focus[i]) && rows.size() < kMaxRows / 2) {
        rows.push_back(Row{timeline.labels[i], i, {static_cast<uint32_t>(i)}});
      } else {
        rest.push_back(i);
      }
    }
    const size_t bands = std::min(kMaxRows - rows.size(), rest.size());
    for (size_t b = 0; b < bands; ++b) {
      const size_t from = rest.size() * b / bands;
      const size_t to = rest.size() * (b + 1) / bands;
      if (from >= to) continue;
      Row row{fmt::format("{} nodes: {}..{}", to - from, timeline.labels[rest[from]].substr(0, timeline.labels[rest[from]].find(' ', 5)),
                          timeline.labels[rest[to - 1]].substr(0, timeline.labels[rest[to - 1]].find(' ', 5))),
              rest[from], {}};
      rows.push_back(std::move(row));
    }
  }

  const int height = kTop + static_cast<int>(rows.size() + 1) * kRowHeight + 40;
  const int width = kLabelWidth + kPlotWidth + 20;
  out << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>ddprun simulation: "
      << HtmlEscape(timeline.title) << "</title>\n<style>body{font-family:sans-serif;margin:16px;"
      << "color:#222}pre{background:#f7f7f7;padding:10px;font-size:12px}"
      << ".legend span{display:inline-block;margin-right:14px;font-size:12px}"
      << ".legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;"
      << "border:1px solid #999}</style></head><body>\n";
  out << "<h2>ddprun simulation: " << HtmlEscape(timeline.title) << "</h2>\n<div class=\"legend\">";
  for (size_t p = 1; p < kPhases; ++p) {
    out << "<span><i style=\"background:" << kColours[p] << "\"></i>"
        << NodePhaseName(static_cast<NodePhase>(p)) << "</span>";
  }
  out << "<span><i style=\"background:#cb181d\"></i>fault / failure</span>"
      << "<span><i style=\"background:#2171b5\"></i>round start</span></div>\n";
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-size=\"11\" font-family=\"sans-serif\">\n";

  // Time axis with about ten ticks at a round step.
  static constexpr std::array<int64_t, 19> kSteps = {
      1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400, 172800, 604800};
  int64_t step_s = kSteps.back();
  for (int64_t s : kSteps) {
    if (end / (s * 1'000'000'000) <= 10) {
      step_s = s;
      break;
    }
  }
  const int axis_y = kTop - 8;
  for (int64_t t = 0; t <= end; t += step_s * 1'000'000'000) {
    const double x = kLabelWidth + x_of(t);
    out << fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#ddd\"/>", x, axis_y, x,
                       height - 30)
        << fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{}</text>\n", x,
                       axis_y - 4, HumanDuration(Duration(t)));
  }

  // The job row: when the gang trained.
  int y = kTop;
  out << fmt::format("<text x=\"4\" y=\"{}\" font-weight=\"bold\">job: training</text>", y + 12);
  for (const auto& [start, stop] : timeline.training) {
    const double x0 = x_of(start);
    const double w = std::max(0.5, x_of(stop < 0 ? end : stop) - x0);
    out << fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>",
                       kLabelWidth + x0, y + 2, w, kRowHeight - 4, kColours[3]);
  }
  out << "\n";
  y += kRowHeight;

  // Node rows, one pixel column at a time so that a 54-day run stays a few thousand shapes.
  for (const Row& row : rows) {
    out << fmt::format("<text x=\"4\" y=\"{}\">{}</text>", y + 12, HtmlEscape(row.label));
    std::vector<int> column(static_cast<size_t>(kPlotWidth), -1);
    for (const Segment& s : timeline.segments[row.node]) {
      const int64_t stop = s.end_ns < 0 ? end : s.end_ns;
      const auto c0 = static_cast<int>(std::floor(x_of(s.start_ns)));
      const auto c1 = std::max(c0 + 1, static_cast<int>(std::ceil(x_of(stop))));
      const auto phase = static_cast<int>(s.phase);
      for (int c = std::max(0, c0); c < std::min(kPlotWidth, c1); ++c) {
        int& slot = column[static_cast<size_t>(c)];
        if (slot < 0 || kPriority[static_cast<size_t>(phase)] > kPriority[static_cast<size_t>(slot)]) slot = phase;
      }
    }
    for (int c = 0; c < kPlotWidth;) {
      const int phase = column[static_cast<size_t>(c)];
      int d = c + 1;
      while (d < kPlotWidth && column[static_cast<size_t>(d)] == phase) ++d;
      if (phase > 0) {
        out << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>",
                           kLabelWidth + c, y + 2, d - c, kRowHeight - 4, kColours[static_cast<size_t>(phase)]);
      }
      c = d;
    }
    // Marks on this row's node.
    for (const Mark& m : timeline.marks) {
      if (m.node != row.node || m.kind == MarkKind::kExit) continue;
      const double x = kLabelWidth + x_of(m.at_ns);
      if (m.end_ns > m.at_ns) {
        out << fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"3\" fill=\"#cb181d\">"
                           "<title>{}</title></rect>",
                           x, y + kRowHeight - 4, std::max(1.0, x_of(m.end_ns) - x_of(m.at_ns)), HtmlEscape(m.text));
      }
      out << fmt::format("<path d=\"M{:.1f},{} l-4,-6 h8 z\" fill=\"#cb181d\"><title>{} at {}</title></path>", x,
                         y + 8, HtmlEscape(m.text), HumanDuration(Duration(m.at_ns)));
    }
    out << "\n";
    y += kRowHeight;
  }
  // Job-wide marks: failures and round starts, across all rows.
  int64_t last_px = -10;
  for (const Mark& m : timeline.marks) {
    if (m.node != Mark::kJob) continue;
    const double x = kLabelWidth + x_of(m.at_ns);
    const auto px = static_cast<int64_t>(x);
    if (m.kind == MarkKind::kRestart && px == last_px) continue;
    last_px = px;
    const char* colour = m.kind == MarkKind::kRestart ? "#2171b5" : "#cb181d";
    out << fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"1\" "
                       "stroke-dasharray=\"{}\" opacity=\"0.7\"><title>{} at {}</title></line>\n",
                       x, kTop, x, y, colour, m.kind == MarkKind::kRestart ? "3,2" : "none",
                       HtmlEscape(m.text), HumanDuration(Duration(m.at_ns)));
  }
  out << fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555\">virtual time; {} node row{}{}</text>\n", kLabelWidth,
                     y + 20, rows.size(), rows.size() == 1 ? "" : "s",
                     n > kMaxRows ? " (bands of nodes are drawn from their first node)" : "");
  out << "</svg>\n<pre>" << HtmlEscape(summary) << "</pre>\n</body></html>\n";
}

}  // namespace ddprun::sim
