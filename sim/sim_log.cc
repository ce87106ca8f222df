#include "sim/sim_log.h"

#include <fmt/format.h>

#include "sim/node.h"
#include "sim/parts.h"
#include "sim/simulation.h"

namespace ddprun::sim {

SimLog::SimLog(std::ostream* out, Timeline* timeline, const Loop& loop, Nodes& nodes,
               const PhaseSource& phases, bool condense)
    : out_(out), timeline_(timeline), loop_(loop), nodes_(nodes), phases_(phases), condense_(condense) {}

void SimLog::ReportViolation(std::string_view what) {
  if (violation_printed_) return;
  violation_printed_ = true;
  if (out_) *out_ << FormatSimTime(loop_.now_ns) << " INVARIANT VIOLATED: " << what << "\n";
}

void SimLog::Print(uint32_t index, std::string_view who, std::string_view text) {
  if (!out_) return;
  if (condense_ && !nodes_[index].focus) {
    ++condensed_lines_;
    if (nodes_[index].condensed_stamp != condense_epoch_) {
      nodes_[index].condensed_stamp = condense_epoch_;
      ++condensed_nodes_;
    }
    return;
  }
  const std::string stamp = FormatSimTime(loop_.now_ns);
  if (condensed_lines_ > 0) {
    *out_ << stamp << " (" << condensed_lines_ << " line" << (condensed_lines_ == 1 ? "" : "s") << " from "
          << condensed_nodes_ << " other node" << (condensed_nodes_ == 1 ? "" : "s") << " not shown)\n";
    condensed_lines_ = 0;
    condensed_nodes_ = 0;
    ++condense_epoch_;
  }
  // Continuation lines line up under the text.
  const std::string indent(stamp.size() + 3, ' ');
  size_t start = 0;
  bool first = true;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    if (first) {
      *out_ << stamp << ' ' << who << ": " << line << '\n';
      first = false;
    } else {
      *out_ << indent << line << '\n';
    }
    start = end + 1;
  }
}

void SimLog::PrintSim(std::optional<uint32_t> index, std::string_view text) {
  if (!out_) return;
  if (index) {
    Print(*index, nodes_.Label(*index), text);
  } else {
    const bool saved = condense_;
    condense_ = false;
    Print(0, "sim", text);
    condense_ = saved;
  }
}

void SimLog::ConsoleLog(uint32_t index, core::LogLevel level, std::string_view source,
                        std::string_view text) {
  if (!out_) return;
  (void)level;
  if (source == "coordinator") {
    // At scale, what the coordinator says about one ordinary node ("node 17 (node-0017) joined
    // ...") is condensed with that node's own lines; lines about no node in particular are
    // node 0's, always shown.
    Print(subject_.value_or(0), "coordinator", text);
    return;
  }
  Print(index, nodes_.Label(index), text);
}

void SimLog::ConsoleSummary(uint32_t index, std::string_view text) {
  if (!out_) return;
  auto [it, inserted] = summaries_seen_.emplace(std::string(text), index);
  if (!inserted) {
    Print(index, nodes_.Label(index),
          fmt::format("printed the same summary as {}", nodes_.Label(it->second)));
    return;
  }
  Print(index, nodes_.Label(index), fmt::format("summary:\n  {}", fmt::join(Split(text), "\n  ")));
}

void SimLog::AddRow(const std::string& label) {
  if (!timeline_) return;
  timeline_->labels.push_back(label);
  timeline_->segments.emplace_back();
  timeline_->focus.push_back(false);
}

void SimLog::SetPhase(uint32_t index) {
  if (!timeline_) return;
  Node& n = nodes_[index];
  int round = -1;
  const NodePhase phase = phases_.PhaseOf(index, &round);
  if (phase == n.phase && !timeline_->segments[index].empty()) return;
  n.phase = phase;
  auto& row = timeline_->segments[index];
  if (!row.empty() && row.back().end_ns < 0) row.back().end_ns = loop_.now_ns;
  row.push_back(Segment{loop_.now_ns, -1, phase, round});
}

void SimLog::SetAllPhases() {
  for (uint32_t i = 0; timeline_ && i < nodes_.size(); ++i) SetPhase(i);
}

void SimLog::FocusRow(uint32_t node) {
  if (timeline_ && node < timeline_->focus.size()) timeline_->focus[node] = true;
}

void SimLog::TrainingBegins() {
  if (timeline_) timeline_->training.emplace_back(loop_.now_ns, -1);
}

void SimLog::TrainingEnds() {
  if (timeline_ && !timeline_->training.empty()) timeline_->training.back().second = loop_.now_ns;
}

void SimLog::AddMark(uint32_t node, MarkKind kind, std::string text, int64_t end_ns) {
  if (!timeline_) return;
  timeline_->marks.push_back(
      Mark{loop_.now_ns, end_ns < 0 ? loop_.now_ns : end_ns, node, kind, std::move(text)});
}

std::vector<std::string> Split(std::string_view text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace ddprun::sim
