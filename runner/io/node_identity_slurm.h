#pragma once
// Node identity and worker environment under SLURM (`srun ddprun job.toml`).
//
// SLURM numbers the hosts of an allocation in its own order (SLURM_NODEID), which need not be
// the order of cluster.nodes. The host's own entry in cluster.nodes decides where node 0's
// coordinator listens (master_addr defaults to nodes[0]), so SLURM_NODEID is used only where
// the host name says nothing else.

#include <map>
#include <string>

#include "base/result.h"
#include "runner/io/node_identity.h"
#include "schema/loader.h"

namespace ddprun::io {

/// The node rank from SLURM_NODEID=`value`, checked against `by_host` (what this host's name or
/// addresses say, DetectNodeRankByHost) when cluster.nodes is listed:
///  - they agree, or cluster.nodes is not listed: SLURM_NODEID;
///  - the host is one entry of cluster.nodes and SLURM_NODEID another: that entry, with a warning
///    that names both;
///  - the host is in no entry of a listed cluster.nodes: an error that names both.
Result<DetectedRank> RankFromSlurmNodeId(const JobSpec& spec, const std::string& value,
                                         const Result<DetectedRank>& by_host);

/// The variables through which srun describes its own task layout (one task per node for
/// ddprun): a worker that saw them would take SLURM_PROCID as its rank. Lightning before 2.1
/// picks SLURMEnvironment over TorchElasticEnvironment whenever SLURM_NTASKS is set (its job
/// name not "bash"/"interactive"); since 2.1 TorchElasticEnvironment (TORCHELASTIC_RUN_ID,
/// which ddprun sets) comes first. Removed from the workers' environment; the allocation's
/// facts (SLURM_JOB_ID, SLURM_JOB_NODELIST, ...) stay.
void RemoveSlurmTaskLayout(std::map<std::string, std::string>& env);

/// The hosts of the allocation this process runs in: SLURM_JOB_NODELIST expanded by the real
/// `scontrol show hostnames` (no hostlist parser of our own), in SLURM's order.
Result<std::vector<std::string>> SlurmAllocationHosts();

/// What the job file loader is told about this machine: inside a SLURM allocation
/// (SLURM_JOB_NODELIST set), where cluster.hosts_from = "slurm" takes its hosts.
LoadContext MachineLoadContext();

/// Under srun, a job file that lists its hosts must name the allocation's hosts (by name, short
/// name or an address the name resolves to): each allocation host is one of cluster.nodes or
/// cluster.spares. An error names both lists and the hosts that differ.
Status CheckListedHostsAgainstAllocation(const JobSpec& spec, const std::vector<std::string>& allocation);

}  // namespace ddprun::io
