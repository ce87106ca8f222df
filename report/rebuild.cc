#include "report/rebuild.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <limits>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "runner/core/failure.h"
#include "schema/duration.h"

namespace ddprun::report {
namespace {

constexpr int64_t kNsPerMs = 1'000'000;

}  // namespace

std::string FormatUtc(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec);
}

namespace {

bool Running(NodePhase phase) {
  return phase == NodePhase::kStarting || phase == NodePhase::kTraining || phase == NodePhase::kStalled ||
         phase == NodePhase::kStopping;
}

std::string ExitWords(int64_t code, int64_t signal) {
  return signal != 0 ? fmt::format("killed by signal {}", signal) : fmt::format("exited with code {}", code);
}

/// One record placed on the run's time axis.
struct Placed {
  int64_t ns = 0;
  const EventRecord* record = nullptr;
};

/// Per round, what the nodes said about it: when each started its workers, trained, stopped.
struct RoundFacts {
  std::map<uint32_t, int64_t> started;  // by row
  std::map<uint32_t, int64_t> trained;
  std::optional<int64_t> ended;  // the first stop or end anywhere
};

class Builder {
 public:
  explicit Builder(const Run& run) : run_(run) {}

  RebuiltRun Build() {
    ReadHeader();
    Init();
    PlaceRecords();
    ReadCoordinator();
    for (uint32_t row = 0; row < rows_; ++row) BuildRow(row);
    Finish();
    return std::move(out_);
  }

 private:
  void ReadHeader() {
    // node 0's start record speaks for the job; any agent's does when node 0's is missing.
    const EventRecord* header = &run_.files.front()->records.front();
    for (const EventFile* file : run_.files) {
      if (file->records.front().node == 0) header = &file->records.front();
    }
    job_ = header->Text("job");
    nnodes_ = static_cast<int>(std::max<int64_t>(1, header->Int("nnodes", 1)));
    spares_ = static_cast<int>(std::max<int64_t>(0, header->Int("spares", 0)));
    nproc_ = static_cast<int>(std::max<int64_t>(1, header->Int("nproc", 1)));
    int max_node = nnodes_ + spares_ - 1;
    for (const EventFile* file : run_.files) max_node = std::max(max_node, file->records.front().node);
    rows_ = static_cast<uint32_t>(max_node + 1);
    files_of_.resize(rows_);
    for (const EventFile* file : run_.files)
      files_of_[static_cast<size_t>(file->records.front().node)].push_back(file);
  }

  void PlaceRecords() {
    // Each file on its own monotonic clock, anchored at its first record's wall clock.
    t0_ms_ = std::numeric_limits<int64_t>::max();
    for (const EventFile* file : run_.files) t0_ms_ = std::min(t0_ms_, file->records.front().unix_ms);
    for (const EventFile* file : run_.files) {
      const EventRecord& first = file->records.front();
      const int64_t base = first.unix_ms - first.mono_ms;
      std::vector<Placed>& placed = placed_[file];
      placed.reserve(file->records.size());
      for (const EventRecord& record : file->records) {
        const int64_t ms = std::max(base + record.mono_ms, t0_ms_);
        placed.push_back(Placed{(ms - t0_ms_) * kNsPerMs, &record});
        end_ns_ = std::max(end_ns_, placed.back().ns);
        if (record.type == "training") any_training_ = true;
      }
    }
  }

  void ReadCoordinator() {
    for (const EventFile* file : run_.files) {
      for (const Placed& p : placed_[file]) {
        const EventRecord& r = *p.record;
        if (r.type == "node-lost") {
          const int64_t peer = r.Int("peer");
          if (peer >= 0 && static_cast<uint64_t>(peer) < rows_) {
            lost_[static_cast<uint32_t>(peer)].push_back(p.ns);
            AddMark(p.ns, static_cast<uint32_t>(peer), MarkKind::kFault, "lost: " + r.Text("reason"), true);
          }
        } else if (r.type == "round-begin") {
          ++out_.rounds;
          AddMark(p.ns, Mark::kJob, MarkKind::kRestart, fmt::format("round {}", r.Int("round")), false);
        } else if (r.type == "round-failed") {
          const int64_t round = r.Int("round");
          AddMark(p.ns, Mark::kJob, MarkKind::kFailure,
                  fmt::format("round {} failed: {}", round, r.Text("cause")), false);
          const int64_t peer = r.Int("peer");
          if (core::HasKind(core::ParseKinds(r.Texts("kinds")), core::FailureKind::Type::kHang) &&
              peer >= 0 && static_cast<uint64_t>(peer) < rows_) {
            AddMark(p.ns, static_cast<uint32_t>(peer), MarkKind::kFault, r.Text("cause"), true);
          }
          EndRound(static_cast<int>(round), p.ns);
        } else if (r.type == "restart") {
          out_.restarts = std::max(out_.restarts, static_cast<int>(r.Int("restart", 0)));
        } else if (r.type == "replace") {
          const int64_t spare = r.Int("spare");
          const int64_t plays = r.Int("plays");
          if (spare >= 0 && static_cast<uint64_t>(spare) < rows_) {
            AddMark(p.ns, static_cast<uint32_t>(spare), MarkKind::kHeal,
                    fmt::format("takes node {}'s place in round {}", plays, r.Int("round")), true);
          }
          if (plays >= 0 && static_cast<uint64_t>(plays) < rows_) {
            AddMark(p.ns, static_cast<uint32_t>(plays), MarkKind::kHeal,
                    fmt::format("replaced by spare node {} in round {}", spare, r.Int("round")), true);
          }
        } else if (r.type == "job-result") {
          out_.exit_code = static_cast<int>(r.Int("exit_code"));
          job_summary_ = r.Text("summary");
        } else if (r.type == "master-lost" && r.node != 0) {
          master_lost_.push_back(p.ns);
        }
      }
    }
    std::sort(master_lost_.begin(), master_lost_.end());
    for (auto& [row, times] : lost_) std::sort(times.begin(), times.end());
  }

  void BuildRow(uint32_t row) {
    std::vector<const EventFile*>& files = files_of_[row];
    std::sort(files.begin(), files.end(), [&](const EventFile* a, const EventFile* b) {
      return placed_[a].front().ns < placed_[b].front().ns;
    });
    for (size_t f = 0; f < files.size(); ++f) {
      const std::vector<Placed>& placed = placed_[files[f]];
      if (f == 0) host_[row] = files[f]->host;
      if (files[f]->truncated) {
        out_.notes.push_back(
            fmt::format("{} reached its size bound: it ends with a \"truncated\" record, and "
                        "this node's row ends there",
                        files[f]->path));
      }
      if (!files[f]->torn.empty()) out_.notes.push_back(files[f]->torn);
      for (const Placed& p : placed) Apply(row, p.ns, *p.record);
      if (phase_[row] != NodePhase::kDone) {
        // The agent left no exit record: it was killed or its host went down. Its row keeps
        // its phase until someone noticed (node 0's coordinator, or for node 0 the others).
        const int64_t last = placed.back().ns;
        const int64_t next_start = f + 1 < files.size() ? placed_[files[f + 1]].front().ns : end_ns_;
        int64_t down = last;
        const std::vector<int64_t>& seen = row == 0 ? master_lost_ : lost_[row];
        if (const auto noticed = std::lower_bound(seen.begin(), seen.end(), last);
            noticed != seen.end() && *noticed <= next_start) {
          down = *noticed;
        }
        if (files[f]->truncated) continue;  // its row ends at the bound, not in a crash
        SetPhase(row, down, NodePhase::kDown, -1);
        AddMark(down, row, MarkKind::kFault, "agent gone: no exit record", true);
      }
    }
  }

  void Apply(uint32_t row, int64_t ns, const EventRecord& r) {
    const std::string& type = r.type;
    const NodePhase phase = phase_[row];
    const int round = static_cast<int>(r.Int("round"));
    if (type == "agent-start") {
      SetPhase(row, ns, NodePhase::kRendezvous, -1);
    } else if (type == "joined") {
      if (phase == NodePhase::kRendezvous) SetPhase(row, ns, NodePhase::kWaiting, -1);
    } else if (type == "join-refused") {
      AddMark(ns, row, MarkKind::kFault, "join refused: " + r.Text("reason"), true);
    } else if (type == "master-lost") {
      if (!Running(phase) && phase != NodePhase::kDone) SetPhase(row, ns, NodePhase::kRendezvous, -1);
      AddMark(ns, row, MarkKind::kFault, "lost the coordinator: " + r.Text("reason"), false);
    } else if (type == "workers-start") {
      SetPhase(row, ns, any_training_ ? NodePhase::kStarting : NodePhase::kTraining, round);
      rounds_[round].started[row] = ns;
      if (!any_training_) rounds_[round].trained[row] = ns;
    } else if (type == "training") {
      if (phase == NodePhase::kStarting) SetPhase(row, ns, NodePhase::kTraining, round);
      rounds_[round].trained.emplace(row, ns);
    } else if (type == "hang") {
      // This node saw one of its ranks go silent and told node 0; which rank hung is node 0's
      // verdict (round-failed), drawn on that rank's node: in a gang stalled in a collective,
      // the node that notices first is often not the hung rank's.
      if (Running(phase) && phase != NodePhase::kStopping) SetPhase(row, ns, NodePhase::kStalled, round);
      AddMark(
          ns, row, MarkKind::kFault,
          fmt::format("rank {} silent for {}", r.Int("rank"),
                      HumanDuration(std::chrono::milliseconds(std::max<int64_t>(0, r.Int("silent_ms", 0))))),
          false);
    } else if (type == "stop-round" || type == "signal-workers") {
      if (Running(phase) && phase != NodePhase::kStopping)
        SetPhase(row, ns, NodePhase::kStopping, round_[row]);
      EndRound(round, ns);
    } else if (type == "worker-exit") {
      const int64_t code = r.Int("exit_code", 0);
      const int64_t signal = r.Int("signal", 0);
      if ((code != 0 || signal != 0) && !r.Flag("stopped")) {
        std::string text = fmt::format("rank {} {}", r.Int("rank"), ExitWords(code, signal));
        if (const std::string error = r.Text("error"); !error.empty()) text += ": " + error;
        AddMark(ns, row, MarkKind::kFault, text, true);
      }
    } else if (type == "spawn-failed") {
      AddMark(ns, row, MarkKind::kFault,
              fmt::format("rank {} did not start: {}", r.Int("rank"), r.Text("error")), true);
    } else if (type == "round-end") {
      if (phase != NodePhase::kDone) SetPhase(row, ns, NodePhase::kWaiting, -1);
      EndRound(round, ns);
    } else if (type == "interrupted") {
      AddMark(ns, row, MarkKind::kFault, "interrupted by " + r.Text("signal"), true);
    } else if (type == "agent-exit") {
      SetPhase(row, ns, NodePhase::kDone, -1);
      AddMark(ns, row, MarkKind::kExit, fmt::format("exit {}", r.Int("exit_code")), false);
      // An agent that could not start says why (issue 39): drawn on its row, and node 0's is the
      // run's summary when nothing else ended it.
      if (const std::string why = r.Text("reason"); !why.empty()) {
        AddMark(ns, row, MarkKind::kFault,
                fmt::format("did not start (exit {}): {}", r.Int("exit_code"), why), true);
        if (row == 0 && job_summary_.empty()) {
          job_summary_ = fmt::format("node 0's agent did not start (exit {}): {}", r.Int("exit_code"), why);
        }
      }
      if (out_.exit_code < 0 && row == 0) out_.exit_code = static_cast<int>(r.Int("exit_code"));
    } else if (type == "job-end") {
      if (job_summary_.empty()) job_summary_ = r.Text("summary");
    } else if (type == "truncated") {
      AddMark(ns, row, MarkKind::kFault, "event log truncated", false);
    }
  }

  void EndRound(int round, int64_t ns) {
    if (round < 0) return;
    RoundFacts& facts = rounds_[round];
    if (!facts.ended || ns < *facts.ended) facts.ended = ns;
  }

  void SetPhase(uint32_t row, int64_t ns, NodePhase phase, int round) {
    auto& segments = out_.timeline.segments[row];
    if (!segments.empty() && segments.back().end_ns < 0) {
      if (segments.back().phase == phase && segments.back().round == round) return;
      segments.back().end_ns = std::max(ns, segments.back().start_ns);
    }
    segments.push_back(Segment{ns, -1, phase, round});
    phase_[row] = phase;
    round_[row] = round;
  }

  void AddMark(int64_t ns, uint32_t node, MarkKind kind, std::string text, bool focus) {
    out_.timeline.marks.push_back(Mark{ns, ns, node, kind, std::move(text)});
    if (focus && node != Mark::kJob) focus_rows_.push_back(node);
  }

  void Finish() {
    Timeline& t = out_.timeline;
    t.end_ns = std::max<int64_t>(end_ns_, 1);
    for (auto& row : t.segments) {
      if (!row.empty() && row.back().end_ns < 0) row.back().end_ns = t.end_ns;
    }
    for (uint32_t row : focus_rows_) t.focus[row] = true;
    for (uint32_t row = 0; row < rows_; ++row) {
      const bool spare = row >= static_cast<uint32_t>(nnodes_);
      const std::string name = spare ? fmt::format("spare node {}", row) : fmt::format("node {}", row);
      if (files_of_[row].empty()) {
        t.labels[row] = name + " (no events file)";
        if (!spare)
          out_.notes.push_back(fmt::format("no events file of {} was found: its row is empty", name));
      } else {
        t.labels[row] = fmt::format("{} ({})", name, host_[row]);
      }
    }
    // The gang trained from the last node's start of training to the first stop anywhere.
    for (const auto& [round, facts] : rounds_) {
      if (facts.trained.empty() || facts.trained.size() < facts.started.size()) continue;
      int64_t start = 0;
      for (const auto& [row, ns] : facts.trained) start = std::max(start, ns);
      const int64_t stop = facts.ended.value_or(t.end_ns);
      if (stop > start) t.training.emplace_back(start, stop);
    }
    std::sort(t.training.begin(), t.training.end());
    std::stable_sort(t.marks.begin(), t.marks.end(),
                     [](const Mark& a, const Mark& b) { return a.at_ns < b.at_ns; });
    t.kind = "ddprun run";
    t.clock = "wall-clock time since the first record";
    t.title = fmt::format("{}: {} node{} x {} worker{}, started {}", job_, nnodes_, nnodes_ == 1 ? "" : "s",
                          nproc_, nproc_ == 1 ? "" : "s", FormatUtc(t0_ms_));
    std::string summary = job_summary_.empty() ? "(no record of the job's end: the run was cut short, or is "
                                                 "still running)"
                                               : job_summary_;
    summary += fmt::format("\n\nfrom {} event file{} ({} to {}):", run_.files.size(),
                           run_.files.size() == 1 ? "" : "s", FormatUtc(run_.first_unix_ms),
                           FormatUtc(run_.last_unix_ms));
    for (const EventFile* file : run_.files) {
      summary += fmt::format("\n  {} ({} records)", file->path, file->records.size());
    }
    for (const std::string& note : out_.notes) summary += "\nnote: " + note;
    out_.summary = std::move(summary);
  }

  void Init() {
    out_.timeline.segments.resize(rows_);
    out_.timeline.labels.resize(rows_);
    out_.timeline.focus.assign(rows_, false);
    phase_.assign(rows_, NodePhase::kOff);
    round_.assign(rows_, -1);
    host_.resize(rows_);
  }

 private:
  const Run& run_;
  RebuiltRun out_;
  std::string job_;
  int nnodes_ = 1;
  int spares_ = 0;
  int nproc_ = 1;
  uint32_t rows_ = 0;
  std::vector<std::vector<const EventFile*>> files_of_;
  std::map<const EventFile*, std::vector<Placed>> placed_;
  int64_t t0_ms_ = 0;
  int64_t end_ns_ = 0;
  bool any_training_ = false;
  std::map<uint32_t, std::vector<int64_t>> lost_;  // node-lost times, by row, in order
  std::vector<int64_t> master_lost_;               // master-lost times of nodes other than 0
  std::map<int, RoundFacts> rounds_;
  std::string job_summary_;
  std::vector<NodePhase> phase_;
  std::vector<int> round_;
  std::vector<std::string> host_;
  std::vector<uint32_t> focus_rows_;
};

}  // namespace

RebuiltRun RebuildTimeline(const Run& run) {
  Builder builder(run);
  return builder.Build();
}

}  // namespace ddprun::report
