#include "runner/host/coordinator_role.h"

#include <cstdlib>
#include <type_traits>

#include <fmt/format.h>

#include "schema/duration.h"

namespace ddprun::host {

std::pair<std::string, uint16_t> SplitEndpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const auto port = colon == std::string::npos ? 0 : std::atoi(endpoint.c_str() + colon + 1);
  return {host, static_cast<uint16_t>(port >= 0 && port <= 65535 ? port : 0)};
}

// ---- StaticRole ---------------------------------------------------------------------------

StaticRole::StaticRole(const JobSpec& spec, int agent, std::string master_at, Journal* journal,
                       Listener listener)
    : spec_(spec),
      agent_(agent),
      master_at_(std::move(master_at)),
      listen_addr_(master_at_.empty() ? spec.cluster.master_addr : master_at_),
      record_(agent == 0 ? journal : nullptr),
      listener_(std::move(listener)) {}

void StaticRole::Seat(core::Coordinator& coordinator) const {
  if (!master_at_.empty()) coordinator.SetMasterAddr(master_at_);
}

void StaticRole::Lookup(TimePoint /*now*/) {
  // Known from the job file (or the agent's --master-at): the agent connects at once.
  listener_.found(CoordinatorAt{listen_addr_, spec_.cluster.master_port, ""});
}

// ---- ElectedRole --------------------------------------------------------------------------

ElectedRole::ElectedRole(const JobSpec& spec, std::string fingerprint, int agent, std::string addr,
                         Store& store, Listener listener)
    : spec_(spec),
      election_(spec, std::move(fingerprint), agent, fmt::format("{}:{}", addr, spec.cluster.master_port)),
      addr_(std::move(addr)),
      agent_(agent),
      store_(store),
      listener_(std::move(listener)) {}

void ElectedRole::Seat(core::Coordinator& coordinator) const { coordinator.PlaceRankZero(agent_, addr_); }

std::string ElectedRole::Holding() const {
  return fmt::format("etcd key {}, rendezvous.lease = {}", election_.role_key(),
                     FormatDuration(spec_.rendezvous.lease));
}

void ElectedRole::OnStoreResult(TimePoint now, const StoreResult& result) {
  auto it = tags_.find(result.id);
  if (it == tags_.end()) return;  // an answer nobody waits for
  core::election::Answer answer{it->second, result.error, result.succeeded, result.lease,
                                result.ttl, std::nullopt, result.revision};
  tags_.erase(it);
  if (result.entry) {
    answer.entry =
        core::election::Entry{result.entry->value, result.entry->create_revision, result.entry->lease};
  }
  Run(now, answer);
}

bool ElectedRole::LetGoOnExit(TimePoint now) {
  if (election_.Writing()) return false;  // the job's record is not in the store yet
  if (!resigned_) {
    resigned_ = true;
    Resign(now);
  }
  return !election_.Revoking();  // the role's key goes before this agent does
}

Inheritance ElectedRole::Inherited() {
  Inheritance from;
  if (!election_.inherited_job() && election_.earlier_workers_may_run()) {
    // Leading afresh: the earlier run's last record is no older than our campaign's read.
    from.workers_may_run_since = Duration::zero();
    from.earlier = election_.earlier_run();
  }
  from.job = election_.inherited_job();
  from.quarantined = election_.record().quarantined;
  return from;
}

bool ElectedRole::Commit(TimePoint now, const core::CommitRound& round) {
  Run(now, round);
  return false;
}

bool ElectedRole::RecordEnd(TimePoint now, int exit_code, const std::string& summary) {
  Run(now, core::RecordEnd{exit_code, summary});
  return false;
}

void ElectedRole::Run(TimePoint now, const core::election::Input& input) {
  std::vector<core::election::Effect> effects;
  election_.Handle(now, input, effects);
  for (const core::election::Effect& effect : effects) Execute(now, effect);
}

void ElectedRole::Sent(uint64_t id, uint64_t tag) {
  if (tag != 0 && id != 0) tags_.emplace(id, tag);
}

void ElectedRole::Execute(TimePoint now, const core::election::Effect& effect) {
  namespace e = core::election;
  std::visit(
      [&](const auto& out) {
        using T = std::decay_t<decltype(out)>;
        if constexpr (std::is_same_v<T, e::Get>) {
          Sent(store_.Get(out.key), out.tag);
        } else if constexpr (std::is_same_v<T, e::Grant>) {
          Sent(store_.Grant(out.ttl), out.tag);
        } else if constexpr (std::is_same_v<T, e::PutIf>) {
          Sent(store_.PutIf(out.compare_key, out.create_revision, {StorePut{out.key, out.value, out.lease}}),
               out.tag);
        } else if constexpr (std::is_same_v<T, e::KeepAlive>) {
          Sent(store_.KeepAlive(out.lease), out.tag);
        } else if constexpr (std::is_same_v<T, e::Revoke>) {
          Sent(store_.Revoke(out.lease), out.tag);
        } else if constexpr (std::is_same_v<T, e::Found>) {
          const auto [host, port] = SplitEndpoint(out.endpoint);
          listener_.found(CoordinatorAt{host, port, out.endpoint});
        } else if constexpr (std::is_same_v<T, e::LookupFailed>) {
          listener_.lookup_failed(out.why);
        } else if constexpr (std::is_same_v<T, e::Lead>) {
          listener_.lead();
        } else if constexpr (std::is_same_v<T, e::SteppedDown>) {
          listener_.step_down(out.why);
        } else if constexpr (std::is_same_v<T, e::Committed>) {
          listener_.committed(out.round);
        } else if constexpr (std::is_same_v<T, e::EndWritten>) {
          listener_.end_recorded();
        } else if constexpr (std::is_same_v<T, e::Flushed>) {
          listener_.flushed();
        } else if constexpr (std::is_same_v<T, e::Continue>) {
          // The notification before this is carried out (the last effect but this one), by the
          // latest time the machine saw meanwhile: a real host's clock ran while it did.
          Run(std::max(now, election_.last_input().value_or(now)), e::Resume{out.step});
        }
      },
      effect);
}

}  // namespace ddprun::host
