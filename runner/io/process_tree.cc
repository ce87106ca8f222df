#include "runner/io/process_tree.h"

#include "base/assert.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include "base/parse_int.h"

namespace ddprun::io {
namespace {

// A stop-and-look pass finds what forked during the previous one; a tree that still grows
// after this many passes is forking faster than we read /proc, and is killed as far as seen.
constexpr int kMaxStopPasses = 32;

bool SamePid(const ProcessEntry& a, const ProcessEntry& b) { return a.pid < b.pid; }

bool Contains(const std::vector<ProcessEntry>& sorted, const ProcessEntry& entry) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), entry, SamePid);
  return it != sorted.end() && it->pid == entry.pid && it->start_time == entry.start_time;
}

}  // namespace

bool ReadProcessEntry(pid_t pid, ProcessEntry& entry) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char line[1024];
  ssize_t n;
  do {
    n = ::read(fd, line, sizeof line - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return false;
  line[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: the fields resume after the
  // last ')'. Then: state, ppid, pgrp, flags as field 9, starttime as field 22 and, where the
  // kernel has it, env_end as field 51.
  char* p = std::strrchr(line, ')');
  if (!p || p[1] != ' ' || p[2] == '\0') return false;
  entry.pid = pid;
  entry.state = p[2];
  p += 3;
  char* end = nullptr;
  uint64_t fields[48] = {};  // fields 4..51
  for (int i = 0; i < 48; ++i) {
    fields[i] = std::strtoull(p, &end, 10);
    if (end == p) {
      if (i < 19) return false;  // up to starttime every kernel has them
      break;
    }
    p = end;
  }
  entry.ppid = static_cast<pid_t>(fields[0]);
  entry.pgid = static_cast<pid_t>(fields[1]);
  entry.flags = fields[5];
  entry.start_time = fields[18];
  entry.env_end = fields[47];
  return true;
}

std::vector<ProcessEntry> ReadProcessTable() {
  std::vector<ProcessEntry> table;
  DIR* dir = ::opendir("/proc");
  if (!dir) return table;
  while (const dirent* d = ::readdir(dir)) {
    if (table.size() >= kMaxProcesses) break;
    const auto pid = ParseNonNegative(d->d_name, std::numeric_limits<pid_t>::max());
    if (!pid || *pid == 0) continue;
    ProcessEntry entry;
    if (ReadProcessEntry(static_cast<pid_t>(*pid), entry)) table.push_back(entry);
  }
  ::closedir(dir);
  std::sort(table.begin(), table.end(), SamePid);
  return table;
}

std::vector<ProcessEntry> DescendantsOf(const std::vector<ProcessEntry>& table,
                                        const std::vector<pid_t>& roots, pid_t exclude) {
  // Children by parent: indices of `table` sorted by ppid.
  std::vector<size_t> by_parent(table.size());
  for (size_t i = 0; i < table.size(); ++i) by_parent[i] = i;
  std::sort(by_parent.begin(), by_parent.end(),
            [&](size_t a, size_t b) { return table[a].ppid < table[b].ppid; });
  std::vector<ProcessEntry> found;
  std::vector<pid_t> frontier(roots);
  std::vector<char> seen(table.size(), 0);  // a pid cannot be its own ancestor, but be safe
  while (!frontier.empty()) {
    const pid_t parent = frontier.back();
    frontier.pop_back();
    auto first = std::partition_point(by_parent.begin(), by_parent.end(),
                                      [&](size_t i) { return table[i].ppid < parent; });
    for (auto it = first; it != by_parent.end() && table[*it].ppid == parent; ++it) {
      const ProcessEntry& child = table[*it];
      if (seen[*it] || child.pid == exclude) continue;
      seen[*it] = 1;
      found.push_back(child);
      frontier.push_back(child.pid);
    }
  }
  return found;
}

void SignalGroup(pid_t leader, int signal) {
  DDPRUN_ASSERT(leader > 1);
  ::kill(-leader, signal);
}

void SignalProcess(pid_t pid, int signal) {
  DDPRUN_ASSERT(pid > 1);
  ::kill(pid, signal);
}

size_t KillTrees(const std::function<bool(const ProcessEntry&)>& is_seed, pid_t exclude) {
  const pid_t self = ::getpid();
  std::vector<ProcessEntry> marked;  // sorted by pid; stopped, to be killed
  for (int pass = 0; pass < kMaxStopPasses; ++pass) {
    const std::vector<ProcessEntry> table = ReadProcessTable();
    std::vector<pid_t> roots;
    std::vector<ProcessEntry> candidates;
    for (const ProcessEntry& entry : table) {
      if (entry.pid <= 1 || entry.pid == self || entry.pid == exclude) continue;
      if (is_seed(entry) || Contains(marked, entry)) {
        roots.push_back(entry.pid);
        candidates.push_back(entry);
      }
    }
    for (const ProcessEntry& entry : DescendantsOf(table, roots, exclude)) {
      if (entry.pid > 1 && entry.pid != self) candidates.push_back(entry);
    }
    size_t added = 0;
    for (const ProcessEntry& entry : candidates) {
      if (Contains(marked, entry)) continue;
      // Stopped, it cannot fork again before the kill; a zombie ignores both signals.
      SignalProcess(entry.pid, SIGSTOP);
      marked.insert(std::upper_bound(marked.begin(), marked.end(), entry, SamePid), entry);
      ++added;
    }
    if (added == 0) break;
  }
  for (const ProcessEntry& entry : marked) SignalProcess(entry.pid, SIGKILL);
  return marked.size();
}

}  // namespace ddprun::io
