#pragma once
// Helpers shared by the core tests: job specs from TOML text, and filters over effect lists
// (one copy each, so the coordinator and agent tests filter alike). The drivers that feed the
// state machines are in tests/core/drivers.h.

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "runner/core/coordinator.h"
#include "runner/core/events.h"
#include "runner/core/time.h"
#include "schema/diagnostics.h"
#include "schema/job_spec.h"
#include "schema/loader.h"

namespace ddprun::core::test {

/// Two nodes of two workers each, one restart, round numbers for every timeout.
inline constexpr std::string_view kTwoNodeJob = R"(version = 1
[job]
name = "demo"
command = ["python", "train.py"]
[cluster]
nodes = ["gpu-01", "gpu-02"]
master_port = 50000
nproc_per_node = 2
[restart]
max_restarts = 1
backoff = "10s"
[timeouts]
rendezvous = "15m"
heartbeat = "2s"
stop_grace = "30s"
)";

/// Two nodes whose coordinator role lives in etcd (core::Election): keys under /team/llm, a
/// 6 s lease.
inline constexpr std::string_view kTwoNodeEtcdJob = R"(version = 1
[job]
name = "llm"
command = ["python", "train.py"]
[cluster]
nodes = ["gpu-01", "gpu-02"]
master_port = 29500
nproc_per_node = 1
[rendezvous]
backend = "etcd"
endpoints = ["http://127.0.0.1:2379"]
prefix = "/team"
lease = "6s"
)";

/// Parses `text` with the real loader; a job the loader refuses fails the test with the
/// rendered diagnostics and yields a default spec.
inline JobSpec SpecFromToml(std::string_view text) {
  LoadResult result = ParseJobText(text, "job.toml");
  if (!result.spec) {
    ADD_FAILURE() << "test job file does not load:\n"
                  << RenderDiagnostics(result.diagnostics, "job.toml", result.source_text, false);
    return JobSpec{};
  }
  return std::move(*result.spec);
}

/// kTwoNodeJob with `from` replaced by `to` (each must occur once).
inline std::string Edit(std::string_view base, std::string_view from, std::string_view to) {
  std::string text(base);
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "no \"" << from << "\" in the test job";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

inline TimePoint At(Duration d) { return AtOffset(d); }

/// Every effect of type T, in order.
template <typename T, typename Effect>
std::vector<T> All(const std::vector<Effect>& effects) {
  std::vector<T> found;
  for (const Effect& e : effects) {
    if (const T* t = std::get_if<T>(&e)) found.push_back(*t);
  }
  return found;
}

template <typename T, typename Effect>
size_t Count(const std::vector<Effect>& effects) {
  return All<T>(effects).size();
}

/// The texts of every LogLine, in order.
template <typename Effect>
std::vector<std::string> LogTexts(const std::vector<Effect>& effects) {
  std::vector<std::string> texts;
  for (const LogLine& line : All<LogLine>(effects)) texts.push_back(line.text);
  return texts;
}

/// The first log line containing `needle`, or "" when none does.
template <typename Effect>
std::string FindLog(const std::vector<Effect>& effects, std::string_view needle) {
  for (const std::string& text : LogTexts(effects)) {
    if (text.find(needle) != std::string::npos) return text;
  }
  return {};
}

/// Every message of type M the coordinator sent, with its connection.
template <typename M>
std::vector<std::pair<ConnId, M>> Sent(const std::vector<CoordinatorEffect>& effects) {
  std::vector<std::pair<ConnId, M>> found;
  for (const SendTo& send : All<SendTo>(effects)) {
    if (const M* m = std::get_if<M>(&send.message)) found.emplace_back(send.conn, *m);
  }
  return found;
}

/// Every message of type M the agent sent to the master.
template <typename M>
std::vector<M> Sent(const std::vector<AgentEffect>& effects) {
  std::vector<M> found;
  for (const SendToMaster& send : All<SendToMaster>(effects)) {
    if (const M* m = std::get_if<M>(&send.message)) found.push_back(*m);
  }
  return found;
}

/// The coordinator's effects without its periodic heartbeats and journal refreshes
/// (RecordWorkers with rounds_may_run), which depend only on the clock.
std::vector<CoordinatorEffect> Meaningful(const std::vector<CoordinatorEffect>& effects);

/// The agent's effects without its own periodic heartbeats and the lease renewals that come
/// with every word from the coordinator.
std::vector<AgentEffect> Meaningful(const std::vector<AgentEffect>& effects);

/// A human listing of effects for failure messages.
std::string Describe(const std::vector<CoordinatorEffect>& effects);
std::string Describe(const std::vector<AgentEffect>& effects);

}  // namespace ddprun::core::test
