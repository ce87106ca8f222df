#pragma once
// The simulator's output: the event log (what `ddprun --simulate` prints, stamped with virtual
// time and condensed at scale) and the timeline (phases per node, marks, training spans) when
// one is kept. Every part writes here and nowhere else; it reads the model only to ask a node's
// phase of the PhaseSource. Internal to sim/.

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "runner/core/events.h"
#include "sim/timeline.h"

namespace ddprun::sim {

struct Loop;
class Nodes;

/// `text` split at newlines (a trailing newline gives a last empty line).
std::vector<std::string> Split(std::string_view text);

/// What a node is doing now, for its timeline row (the Cluster, which sees agent and workers).
class PhaseSource {
 public:
  virtual ~PhaseSource() = default;
  /// The node's phase; `round` is set with the phases that have one (else left at -1).
  virtual NodePhase PhaseOf(uint32_t node, int* round) const = 0;
};

class SimLog {
 public:
  /// `out` null: no lines (--quiet); `timeline` null: no timeline. At more than
  /// `condense_above` agents only node 0's and faulted nodes' lines are shown.
  SimLog(std::ostream* out, Timeline* timeline, const Loop& loop, Nodes& nodes, const PhaseSource& phases,
         bool condense);

  /// A "sim:" line (no node) or a line on a node's behalf.
  void PrintSim(std::optional<uint32_t> node, std::string_view text);
  /// The console port of `node`'s agent (and on the coordinator's node, the coordinator's).
  void ConsoleLog(uint32_t node, core::LogLevel level, std::string_view source, std::string_view text);
  void ConsoleSummary(uint32_t node, std::string_view text);
  /// "INVARIANT VIOLATED: ..." once.
  void ReportViolation(std::string_view what);

  // ---- the timeline (each a no-op without one) ----
  /// A node was added: its row.
  void AddRow(const std::string& label);
  void AddMark(uint32_t node, MarkKind kind, std::string text, int64_t end_ns = -1);
  /// Records what `node` is doing now on its row.
  void SetPhase(uint32_t node);
  void SetAllPhases();
  /// Its row stays expanded on the page (a fault touched it).
  void FocusRow(uint32_t node);
  /// The gang starts or stops training now.
  void TrainingBegins();
  void TrainingEnds();
  Timeline* timeline() { return timeline_; }

  /// While a node's bytes (or its connect) are handed to the coordinator, the lines the
  /// coordinator logs are about that node: the subject comes from the data being delivered,
  /// never from the words of the line.
  class Subject {
   public:
    Subject(SimLog& log, std::optional<uint32_t> node) : log_(log), saved_(log.subject_) {
      log_.subject_ = node;
    }
    ~Subject() { log_.subject_ = saved_; }
    Subject(const Subject&) = delete;
    Subject& operator=(const Subject&) = delete;

   private:
    SimLog& log_;
    std::optional<uint32_t> saved_;
  };

 private:
  void Print(uint32_t node, std::string_view who, std::string_view text);

  std::ostream* out_;
  Timeline* timeline_;
  const Loop& loop_;
  Nodes& nodes_;
  const PhaseSource& phases_;
  bool condense_;
  std::optional<uint32_t> subject_;  // see Subject
  bool violation_printed_ = false;
  uint64_t condensed_lines_ = 0;
  uint64_t condensed_nodes_ = 0;
  uint64_t condense_epoch_ = 1;
  std::map<std::string, uint32_t> summaries_seen_;
};

}  // namespace ddprun::sim
