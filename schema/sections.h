#pragma once
// One loader per section of the job file, and the checks that need several sections. Each
// loader reads its section into its part of JobSpec; what it needs from sections loaded before
// it is a parameter, and what later steps need from it (besides JobSpec) is its return value.
// schema/loader.cc calls them in the order that makes those inputs available and says why.
// Internal to the loader: includes toml++ through toml_access.h.

#include <functional>
#include <map>
#include <string>

#include "base/result.h"
#include "schema/faults.h"
#include "schema/job_spec.h"
#include "schema/toml_access.h"

namespace ddprun {

/// `version = 1`.
void LoadVersion(const toml::table& root, TomlReader& reader);

/// [job], with job.env (LoadEnv).
void LoadJob(const toml::table& root, TomlReader& reader, JobSpec::Job& job);

/// job.env: names ddprun sets itself and the shared secret are refused.
void LoadEnv(const toml::table& job, TomlReader& reader, std::map<std::string, std::string>& env);

/// What the [trainer] loader learnt that the [cluster] loader and the cross-section checks need.
struct TrainerFacts {
  const toml::table* table = nullptr;  // [trainer], when it is a table
  /// trainer.devices is written but was rejected: cluster.nproc_per_node then gets no default,
  /// so that one mistake is not reported again as a mismatch.
  bool devices_failed = false;
};

/// [trainer]: every key is forwarded to the script; devices, num_nodes, accelerator and
/// strategy are also checked and mirrored typed.
TrainerFacts LoadTrainer(const toml::table& root, TomlReader& reader, JobSpec::Trainer& trainer);

/// What the [cluster] loader learnt that the cross-section checks need.
struct ClusterFacts {
  const toml::node* nproc_per_node = nullptr;  // where it was written, when it was
};

/// [cluster]. nproc_per_node defaults to trainer.devices, so [trainer] is loaded first.
/// `slurm_hosts` answers cluster.hosts_from = "slurm" (schema/loader.h LoadContext).
ClusterFacts LoadCluster(const toml::table& root, TomlReader& reader, const JobSpec::Trainer& trainer,
                         const TrainerFacts& trainer_facts,
                         const std::function<Result<std::vector<std::string>>()>& slurm_hosts,
                         JobSpec::Cluster& cluster);

/// [restart].
void LoadRestart(const toml::table& root, TomlReader& reader, JobSpec::Restart& restart);

/// [timeouts], with the checks between its own keys (heartbeat against rendezvous).
void LoadTimeouts(const toml::table& root, TomlReader& reader, JobSpec::Timeouts& timeouts);

/// [rendezvous]. "etcd" needs every agent's host listed in `cluster`, and a lease shorter
/// than timeouts.rendezvous.
void LoadRendezvous(const toml::table& root, TomlReader& reader, const JobSpec::Cluster& cluster,
                    const JobSpec::Timeouts& timeouts, JobSpec::Rendezvous& rendezvous);

/// [quarantine].
void LoadQuarantine(const toml::table& root, TomlReader& reader, JobSpec::Quarantine& quarantine);
/// [stragglers].
void LoadStragglers(const toml::table& root, TomlReader& reader, JobSpec::Stragglers& stragglers);

/// Warns that `key` (a wait of `value`) `relation` timeouts.rendezvous, at `key` when it is in
/// the file, else at rendezvous, naming `key`'s default.
void TimeoutOrderWarning(TomlReader& reader, const JobSpec::Timeouts& timeouts, const std::string& key,
                         Duration value, std::string_view relation, std::string_view why);

/// [logs]. Console ranks must be below `world_size` (0: unknown, [cluster] had errors).
void LoadLogs(const toml::table& root, TomlReader& reader, int world_size, JobSpec::Logs& logs);

/// [metrics]. The port must not be one of `cluster`'s; "*" needs cluster.nodes.
void LoadMetrics(const toml::table& root, TomlReader& reader, const JobSpec::Cluster& cluster,
                 JobSpec::Metrics& metrics);

/// [simulate] and its [[simulate.faults]], whose nodes and workers must exist in `bounds`.
void LoadSimulate(const toml::table& root, TomlReader& reader, FaultBounds bounds,
                  JobSpec::Simulate& simulate);

/// The checks between sections, after every section is loaded: [trainer] against [cluster]
/// (devices, num_nodes), and restart backoff against timeouts.rendezvous.
void CheckAcrossSections(const JobSpec& spec, const TrainerFacts& trainer_facts,
                         const ClusterFacts& cluster_facts, TomlReader& reader);

}  // namespace ddprun
