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
#include "runner/io/driver.h"

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

}  // namespace ddprun::io
