// The checks that need more than one section. They run after every section is loaded (see
// schema/loader.cc), so each sees the final values of both sides, and a mistake already
// reported by a section loader (a value left unset) is not reported again as a mismatch.
#include <fmt/format.h>

#include "schema/sections.h"

namespace ddprun {
namespace {

// trainer.devices and trainer.num_nodes must describe the cluster Lightning will see.
void CheckTrainerAgainstCluster(const JobSpec& spec, const TrainerFacts& trainer_facts,
                                const ClusterFacts& cluster_facts, TomlReader& reader) {
  Diagnostics& diags = reader.diags();
  const auto& c = spec.cluster;
  const auto& t = spec.trainer;
  const bool nnodes_known = c.nnodes > 0;
  if (cluster_facts.nproc_per_node && c.nproc_per_node > 0 && t.devices && *t.devices != c.nproc_per_node) {
    diags.Error(
        LocOf(*cluster_facts.nproc_per_node), "cluster.nproc_per_node",
        fmt::format("cluster.nproc_per_node = {} does not match trainer.devices = {}", c.nproc_per_node,
                    *t.devices),
        fmt::format("set trainer.devices = {} or cluster.nproc_per_node = {}", c.nproc_per_node, *t.devices));
  }
  if (t.num_nodes && nnodes_known && *t.num_nodes != c.nnodes) {
    const SourceLoc loc = reader.LocationOf("trainer.num_nodes");
    if (!c.nodes.empty()) {
      diags.Error(loc, "trainer.num_nodes",
                  fmt::format("trainer.num_nodes = {} does not match the {} hosts of "
                              "cluster.nodes",
                              *t.num_nodes, c.nnodes),
                  fmt::format("set trainer.num_nodes = {} or list {} hosts in cluster.nodes", c.nnodes,
                              *t.num_nodes));
    } else {
      diags.Error(
          loc, "trainer.num_nodes",
          fmt::format("trainer.num_nodes = {} does not match cluster.nnodes = {}", *t.num_nodes, c.nnodes),
          fmt::format("set trainer.num_nodes = {} or cluster.nnodes = {}", c.nnodes, *t.num_nodes));
    }
  }
  if (trainer_facts.table && !trainer_facts.table->get("num_nodes") && nnodes_known &&
      c.min_nodes < c.nnodes) {
    // A round with fewer nodes must tell Lightning so: ddprun sets PL_TRAINER_NUM_NODES to
    // the round's node count, which needs the key in the first place.
    diags.Error(reader.LocationOf("cluster.min_nodes"), "cluster.min_nodes",
                fmt::format("cluster.min_nodes = {} lets rounds run with fewer nodes, but "
                            "[trainer] does not set num_nodes: Lightning's Trainer() would use 1 "
                            "and reject the round's WORLD_SIZE",
                            c.min_nodes),
                fmt::format("add num_nodes = {} under [trainer]; a smaller round gets "
                            "PL_TRAINER_NUM_NODES = its own node count",
                            c.nnodes));
  } else if (trainer_facts.table && !trainer_facts.table->get("num_nodes") && nnodes_known && c.nnodes > 1) {
    diags.Warning(LocOf(*trainer_facts.table), "trainer.num_nodes",
                  fmt::format("[trainer] does not set num_nodes; Lightning's Trainer() then "
                              "uses 1 and rejects WORLD_SIZE = {}",
                              spec.WorldSize()),
                  fmt::format("add num_nodes = {} under [trainer]", c.nnodes));
  }
  if (t.device_ids && t.accelerator == "cpu") {
    diags.Error(reader.LocationOf("trainer.devices"), "trainer.devices",
                "trainer.devices lists device ids, but accelerator = \"cpu\" takes a count",
                fmt::format("write devices = {}", *t.devices));
  }
}

// Nodes wait for the backoff before rejoining a round, so it must end well before the
// rendezvous timeout of the nodes already waiting.
void CheckBackoffAgainstRendezvous(const JobSpec& spec, TomlReader& reader) {
  const auto& t = spec.timeouts;
  const Duration longest_backoff = spec.restart.backoff_max.value_or(spec.restart.backoff);
  if (longest_backoff >= t.rendezvous && t.rendezvous > Duration::zero()) {
    TimeoutOrderWarning(reader, t, spec.restart.backoff_max ? "restart.backoff_max" : "restart.backoff",
                        longest_backoff, "is not shorter than",
                        "nodes wait for the backoff before rejoining; keep it well under the "
                        "rendezvous timeout");
  }
}

// A spare takes over, and a round shrinks, only at a restart; and only before the others give
// up waiting for the node.
void CheckReplacement(const JobSpec& spec, TomlReader& reader) {
  const auto& c = spec.cluster;
  if (!c.CanReplace()) return;
  const std::string key = c.spares > 0 ? "cluster.spares" : "cluster.min_nodes";
  if (spec.restart.max_restarts == 0) {
    reader.diags().Warning(reader.LocationOf(key), key,
                           fmt::format("{} can only act at a restart, and restart.max_restarts = 0", key),
                           "a lost node's rank goes to a spare (or the job shrinks) in the next "
                           "round: set restart.max_restarts to at least 1");
  }
  const auto& t = spec.timeouts;
  if (t.replace >= t.rendezvous && t.rendezvous > Duration::zero()) {
    TimeoutOrderWarning(reader, t, "timeouts.replace", t.replace, "is not shorter than",
                        "the round gives up on a lost node at the rendezvous timeout, before a "
                        "spare could take its rank (or the job shrink)");
  }
}

}  // namespace

void CheckAcrossSections(const JobSpec& spec, const TrainerFacts& trainer_facts,
                         const ClusterFacts& cluster_facts, TomlReader& reader) {
  CheckTrainerAgainstCluster(spec, trainer_facts, cluster_facts, reader);
  CheckBackoffAgainstRendezvous(spec, reader);
  CheckReplacement(spec, reader);
}

}  // namespace ddprun
