// The console side of RealProcessLauncher (process_launcher.h): every byte of a worker's output
// goes to its rank's log file first, then, split into lines, to the console (progress bars
// throttled, consequence tracebacks held until the round's root cause is known and then told
// as one digest line per node). Starting, reaping, signals and stacks are in
// process_launcher.cc.
#include <algorithm>
#include <filesystem>

#include <unistd.h>

#include <fmt/format.h>

#include "runner/io/consequence_filter.h"
#include "runner/io/console_writer.h"
#include "runner/io/launcher_worker.h"
#include "runner/io/log_files.h"

namespace ddprun::io {

using boost::system::error_code;

void RealProcessLauncher::WriteLog(Worker& worker, const char* data, size_t size) {
  if (!worker.log_fd.valid() || worker.log_failed) return;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(worker.log_fd.get(), data + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // A full disk or an I/O error: say so once, and keep the file as it is rather than
      // leave holes in it if space comes back.
      const int error = n < 0 ? errno : EIO;
      worker.log_failed = true;
      worker.log_bytes += written;
      const std::string what =
          fmt::format("rank {}: cannot write {}: {}; the file stops after {} bytes", worker.global_rank,
                      worker.log_path, std::strerror(error), worker.log_bytes);
      log_problems_.push_back(what);
      if (options_.report) options_.report("log file incomplete: " + what);
      return;
    }
    written += static_cast<size_t>(n);
  }
  worker.log_bytes += written;
}

void RealProcessLauncher::CloseLog(Worker& worker) {
  if (!worker.log_fd.valid()) return;
  // NFS may report a failed write only when the file is closed.
  if (worker.log_fd.Reset() != 0 && !worker.log_failed) {
    worker.log_failed = true;
    const std::string what = fmt::format("rank {}: cannot write {}: {}", worker.global_rank, worker.log_path,
                                         std::strerror(errno));
    log_problems_.push_back(what);
    if (options_.report) options_.report("log file incomplete: " + what);
  }
}

void RealProcessLauncher::OnOutput(const std::shared_ptr<Worker>& worker, bool is_stderr, const char* data,
                                   size_t size) {
  // Every byte goes to the rank's file first: the file is the record, the console a view.
  WriteLog(*worker, data, size);
  // Only stderr keeps lines (for the failure summary) and only shown ranks need them split,
  // so a hidden rank's stdout costs nothing beyond the write above.
  if (!worker->show && !is_stderr) return;
  std::string& console = console_buffer_;
  console.clear();
  worker->splitters[is_stderr ? 1 : 0].Feed(std::string_view(data, size), OutputSplitter::Clock::now(),
                                            console);
  if (!console.empty()) Show(is_stderr, console);
  ArmProgress(worker);
}

void RealProcessLauncher::ArmProgress(const std::shared_ptr<Worker>& worker) {
  std::optional<OutputSplitter::Clock::time_point> next;
  for (const auto& splitter : worker->splitters) {
    auto deadline = splitter.ProgressDeadline();
    if (deadline && (!next || *deadline < *next)) next = deadline;
  }
  // After its report, a worker's timer only serves lines held for a verdict (stderr).
  if (!next || worker->progress_armed == next ||
      (worker->reported && worker->splitters[1].filter().Settled())) {
    return;
  }
  worker->progress_armed = next;
  worker->progress_timer.expires_at(*next);
  worker->progress_timer.async_wait([this, worker](error_code ec) {
    if (ec) return;  // replaced or cancelled
    worker->progress_armed.reset();
    for (size_t s = 0; s < 2; ++s) {
      std::string& console = console_buffer_;
      console.clear();
      worker->splitters[s].FlushProgress(OutputSplitter::Clock::now(), console);
      if (!console.empty()) Show(s == 1, console);
    }
    ArmProgress(worker);
    MaybeDigest(worker->round);
  });
}

void RealProcessLauncher::Show(bool is_stderr, std::string_view text) {
  // Through the console writer, which never blocks the loop (runner/io/console_writer.h).
  if (options_.console_writer) {
    options_.console_writer->Write(is_stderr ? ConsoleWriter::Stream::kErr : ConsoleWriter::Stream::kOut,
                                   text);
    return;
  }
  FILE* stream = is_stderr ? stderr : stdout;
  std::fwrite(text.data(), 1, text.size(), stream);
  std::fflush(stream);
}

void RealProcessLauncher::TrackForConsole(int round, const std::shared_ptr<Worker>& worker) {
  // Earlier rounds are forgotten once nothing of theirs waits for the console.
  for (auto it = rounds_.begin(); it != rounds_.end() && it->first < round;) {
    const bool settled = std::all_of(
        it->second.workers.begin(), it->second.workers.end(),
        [](const std::shared_ptr<Worker>& w) { return w->reported && w->splitters[1].filter().Settled(); });
    it = settled ? rounds_.erase(it) : std::next(it);
  }
  rounds_[round].workers.push_back(worker);
}

void RealProcessLauncher::RootCauseKnown(int round, int cause_rank, bool provisional) {
  const auto it = rounds_.find(round);
  if (it == rounds_.end()) return;
  it->second.cause_rank = cause_rank;
  it->second.provisional_until.reset();
  if (provisional) it->second.provisional_until = std::chrono::steady_clock::now() + ConsequenceFilter::kHold;
  for (const std::shared_ptr<Worker>& worker : it->second.workers) {
    std::string& console = console_buffer_;
    console.clear();
    worker->splitters[1].Verdict(worker->global_rank == cause_rank, provisional, console);
    if (!console.empty()) Show(true, console);
  }
  MaybeDigest(round);
}

void RealProcessLauncher::MaybeDigest(int round) {
  const auto it = rounds_.find(round);
  if (it == rounds_.end() || !it->second.cause_rank || it->second.digest_told) return;
  RoundConsole& console = it->second;
  if (console.provisional_until && std::chrono::steady_clock::now() < *console.provisional_until) {
    if (!console.digest_timer) {
      console.digest_timer = std::make_shared<boost::asio::steady_timer>(io_, *console.provisional_until);
      console.digest_timer->async_wait([this, round](error_code ec) {
        if (ec) return;  // the round was forgotten
        MaybeDigest(round);
      });
    }
    return;
  }
  std::vector<CollapsedRank> collapsed;
  std::string folder;
  for (const std::shared_ptr<Worker>& worker : it->second.workers) {
    const ConsequenceFilter& filter = worker->splitters[1].filter();
    if (!worker->reported || !filter.Settled()) return;  // more may come, or be collapsed
    if (filter.collapsed_lines() == 0) continue;
    collapsed.push_back({worker->global_rank, filter.collapsed_lines(), filter.collapsed_lost_peer(),
                         filter.collapsed_the_stop()});
    if (folder.empty()) folder = std::filesystem::path(worker->log_path).parent_path().string();
  }
  it->second.digest_told = true;
  if (!collapsed.empty() && options_.note) {
    options_.note(false, ConsequenceDigest(round, *it->second.cause_rank, collapsed, folder));
  }
}

}  // namespace ddprun::io
