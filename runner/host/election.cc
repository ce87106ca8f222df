#include "runner/host/election.h"

#include <charconv>

#include <fmt/format.h>

#include "base/parse_int.h"
#include "schema/worker_env.h"

namespace ddprun::host {

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
std::string FormatJobRecord(const core::JobRecord& r) {
  std::string out = fmt::format(
      "ddprun-state=1\nnext_round={}\nrestarts={}\nrunning={}\nnodes={}\nunconfirmed={}\ndone={}\nholder={}\n"
      "holder_agent={}\nfingerprint={}\n",
      r.next_round, r.restarts_used, r.round_may_run ? 1 : 0, r.round_nodes, r.workers_may_run ? 1 : 0, r.done ? 1 : 0,
      r.holder, r.holder_agent, r.fingerprint);
  for (const core::QuarantinedHost& q : r.quarantined) {
    const int64_t left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(q.left).count();
    out += fmt::format("quarantine={} {} {}\n", std::max<int64_t>(left_ms, 0), q.times, q.host);
  }
  if (r.exit_code) out += fmt::format("exit={}\nsummary={}", *r.exit_code, r.summary);
  return out;
}

std::optional<core::JobRecord> ParseJobRecord(const std::string& text) {
  if (Field(text, "ddprun-state") != "1") return std::nullopt;
  core::JobRecord state;
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
    state.quarantined.push_back(core::QuarantinedHost{line.substr(b + 1), Millis(*left), static_cast<int>(*times)});
  }
  if (const auto exit = IntField(text, "exit")) {
    state.exit_code = *exit;
    const size_t at = text.find("\nsummary=");
    if (at != std::string::npos) state.summary = text.substr(at + 9);
  }
  return state;
}

Election::Election(const JobSpec& spec, std::string fingerprint, int agent, std::string endpoint, Store& store,
                   Listener listener)
    : spec_(spec),
      fingerprint_(std::move(fingerprint)),
      agent_(agent),
      endpoint_(std::move(endpoint)),
      store_(store),
      listener_(std::move(listener)) {
  const std::string base = EtcdKeyDir(spec);
  role_key_ = base + "/coordinator";
  state_key_ = base + "/state";
  value_ = fmt::format("agent={}\nendpoint={}\nname={}", agent_, endpoint_, AgentLabel(spec, agent_));
  state_.holder = AgentLabel(spec, agent_);
  state_.holder_agent = agent_;
  state_.fingerprint = fingerprint_;
}

Duration Election::StepDownMargin(Duration lease) { return std::max<Duration>(lease / 5, Millis(400)); }

void Election::Lookup(TimePoint now) {
  (void)now;
  if (phase_ == Phase::kLeading) {
    listener_.found(endpoint_);
    return;
  }
  wanted_ = true;
  if (phase_ != Phase::kIdle) return;  // the answer is on its way
  phase_ = Phase::kLooking;
  pending_ = store_.Get(role_key_);
}

void Election::Fail(const std::string& why) {
  phase_ = Phase::kIdle;
  pending_ = 0;
  if (!wanted_) return;
  wanted_ = false;
  listener_.lookup_failed(why);
}

void Election::Campaign(TimePoint now) {
  phase_ = Phase::kGranting;
  keepalive_sent_ = now;
  pending_ = store_.Grant(spec_.rendezvous.lease);
}

void Election::OnStoreResult(TimePoint now, const StoreResult& result) {
  if (result.id == 0) return;
  if (result.id == revoke_id_) {
    revoke_id_ = 0;
    listener_.flushed();
    return;
  }
  if (result.id == keepalive_id_) {
    keepalive_id_ = 0;
    if (phase_ != Phase::kLeading) return;
    if (!result.error.empty()) {
      next_keepalive_ = now + kRetry;
    } else if (result.ttl <= Duration::zero()) {
      StepDown(now, "its etcd lease has ended");
    } else {
      valid_until_ = keepalive_sent_ + result.ttl;
      next_keepalive_ = keepalive_sent_ + result.ttl / 3;
    }
    return;
  }
  if (result.id == write_id_) {
    write_id_ = 0;
    if (phase_ != Phase::kLeading) return;
    if (!result.error.empty()) {
      dirty_ = true;
      retry_write_at_ = now + kRetry;
      return;
    }
    if (!result.succeeded) {
      StepDown(now, "another agent holds the coordinator role now");
      return;
    }
    // The write was made while the role was ours, but an answer that arrives when the lease
    // may be ending cannot let the coordinator act on it: another agent may take over soon.
    if (now >= valid_until_ - StepDownMargin(spec_.rendezvous.lease)) {
      StepDown(now, fmt::format("it could not renew its etcd lease (rendezvous.lease = {}) in time",
                                FormatDuration(spec_.rendezvous.lease)));
      return;
    }
    if (written_commit_ && commit_round_ == written_commit_) {
      const int round = *commit_round_;
      commit_round_.reset();
      listener_.committed(round);
      if (phase_ != Phase::kLeading) return;
    }
    if (written_end_ && end_unacked_) {
      end_unacked_ = false;
      listener_.end_recorded();
      if (phase_ != Phase::kLeading) return;
    }
    MaybeWrite(now);
    if (!Writing()) listener_.flushed();
    return;
  }
  if (result.id != pending_) return;  // a revoke, or an answer we no longer wait for
  pending_ = 0;
  const std::string& etcd_error = result.error;  // the store's words name etcd already
  switch (phase_) {
    case Phase::kLooking: {
      if (!result.error.empty()) return Fail(etcd_error);
      if (!result.entry) return Campaign(now);
      phase_ = Phase::kIdle;
      const std::string endpoint = Field(result.entry->value, "endpoint");
      if (endpoint.empty()) return Fail(fmt::format("etcd: {} holds no endpoint", role_key_));
      if (wanted_) {
        wanted_ = false;
        listener_.found(endpoint);
      }
      return;
    }
    case Phase::kGranting:
      if (!result.error.empty()) return Fail(etcd_error);
      lease_ = result.lease;
      valid_until_ = keepalive_sent_ + result.ttl;
      phase_ = Phase::kCampaigning;
      pending_ = store_.PutIf(role_key_, 0, {StorePut{role_key_, value_, lease_}});
      return;
    case Phase::kCampaigning:
      if (result.error.empty() && !result.succeeded && result.entry && result.entry->lease == lease_) {
        // The store tried the put again at another member after the first try had reached
        // etcd: the key is ours, made by that first try.
        role_revision_ = result.entry->create_revision;
        phase_ = Phase::kReading;
        pending_ = store_.Get(state_key_);
        return;
      }
      if (!result.error.empty() || !result.succeeded) {
        store_.Revoke(lease_);
        lease_ = 0;
        if (!result.error.empty()) return Fail(etcd_error);
        phase_ = Phase::kIdle;
        const std::string endpoint = result.entry ? Field(result.entry->value, "endpoint") : "";
        if (endpoint.empty()) return Fail("etcd: the coordinator role was taken and let go meanwhile");
        if (wanted_) {
          wanted_ = false;
          listener_.found(endpoint);
        }
        return;
      }
      role_revision_ = result.revision;
      phase_ = Phase::kReading;
      pending_ = store_.Get(state_key_);
      return;
    case Phase::kReading: {
      if (!result.error.empty()) {
        store_.Revoke(lease_);
        lease_ = 0;
        return Fail(etcd_error);
      }
      std::optional<core::JobRecord> previous;
      if (result.entry) previous = ParseJobRecord(result.entry->value);
      if (previous && previous->fingerprint != fingerprint_) {
        // A run of another job file under this job name (an edited file, or a node that has
        // another one) wrote the record. This file's run starts afresh; if that run had not
        // ended, or ended unconfirmed, its workers may still run until their lease ends.
        state_.quarantined = previous->quarantined;
        earlier_workers_may_run_ = !previous->done || previous->round_may_run || previous->workers_may_run;
        earlier_run_ = fmt::format("a run of job '{}' from another job file (fingerprint {}, recorded by {}){}",
                                   spec_.job.name, previous->fingerprint.substr(0, 8),
                                   previous->holder.empty() ? "an unnamed agent" : previous->holder,
                                   previous->done ? "" : " that had not ended");
        previous.reset();
      } else if (previous && previous->done && !(took_part_ && previous->exit_code)) {
        // An earlier launch of the job ended: this one starts afresh, its quarantine kept.
        state_.quarantined = previous->quarantined;
        earlier_workers_may_run_ = previous->round_may_run;
        earlier_run_ = "the previous launch of this job (etcd)";
        previous.reset();
      } else if (previous) {
        // The job goes on from the record; or it is over and this agent, which took part, was
        // away when the others heard the verdict: its coordinator tells it the same.
        state_ = *previous;
      }
      state_.holder = AgentLabel(spec_, agent_);
      state_.holder_agent = agent_;
      state_.fingerprint = fingerprint_;
      phase_ = Phase::kLeading;
      next_keepalive_ = keepalive_sent_ + spec_.rendezvous.lease / 3;
      inherited_job_ = previous;
      listener_.lead(previous);
      if (phase_ == Phase::kLeading && wanted_) {
        wanted_ = false;
        listener_.found(endpoint_);
      }
      return;
    }
    case Phase::kIdle:
    case Phase::kLeading:
      return;
  }
}

Inheritance Election::Inherited() {
  Inheritance from;
  if (!inherited_job_ && earlier_workers_may_run_) {
    // Leading afresh: the earlier run's last record is no older than our campaign's read.
    from.workers_may_run_since = Duration::zero();
    from.earlier = earlier_run_;
  }
  from.job = inherited_job_;
  from.quarantined = state_.quarantined;
  return from;
}

void Election::OnTick(TimePoint now) {
  if (phase_ != Phase::kLeading) return;
  if (now >= valid_until_ - StepDownMargin(spec_.rendezvous.lease)) {
    StepDown(now, fmt::format("it could not renew its etcd lease (rendezvous.lease = {}) in time",
                              FormatDuration(spec_.rendezvous.lease)));
    return;
  }
  if (keepalive_id_ == 0 && now >= next_keepalive_) {
    keepalive_sent_ = now;
    keepalive_id_ = store_.KeepAlive(lease_);
  }
  if (retry_write_at_ && now >= *retry_write_at_) {
    retry_write_at_.reset();
    MaybeWrite(now);
  }
}

std::optional<TimePoint> Election::NextDeadline() const {
  if (phase_ != Phase::kLeading) return std::nullopt;
  TimePoint next = valid_until_ - StepDownMargin(spec_.rendezvous.lease);
  if (keepalive_id_ == 0) next = std::min(next, next_keepalive_);
  if (retry_write_at_) next = std::min(next, *retry_write_at_);
  return next;
}

void Election::StepDown(TimePoint now, const std::string& why) {
  const bool wanted = wanted_;
  wanted_ = false;
  Resign(now);
  wanted_ = wanted;
  listener_.step_down(why);
}

void Election::Resign(TimePoint now) {
  (void)now;
  if (lease_ != 0) revoke_id_ = store_.Revoke(lease_);
  lease_ = 0;
  role_revision_ = 0;
  keepalive_id_ = 0;
  write_id_ = 0;
  dirty_ = false;
  commit_round_.reset();
  written_commit_.reset();
  end_unacked_ = false;
  written_end_ = false;
  retry_write_at_.reset();
  Fail("this agent let the coordinator role go");
}

void Election::MaybeWrite(TimePoint now) {
  if (phase_ != Phase::kLeading || write_id_ != 0 || !dirty_) return;
  if (retry_write_at_ && now < *retry_write_at_) return;
  dirty_ = false;
  written_commit_ = commit_round_;
  written_end_ = end_unacked_;
  write_id_ = store_.PutIf(role_key_, role_revision_, {StorePut{state_key_, FormatJobRecord(state_), 0}});
}

bool Election::Commit(TimePoint now, const core::CommitRound& round) {
  state_.next_round = round.round + 1;
  state_.restarts_used = round.restarts_used;
  state_.round_may_run = true;
  state_.round_nodes = round.nodes;
  state_.workers_may_run = false;  // the round starts only once its ranks' fences passed
  commit_round_ = round.round;
  dirty_ = true;
  MaybeWrite(now);
  return false;
}

void Election::RecordRestart(TimePoint now, int next_round, int restarts_used, bool workers_may_run) {
  state_.next_round = next_round;
  state_.restarts_used = restarts_used;
  state_.round_may_run = false;
  state_.workers_may_run = workers_may_run;
  dirty_ = true;
  MaybeWrite(now);
}

bool Election::RecordEnd(TimePoint now, int exit_code, const std::string& summary) {
  state_.exit_code = exit_code;
  state_.summary = summary;
  end_unacked_ = true;
  dirty_ = true;
  MaybeWrite(now);
  return false;
}

void Election::RecordQuarantine(TimePoint now, const std::vector<core::QuarantinedHost>& hosts) {
  state_.quarantined = hosts;
  dirty_ = true;
  MaybeWrite(now);
}

void Election::RecordWorkers(TimePoint now, bool may_run) {
  if (may_run) return;
  state_.round_may_run = false;
  dirty_ = true;
  MaybeWrite(now);
}

void Election::RecordDone(TimePoint now) {
  state_.done = true;
  dirty_ = true;
  MaybeWrite(now);
}

}  // namespace ddprun::host
