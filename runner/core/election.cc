#include "runner/core/election.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/assert.h"
#include "base/parse_int.h"
#include "schema/duration.h"
#include "schema/worker_env.h"

namespace ddprun::core {

using namespace election;

namespace {

// A write or a renewal that could not reach the store is tried again after this, for as long
// as the lease certainly lives.
constexpr Duration kRetry = Millis(500);

std::string Field(std::string_view text, std::string_view key) {
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == '=') {
      return std::string(line.substr(key.size() + 1));
    }
    begin = end + 1;
  }
  return "";
}

std::optional<int> IntField(std::string_view text, std::string_view key) {
  const std::string value = Field(text, key);
  const auto n = ParseNonNegative(value, 1'000'000'000);
  if (!n) return std::nullopt;
  return static_cast<int>(*n);
}

std::string AgentLabel(const JobSpec& spec, int agent) {
  const std::string host = spec.cluster.HostOf(agent);
  return spec.cluster.AgentLabel(agent) + (host.empty() ? "" : fmt::format(" ({})", host));
}

}  // namespace

// One field per line, the summary last (it spans lines). Quarantined hosts carry the time
// left when written: a holder that takes over counts it from then (a host stays out a little
// longer, never shorter, by the time the takeover took).
std::string FormatJobRecord(const JobRecord& r) {
  std::string out = fmt::format(
      "ddprun-state=1\nnext_round={}\nrestarts={}\nrunning={}\nnodes={}\nunconfirmed={}\ndone={}\nholder={}\n"
      "holder_agent={}\nfingerprint={}\n",
      r.next_round, r.restarts_used, r.round_may_run ? 1 : 0, r.round_nodes, r.workers_may_run ? 1 : 0,
      r.done ? 1 : 0, r.holder, r.holder_agent, r.fingerprint);
  for (const QuarantinedHost& q : r.quarantined) {
    const int64_t left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(q.left).count();
    out += fmt::format("quarantine={} {} {}\n", std::max<int64_t>(left_ms, 0), q.times, q.host);
  }
  if (r.exit_code) out += fmt::format("exit={}\nsummary={}", *r.exit_code, r.summary);
  return out;
}

std::optional<JobRecord> ParseJobRecord(const std::string& text) {
  if (Field(text, "ddprun-state") != "1") return std::nullopt;
  JobRecord state;
  const auto next = IntField(text, "next_round");
  const auto restarts = IntField(text, "restarts");
  if (!next || !restarts) return std::nullopt;
  state.next_round = *next;
  state.restarts_used = *restarts;
  state.round_may_run = Field(text, "running") == "1";
  state.round_nodes = IntField(text, "nodes").value_or(0);
  state.workers_may_run = Field(text, "unconfirmed") == "1";
  state.done = Field(text, "done") == "1";
  state.holder = Field(text, "holder");
  state.holder_agent = IntField(text, "holder_agent").value_or(-1);
  state.fingerprint = Field(text, "fingerprint");
  size_t begin = 0;
  while ((begin = text.find("\nquarantine=", begin)) != std::string::npos) {
    begin += 12;
    const size_t end = std::min(text.find('\n', begin), text.size());
    const std::string line = text.substr(begin, end - begin);
    const size_t a = line.find(' ');
    const size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
    if (b == std::string::npos) continue;
    const auto left = ParseNonNegative(line.substr(0, a), int64_t{1} << 50);
    const auto times = ParseNonNegative(line.substr(a + 1, b - a - 1), 1'000'000);
    if (!left || !times) continue;
    state.quarantined.push_back(QuarantinedHost{line.substr(b + 1), Millis(*left), static_cast<int>(*times)});
  }
  if (const auto exit = IntField(text, "exit")) {
    state.exit_code = *exit;
    const size_t at = text.find("\nsummary=");
    if (at != std::string::npos) state.summary = text.substr(at + 9);
  }
  return state;
}

Election::Election(const JobSpec& spec, std::string fingerprint, int agent, std::string endpoint)
    : spec_(spec), fingerprint_(std::move(fingerprint)), agent_(agent), endpoint_(std::move(endpoint)) {
  const std::string base = EtcdKeyDir(spec);
  role_key_ = base + "/coordinator";
  state_key_ = base + "/state";
  value_ = fmt::format("agent={}\nendpoint={}\nname={}", agent_, endpoint_, AgentLabel(spec, agent_));
  record_.holder = AgentLabel(spec, agent_);
  record_.holder_agent = agent_;
  record_.fingerprint = fingerprint_;
}

Duration Election::StepDownMargin(Duration lease) { return std::max<Duration>(lease / 5, Millis(400)); }

bool Election::Writing() const {
  const auto* leading = std::get_if<Leading>(&state_);
  return leading && (leading->dirty || leading->write_tag != 0);
}

bool Election::Quiet() const {
  if (!took_part_ || wanted_ || Revoking()) return false;
  if (std::holds_alternative<Idle>(state_)) return true;
  const auto* leading = std::get_if<Leading>(&state_);
  return leading && !Writing() && leading->keepalive_tag == 0 && !leading->commit_round &&
         !leading->end_unacked && !leading->retry_write_at;
}

void Election::Enter(State next) {
  // Forward one phase at a time, or back to Idle from anywhere.
  DDPRUN_ASSERT(next.index() == 0 || next.index() == state_.index() + 1);
  state_ = std::move(next);
}

void Election::Handle(TimePoint now, const Input& input, std::vector<Effect>& out) {
  DDPRUN_ASSERT(!last_input_ || now >= *last_input_);
  last_input_ = now;
  std::visit(
      [&](const auto& in) {
        using T = std::decay_t<decltype(in)>;
        if constexpr (std::is_same_v<T, Lookup>) {
          OnLookup(out);
        } else if constexpr (std::is_same_v<T, Resign>) {
          LetGo(out);
        } else if constexpr (std::is_same_v<T, TookPart>) {
          took_part_ = true;
        } else if constexpr (std::is_same_v<T, Answer>) {
          OnAnswer(now, in, out);
        } else if constexpr (std::is_same_v<T, Tick>) {
          OnTick(now, out);
        } else if constexpr (std::is_same_v<T, Resume>) {
          OnResume(now, in.step, out);
        } else if constexpr (std::is_same_v<T, CommitRound>) {
          record_.next_round = in.round + 1;
          record_.restarts_used = in.restarts_used;
          record_.round_may_run = true;
          record_.round_nodes = in.nodes;
          record_.workers_may_run = false;  // the round starts only once its ranks' fences passed
          if (auto* leading = std::get_if<Leading>(&state_)) leading->commit_round = in.round;
          Changed(now, out);
        } else if constexpr (std::is_same_v<T, RecordWorkers>) {
          // Only "every worker is confirmed stopped" is written: the lease renews the rest.
          if (in.rounds_may_run) return;
          record_.round_may_run = false;
          Changed(now, out);
        } else if constexpr (std::is_same_v<T, RecordRestart>) {
          record_.next_round = in.next_round;
          record_.restarts_used = in.restarts_used;
          record_.round_may_run = false;
          record_.workers_may_run = in.workers_may_run;
          Changed(now, out);
        } else if constexpr (std::is_same_v<T, RecordEnd>) {
          record_.exit_code = in.exit_code;
          record_.summary = in.summary;
          if (auto* leading = std::get_if<Leading>(&state_)) leading->end_unacked = true;
          Changed(now, out);
        } else if constexpr (std::is_same_v<T, RecordQuarantine>) {
          record_.quarantined = in.hosts;
          Changed(now, out);
        } else if constexpr (std::is_same_v<T, CoordinatorDone>) {
          record_.done = true;
          Changed(now, out);
        }
      },
      input);
}

void Election::Changed(TimePoint now, std::vector<Effect>& out) {
  if (auto* leading = std::get_if<Leading>(&state_)) leading->dirty = true;
  MaybeWrite(now, out);
}

void Election::OnLookup(std::vector<Effect>& out) {
  if (leading()) {
    out.push_back(Found{endpoint_});
    return;
  }
  wanted_ = true;
  if (!std::holds_alternative<Idle>(state_)) return;  // the answer is on its way
  const uint64_t tag = NewTag();
  Enter(Looking{tag});
  out.push_back(Get{tag, role_key_});
}

void Election::Fail(const std::string& why, std::vector<Effect>& out) {
  Enter(Idle{});
  if (!wanted_) return;
  wanted_ = false;
  out.push_back(LookupFailed{why});
}

void Election::FoundHolder(const std::string& role_value, const std::string& missing,
                           std::vector<Effect>& out) {
  Enter(Idle{});
  const std::string endpoint = Field(role_value, "endpoint");
  if (endpoint.empty()) return Fail(missing, out);
  if (!wanted_) return;
  wanted_ = false;
  out.push_back(Found{endpoint});
}

void Election::Campaign(TimePoint now, std::vector<Effect>& out) {
  const uint64_t tag = NewTag();
  Enter(Granting{tag, now});
  out.push_back(Grant{tag, spec_.rendezvous.lease});
}

void Election::OnAnswer(TimePoint now, const Answer& answer, std::vector<Effect>& out) {
  if (answer.tag == 0) return;
  if (answer.tag == revoke_tag_) {
    revoke_tag_ = 0;
    out.push_back(Flushed{});
    return;
  }
  if (const auto* leading = std::get_if<Leading>(&state_)) {
    if (answer.tag == leading->keepalive_tag) return OnKeepAliveAnswer(now, answer, out);
    if (answer.tag == leading->write_tag) return OnWriteAnswer(now, answer, out);
    return;
  }
  // The phase's one request; any other answer is one we no longer wait for (a revoke).
  const uint64_t pending = std::visit(
      [](const auto& phase) -> uint64_t {
        if constexpr (requires { phase.tag; }) {
          return phase.tag;
        } else {
          return 0;
        }
      },
      state_);
  if (answer.tag != pending) return;
  if (std::holds_alternative<Looking>(state_)) return OnLookingAnswer(now, answer, out);
  if (std::holds_alternative<Granting>(state_)) return OnGrantAnswer(answer, out);
  if (std::holds_alternative<Campaigning>(state_)) return OnCampaignAnswer(answer, out);
  if (std::holds_alternative<Reading>(state_)) return OnRecordRead(answer, out);
}

void Election::OnLookingAnswer(TimePoint now, const Answer& answer, std::vector<Effect>& out) {
  // The store's words name etcd already.
  if (!answer.error.empty()) return Fail(answer.error, out);
  if (!answer.entry) return Campaign(now, out);
  FoundHolder(answer.entry->value, fmt::format("etcd: {} holds no endpoint", role_key_), out);
}

void Election::OnGrantAnswer(const Answer& answer, std::vector<Effect>& out) {
  if (!answer.error.empty()) return Fail(answer.error, out);
  const Granting granting = std::get<Granting>(state_);
  const uint64_t tag = NewTag();
  Enter(Campaigning{tag, granting.sent, answer.lease, granting.sent + answer.ttl});
  out.push_back(PutIf{tag, role_key_, 0, role_key_, value_, answer.lease});
}

void Election::OnCampaignAnswer(const Answer& answer, std::vector<Effect>& out) {
  const Campaigning campaign = std::get<Campaigning>(state_);
  int64_t role_revision = answer.revision;
  if (answer.error.empty() && !answer.succeeded && answer.entry && answer.entry->lease == campaign.lease) {
    // The store tried the put again at another member after the first try had reached etcd:
    // the key is ours, made by that first try.
    role_revision = answer.entry->create_revision;
  } else if (!answer.error.empty() || !answer.succeeded) {
    out.push_back(Revoke{0, campaign.lease});
    if (!answer.error.empty()) return Fail(answer.error, out);
    return FoundHolder(answer.entry ? answer.entry->value : "",
                       "etcd: the coordinator role was taken and let go meanwhile", out);
  }
  const uint64_t tag = NewTag();
  Enter(Reading{tag, campaign.sent, campaign.lease, campaign.valid_until, role_revision});
  out.push_back(Get{tag, state_key_});
}

std::optional<JobRecord> Election::Adopt(std::optional<JobRecord> previous) {
  if (previous && previous->fingerprint != fingerprint_) {
    // A run of another job file under this job name (an edited file, or a node that has
    // another one) wrote the record. This file's run starts afresh; if that run had not
    // ended, or ended unconfirmed, its workers may still run until their lease ends.
    record_.quarantined = previous->quarantined;
    earlier_workers_may_run_ = !previous->done || previous->round_may_run || previous->workers_may_run;
    earlier_run_ = fmt::format("a run of job '{}' from another job file (fingerprint {}, recorded by {}){}",
                               spec_.job.name, previous->fingerprint.substr(0, 8),
                               previous->holder.empty() ? "an unnamed agent" : previous->holder,
                               previous->done ? "" : " that had not ended");
    previous.reset();
  } else if (previous && previous->done && !(took_part_ && previous->exit_code)) {
    // An earlier launch of the job ended: this one starts afresh, its quarantine kept.
    record_.quarantined = previous->quarantined;
    earlier_workers_may_run_ = previous->round_may_run;
    earlier_run_ = "the previous launch of this job (etcd)";
    previous.reset();
  } else if (previous) {
    // The job goes on from the record; or it is over and this agent, which took part, was
    // away when the others heard the verdict: its coordinator tells it the same.
    record_ = *previous;
  }
  record_.holder = AgentLabel(spec_, agent_);
  record_.holder_agent = agent_;
  record_.fingerprint = fingerprint_;
  return previous;
}

void Election::OnRecordRead(const Answer& answer, std::vector<Effect>& out) {
  const Reading reading = std::get<Reading>(state_);
  if (!answer.error.empty()) {
    out.push_back(Revoke{0, reading.lease});
    return Fail(answer.error, out);
  }
  std::optional<JobRecord> previous;
  if (answer.entry) previous = ParseJobRecord(answer.entry->value);
  inherited_job_ = Adopt(std::move(previous));
  Leading leading;
  leading.lease = reading.lease;
  leading.valid_until = reading.valid_until;
  leading.role_revision = reading.role_revision;
  leading.keepalive_sent = reading.sent;
  leading.next_keepalive = reading.sent + spec_.rendezvous.lease / 3;
  Enter(std::move(leading));
  out.push_back(Lead{});
  out.push_back(Continue{Step::kAfterLead});
}

void Election::OnKeepAliveAnswer(TimePoint now, const Answer& answer, std::vector<Effect>& out) {
  Leading& leading = std::get<Leading>(state_);
  leading.keepalive_tag = 0;
  if (!answer.error.empty()) {
    leading.next_keepalive = now + kRetry;
  } else if (answer.ttl <= Duration::zero()) {
    StepDown("its etcd lease has ended", out);
  } else {
    leading.valid_until = leading.keepalive_sent + answer.ttl;
    leading.next_keepalive = leading.keepalive_sent + answer.ttl / 3;
  }
}

std::string Election::LeaseEnding() const {
  return fmt::format("it could not renew its etcd lease (rendezvous.lease = {}) in time",
                     FormatDuration(spec_.rendezvous.lease));
}

void Election::OnWriteAnswer(TimePoint now, const Answer& answer, std::vector<Effect>& out) {
  Leading& leading = std::get<Leading>(state_);
  leading.write_tag = 0;
  if (!answer.error.empty()) {
    leading.dirty = true;
    leading.retry_write_at = now + kRetry;
    return;
  }
  if (!answer.succeeded) return StepDown("another agent holds the coordinator role now", out);
  // The write was made while the role was ours, but an answer that arrives when the lease may
  // be ending cannot let the coordinator act on it: another agent may take over soon.
  if (now >= leading.valid_until - StepDownMargin(spec_.rendezvous.lease))
    return StepDown(LeaseEnding(), out);
  if (leading.written_commit && leading.commit_round == leading.written_commit) {
    const int round = *leading.commit_round;
    leading.commit_round.reset();
    out.push_back(Committed{round});
    out.push_back(Continue{Step::kAfterCommit});
    return;
  }
  OnResume(now, Step::kAfterCommit, out);
}

void Election::OnResume(TimePoint now, Step step, std::vector<Effect>& out) {
  auto* leading = std::get_if<Leading>(&state_);
  if (!leading) return;  // the host let the role go meanwhile
  switch (step) {
    case Step::kAfterLead:
      if (!wanted_) return;
      wanted_ = false;
      out.push_back(Found{endpoint_});
      return;
    case Step::kAfterCommit:
      if (leading->written_end && leading->end_unacked) {
        leading->end_unacked = false;
        out.push_back(EndWritten{});
        out.push_back(Continue{Step::kAfterEnd});
        return;
      }
      [[fallthrough]];
    case Step::kAfterEnd:
      MaybeWrite(now, out);
      if (!Writing()) out.push_back(Flushed{});
      return;
  }
}

std::optional<TimePoint> Election::DeadlineOf(Deadline deadline) const {
  const auto* leading = std::get_if<Leading>(&state_);
  if (!leading) return std::nullopt;
  switch (deadline) {
    case Deadline::kStepDown:
      return leading->valid_until - StepDownMargin(spec_.rendezvous.lease);
    case Deadline::kKeepAlive:
      if (leading->keepalive_tag != 0) return std::nullopt;
      return leading->next_keepalive;
    case Deadline::kRetryWrite:
      return leading->retry_write_at;
    case Deadline::kCount:
      break;
  }
  return std::nullopt;
}

std::optional<TimePoint> Election::NextDeadline() const {
  std::optional<TimePoint> next;
  for (int d = 0; d < static_cast<int>(Deadline::kCount); ++d) {
    const auto at = DeadlineOf(static_cast<Deadline>(d));
    if (at && (!next || *at < *next)) next = at;
  }
  return next;
}

void Election::OnTick(TimePoint now, std::vector<Effect>& out) {
  const auto due = [&](Deadline deadline) {
    const auto at = DeadlineOf(deadline);
    return at && now >= *at;
  };
  if (due(Deadline::kStepDown)) return StepDown(LeaseEnding(), out);
  if (due(Deadline::kKeepAlive)) {
    Leading& leading = std::get<Leading>(state_);
    leading.keepalive_sent = now;
    leading.keepalive_tag = NewTag();
    out.push_back(KeepAlive{leading.keepalive_tag, leading.lease});
  }
  if (due(Deadline::kRetryWrite)) {
    std::get<Leading>(state_).retry_write_at.reset();
    MaybeWrite(now, out);
  }
}

void Election::StepDown(const std::string& why, std::vector<Effect>& out) {
  // The lookup that waits (if any) keeps waiting: the host looks the new holder up.
  const bool wanted = wanted_;
  wanted_ = false;
  LetGo(out);
  wanted_ = wanted;
  out.push_back(SteppedDown{why});
}

void Election::LetGo(std::vector<Effect>& out) {
  const int64_t lease = std::visit(
      [](const auto& phase) -> int64_t {
        if constexpr (requires { phase.lease; }) {
          return phase.lease;
        } else {
          return 0;
        }
      },
      state_);
  if (lease != 0) {
    revoke_tag_ = NewTag();
    out.push_back(Revoke{revoke_tag_, lease});
  }
  Fail("this agent let the coordinator role go", out);
}

void Election::MaybeWrite(TimePoint now, std::vector<Effect>& out) {
  auto* leading = std::get_if<Leading>(&state_);
  if (!leading || leading->write_tag != 0 || !leading->dirty) return;
  if (leading->retry_write_at && now < *leading->retry_write_at) return;
  leading->dirty = false;
  leading->written_commit = leading->commit_round;
  leading->written_end = leading->end_unacked;
  leading->write_tag = NewTag();
  out.push_back(
      PutIf{leading->write_tag, role_key_, leading->role_revision, state_key_, FormatJobRecord(record_), 0});
}

}  // namespace ddprun::core
